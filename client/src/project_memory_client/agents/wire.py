"""The hooks' HTTP: HTTP/1.1 on a socket, and the few calls a hook makes.

A hook is a new process each time the agent calls it, often on a busy machine, inside the
agent's 10 s: what it imports is time it spends before its first request. httpx (and the
full client) cost about a third of a second of CPU; ``http.client`` pulls in the email
package, and ``socket`` builds its enums at import. So the hooks speak HTTP/1.1 themselves
on ``_socket``: one connection to the server, reused for each request (Content-Length
bodies, chunked or Content-Length answers), ``socket`` and ``ssl`` only for an https URL.
Requests go to the server directly: the proxy variables are not read.

:class:`HookClient` has the methods of :class:`~project_memory_client.Client` that the spool
(agents/spool.py) and the hooks call, with the same errors (project_memory_client.errors);
a task's index comes back as the few fields the spool reads (the models' dataclasses cost
start-up time too). ``agent flush`` and the other commands use the full client.
"""

from __future__ import annotations

import _socket
import json
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

from .. import __version__
from ..errors import ApiError, InvalidArgument, ServerUnreachable, api_error, turn_form_unknown
from ..settings import API_PREFIX, Settings

MAX_HEAD_BYTES = 64 * 1024  # a status line and headers
MAX_BODY_BYTES = 64 * 1024 * 1024
CHUNK = 64 * 1024
CORRELATION_HEADER = "x-correlation-id"


class Response:
    def __init__(self, status: int, reason: str, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers  # names in lower case
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class _Reader:
    """Bytes of a socket, read as a status line, headers and a body."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.buffer = b""

    def _more(self) -> bytes:
        data: bytes = self.sock.recv(CHUNK)
        if not data:
            raise ConnectionError("the server closed the connection")
        return data

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise ConnectionError("an answer's head is too long")
            self.buffer += self._more()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def exactly(self, n: int) -> bytes:
        if n > MAX_BODY_BYTES:
            raise ConnectionError("an answer's body is too large")
        while len(self.buffer) < n:
            self.buffer += self._more()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def rest(self) -> bytes:
        parts = [self.buffer]
        size = len(self.buffer)
        self.buffer = b""
        while size <= MAX_BODY_BYTES:
            data: bytes = self.sock.recv(CHUNK)
            if not data:
                return b"".join(parts)
            parts.append(data)
            size += len(data)
        raise ConnectionError("an answer's body is too large")


class Connection:
    """One keep-alive connection to ``url`` (http or https), opened on first use; an https
    server's certificate is checked against ``cafile`` (None: OpenSSL's default store)."""

    def __init__(self, url: str, *, cafile: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(f"not an http(s) URL: {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        default = parts.port is None
        name = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = name if default else f"{name}:{self.port}"
        self.cafile = cafile
        self.sock: Any = None  # a _socket.socket (an ssl.SSLSocket for https)
        self.reader: _Reader | None = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = self.reader = None

    def _open(self, timeout: float) -> tuple[Any, _Reader]:
        sock = _connect(self.host, self.port, timeout)
        if self.tls:
            import socket  # only for an https server: they cost start-up time
            import ssl

            plain = socket.socket(fileno=sock.detach())
            context = ssl.create_default_context(cafile=self.cafile)
            sock = context.wrap_socket(plain, server_hostname=self.host)
        self.sock, self.reader = sock, _Reader(sock)
        return sock, self.reader

    def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float,
    ) -> Response:
        """Send one request and read its whole answer, within ``timeout`` seconds for each
        wait. A connection the server closed while it was idle is opened again once: the
        request never reached it."""
        reused = self.sock is not None
        try:
            return self._exchange(method, target, headers, body, timeout)
        except _Unanswered:
            self.close()
            if not reused:
                raise ConnectionError("the server closed the connection") from None
            return self._exchange(method, target, headers, body, timeout)
        except BaseException:
            self.close()
            raise

    def _exchange(
        self, method: str, target: str, headers: dict[str, str], body: bytes | None, timeout: float
    ) -> Response:
        if self.sock is None or self.reader is None:
            sock, reader = self._open(timeout)
        else:
            sock, reader = self.sock, self.reader
            sock.settimeout(timeout)
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host_header}"]
        for name, value in headers.items():
            if "\r" in name + value or "\n" in name + value:
                # A line break would end this header and start another the caller never
                # wrote.
                raise ValueError(f"the {name} header cannot hold a line break")
            lines.append(f"{name}: {value}")
        if body is not None or method in ("PUT", "POST"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            sock.sendall(head + (body or b"") if len(body or b"") < CHUNK else head)
            if body is not None and len(body) >= CHUNK:
                sock.sendall(body)
            status_line = reader.line()
        except (BrokenPipeError, ConnectionResetError, ConnectionError):
            if not reader.buffer:
                raise _Unanswered() from None
            raise
        version, _, rest = status_line.decode("latin-1").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ConnectionError(f"not an HTTP answer: {status_line[:80]!r}")
        found: dict[str, str] = {}
        while True:
            line = reader.line()
            if not line:
                break
            name, _, value = line.decode("latin-1").partition(":")
            found[name.strip().lower()] = value.strip()
        status = int(code)
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            data = b""
        elif "chunked" in found.get("transfer-encoding", "").lower():
            data = self._chunked(reader)
        elif "content-length" in found:
            data = reader.exactly(int(found["content-length"]))
        else:
            data = reader.rest()
            found["connection"] = "close"
        if found.get("connection", "").lower() == "close" or version == "HTTP/1.0":
            self.close()
        return Response(status, reason, found, data)

    @staticmethod
    def _chunked(reader: _Reader) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            length = int(reader.line().split(b";", 1)[0].strip() or b"0", 16)
            if length == 0:
                while reader.line():  # trailers
                    pass
                return b"".join(parts)
            size += length
            if size > MAX_BODY_BYTES:
                raise ConnectionError("an answer's body is too large")
            parts.append(reader.exactly(length))
            reader.exactly(2)


class TurnEntry:
    """A turn as a task's index lists it: what the spool reads of it."""

    __slots__ = ("turn", "meta", "artifacts")

    def __init__(self, data: dict[str, Any]) -> None:
        self.turn = int(data["turn"])
        self.meta = dict(data.get("meta") or {})
        self.artifacts = tuple(str(a) for a in data.get("artifacts") or [])


