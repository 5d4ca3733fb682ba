"""Prometheus metrics: requests and latency by route and status, bytes written, lock waits,
sweeper removals. Off by default; with ``MEMORY_METRICS=token`` ``GET /metrics`` answers
admin tokens only.

Under gunicorn each worker is its own process, so the counters live in prometheus-client's
multiprocess mode: ``gunicorn.conf.py`` points ``PROMETHEUS_MULTIPROC_DIR`` at an empty
directory before any worker starts, and ``/metrics`` sums the files of every worker. Without
that variable (tests, ``flask run``) the process's own registry is served.
"""

from __future__ import annotations

import os
import time

from flask import Blueprint, Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

from .storage import locks

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

REQUESTS = Counter(
    "memory_http_requests_total", "HTTP requests answered.", ["method", "route", "status"]
)
LATENCY = Histogram(
    "memory_http_request_duration_seconds",
    "Time to answer an HTTP request.",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
BYTES_WRITTEN = Counter(
    "memory_bytes_written_total", "Request body bytes accepted by successful writes.", ["route"]
)
LOCK_WAIT = Histogram(
    "memory_lock_wait_seconds",
    "Time spent waiting for a storage lock.",
    ["outcome"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0),
)
SWEEP_REMOVED = Counter(
    "memory_sweeper_removed_total",
    "What the retention sweeper removed: turns, tasks, bytes, temp_files, leftovers.",
    ["kind"],
)
SWEEP_RUNS = Counter("memory_sweeper_runs_total", "Retention sweeps run.")

bp = Blueprint("metrics", __name__)

# Every label value comes from a closed set: a value taken from request input (a made-up method,
# a path, a header) would be a new series per request, memory an attacker controls.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def record_sweep(report: object) -> None:
    SWEEP_RUNS.inc()
    for kind in ("turns", "tasks", "bytes", "temp_files", "leftovers"):
        SWEEP_REMOVED.labels(kind).inc(int(getattr(report, kind, 0)))


def _observe_lock(waited: float, acquired: bool) -> None:
    LOCK_WAIT.labels("acquired" if acquired else "timeout").observe(waited)


def _observe_request(response: Response) -> Response:
    method = request.method if request.method in METHODS else "other"
    # The URL rule's template (one of the app's routes), never the path.
    route = request.url_rule.rule if request.url_rule else "unmatched"
    code = response.status_code
    status = str(code) if 100 <= code <= 599 else "other"
    REQUESTS.labels(method, route, status).inc()
    started = g.get("started")
    if started is not None:
        LATENCY.labels(method, route).observe(time.perf_counter() - started)
    if request.method in ("PUT", "POST", "PATCH") and 200 <= response.status_code < 300:
        BYTES_WRITTEN.labels(route).inc(request.content_length or 0)
    return response


@bp.get("/metrics")
def get_metrics() -> Response:
    """Prometheus metrics (admin tokens only)"""
    from .auth import authenticate
    from .errors import ApiError

    token = authenticate()
    if token.role != "admin":
        raise ApiError(403, "metrics are served to admin tokens only")
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        data = generate_latest(registry)
    else:
        data = generate_latest(REGISTRY)
    return Response(data, mimetype=CONTENT_TYPE_LATEST)


def init_app(app: Flask) -> None:
    """With METRICS=token: count every request and lock wait and serve /metrics."""
    if app.config["METRICS"] != "token":
        return  # off: not even a counter on the request path
    app.after_request(_observe_request)
    if _observe_lock not in locks.wait_observers:
        locks.wait_observers.append(_observe_lock)
    app.register_blueprint(bp)
