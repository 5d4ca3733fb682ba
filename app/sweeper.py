"""The background sweeper: exactly one per deployment, however many gunicorn workers and nodes.

Every worker starts a daemon thread (gunicorn's ``post_worker_init`` hook). The threads
compete for the storage backend's leader lease (``storage.lead``: a non-blocking flock on
``<root>/.locks/sweeper.leader`` for the tree, a session advisory lock for PostgreSQL); the
holder keeps it and sweeps every ``MEMORY_SWEEP_INTERVAL`` seconds, the others retry now and
then. When the leader dies its lease goes with it and another worker takes over, and because
the time of the last run is kept by the backend (``<root>/.sweeper.json``, or a row), not in
memory, the new leader keeps the same rhythm instead of sweeping at once. No cron, and no sweep runs twice: a thread per
worker without the leader lock would sweep N times per interval, and a thread started
before the fork (``--preload``) would not run at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .storage.atomic import flush_derived, fsync_dir, write_atomic
from .storage.errors import StorageError, UnsafePath
from .storage.retention import SweepReport

if TYPE_CHECKING:
    from flask import Flask

    from .storage.facade import SweepOutcome, TreeStorage
    from .storage.interface import Lease

LEADER = "sweeper"  # the tree's <root>/.locks/sweeper.leader and <root>/.sweeper.json
STATE_FILE = f".{LEADER}.json"
RUNNING_SENTINEL = ".server-running"
KEEP_RUNS = 50
STANDBY_POLL = 5.0

log = logging.getLogger("app.sweeper")


def run_sweep(app: Flask, *, now: datetime | None = None, dry_run: bool = False) -> SweepOutcome:
    """Sweep both engines: expired turns and memory-store versions past their retention."""
    from . import metrics

    outcome = storage_of(app).sweep(now=now or datetime.now(UTC), dry_run=dry_run)
    if not dry_run:
        metrics.record_sweep(outcome.tasks)
    for link in (*outcome.tasks.links, *outcome.versions.links):
        log.warning("sweep skipped a symlink (never followed): %s", link)
    return outcome


def storage_of(app: Flask) -> TreeStorage:
    found: TreeStorage = app.extensions["storage"]
    return found


def read_state(storage: TreeStorage) -> dict[str, Any]:
    try:
        state = storage.load_state(LEADER)
    except Exception:  # noqa: BLE001 - an unreadable state only costs us one early sweep
        state = None
    return state if isinstance(state, dict) else {"runs": 0, "recent": []}


class Sweeper:
    """The per-worker thread; only the one holding the leader lock sweeps."""

    def __init__(self, app: Flask, interval: float, *, poll: float = STANDBY_POLL) -> None:
        self.app = app
        self.storage = storage_of(app)
        self.interval = interval
        self.poll = min(poll, interval)
        self._stop = threading.Event()
        self._lock: Lease | None = None
        self.thread = threading.Thread(target=self._loop, name="memory-sweeper", daemon=True)

    def start(self) -> Sweeper:
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; it releases the leader lock itself (filelock locks are per thread)."""
        self._stop.set()
        self.thread.join(timeout)

    @property
    def is_leader(self) -> bool:
        return self._lock is not None

    def _loop(self) -> None:
        try:
            self._serve()
        except StorageError as exc:  # e.g. a linked .locks: never create files through it
            log.error("sweeper stopped: %s", exc)
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self._lock is not None and not self._lock.held():
                self._lock.release()  # lost with its connection: compete again
                self._lock = None
            if self._lock is None:
                try:
                    self._lock = self.storage.lead(LEADER)
                except UnsafePath:
                    raise
                except StorageError as exc:  # the database is away: try again later
                    log.warning("sweeper lease not taken: %s", exc)
                if self._lock is None:
                    self._stop.wait(self.poll)
                    continue
            last = read_state(self.storage).get("last_started_epoch", 0.0)
            wait = float(last) + self.interval - time.time()
            if wait > 0:
                self._stop.wait(min(wait, self.interval))
                continue
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the thread must outlive one bad run
                log.exception("sweep failed")
                self._stop.wait(self.poll)

    def run_once(self) -> SweepReport:
        """Sweep now and record the run; the caller holds the leader lock."""
        started = time.time()
        state = read_state(self.storage)
        # Recorded before the sweep: a leader killed mid-sweep does not make its successor
        # sweep again at once, and the next run finishes whatever this one left in the trash.
        state["last_started_epoch"] = started
        self.storage.save_state(LEADER, state)
        report = run_sweep(self.app).tasks
        run = {
            "pid": os.getpid(),
            "started": datetime.fromtimestamp(started, UTC).isoformat(),
            "finished": datetime.now(UTC).isoformat(),
            "started_epoch": started,
            "finished_epoch": time.time(),
            "turns": report.turns,
            "tasks": report.tasks,
            "bytes": report.bytes,
            "errors": len(report.errors),
        }
        state["runs"] = int(state.get("runs", 0)) + 1
        state["recent"] = [*state.get("recent", []), run][-KEEP_RUNS:]
        self.storage.save_state(LEADER, state)
        log.info("sweep %s", run)
        return report


_started: Sweeper | None = None


def start_for_worker(app: Any) -> Sweeper | None:
    """Start this worker's sweeper thread (gunicorn ``post_worker_init``); once per process."""
    global _started
    extensions = getattr(app, "extensions", None)
    if _started is not None or not extensions or "storage" not in extensions:
        return _started
    interval = float(app.config.get("SWEEP_INTERVAL", 0))
    if interval <= 0:
        return None
    _started = Sweeper(app, interval).start()
    return _started


def startup_recovery(app: Flask) -> list[str]:
    """Mark the server running; if the last run did not shut down cleanly, fsck --repair.

    Returns the lines worth printing (empty after a clean shutdown). Whatever the check
    cannot repair (a planted link, a torn record) is reported, and the server still starts.
    """
    storage = storage_of(app)
    if not hasattr(storage, "layout"):  # a database: every write is one transaction
        return [f"upgraded: {line}" for line in getattr(storage, "migrations", [])]
    root = storage.layout.root
    sentinel = root / RUNNING_SENTINEL
    try:
        lines = [f"upgraded: {line}" for line in storage.upgrade()]
    except Exception as exc:  # noqa: BLE001 - an upgrade that fails must not keep the server down
        log.exception("start-up upgrade failed")
        lines = [f"upgrade failed: {exc}"]
    if sentinel.exists():
        try:
            report = storage.fsck(repair=True)
        except Exception as exc:  # noqa: BLE001 - recovery must not keep the server down
            log.exception("start-up recovery failed")
            lines.append(f"previous run did not shut down cleanly; recovery failed: {exc}")
        else:
            lines.append(
                "previous run did not shut down cleanly: fsck --repair found "
                f"{len(report.problems)} problem(s), repaired {len(report.repaired)}, "
                f"unrepairable {len(report.unrepairable)}"
            )
            lines += [f"  unrepairable: {p}" for p in report.unrepairable]
    write_atomic(sentinel, f"{os.getpid()}\n".encode())
    return lines


def clean_shutdown(app: Flask) -> None:
    """Derived files are written without fsync: sync them all, then drop the sentinel."""
    storage = storage_of(app)
    if not hasattr(storage, "layout"):
        storage.close()
        return
    root = storage.layout.root
    flush_derived()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(root / RUNNING_SENTINEL)
        fsync_dir(root)