class TaskEntries:
    """A task's index: its turns and its latest turn's number."""

    __slots__ = ("task_id", "turns", "latest_turn")

    def __init__(self, data: dict[str, Any]) -> None:
        self.task_id = str(data.get("task_id") or "")
        self.turns = [TurnEntry(t) for t in data.get("turns") or []]
        latest = data.get("latest_turn")
        self.latest_turn = latest if isinstance(latest, int) else None


def _connect(host: str, port: int, timeout: float) -> Any:
    """A TCP connection to ``host``, each of its addresses tried in turn (what
    ``socket.create_connection`` does)."""
    # An ASCII name as bytes: a str would load the idna codec (and unicodedata) first.
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    error: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        return sock
    raise error or OSError(f"no address for {host}")


class _Unanswered(Exception):
    """The connection was closed before any byte of an answer came."""


def segment(value: object) -> str:
    """One path segment, percent-encoded; what would change the path is refused (as the
    full client does)."""
    text = str(value)
    if text in ("", ".", "..") or "/" in text:
        raise InvalidArgument(f"{text!r} cannot be a task id, turn or artifact name")
    return quote(text, safe="")


class HookClient:
    """What a hook asks of the server, over one :class:`Connection`. Every request waits at
    most until ``deadline`` (``time.monotonic()``) and is never retried: what is not sent
    stays in the spool for the next hook."""

    def __init__(self, settings: Settings, *, deadline: float) -> None:
        assert settings.url is not None and settings.token is not None
        self.settings = settings
        self.url = settings.url
        self.deadline = deadline
        self.connection = Connection(settings.url)
        # The headers of Settings.http(), on the hooks' own connection (no httpx: see above).
        self.headers = settings.headers(f"project-memory-client/{__version__} (hook)")
        self.headers["Accept"] = "application/json"

    def close(self) -> None:
        self.connection.close()

    def send(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        ok: Sequence[int] = (200,),
    ) -> Response:
        target = API_PREFIX + path
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ServerUnreachable(f"{method} {self.url}{target}: the hook's time is up")
        try:
            response = self.connection.request(
                method, target, {**self.headers, **(headers or {})}, body, max(0.05, left)
            )
        except TimeoutError:
            raise ServerUnreachable(
                f"{method} {self.url}{target}: no answer within the hook's time"
            ) from None
        except (OSError, ValueError) as exc:  # refused, reset, DNS, TLS, a broken answer
            raise ServerUnreachable(f"{method} {self.url}{target}: {exc}") from None
        if response.status not in ok:
            raise self._error(response, method, path)
        return response

    @staticmethod
    def _error(response: Response, method: str, path: str) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = None
        detail: Any
        if isinstance(body, dict) and "detail" in body:
            detail = body["detail"]
        else:
            detail = response.reason or f"HTTP {response.status}"
        return api_error(
            response.status,
            detail,
            correlation_id=response.headers.get(CORRELATION_HEADER),
            method=method,
            path=path,
        )

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.send(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise ServerUnreachable(f"{method} {path}: the answer is not JSON") from None

    # -- the calls ----------------------------------------------------------------------
    def get_task(self, task_id: str) -> TaskEntries:
        found = self._json("GET", f"/tasks/{segment(task_id)}")
        if not isinstance(found, dict):
            raise ServerUnreachable(f"GET /tasks/{task_id}: the answer is not a task")
        return TaskEntries(found)

    def get_context(self, task_id: str, *, max_bytes: int, turns: int) -> dict[str, Any]:
        query = f"?task_id={quote(task_id, safe='')}&max_bytes={max_bytes}&turns={turns}"
        found = self._json("GET", f"/context{query}")
        if not isinstance(found, dict) or not isinstance(found.get("context"), str):
            raise ServerUnreachable("GET /context: the answer is not a context")
        return found

    def recall(self, prompt: str, *, task_id: str, max_chars: int) -> dict[str, Any]:
        """What the project's memory holds about ``prompt`` (POST /recall: the prompt in the
        body, never in a URL)."""
        body = json.dumps({"prompt": prompt, "task_id": task_id, "max_chars": max_chars})
        found = self._json(
            "POST",
            "/recall",
            body=body.encode("utf-8"),
            headers={"Content-Type": "application/json"},
        )
        if not isinstance(found, dict) or not isinstance(found.get("context"), str):
            raise ServerUnreachable("POST /recall: the answer is not a recall")
        return found

    def put_turn(
        self,
        task_id: str,
        turn: int,
        *,
        meta: dict[str, Any] | None = None,
        summary_md: str = "",
        if_none_match: str | None = None,
        artifacts: Iterable[Any] = (),
    ) -> None:
        """Write one turn with its artifacts in one request (a multipart PUT, beyond the
        seed); a server that takes a turn only as JSON gets the turn, then each artifact."""
        path = f"/tasks/{segment(task_id)}/turns/{segment(turn)}"
        turn_json = json.dumps({"meta": meta or {}, "summary_md": summary_md}).encode("utf-8")
        headers = {"If-None-Match": if_none_match} if if_none_match else {}
        uploads = [(u.name, u.content_type, _bytes_of(u.source)) for u in artifacts]
        if not uploads:
            headers["Content-Type"] = "application/json"
            self.send("PUT", path, body=turn_json, headers=headers)
            return
        boundary = os.urandom(16).hex()
        body = _form(boundary, turn_json, uploads)
        headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        try:
            self.send("PUT", path, body=body, headers=headers)
        except ApiError as exc:
            if not turn_form_unknown(exc):
                raise
            headers["Content-Type"] = "application/json"
            self.send("PUT", path, body=turn_json, headers=headers)
            for name, kind, data in uploads:
                self.put_artifact(task_id, turn, name, data, content_type=kind)

    def put_artifact(
        self,
        task_id: str,
        turn: int,
        name: str,
        source: Any,
        *,
        content_type: str | None = None,
    ) -> None:
        path = f"/tasks/{segment(task_id)}/turns/{segment(turn)}/artifacts/{segment(name)}"
        kind = content_type or "application/octet-stream"
        self.send("PUT", path, body=_bytes_of(source), headers={"Content-Type": kind})


def _bytes_of(source: Any) -> bytes:
    """An artifact the spool holds: its file (a path) or its bytes."""
    if isinstance(source, bytes | bytearray):
        return bytes(source)
    with open(source, "rb") as fh:
        return fh.read()


def _form(boundary: str, turn: bytes, uploads: list[tuple[str, str | None, bytes]]) -> bytes:
    """The turn and its artifacts as one multipart/form-data body, as the full client sends
    it: the turn's JSON first, then one part per artifact named by its filename."""
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="turn"\r\n'
        "Content-Type: application/json\r\n\r\n".encode("ascii"),
        turn,
        b"\r\n",
    ]
    for name, kind, data in uploads:
        for what, value in (("name", name), ("type", kind or "")):
            # What would end or bend the part's header is refused, as the full client does.
            if not value.isascii() or any(c in value for c in '"\\\r\n'):
                raise InvalidArgument(f"{value!r} cannot be an artifact's {what} in a form")
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="artifact";'
            f' filename="{name}"\r\nContent-Type: {kind or "application/octet-stream"}'
            "\r\n\r\n".encode("ascii")
        )
        parts += [data, b"\r\n"]
    parts.append(f"--{boundary}--\r\n".encode("ascii"))
    return b"".join(parts)
