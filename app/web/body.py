"""The request body as the app reads it: bytes counted, a pace the client must keep, and
what the worker knows of the request its thread serves.

The gunicorn worker (app/ops/serving.py) paces each body read (:class:`BodyPace`) and records
its request here (:data:`worker_request`); the app counts what it read (:class:`CountingInput`)
and asks, when a read failed, whether the client was cut off for being too slow.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flask import request as _flask_request

from app.config import SETTINGS

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: The request this worker thread serves: its gunicorn request (``req``), its body's pace
#: (``pace``) and the start of its head (``head``), set by the worker around each request.
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

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.stream.read(size)
        self.received += len(data)
        if size is None or size < 0 or (size and not data):
            self.ended = True
        return data

    def readline(self, size: int = -1) -> bytes:
        data: bytes = self.stream.readline(size)
        self.received += len(data)
        if not data and size != 0:
            self.ended = True
        return data

    def __iter__(self) -> Iterator[bytes]:
        for line in self.stream:
            self.received += len(line)
            yield line
        self.ended = True

    def unread(self, declared: int | None) -> bool:
        """Whether some of the body is still unread (``declared``: its Content-Length)."""
        if declared is not None:
            return self.received < declared
        return not self.ended


def count_body() -> None:
    """Read the body of the current request (if it has one) through a CountingInput: an app
    hook, which runs before any blueprint's, so every read is counted."""
    environ = _flask_request.environ
    if environ.get("CONTENT_LENGTH") or environ.get("HTTP_TRANSFER_ENCODING"):
        environ["wsgi.input"] = environ[COUNTED_INPUT] = CountingInput(environ["wsgi.input"])


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

    def recv(self, size: int) -> bytes:
        if self.continue_owed:
            self.continue_owed = False
            self.sock.sendall(CONTINUE)
        wait = self.gap
        reason: str | None = f"no request body bytes for {self.gap:g} s"
        if self.min_rate:
            left = self.started + self.gap + self.received / self.min_rate - time.monotonic()
            if left < wait:
                wait, reason = left, f"request body slower than {self.min_rate} bytes/s"
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
