"""A stub OpenAI-compatible embeddings server: a real HTTP server on 127.0.0.1, in a thread.

Its vectors are deterministic and mean something: a hashed bag of the text's words (each word
adds +-1 at a position its hash picks), so texts sharing words are near and texts sharing none
are far, with no model. They are answered unnormalised (scaled) so a client must normalise.

Switch its behaviour while a test runs: ``mode`` is "ok", "slow" (answers after ``delay``
seconds), "fail" (HTTP 500), "hang" (answers nothing until the server stops), "trickle" (a
byte every 50 ms), "garbage" (200 with no vectors in it) or "down" (the port refuses connections: :meth:`down`, then :meth:`up`).
``fail_next`` fails that many requests with 500 and then answers again; ``dims`` may be changed
to play a server whose model was swapped.

Other tests use it through the ``embeddings_server`` fixture (import it into a conftest or a
test module) or as a context manager.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

WORD = re.compile(r"[a-z0-9_]+")
DIMS = 64


def stub_vector(text: str, dims: int = DIMS) -> list[float]:
    """The stub's vector for ``text``: a signed hashed bag of its lowercased words."""
    vec = [0.0] * dims
    for word in WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        at = int.from_bytes(digest[:4], "big") % dims
        vec[at] += 1.0 if digest[4] & 1 else -1.0
    if not any(vec):
        vec[0] = 1.0  # a text with no words still gets a (shared) direction
    return [3.0 * x for x in vec]


class StubEmbeddingsServer:
    """The server, its switches, and what it was asked."""

    def __init__(self, dims: int = DIMS) -> None:
        self.dims = dims
        self.mode = "ok"
        self.delay = 10.0
        self.fail_next = 0
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self.port = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.up()

    @property
    def base_url(self) -> str:
        """The base URL a client is given (``.../v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def up(self) -> None:
        """Serve (again, on the same port after :meth:`down`)."""
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                stub._answer(self)

        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._release.clear()
        self._thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        self._thread.start()
        self.mode = "ok"

    def down(self) -> None:
        """Stop serving: connections to the port are refused until :meth:`up`."""
        self._release.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.mode = "down"

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length) or b"{}")
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(handler.headers.items()))
            mode = self.mode
            if self.fail_next > 0:
                self.fail_next -= 1
                mode = "fail"
        if not handler.path.endswith("/embeddings"):
            self._send(handler, 404, {"error": {"message": "not found"}})
            return
        if mode == "hang":
            self._release.wait(60)
            return
        if mode == "slow":
            self._release.wait(self.delay)
        if mode == "fail":
            self._send(handler, 500, {"error": {"message": "the stub was told to fail"}})
            return
        if mode == "trickle":
            raw = json.dumps({"data": [{"index": 0, "embedding": [1.0] * self.dims}]}).encode()
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(raw)))
            handler.end_headers()
            for at in range(len(raw)):
                if self._release.wait(0.05):
                    return
                handler.wfile.write(raw[at : at + 1])
                handler.wfile.flush()
            return
        if mode == "garbage":
            self._send(handler, 200, {"data": [{"index": 0, "embedding": "not a vector"}]})
            return
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        data = [
            {"object": "embedding", "index": i, "embedding": stub_vector(t, self.dims)}
            for i, t in enumerate(texts)
        ]
        self._send(handler, 200, {"object": "list", "data": data, "model": body.get("model")})

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, doc: object) -> None:
        raw = json.dumps(doc).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    def close(self) -> None:
        """Stop serving and let hung answers go."""
        if self._httpd is not None:
            self.down()

    def __enter__(self) -> StubEmbeddingsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def embeddings_server() -> Iterator[StubEmbeddingsServer]:
    """A stub embeddings server answering "ok", stopped after the test."""
    with StubEmbeddingsServer() as server:
        yield server
