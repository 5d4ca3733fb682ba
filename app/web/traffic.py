"""Requests and bytes per hour, per project and per token, counted without slowing a request.

Each worker process adds up every request made with a credential (the APIs and the console)
in a dict in memory: one lock and three additions per request. A thread of its own adds the
sums to their hours in the storage backend every ``FLUSH_SECONDS`` (one transaction), and
gunicorn's ``worker_exit`` hook once more when a worker stops; hours older than the retention
are pruned once an hour. A worker killed with SIGKILL loses at most its last
``FLUSH_SECONDS`` of counts. bench/README.md measures what this costs a read.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING

from flask import Flask, g, request
from werkzeug.wrappers import Response

from app.services.usage_report import hour_now
from app.storage.core.audit import KEEP_DAYS as AUDIT_KEEP_DAYS
from app.storage.core.files import is_no_space
from app.storage.core.traffic import TrafficRow
from app.web.body import body_bytes_read

if TYPE_CHECKING:
    from app.storage.interface import StorageBackend

log = logging.getLogger("app.traffic")

FLUSH_SECONDS = 10.0
#: Counts are SQLite INTEGERs (and PostgreSQL bigints).
_MAX_COUNT = (1 << 63) - 1


class TrafficRecorder:
    """This process's sums since its last flush, and the thread that flushes them."""

    def __init__(
        self, storage: StorageBackend, *, keep_hours: int, flush_every: float = FLUSH_SECONDS
    ) -> None:
        self.storage = storage
        self.keep_hours = keep_hours
        self.flush_every = flush_every
        self._counts: dict[tuple[int, str, str, str], list[int]] = {}
        self._lock = threading.Lock()
        self._thread_pid = -1
        self._pruned_hour = -1
        self._stop = threading.Event()
        _recorders.add(self)

    def _forked(self) -> None:
        # The parent's counts are the parent's to flush; a child starts empty, with its thread.
        self._lock = threading.Lock()
        self._counts = {}
        self._thread_pid = -1
        self._stop = threading.Event()

    def record(
        self, tenant: str, project: str, token_id: str, bytes_in: int, bytes_out: int
    ) -> None:
        key = (hour_now(), tenant, project, token_id)
        with self._lock:
            counts = self._counts.get(key)
            if counts is None:
                self._counts[key] = [1, bytes_in, bytes_out]
            else:
                counts[0] += 1
                counts[1] += bytes_in
                counts[2] += bytes_out
        if self._thread_pid != os.getpid():
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread_pid == os.getpid():
                return
            self._thread_pid = os.getpid()
        # The thread holds the recorder weakly: an app that is gone stops its thread.
        thread = threading.Thread(
            target=_flush_loop,
            args=(weakref.ref(self), self._stop, self.flush_every),
            name="traffic-flush",
            daemon=True,
        )
        thread.start()

    def close(self) -> None:
        """Flush what is left and stop the thread (a worker's exit; an app's end in tests)."""
        self._stop.set()
        self.flush()

    def flush(self) -> int:
        """Add this process's sums to their hours; return how many rows were written."""
        with self._lock:
            counts, self._counts = self._counts, {}
        if not counts:
            return 0
        rows = [
            TrafficRow(hour, tenant, project, token, *(min(v, _MAX_COUNT) for v in values))
            for (hour, tenant, project, token), values in counts.items()
        ]
        try:
            self.storage.record_traffic(rows)
            hour = hour_now()
            if hour != self._pruned_hour:
                self.storage.prune_traffic(hour - self.keep_hours)
                # The audit log is kept longer than the traffic (core/audit.py), on the
                # same hourly round.
                self.storage.audit_log.prune((hour - AUDIT_KEEP_DAYS * 24) * 3600 * 1_000_000)
                self._pruned_hour = hour
        except Exception as exc:  # noqa: BLE001 - counts are kept for the next flush, never lost here
            if is_no_space(exc):
                # Every flush of every worker meets the same full disk: one line each, the
                # 507s of the writes say the rest.
                log.warning("traffic counts not written (%s); kept for the next flush", exc)
            else:
                log.exception("traffic counts not written; kept for the next flush")
            with self._lock:
                for key, values in counts.items():
                    mine = self._counts.setdefault(key, [0, 0, 0])
                    for i, value in enumerate(values):
                        mine[i] += value
            return 0
        return len(rows)


def _flush_loop(
    ref: weakref.ReferenceType[TrafficRecorder], stop: threading.Event, every: float
) -> None:
    while not stop.wait(every):
        recorder = ref()
        if recorder is None:
            return
        recorder.flush()
        del recorder


_recorders: weakref.WeakSet[TrafficRecorder] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for recorder in _recorders:
        recorder._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def init_app(app: Flask) -> None:
    recorder = app.extensions["traffic"] = TrafficRecorder(
        app.extensions["storage"], keep_hours=max(1, int(app.config["RETENTION_DAYS"] * 24))
    )

    # Runs on every request: the recorder is this app's, and each context proxy is looked
    # up once.
    def after_request(response: Response) -> Response:
        principal = g.get("principal")
        if principal is None:
            return response
        req = request._get_current_object()  # type: ignore[attr-defined]
        sent = 0 if req.method == "HEAD" else response.content_length or 0
        recorder.record(
            principal.scope.tenant,
            principal.scope.project,
            principal.token.id,
            body_bytes_read(req.environ),
            sent,
        )
        return response

    app.after_request(after_request)
