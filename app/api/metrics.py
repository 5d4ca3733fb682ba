"""``GET /metrics``: Prometheus metrics for admin tokens (app/web/metrics.py counts them).

Registered only with ``MEMORY_METRICS=token``; the counters of every gunicorn worker are
summed from prometheus-client's multiprocess files when ``PROMETHEUS_MULTIPROC_DIR`` is set.
"""

from __future__ import annotations

import os

from flask import Blueprint, Response, current_app
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)

from app.web.auth import authenticate
from app.web.errors import ApiError
from app.web.metrics import MULTIPROC_ENV, UsageCollector

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def get_metrics() -> Response:
    """Prometheus metrics (admin tokens only)"""
    token = authenticate()
    if token.role != "admin":
        raise ApiError(403, "metrics are served to admin tokens only")
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        data = generate_latest(registry)
    else:
        data = generate_latest(REGISTRY)
    usage = CollectorRegistry(auto_describe=False)
    usage.register(UsageCollector(current_app.extensions["storage"]))
    return Response(data + generate_latest(usage), mimetype=CONTENT_TYPE_LATEST)
