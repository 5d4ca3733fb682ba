"""The gunicorn worker `gunicorn.conf.py` selects: slow clients are bounded, errors are JSON.

gunicorn's gthread worker hands a connection to a pool thread, which then blocks reading the
request's head and body: N clients trickling bytes hold N threads, and a few dozen of them make
``/healthz`` time out. ``EdgeWorker`` keeps gthread and changes four things:

* a request head is read in the worker's event loop (non-blocking), and must be complete within
  ``MEMORY_HEADER_TIMEOUT`` seconds (else 408); a connection reaches the thread pool only with a
  complete head, which is handed back to gunicorn's own parser;
* in the pool every read of the body is bounded: no wait longer than ``MEMORY_BODY_TIMEOUT``, and
  after that much slack at least ``MEMORY_BODY_MIN_RATE`` bytes/s; a slower client gets 408;
* the answers gunicorn writes itself (400, 408, 414, 431, 500, ...) have the JSON body of the API
  the request path names (``app.web.errors.error_body``) instead of an HTML page;
* closing a connection lingers in the event loop: gunicorn's graceful close blocks it, up to 2 s
  per connection whose client keeps it open.

TLS, HTTP/2, PROXY-protocol and uWSGI connections skip the head reader and are served exactly
as gthread serves them; put a reverse proxy in front for those (docs/deploy.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import selectors
import signal
import socket
import ssl
import time
from functools import partial
from typing import Any

from gunicorn import util
from gunicorn.http.errors import LimitRequestHeaders
from gunicorn.http.message import MAX_REQUEST_LINE
from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import STOP_KEEPALIVE_LINGER, TConn, ThreadWorker
from ulid import ULID

from app.web.body import (
    BodyPace,
    Limits,
    close_after_answer,
    worker_request,
)
from app.web.errors import error_body

HEAD_END = b"\r\n\r\n"
#: Largest request head read in the event loop; each connection holds its own until complete.
MAX_HEAD_BYTES = 64 * 1024
#: How much of a head is kept to tell, when gunicorn refuses the request, which API it was for.
HEAD_PREFIX_BYTES = 256
RECV_BYTES = 64 * 1024
#: A closed connection's remaining request bytes are drained this long, or this much, at most
#: (the bounds gunicorn's own graceful close uses).
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 64 * 1024

_HAND_OFF = object()


_PR_SET_PDEATHSIG = 1


def die_with(master: int) -> None:
    """Have the kernel SIGKILL this worker the moment its master dies.

    A worker that outlives its master (killed by SIGKILL or the OOM killer) would go on
    answering on the inherited socket until gunicorn's own check notices (seconds, and a
    kept-alive connection longer), and would hold the listening socket and the root lock
    (tree/recovery.py) the next server needs: that one could then neither bind nor start.
    Dying with it is what a crash of the whole server does, which the journals repair. A
    clean stop never triggers it: the master waits for its workers before it exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: gunicorn's own check remains
        return
    if os.getppid() != master:  # it died before the prctl: no signal will come
        os._exit(1)


def _too_large() -> LimitRequestHeaders:
    return LimitRequestHeaders(f"request head over {MAX_HEAD_BYTES} bytes")


class EdgeConn(TConn):  # type: ignore[misc]  # gunicorn is untyped
    """A gthread connection that also carries its partly read head and its body pace."""

    def __init__(self, worker: EdgeWorker, *args: Any) -> None:
        super().__init__(*args)
        self.worker = worker
        self.head: bytearray | None = None
        self.head_deadline = 0.0
        self.head_prefix = b""
        self.pace: BodyPace | None = None

    def close(self, graceful: bool = False) -> None:
        # Called from the event loop (gthread's finish_request), which must not block.
        if graceful and not isinstance(self.sock, ssl.SSLSocket):
            self.worker.linger(self.sock)
        else:
            super().close(graceful)


class _Captured:
    """A stand-in socket that keeps the answer gunicorn's ``handle_error`` writes."""

    def __init__(self) -> None:
        self.data = b""

    def gettimeout(self) -> float:
        return 0.0

    def sendall(self, data: bytes) -> None:
        self.data += data

    def status(self) -> tuple[int, str]:
        parts = self.data.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        if len(parts) == 3 and parts[1].isascii() and parts[1].isdigit():
            return int(parts[1]), parts[2]
        return 500, "Internal Server Error"


def target_path(head: bytes) -> str | None:
    """Return the path of the request line at the start of ``head`` (maybe cut short), or None."""
    if head.startswith(b"\r\n"):
        head = head[2:]
    parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(parts) < 2:
        return None
    return parts[1].split(b"?", 1)[0].decode("latin-1")


