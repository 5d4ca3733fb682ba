"""The request body as the app reads it: bytes counted, a pace the client must keep, and
what the worker knows of the request its thread serves.

The gunicorn worker (app/ops/serving.py) reads a body of up to :data:`READ_AHEAD_BYTES` in its
event loop, before any thread serves the request, paces every body read (:class:`BodyPace`) and
records its request here (:data:`worker_request`); the app counts what it read
(:class:`CountingInput`), reads a larger body only for a client it knows (:func:`count_body`),
and asks, when a read failed, whether the client was cut off for being too slow.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flask import g, request as _flask_request
from werkzeug.exceptions import ExpectationFailed, RequestEntityTooLarge

from app.config import SETTINGS

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: The largest body the worker reads in its event loop, where a slow client holds no thread,
#: before a thread serves the request. A larger body is left on the socket for the app: the
#: thread reading it waits on the client, so the app reads it only once it knows the sender.
READ_AHEAD_BYTES = 64 * 1024
#: Why some of a request's body is still on the socket when a thread serves it: it is over
#: READ_AHEAD_BYTES, or its client waits for "100 Continue" before sending it.
PENDING_LARGE = "large"
PENDING_CONTINUE = "continue"
#: The request this worker thread serves: its gunicorn request (``req``), its body's pace
#: (``pace``), the start of its head (``head``), and why some of its body is still to be read
#: from the client (``body_pending``: "", PENDING_LARGE or PENDING_CONTINUE), set by the worker
#: around each request.
worker_request = threading.local()


class ClientTooSlow(TimeoutError):
    """The request body arrived slower than the configured floor."""


#: The environ key of the request's CountingInput (requests with a body).
COUNTED_INPUT = "memory.counted_input"


class CountingInput:
    """``wsgi.input`` that counts the bytes read through it, and sees where the body ends.

    A request's declared length is what the client claims; what the app read is what it
    received (a refused body is never read)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.received = 0
        self.ended = False
        # Told of the bytes of each read (the upload budgets: app/web/ratelimit/hooks.py's
        # UploadMeter); it may refuse the rest of the body by raising.
        self.meter: Callable[[int], None] | None = None
        # Asked before the first read; it may refuse the whole body by raising.
        self.guard: Callable[[], None] | None = None

    def _check(self) -> None:
        if self.guard is not None:
            guard, self.guard = self.guard, None
            guard()

    def _got(self, data: bytes) -> None:
        self.received += len(data)
        if self.meter is not None and data:
            self.meter(len(data))

    def read(self, size: int = -1) -> bytes:
        self._check()
        data: bytes = self.stream.read(size)
        if size is None or size < 0 or (size and not data):
            self.ended = True
        self._got(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        self._check()
        data: bytes = self.stream.readline(size)
        if not data and size != 0:
            self.ended = True
        self._got(data)
        return data

    def __iter__(self) -> Iterator[bytes]:
        self._check()
        for line in self.stream:
            self._got(line)
            yield line
        self.ended = True

    def unread(self, declared: int | None) -> bool:
        """Whether some of the body is still unread (``declared``: its Content-Length)."""
        if declared is not None:
            return self.received < declared
        return not self.ended


def count_body() -> None:
    """Read the body of the current request (if it has one) through a CountingInput: an app
    hook, which runs before any blueprint's, so every read is counted, and a body the worker
    left on the socket is read only for a known sender."""
    environ = _flask_request.environ
    if environ.get("CONTENT_LENGTH") or environ.get("HTTP_TRANSFER_ENCODING"):
        counted = CountingInput(environ["wsgi.input"])
        if getattr(worker_request, "body_pending", ""):
            counted.guard = _sender_known
        environ["wsgi.input"] = environ[COUNTED_INPUT] = counted


def _sender_known() -> None:
    """Refuse to read a body still on the socket for a client no credential names.

    Reading it holds this thread for as long as the client takes to send it: anonymous
    clients trickling bodies would hold every thread. A credential is checked before any read
    on every route but the console's sign-in form (``g.token_id`` is set where it is:
    app/web/auth.py, the console's guard), whose form is small and sent without asking.
    """
    if g.get("token_id") is not None:
        return
    if worker_request.body_pending == PENDING_CONTINUE:
        # A client told 417 sends the request again without the expectation (RFC 9110
        # 10.1.1), and the worker then reads its small body before a thread serves it.
        raise ExpectationFailed(
            "this body is read without a credential only when sent without 'Expect: 100-continue'"
        )
    exc = RequestEntityTooLarge(
        f"a request body over {READ_AHEAD_BYTES} bytes is read only with a credential"
    )
    exc.limit = READ_AHEAD_BYTES  # type: ignore[attr-defined]  # the APIs' 413 names it
    raise exc


def body_bytes_read(environ: Mapping[str, Any]) -> int:
    counted: CountingInput | None = environ.get(COUNTED_INPUT)
    return 0 if counted is None else counted.received


def close_if_body_unread(response: Any) -> Any:
    """Answer ``Connection: close`` when the app left some of the body unread (a write refused
    before its body: 401, 413, 429, 507...). gunicorn drains at most 64 KiB of it before the
    next request and otherwise closes the connection, which a client told "keep-alive" would
    meet on its next request, unanswered."""
    environ = _flask_request.environ
    counted: CountingInput | None = environ.get(COUNTED_INPUT)
    if counted is not None and counted.unread(_flask_request.content_length):
        close_after_answer()
    return response


def close_after_answer() -> None:
    """Close the connection once the current answer is sent: the request's framing is broken,
    so nothing that follows on the connection can be read as a request."""
    req = getattr(worker_request, "req", None)
    if req is not None:
        req.force_close()


def body_cut_off() -> str | None:
    """Return why the current request's body was cut off for arriving too slowly, or None."""
    pace: BodyPace | None = getattr(worker_request, "pace", None)
    return pace.cut_off if pace is not None else None


@dataclass(frozen=True, slots=True)
class Limits:
    header_timeout: float
    body_timeout: float
    body_min_rate: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> Limits:
        """Read the limits from the app's validated config (SETTINGS defaults for another app)."""
        values = {
            name: (config or {}).get(name, SETTINGS[name][0])
            for name in ("HEADER_TIMEOUT", "BODY_TIMEOUT", "BODY_MIN_RATE")
        }
        return cls(
            float(values["HEADER_TIMEOUT"]),
            float(values["BODY_TIMEOUT"]),
            int(values["BODY_MIN_RATE"]),
        )


class BodyPace:
    """A connection's socket as gunicorn's request parser reads it: every recv under the floor.

    Per request: no wait longer than ``gap`` seconds for the next bytes, and after ``t`` seconds
    at least ``(t - gap) * min_rate`` bytes received. The socket is put back to blocking after
    each read, so writing the response is not bounded by the floor.
    """

    def __init__(
        self,
        sock: socket.socket,
        gap: float,
        min_rate: int,
        on_cut_off: Callable[[], None] | None = None,
    ) -> None:
        self.sock = sock
        self.gap = gap
        self.min_rate = min_rate
        self.on_cut_off = on_cut_off
        self.start()

    def start(self) -> None:
        """Begin a request: its body's clock and byte count start from zero."""
        self.started = time.monotonic()
        self.received = 0
        self.cut_off: str | None = None
        self.cap: float | None = None
        # "100 Continue" owed to a client that asked for it, sent when the body is first read.
        self.continue_owed = False

    def due(self, since: float) -> tuple[float, str]:
        """When the client is cut off if no more bytes come, waiting from ``since``, and why.

        The worker's event loop, which reads small bodies, asks it with the time of the last
        bytes; a thread asks it as it starts each read."""
        deadline, reason = since + self.gap, f"no request body bytes for {self.gap:g} s"
        if self.min_rate:
            floor = self.started + self.gap + self.received / self.min_rate
            if floor < deadline:
                deadline, reason = floor, f"request body slower than {self.min_rate} bytes/s"
        return deadline, reason

    def recv(self, size: int) -> bytes:
        if self.continue_owed:
            self.continue_owed = False
            self.sock.sendall(CONTINUE)
        now = time.monotonic()
        deadline, why = self.due(now)
        wait = deadline - now
        reason: str | None = why
        if self.cap is not None and self.cap < wait:
            # gunicorn's own bound (draining an unread body before keep-alive): not the client's
            # fault, so no 408.
            wait, reason = self.cap, None
        if wait <= 0:
            raise self._timed_out(reason)
        self.sock.settimeout(wait)
        try:
            data = self.sock.recv(size)
        except TimeoutError:
            raise self._timed_out(reason) from None
        finally:
            self.sock.settimeout(None)
        self.received += len(data)
        return data

    def _timed_out(self, reason: str | None) -> TimeoutError:
        if reason is None:
            return TimeoutError("timed out")
        self.cut_off = reason
        if self.on_cut_off is not None:
            self.on_cut_off()
        return ClientTooSlow(reason)

    # gunicorn's parser bounds its keep-alive drain with these.
    def settimeout(self, value: float | None) -> None:
        self.cap = value

    def gettimeout(self) -> float | None:
        return self.cap
