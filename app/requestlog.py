"""Correlation ids and the one structured log line per request."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

from flask import Flask, Response, g, request
from ulid import ULID

CORRELATION_HEADER = "x-correlation-id"
_CORRELATION_RE = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")

log = logging.getLogger("app.request")


def _start() -> None:
    g.started = time.perf_counter()
    supplied = request.headers.get(CORRELATION_HEADER)
    # Honoured verbatim when it is a sane token; anything else (newlines, 1 MB) is replaced
    # so it can neither forge log lines nor bloat them.
    if supplied and _CORRELATION_RE.fullmatch(supplied):
        g.correlation_id = supplied
    else:
        g.correlation_id = str(ULID())


def _finish(response: Response) -> Response:
    response.headers[CORRELATION_HEADER] = g.get("correlation_id") or str(ULID())
    started = g.get("started")
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "correlation_id": g.get("correlation_id"),
        "method": request.method,
        "route": request.url_rule.rule if request.url_rule else None,
        "path": request.path[:256],
        "status": response.status_code,
        "duration_ms": round((time.perf_counter() - started) * 1000, 3) if started else None,
        "tenant": g.get("tenant"),
        "project": g.get("project"),
        "token_id": g.get("token_id"),
    }
    log.info(json.dumps(record, separators=(",", ":")))
    return response


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Write to whatever sys.stderr is now (test runners and daemons swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def init_app(app: Flask) -> None:
    from . import metrics

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
