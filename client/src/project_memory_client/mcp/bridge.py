"""A stdio ↔ HTTP relay to the server's ``/mcp`` endpoint (docs/agents.md, "MCP over stdio").

Each line on stdin is one JSON-RPC message; it is POSTed to ``<url>/mcp`` with the user's
token, and the answer, if there is one, is written to stdout as one line. The tools exist
once, on the server: this process never opens the storage root, and keeps no state but the
protocol revision a handshake agreed on.

HTTP needs what stdio does not carry, and the relay adds it: ``MCP-Protocol-Version`` (the
revision of a 2026-07-28 request's ``_meta``, or the one ``initialize`` agreed on), and for
a 2026-07-28 request ``Mcp-Method`` and ``Mcp-Name``. An answer that is not JSON-RPC (the
server down, a 401, a 429) becomes a JSON-RPC error to the request that caused it. Requests
are relayed concurrently (a slow search does not hold back the next call); answers may
leave in another order, as JSON-RPC allows.

An agent starts this process and waits for its answer to ``initialize`` (seconds, on a busy
machine, if it loads what it need not). So ``project-memory mcp`` comes here without the
CLI's parser (cli.py), and the relay imports only what the answer needs: HTTP/1.1 on the
hooks' keep-alive connection (agents/wire.py), one per relaying thread, rather than httpx,
and plain threads rather than concurrent.futures. A proxy variable in the environment
(``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``) brings httpx back: it honours them, with
``NO_PROXY``. For an https server the certificate is checked as httpx checks it:
``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` when set, else certifi's bundle.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping
from queue import SimpleQueue
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .. import __version__
from ..agents.wire import Connection, Response

if TYPE_CHECKING:
    import httpx

    from ..settings import Settings

META_VERSION = "io.modelcontextprotocol/protocolVersion"
RELAY_ERROR = -32000  # JSON-RPC's "server error" range: the relay could not get an answer
MAX_LINE = 8 * 1024 * 1024
WORKERS = 4
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


class Unreachable(Exception):
    """No HTTP answer (refused, reset, DNS, TLS, a timeout, a broken answer)."""


def proxied(env: Mapping[str, str]) -> bool:
    """Whether a proxy variable is set (in any case), which only httpx honours."""
    return any(value and key.lower() in PROXY_VARIABLES for key, value in env.items())


def certificates(env: Mapping[str, str]) -> str | None:
    """The CA file an https connection checks the server with, as httpx chooses it: None
    (OpenSSL's defaults, which read ``SSL_CERT_FILE`` and ``SSL_CERT_DIR``) when either is
    set, else certifi's bundle."""
    if env.get("SSL_CERT_FILE") or env.get("SSL_CERT_DIR"):
        return None
    import certifi  # httpx's own dependency: always installed with the client

    return str(certifi.where())


class Direct:
    """POSTs to ``url`` on one keep-alive connection per thread, straight to the server."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float) -> None:
        self.url = url
        self.target = urlsplit(url).path or "/"
        self.headers = headers
        self.timeout = timeout
        self.cafile: str | None = None
        if url.startswith("https:"):
            self.cafile = certificates(os.environ)
        self.local = threading.local()
        self.opened: list[Connection] = []
        self.lock = threading.Lock()

    def post(self, body: bytes, headers: dict[str, str]) -> Response:
        connection: Connection | None = getattr(self.local, "connection", None)
        if connection is None:
            connection = self.local.connection = Connection(self.url, cafile=self.cafile)
            with self.lock:
                self.opened.append(connection)
        try:
            return connection.request(
                "POST", self.target, {**self.headers, **headers}, body, self.timeout
            )
        except (OSError, ValueError) as exc:  # refused, reset, DNS, TLS, a broken answer
            raise Unreachable(str(exc) or type(exc).__name__) from None

    def close(self) -> None:
        with self.lock:
            for connection in self.opened:
                connection.close()


class Proxied:
    """POSTs to ``url`` through httpx, which honours the proxy variables."""

    def __init__(
        self,
        url: str,
        settings: Settings,
        headers: dict[str, str],
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url
        self.http = settings.http(headers=headers, transport=transport)

    def post(self, body: bytes, headers: dict[str, str]) -> Response:
        import httpx

        try:
            got = self.http.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise Unreachable(str(exc) or type(exc).__name__) from None
        return Response(got.status_code, got.reason_phrase, dict(got.headers), got.content)

    def close(self) -> None:
        self.http.close()


def _sendable(value: str) -> bool:
    """A header value that goes on the wire as it is: printable ASCII."""
    return value.isascii() and value.isprintable()


class Bridge:
    def __init__(
        self, settings: Settings, out: IO[str], *, transport: httpx.BaseTransport | None = None
    ):
        settings.require()
        self.url = f"{(settings.url or '').rstrip('/')}/mcp"
        headers = {
            **settings.headers(f"project-memory-mcp/{__version__}"),
            "Accept": "application/json",
            "Content-Type": "application/json",
        }
        self.relayed: Direct | Proxied
        if transport is not None or proxied(os.environ):
            self.relayed = Proxied(self.url, settings, headers, transport)
        else:
            self.relayed = Direct(self.url, headers, settings.timeout)
        self.out = out
        self.lock = threading.Lock()
        self.version: str | None = None  # what initialize agreed on

    def close(self) -> None:
        self.relayed.close()

    def emit(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    def headers_for(self, message: Any) -> dict[str, str]:
        if not isinstance(message, dict):
            return {}
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        version = meta.get(META_VERSION) if isinstance(meta, dict) else None
        if isinstance(version, str):
            headers = {"MCP-Protocol-Version": version}
            method = message.get("method")
            if isinstance(method, str):
                headers["Mcp-Method"] = method
                name = params.get("name") if isinstance(params, dict) else None
                if method == "tools/call" and isinstance(name, str):
                    headers["Mcp-Name"] = name
            return headers
        if self.version is not None and message.get("method") != "initialize":
            return {"MCP-Protocol-Version": self.version}
        return {}

    def relay(self, line: str) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            self.emit(
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
            )
            return
        mid = message.get("id") if isinstance(message, dict) else None
        wants_answer = isinstance(message, dict) and "id" in message and "method" in message
        headers = self.headers_for(message)
        unsendable = [k for k, v in headers.items() if not _sendable(v)]
        if unsendable:
            # A line break would end the header and start one the client never wrote.
            if wants_answer:
                self._fail(mid, f"{unsendable[0]} cannot go in an HTTP header: not printable ASCII")
            return
        try:
            response = self.relayed.post(line.encode("utf-8"), headers)
        except Unreachable as exc:
            if wants_answer:
                self._fail(mid, f"cannot reach the project-memory server at {self.url}: {exc}")
            return
        if response.status == 202 or not response.body:
            return
        try:
            answer = json.loads(response.body)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and answer.get("jsonrpc") == "2.0":
            if wants_answer and "error" in answer and answer.get("id") is None:
                # Refused before the server read the id (a message too large): the error is
                # this request's, and a client waits for that id.
                answer = {**answer, "id": mid}
            result = answer.get("result")
            if (
                isinstance(message, dict)
                and message.get("method") == "initialize"
                and isinstance(result, dict)
            ):
                agreed = result.get("protocolVersion")
                self.version = agreed if isinstance(agreed, str) else None
            self.emit(answer)
        elif wants_answer:
            detail = answer.get("detail") if isinstance(answer, dict) else None
            self._fail(
                mid,
                f"the server answered HTTP {response.status}: {detail or response.reason}",
            )

    def refuse_too_large(self, line: str) -> None:
        """Answer a message over MAX_LINE with an error to its id (when it has one)."""
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        mid = message.get("id") if isinstance(message, dict) else None
        if isinstance(message, dict) and "id" not in message:
            return  # a notification: nobody waits for an answer
        text = f"the message is larger than the {MAX_LINE} bytes this relay sends on"
        self.emit({"jsonrpc": "2.0", "id": mid, "error": {"code": -32600, "message": text}})

    def _fail(self, mid: Any, text: str) -> None:
        self.emit({"jsonrpc": "2.0", "id": mid, "error": {"code": RELAY_ERROR, "message": text}})


def serve(settings: Settings, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> int:
    """Relay until stdin ends; the exit status."""
    source = stdin or sys.stdin
    bridge = Bridge(settings, stdout or sys.stdout)
    # Lines wait here for the first free worker; None tells a worker that stdin has ended.
    lines: SimpleQueue[str | None] = SimpleQueue()
    workers = [
        threading.Thread(target=_work, args=(bridge, lines), name=f"relay-{n}", daemon=True)
        for n in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    try:
        for line in iter(source.readline, ""):
            line = line.strip()
            if not line:
                continue
            if len(line) > MAX_LINE:
                bridge.refuse_too_large(line)
                continue
            lines.put(line)
    except KeyboardInterrupt:
        pass
    for _ in workers:
        lines.put(None)
    for worker in workers:  # every request read is answered before the process ends
        worker.join()
    bridge.close()
    return 0


def _work(bridge: Bridge, lines: SimpleQueue[str | None]) -> None:
    while (line := lines.get()) is not None:
        try:
            bridge.relay(line)
        except Exception as exc:  # noqa: BLE001 - one message's failure ends no other
            sys.stderr.write(f"project-memory mcp: {type(exc).__name__}: {exc}\n")


def main() -> int:
    """``project-memory mcp`` as the agents run it (no options): the settings from the
    environment and the config file; what is wrong with them goes to stderr as the CLI
    says it (exit status 2)."""
    from ..errors import SettingsError
    from ..settings import load_settings

    try:
        settings = load_settings().require()
    except SettingsError as exc:
        from ..terminal import show

        show(sys.stderr, f"project-memory: {exc}\n")
        return 2
    try:
        return serve(settings)
    except KeyboardInterrupt:
        return 130