def error_response(status: int, reason: str, message: str, path: str | None) -> bytes:
    """Build a whole HTTP/1.1 error answer with the JSON body of the API ``path`` names."""
    correlation = str(ULID())
    body = json.dumps(
        error_body(status, message, path=path, correlation_id=correlation),
        separators=(",", ":"),
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"x-correlation-id: {correlation}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class EdgeWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn is untyped
    """gthread with request heads read in the event loop, paced bodies and JSON errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = Limits.from_config(None)
        # Insertion order is deadline order: every deadline is now + a constant.
        self.reading: dict[EdgeConn, None] = {}
        self.lingering: dict[socket.socket, list[float]] = {}
        self.stopping_since: float | None = None
        cfg = self.cfg
        self.reads_heads = not (
            cfg.is_ssl
            or getattr(cfg, "protocol", "http") != "http"
            or cfg.proxy_protocol not in ("off", False)
        )
        limit = cfg.limit_request_line
        # The request-line limit as gunicorn's parser applies it (0: none).
        self.line_limit = MAX_REQUEST_LINE if limit < 0 or limit > MAX_REQUEST_LINE else limit

    def init_process(self) -> None:
        die_with(self.ppid)
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.limits = Limits.from_config(getattr(self.wsgi, "config", None))

    # -- the event loop (main thread) ----------------------------------------------------------
    def accept(self, listener: socket.socket) -> None:
        try:
            sock, client = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        self.enqueue_req(EdgeConn(self, self.cfg, sock, client, listener.getsockname()))

    def enqueue_req(self, conn: TConn) -> None:
        """Read ``conn``'s next request head in the event loop; hand it on once complete."""
        if (
            not isinstance(conn, EdgeConn)
            or not self.reads_heads
            or conn.is_http2
            or negotiation.prior_knowledge_allowed(self.cfg, conn.client)
        ):
            super().enqueue_req(conn)
            return
        # Bytes of a pipelined request already read with the previous one's body.
        held = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        conn.head = bytearray(held)
        conn.head_deadline = time.monotonic() + self.limits.header_timeout
        if held and self._advance(conn, 0, reading=False):
            return
        conn.sock.setblocking(False)
        self.reading[conn] = None
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_head_readable, conn))

    def _on_head_readable(self, conn: EdgeConn, _sock: socket.socket) -> None:
        assert conn.head is not None
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away before finishing its head
            self._stop_reading(conn)
            self.nr_conns -= 1
            util.close(conn.sock)
            return
        searched = max(0, len(conn.head) - len(HEAD_END) + 1)
        conn.head += data
        self._advance(conn, searched, reading=True)

    def _advance(self, conn: EdgeConn, searched: int, *, reading: bool) -> bool:
        """Hand ``conn`` on, or refuse it, if its head so far allows; True when done with it."""
        assert conn.head is not None
        verdict = self._judge(conn.head, searched)
        if verdict is None:
            return False
        if reading:
            self._stop_reading(conn)
        if not isinstance(verdict, LimitRequestHeaders):
            self._hand_off(conn)
        else:
            worker_request.head = bytes(conn.head[:HEAD_PREFIX_BYTES])
            try:
                self.handle_error(None, conn.sock, conn.client, verdict)
            finally:
                worker_request.head = b""
            self.nr_conns -= 1
            self.linger(conn.sock)
        return True

    def _judge(self, head: bytearray, searched: int) -> object:
        """Judge ``head``: None to read on, _HAND_OFF to hand it on, or the error to refuse it with.

        A head gunicorn's parser refuses from the bytes it has (a bare LF, an over-long request
        line) is handed on too, so the refusal is gunicorn's own.
        """
        end = head.find(HEAD_END, searched)
        if end >= 0:
            return _HAND_OFF if end + len(HEAD_END) <= MAX_HEAD_BYTES else _too_large()
        if head.count(b"\n") != head.count(b"\r\n"):
            return _HAND_OFF
        if self.line_limit:
            start = 2 if head.startswith(b"\r\n") else 0
            line_end = head.find(b"\r\n", start)
            length = line_end - start if line_end >= 0 else len(head) - start - 2
            if length > self.line_limit:
                return _HAND_OFF
        return _too_large() if len(head) > MAX_HEAD_BYTES else None

    def _hand_off(self, conn: EdgeConn) -> None:
        assert conn.head is not None
        head, conn.head = bytes(conn.head), None
        conn.head_prefix = head[:HEAD_PREFIX_BYTES]
        conn.init()  # plain HTTP/1: makes the parser, no I/O
        if conn.pace is None:
            # A body cut off for its pace is never read to its end: the answer says
            # "Connection: close".
            conn.pace = BodyPace(
                conn.sock,
                self.limits.body_timeout,
                self.limits.body_min_rate,
                on_cut_off=close_after_answer,
            )
            conn.parser.unreader.sock = conn.pace
        conn.parser.unreader.unread(head)
        super().enqueue_req(conn)

    def _stop_reading(self, conn: EdgeConn) -> None:
        del self.reading[conn]
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)

    def murder_pending(self) -> None:
        """Time out pending connections, unfinished heads and lingering closes (every loop turn)."""
        super().murder_pending()
        self._expire_heads()
        self._expire_lingering()

    def _expire_heads(self) -> None:
        now = time.monotonic()
        if self.alive:
            expired = []
            for conn in self.reading:
                if conn.head_deadline > now:
                    break
                expired.append(conn)
        else:
            # Stopping: a connection that sent nothing gets what a kept-alive one gets.
            if self.stopping_since is None:
                self.stopping_since = now
            idle_until = self.stopping_since + STOP_KEEPALIVE_LINGER
            expired = [
                conn
                for conn in self.reading
                if conn.head_deadline <= now or (not conn.head and idle_until <= now)
            ]
        for conn in expired:
            self._stop_reading(conn)
            self.nr_conns -= 1
            if not conn.head:  # an idle connection is closed, as a kept-alive one is
                util.close(conn.sock)
                continue
            timeout = self.limits.header_timeout
            self.log.warning(
                "Request head not complete within %gs from ip=%s", timeout, conn.client[0]
            )
            answer = error_response(
                408,
                "Request Timeout",
                f"request headers not received within {timeout:g} s",
                target_path(bytes(conn.head[:HEAD_PREFIX_BYTES])),
            )
            with contextlib.suppress(OSError):
                conn.sock.send(answer)
            self.linger(conn.sock)

    def linger(self, sock: socket.socket) -> None:
        """Close ``sock`` after the client has read the answer: half-close, drain, then close.

        Closing with request bytes still unread makes the kernel send a reset, which can destroy
        the answer before the client reads it. Event loop only.
        """
        if len(self.lingering) >= self.worker_connections:
            util.close(sock)
            return
        try:
            sock.setblocking(False)
            sock.shutdown(socket.SHUT_WR)
            self.poller.register(sock, selectors.EVENT_READ, self._on_linger_readable)
        except (OSError, ValueError, KeyError):
            util.close(sock)
            return
        self.lingering[sock] = [time.monotonic() + LINGER_SECONDS, 0]

    def _on_linger_readable(self, sock: socket.socket) -> None:
        entry = self.lingering.get(sock)
        if entry is None:
            return
        while True:
            try:
                data = sock.recv(RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            entry[1] += len(data)
            if not data or entry[1] >= LINGER_MAX_BYTES:
                self._end_linger(sock)
                return

    def _expire_lingering(self) -> None:
        now = time.monotonic()
        expired = []
        for sock, (deadline, _) in self.lingering.items():
            if deadline > now:
                break
            expired.append(sock)
        for sock in expired:
            self._end_linger(sock)

    def _end_linger(self, sock: socket.socket) -> None:
        del self.lingering[sock]
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(sock)
        util.close(sock)

    # -- the thread pool ---------------------------------------------------------------------
    def handle(self, conn: TConn) -> Any:
        pace = getattr(conn, "pace", None)
        if pace is not None:
            pace.start()
        worker_request.pace = pace
        worker_request.head = getattr(conn, "head_prefix", b"")
        try:
            return super().handle(conn)
        finally:
            worker_request.pace = None
            worker_request.head = b""

    def handle_request(self, req: Any, conn: TConn) -> Any:
        worker_request.req = req
        pace = getattr(conn, "pace", None)
        if pace is not None and getattr(req, "_expected_100_continue", False):
            # gunicorn answers "100 Continue" as soon as it has the head, before the app has
            # looked at the credential or the length, so a client sends its body only to be
            # refused. It goes out when the app first reads the body instead; a request
            # refused before that gets its final status alone (RFC 9110 10.1.1).
            req._expected_100_continue = False
            pace.continue_owed = True
        try:
            return super().handle_request(req, conn)
        finally:
            worker_request.req = None

    # -- both --------------------------------------------------------------------------------
    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """Log and pick the status as gunicorn does; answer with the API's JSON error body."""
        captured = _Captured()
        super().handle_error(req, captured, addr, exc)
        status, reason = captured.status()
        # A server fault's text stays in the log; a client's mistake is named to the client.
        message = reason if status >= 500 else f"{reason}: {exc}"[:300]
        req = req if req is not None else getattr(exc, "req", None)
        path = getattr(req, "path", None) or target_path(getattr(worker_request, "head", b""))
        try:
            util.write_nonblock(client, error_response(status, reason, message, path))
        except Exception:  # noqa: BLE001 - the client may be gone; nothing left to tell it
            self.log.debug("Failed to send error message.")
