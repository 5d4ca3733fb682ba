"""The gunicorn worker `gunicorn.conf.py` selects: slow clients are bounded, errors are JSON.

gunicorn's gthread worker hands a connection to a pool thread, which then blocks reading the
request's head and body: N clients trickling bytes hold N threads, and a few dozen of them make
``/healthz`` time out. ``EdgeWorker`` keeps gthread and changes these things:

* a request head is read in the worker's event loop (non-blocking), and must be complete within
  ``MEMORY_HEADER_TIMEOUT`` seconds (else 408); so is a body of up to ``READ_AHEAD_BYTES``
  (64 KiB, with Content-Length or chunked, unless its client waits for "100 Continue"), under
  the floor below. A connection reaches the thread pool only with a complete head, and its
  whole body when that is small, handed back to gunicorn's own parser: a slow client of a small
  body holds no thread;
* a larger body is read by the thread, and by the app only once it knows the sender
  (app/web/body.py); every read there is bounded: no wait longer than ``MEMORY_BODY_TIMEOUT``,
  and after that much slack at least ``MEMORY_BODY_MIN_RATE`` bytes/s; a slower client gets 408.
  At most half the threads serve such requests at once; the next ones wait in the event loop
  for one of them to finish, holding no thread (503 after ``MEMORY_BODY_TIMEOUT``);
* the answers gunicorn writes itself (400, 408, 414, 431, 500, ...) have the JSON body of the API
  the request path names (``app.web.errors.error_body``) instead of an HTML page;
* closing a connection lingers in the event loop: gunicorn's graceful close blocks it, up to 2 s
  per connection whose client keeps it open.

TLS, HTTP/2, PROXY-protocol and uWSGI connections skip the head reader and are served exactly
as gthread serves them; put a reverse proxy in front for those (docs/deploy.md).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import json
import os
import re
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
    PENDING_CONTINUE,
    PENDING_LARGE,
    READ_AHEAD_BYTES,
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
#: Bodies read in the event loop are checked against their floor this often (seconds).
BODY_CHECK_SECONDS = 0.25

_HAND_OFF = object()
_HEX = re.compile(rb"[0-9A-Fa-f]+")


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


def body_framing(head: bytes) -> tuple[int | None, bool] | None:
    """How the body of the request with this complete ``head`` ends: ``(length, continue)``.

    ``length`` is the Content-Length, or None for a chunked body; ``continue``: the client waits
    for "100 Continue" before it sends the body. None when there is no body. ValueError when the
    framing is not one this reads ahead: gunicorn's parser refuses most such heads (400, 417)
    before any body is read, and whatever it reads of the others is treated as a large body.
    """
    if head.count(b"\n") != head.count(b"\r\n"):
        raise ValueError("bare LF")
    lines = head.removeprefix(b"\r\n").split(b"\r\n")
    version = lines[0].rpartition(b" ")[2]
    lengths: list[bytes] = []
    codings: list[bytes] = []
    expect: bytes | None = None
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon:
            raise ValueError("a header line without a colon")
        name, value = name.lower(), value.strip(b" \t")
        if name == b"content-length":
            lengths.append(value)
        elif name == b"transfer-encoding":
            codings += [coding.strip(b" \t").lower() for coding in value.split(b",")]
        elif name == b"expect":
            expect = value.lower()
    if expect is not None and expect != b"100-continue":
        raise ValueError("an expectation gunicorn refuses")
    continues = expect is not None and version == b"HTTP/1.1"  # HTTP/1.0 ignores it
    if codings:
        if lengths or version != b"HTTP/1.1" or codings[-1] != b"chunked":
            raise ValueError("a transfer coding gunicorn refuses")
        return None, continues
    if not lengths:
        return None
    if len(lengths) != 1 or not lengths[0].isdigit():
        raise ValueError("a Content-Length gunicorn refuses")
    length = int(lengths[0])
    return (length, continues) if length else None


class ChunkScan:
    """Where a chunked body ends (RFC 9112 7.1), found as its bytes arrive.

    Each byte is looked at about once however the client splits its sends: the scan resumes
    where it stopped.
    """

    def __init__(self, start: int) -> None:
        self.pos = start  # the first byte not yet understood
        self.searched = start  # no line ends before this
        self.left = 0  # bytes of chunk data, and its CRLF, still to come
        self.trailers = False

    def ended(self, data: bytearray) -> bool | None:
        """True when the body ends within ``data``, False to read on, None when malformed."""
        while True:
            if self.left:
                took = min(self.left, len(data) - self.pos)
                self.pos += took
                self.left -= took
                if self.left:
                    return False
                if data[self.pos - 2 : self.pos] != b"\r\n":
                    return None
                self.searched = self.pos
            end = data.find(b"\r\n", max(self.pos, self.searched - 1))
            if end < 0:
                self.searched = len(data)
                return False
            line = bytes(data[self.pos : end])
            self.pos = self.searched = end + 2
            if self.trailers:
                if not line:
                    return True
                continue
            size = line.split(b";", 1)[0].strip(b" \t")
            if not _HEX.fullmatch(size):
                return None
            self.left = int(size, 16) + 2
            if self.left == 2:  # the last chunk: trailer lines follow, then an empty line
                self.left, self.trailers = 0, True


class ReadAhead:
    """A request body read in the event loop, before a thread serves the request."""

    def __init__(self, start: int, length: int | None) -> None:
        self.start = start  # where the body begins among the connection's bytes
        self.length = length  # None: chunked
        self.chunks = ChunkScan(start) if length is None else None

    def ended(self, data: bytearray) -> bool | None:
        """True once the whole body is in ``data``, False to read on, None to stop reading it
        here: it is over READ_AHEAD_BYTES, or malformed (gunicorn's parser refuses it)."""
        if self.chunks is None:
            assert self.length is not None
            return len(data) - self.start >= self.length
        ended = self.chunks.ended(data)
        if ended is False and len(data) - self.start > READ_AHEAD_BYTES:
            return None
        return ended


class EdgeConn(TConn):  # type: ignore[misc]  # gunicorn is untyped
    """A gthread connection that also carries its partly read request and its body pace."""

    def __init__(self, worker: EdgeWorker, *args: Any) -> None:
        super().__init__(*args)
        self.worker = worker
        # The request's bytes read in the event loop: its head, then a small body.
        self.head: bytearray | None = None
        self.head_deadline = 0.0
        self.head_prefix = b""
        self.pace: BodyPace | None = None
        self.body: ReadAhead | None = None  # the body being read in the event loop
        self.last_bytes = 0.0  # when the body's last bytes came
        self.body_pending = ""  # why some of the body is left for the thread (app/web/body.py)
        self.holds_slot = False  # one of the threads that may wait on a client's body

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


def error_response(
    status: int, reason: str, message: str, path: str | None, *, extra: str = ""
) -> bytes:
    """Build a whole HTTP/1.1 error answer with the JSON body of the API ``path`` names
    (``extra``: more header lines, each ending in CRLF)."""
    correlation = str(ULID())
    body = json.dumps(
        error_body(status, message, path=path, correlation_id=correlation),
        separators=(",", ":"),
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"x-correlation-id: {correlation}\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + body


class EdgeWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn is untyped
    """gthread with request heads and small bodies read in the event loop, paced bodies and
    JSON errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = Limits.from_config(None)
        # Heads being read. Insertion order is deadline order: every deadline is now + a constant.
        self.reading: dict[EdgeConn, None] = {}
        # Small bodies being read, each against its own floor.
        self.bodies: dict[EdgeConn, None] = {}
        self.bodies_checked = 0.0
        # Threads that may serve a request whose body is still coming from its client: at
        # most half of them, so that the others always serve requests that arrived whole
        # (health checks, reads, small writes), whoever trickles large bodies.
        self.body_slots = max(1, self.cfg.threads // 2)
        # Connections waiting for one of those, with their deadlines (deadline order).
        self.waiting: collections.deque[tuple[EdgeConn, float]] = collections.deque()
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
        """Read ``conn``'s next request head (and small body) in the event loop; hand it on once
        complete."""
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
        conn.body, conn.body_pending = None, ""
        conn.sock.setblocking(False)
        self.reading[conn] = None
        if held and self._advance(conn, 0):
            return
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))

    def _on_readable(self, conn: EdgeConn, _sock: socket.socket) -> None:
        assert conn.head is not None
        size = RECV_BYTES
        if conn.body is not None and conn.body.length is not None:
            # No further than the body: what follows it is the next request's, read with it.
            size = max(1, conn.body.start + conn.body.length - len(conn.head))
        try:
            data = conn.sock.recv(size)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data and conn.body is not None:
            # The body ends early: the app answers that as it answers a body cut short in a
            # thread (400), from what was read, and the thread meets the end at once.
            self._stop_reading(conn)
            self._hand_off(conn)
            return
        if not data:  # the client went away before finishing its head
            self._stop_reading(conn)
            self.nr_conns -= 1
            util.close(conn.sock)
            return
        searched = max(0, len(conn.head) - len(HEAD_END) + 1)
        conn.head += data
        if conn.body is not None:
            assert conn.pace is not None
            conn.pace.received += len(data)
            conn.last_bytes = time.monotonic()
        self._advance(conn, searched)

    def _advance(self, conn: EdgeConn, searched: int) -> bool:
        """Hand ``conn`` on, or refuse it, if its bytes so far allow; True when done with it."""
        assert conn.head is not None
        if conn.body is None:
            verdict = self._judge(conn.head, searched)
            if verdict is None:
                return False
            if isinstance(verdict, LimitRequestHeaders):
                self._stop_reading(conn)
                worker_request.head = bytes(conn.head[:HEAD_PREFIX_BYTES])
                try:
                    self.handle_error(None, conn.sock, conn.client, verdict)
                finally:
                    worker_request.head = b""
                self.nr_conns -= 1
                self.linger(conn.sock)
                return True
            if not isinstance(verdict, int) or not self._read_body_ahead(conn, verdict):
                self._stop_reading(conn)
                self._hand_off(conn)
                return True
        assert conn.body is not None
        ended = conn.body.ended(conn.head)
        if ended is False:
            return False
        if ended is None:
            conn.body_pending = PENDING_LARGE
        self._stop_reading(conn)
        self._hand_off(conn)
        return True

    def _judge(self, head: bytearray, searched: int) -> object:
        """Judge ``head``: None to read on, the offset of its end when complete, _HAND_OFF to hand
        it on as it is, or the error to refuse it with.

        A head gunicorn's parser refuses from the bytes it has (a bare LF, an over-long request
        line) is handed on too, so the refusal is gunicorn's own.
        """
        end = head.find(HEAD_END, searched)
        if end >= 0:
            end += len(HEAD_END)
            return end if end <= MAX_HEAD_BYTES else _too_large()
        if head.count(b"\n") != head.count(b"\r\n"):
            return _HAND_OFF
        if self.line_limit:
            start = 2 if head.startswith(b"\r\n") else 0
            line_end = head.find(b"\r\n", start)
            length = line_end - start if line_end >= 0 else len(head) - start - 2
            if length > self.line_limit:
                return _HAND_OFF
        return _too_large() if len(head) > MAX_HEAD_BYTES else None

    def _read_body_ahead(self, conn: EdgeConn, end: int) -> bool:
        """Go on reading ``conn``'s body in the event loop if it is small; True when it does."""
        assert conn.head is not None
        try:
            framing = body_framing(bytes(conn.head[:end]))
        except ValueError:
            conn.body_pending = PENDING_LARGE
            return False
        if framing is None:
            return False
        length, continues = framing
        if length is not None and length > READ_AHEAD_BYTES:
            conn.body_pending = PENDING_LARGE
            return False
        if continues:
            # "100 Continue" goes out only once the app wants the body (handle_request): a
            # client refused on its head alone never sends it.
            conn.body_pending = PENDING_CONTINUE
            return False
        conn.body = ReadAhead(end, length)
        pace = self._pace(conn)
        pace.start()
        pace.received = len(conn.head) - end
        conn.last_bytes = time.monotonic()
        del self.reading[conn]
        self.bodies[conn] = None
        return True

    def _pace(self, conn: EdgeConn) -> BodyPace:
        if conn.pace is None:
            # A body cut off for its pace is never read to its end: the answer says
            # "Connection: close".
            conn.pace = BodyPace(
                conn.sock,
                self.limits.body_timeout,
                self.limits.body_min_rate,
                on_cut_off=close_after_answer,
            )
        return conn.pace

    def _hand_off(self, conn: EdgeConn) -> None:
        assert conn.head is not None
        head, conn.head, conn.body = bytes(conn.head), None, None
        conn.head_prefix = head[:HEAD_PREFIX_BYTES]
        conn.init()  # plain HTTP/1: makes the parser, no I/O
        pace = self._pace(conn)
        if conn.parser.unreader.sock is not pace:
            conn.parser.unreader.sock = pace
        conn.parser.unreader.unread(head)
        if conn.body_pending:
            if not self.body_slots:
                self.waiting.append((conn, time.monotonic() + self.limits.body_timeout))
                return
            self.body_slots -= 1
            conn.holds_slot = True
        super().enqueue_req(conn)

    def finish_request(self, conn: TConn, fs: Any) -> None:
        if getattr(conn, "holds_slot", False):
            conn.holds_slot = False
            self.body_slots += 1
            if self.waiting:
                waiting, _ = self.waiting.popleft()
                self.body_slots -= 1
                waiting.holds_slot = True
                ThreadWorker.enqueue_req(self, waiting)
        super().finish_request(conn, fs)

    def _stop_reading(self, conn: EdgeConn) -> None:
        self.reading.pop(conn, None)
        self.bodies.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)

    def murder_pending(self) -> None:
        """Time out pending connections, unfinished heads and bodies, and lingering closes
        (every loop turn)."""
        super().murder_pending()
        self._expire_heads()
        self._expire_bodies()
        self._expire_waiting()
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
            self._refuse_slow(conn, f"request headers not received within {timeout:g} s")

    def _expire_bodies(self) -> None:
        now = time.monotonic()
        if now < self.bodies_checked + BODY_CHECK_SECONDS:
            return
        self.bodies_checked = now
        expired = []
        for conn in self.bodies:
            assert conn.pace is not None
            deadline, reason = conn.pace.due(conn.last_bytes)
            if deadline <= now:
                expired.append((conn, reason))
        for conn, reason in expired:
            self._stop_reading(conn)
            self.nr_conns -= 1
            self.log.warning("Request body cut off from ip=%s: %s", conn.client[0], reason)
            self._refuse_slow(conn, reason)

    def _expire_waiting(self) -> None:
        now = time.monotonic()
        while self.waiting and self.waiting[0][1] <= now:
            conn, _ = self.waiting.popleft()
            self.nr_conns -= 1
            self.log.warning("No thread free for a request body from ip=%s", conn.client[0])
            answer = error_response(
                503,
                "Service Unavailable",
                f"every thread that reads request bodies has been busy for"
                f" {self.limits.body_timeout:g} s; retry shortly",
                target_path(conn.head_prefix),
                extra="Retry-After: 1\r\n",
            )
            with contextlib.suppress(OSError):
                conn.sock.setblocking(False)
                conn.sock.send(answer)
            self.linger(conn.sock)

    def _refuse_slow(self, conn: EdgeConn, message: str) -> None:
        assert conn.head is not None
        path = target_path(bytes(conn.head[:HEAD_PREFIX_BYTES]))
        with contextlib.suppress(OSError):
            conn.sock.send(error_response(408, "Request Timeout", message, path))
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
        worker_request.body_pending = getattr(conn, "body_pending", "")
        try:
            return super().handle(conn)
        finally:
            worker_request.pace = None
            worker_request.head = b""
            worker_request.body_pending = ""

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
