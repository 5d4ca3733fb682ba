"""Correlation ids and the one structured log line per request."""

from __future__ import annotations

import logging
import re
import sys
import time

from flask import Flask, Response, g, request
from ulid import ULID

from app.storage.core.encoding import dumps_compact

CORRELATION_HEADER = "x-correlation-id"
REQUEST_ID_HEADER = "request-id"
STORES_PREFIX = "/v1/memory_stores"


def request_id(correlation: str) -> str:
    """The memory stores API's "req_..." id of a request (its correlation id, prefixed)."""
    return correlation if correlation.startswith("req_") else f"req_{correlation}"


# A client's x-correlation-id is echoed and logged verbatim, as the seed says, when it is at
# most this many characters of printable ASCII (space to tilde). Anything else (a control
# character, a byte beyond ASCII, a megabyte) could forge or bloat log lines and cannot go back
# in a response header as sent: it is replaced by a new ULID, and one log line says so.
MAX_CORRELATION_CHARS = 128
CORRELATION_PATTERN = rf"[\x20-\x7e]{{1,{MAX_CORRELATION_CHARS}}}"
CORRELATION_RULE = f"at most {MAX_CORRELATION_CHARS} characters of printable ASCII (space to '~')"
_CORRELATION_RE = re.compile(CORRELATION_PATTERN)
_SHOWN_CHARS = 64  # of a refused id, in its log line

log = logging.getLogger("app.request")


def _start() -> None:
    g.started = time.perf_counter()
    supplied = request.headers.get(CORRELATION_HEADER)
    if supplied and _CORRELATION_RE.fullmatch(supplied):
        g.correlation_id = supplied
        return
    g.correlation_id = str(ULID())
    if supplied:
        _log_replaced(supplied, g.correlation_id)


def _log_replaced(supplied: str, replacement: str) -> None:
    """One line naming the id a request got in place of the one it sent, and why."""
    if not log.isEnabledFor(logging.INFO):
        return
    record = {
        "time": _utc_second(),
        "correlation_id": replacement,
        "event": "correlation_id_replaced",
        "reason": f"the x-correlation-id sent is not {CORRELATION_RULE}",
        "length": len(supplied),
        # JSON escapes the control characters: the line stays one line.
        "supplied": supplied[:_SHOWN_CHARS],
    }
    log.info(dumps_compact(record).decode())


_second: tuple[int, str] = (-1, "")


def _utc_second() -> str:
    """The current UTC second as text, formatted once per second rather than per request."""
    global _second
    now = int(time.time())
    if _second[0] != now:
        _second = (now, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
    return _second[1]


def _finish(response: Response) -> Response:
    # One lookup through each context proxy: this runs on every request, and the proxied
    # attribute reads and the log record were a seventh of a read's CPU (bench.profile).
    ctx = g._get_current_object()
    correlation = getattr(ctx, "correlation_id", None) or str(ULID())
    response.headers[CORRELATION_HEADER] = correlation
    req = request._get_current_object()  # type: ignore[attr-defined]
    if req.path.startswith(STORES_PREFIX):
        # The memory stores API's own name for it, as its error bodies give it (request_id):
        # the Anthropic SDKs read this header into APIStatusError.request_id.
        response.headers[REQUEST_ID_HEADER] = request_id(correlation)
    if not log.isEnabledFor(logging.INFO):
        return response
    started = getattr(ctx, "started", None)
    rule = req.url_rule
    record = {
        "time": _utc_second(),
        "correlation_id": correlation,
        "method": req.method,
        "route": rule.rule if rule else None,
        "path": req.path[:256],
        "status": response.status_code,
        "duration_ms": round((time.perf_counter() - started) * 1000, 3) if started else None,
        "tenant": getattr(ctx, "tenant", None),
        "project": getattr(ctx, "project", None),
        "token_id": getattr(ctx, "token_id", None),
    }
    log.info(dumps_compact(record).decode())
    return response


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Write to whatever sys.stderr is now (test runners and daemons swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def init_app(app: Flask) -> None:
    from app.web import metrics

    app.before_request(_start)
    # Registered before _finish: Flask runs after_request handlers in reverse order, so the
    # metrics see the response after the log line has stamped the correlation id.
    metrics.init_app(app)
    app.after_request(_finish)
    if not log.handlers:
        handler = _StderrHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(app.config["LOG_LEVEL"])
