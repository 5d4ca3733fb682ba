"""Prometheus metrics: requests and latency by route and status, bytes written, lock waits,
sweeper removals, and what each project stores against its quotas. Off by default; with
``MEMORY_METRICS=token`` ``GET /metrics`` answers admin tokens only.

Under gunicorn each worker is its own process, so the counters live in prometheus-client's
multiprocess mode: ``gunicorn.conf.py`` points ``PROMETHEUS_MULTIPROC_DIR`` at an empty
directory before any worker starts, and ``/metrics`` sums the files of every worker. Without
that variable (tests, ``flask run``) the process's own registry is served.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from flask import Flask, Response, g, request
from prometheus_client import (
    Counter,
    Histogram,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from app.storage.core import observers

if TYPE_CHECKING:
    from app.storage.interface import StorageBackend

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

# Every label value comes from a closed set: a value taken from request input (a made-up method,
# a path, a header) would be a new series per request, memory an attacker controls.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


# The kinds of usage, a closed set; the tenant and project labels come from the projects the
# storage holds (never from a request), so they are as many as the projects that exist.
USAGE_BYTES = ("turn_bytes", "artifact_bytes", "version_bytes", "memory_bytes")
USAGE_ITEMS = ("tasks", "turns", "artifacts", "stores", "memories", "versions")


class UsageCollector(Collector):
    """Gauges read from the storage's counters at each scrape (one read per project)."""

    def __init__(self, storage: StorageBackend) -> None:
        self.storage = storage

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stored = GaugeMetricFamily(
            "memory_usage_bytes",
            "Bytes a project stores, by kind: turn, artifact, version (what quotas count),"
            " and memory (the live memories, a part of the versions).",
            labels=["tenant", "project", "kind"],
        )
        items = GaugeMetricFamily(
            "memory_usage_items",
            "What a project holds: tasks, turns, artifacts, stores, memories, versions.",
            labels=["tenant", "project", "kind"],
        )
        quota = GaugeMetricFamily(
            "memory_quota",
            "A project's quota by kind (bytes, tasks); absent: none.",
            labels=["tenant", "project", "kind"],
        )
        tenant_quota = GaugeMetricFamily(
            "memory_tenant_quota",
            "A tenant's quota (on the sum of its projects) by kind (bytes, tasks).",
            labels=["tenant", "kind"],
        )
        quotas = self.storage.limits().quotas()
        for scope, usage in sorted(
            self.storage.usages().items(), key=lambda kv: (kv[0].tenant, kv[0].project)
        ):
            labels = [scope.tenant, scope.project]
            for kind in USAGE_BYTES:
                stored.add_metric([*labels, kind.removesuffix("_bytes")], getattr(usage, kind))
            for kind in USAGE_ITEMS:
                items.add_metric([*labels, kind], getattr(usage, kind))
            own = quotas.projects.get((scope.tenant, scope.project))
            for kind in ("bytes", "tasks"):
                value = None if own is None else getattr(own, kind)
                if value is not None:
                    quota.add_metric([*labels, kind], value)
        for tenant, own in sorted(quotas.tenants.items()):
            for kind in ("bytes", "tasks"):
                value = getattr(own, kind)
                if value is not None:
                    tenant_quota.add_metric([tenant, kind], value)
        yield from (stored, items, quota, tenant_quota)
        free = self.storage.free_space()
        if free is not None:
            disk = GaugeMetricFamily(
                "memory_disk_free_bytes", "Bytes free on the storage root's filesystem."
            )
            disk.add_metric([], free[0])
            floor = GaugeMetricFamily(
                "memory_disk_floor_bytes", "Free space below which writes are refused (507)."
            )
            floor.add_metric([], free[1])
            yield from (disk, floor)


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


def init_app(app: Flask) -> None:
    """With METRICS=token: count every request and lock wait (app/api/metrics.py serves them)."""
    if app.config["METRICS"] != "token":
        return  # off: not even a counter on the request path
    app.after_request(_observe_request)
    if _observe_lock not in observers.lock_wait_observers:
        observers.lock_wait_observers.append(_observe_lock)
