"""The background housekeeper: exactly one per storage root, however many gunicorn workers.

Every worker starts a daemon thread (gunicorn's ``post_worker_init`` hook). The threads
compete for the storage backend's leader lease (``storage.lead``: a non-blocking flock on
``<root>/.locks/sweeper.leader`` for the tree, a session advisory lock that every node
competes for with PostgreSQL); the holder keeps it and, the others retrying now and then:

* runs the full check a start-up recovery left pending (app/storage/tree/recovery.py), first;
* renews the recovery's canary every ``RENEW_SECONDS``;
* sweeps every ``MEMORY_SWEEP_INTERVAL`` seconds (0: never).

When the leader dies the kernel drops its flock and another worker takes over, and because
the time of the last sweep is kept by the backend (``<root>/.sweeper.json``, or a row), the new
leader keeps the same rhythm instead of sweeping at once. No cron, and no sweep runs twice:
a thread per worker without the leader lock would sweep N times per interval, and a thread
started before the fork (``--preload``) would not run at all.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from app.storage.core.errors import StorageError, UnsafePath
from app.storage.core.files import is_no_space
from app.storage.core.sweep import SweepReport

if TYPE_CHECKING:
    from flask import Flask

    from app.storage.core.sweep import SweepOutcome
    from app.storage.interface import Lease, StorageBackend

LEADER = "sweeper"  # the tree's <root>/.locks/sweeper.leader and <root>/.sweeper.json
STATE_FILE = f".{LEADER}.json"
KEEP_RUNS = 50
STANDBY_POLL = 5.0
RENEW_SECONDS = 5.0

log = logging.getLogger("app.sweeper")


def run_sweep(
    app: Flask, *, now: datetime | None = None, dry_run: bool = False, force: bool = False
) -> SweepOutcome:
    """Sweep both engines: expired turns and memory-store versions past their retention.

    An explicit ``now`` is a time a person chose, not the clock's: the guard against a clock
    stepped forward (core/sweep.py ClockGuard) is for the clock alone, as ``force`` says."""
    from app.web import metrics

    outcome = storage_of(app).sweep(
        now=now or datetime.now(UTC), dry_run=dry_run, force=force or now is not None
    )
    if outcome.refused:
        log.warning("sweep refused: %s", outcome.refused)
    if not dry_run:
        metrics.record_sweep(outcome.tasks)
    for link in (*outcome.tasks.links, *outcome.versions.links):
        log.warning("sweep skipped a symlink (never followed): %s", link)
    return outcome


def storage_of(app: Flask) -> StorageBackend:
    found: StorageBackend = app.extensions["storage"]
    return found


def read_state(storage: StorageBackend) -> dict[str, Any]:
    try:
        state = storage.load_state(LEADER)
    except Exception:  # noqa: BLE001 - an unreadable state only costs us one early sweep
        state = None
    return state if isinstance(state, dict) else {"runs": 0, "recent": []}


class Sweeper:
    """The per-worker thread; only the one holding the leader lock does the work."""

    def __init__(
        self,
        app: Flask,
        interval: float,
        *,
        poll: float = STANDBY_POLL,
        renew: float = RENEW_SECONDS,
    ) -> None:
        self.app = app
        self.storage = storage_of(app)
        self.interval = interval
        self.renew = renew
        self.poll = min(poll, interval) if interval > 0 else poll
        self._stop = threading.Event()
        self._lock: Lease | None = None
        # When the next sweep is due, on the monotonic clock: a wall clock stepped back must
        # not stop the sweeps for as long as the step (nor one stepped forward run them early).
        self._next_sweep: float | None = None
        self._stopped_by_full_disk = False
        self._led = False  # whether this leadership ran _lead_once yet
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
        except UnsafePath as exc:  # a linked .locks: never create files through it
            log.error("sweeper stopped: %s", exc)
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self._lock is not None and not self._lock.held():
                self._lock.release()  # lost with its database connection: compete again
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
                self._next_sweep = None
                self._led = False
            # Nothing below writes while a full disk keeps the start-up recovery unfinished
            # (a renewed sentinel would tell the workers it is done).
            if not self._writable():
                continue
            if not self._led:
                self._led = True
                self._lead_once()
            if self.storage.recovery.running():
                self._guard(self.storage.recovery.renew, "canary renewal")
            wait = self.renew
            if self.interval > 0:
                now = time.monotonic()
                if self._next_sweep is None:
                    self._next_sweep = now + self._due_in()
                if self._next_sweep <= now:
                    self._guard(self.run_once, "sweep")
                    self._next_sweep = time.monotonic() + self.interval
                wait = min(wait, max(0.0, self._next_sweep - time.monotonic()))
            self._stop.wait(wait)

    def _writable(self) -> bool:
        """Finish a start-up recovery a full disk stopped, if there is one: False (after a
        pause) while the disk is still full; True once it is done."""
        try:
            done = self.storage.resume_writes()
        except Exception:  # noqa: BLE001 - the thread must outlive one bad run
            log.exception("finishing the start-up recovery failed")
            done = False
        if not done:
            self._stopped_by_full_disk = True
            self._stop.wait(self.poll)
            return False
        if self._stopped_by_full_disk:
            self._stopped_by_full_disk = False
            log.warning("the start-up recovery finished: writes are served again")
        return True

    def _due_in(self) -> float:
        """Seconds until the first sweep of a new leader: the rest of the interval since the
        last run any leader recorded (on the wall clock, the one kept between processes),
        never more than one interval (a record from a time ahead of the clock: stepped back)."""
        last = float(read_state(self.storage).get("last_started_epoch", 0.0))
        return min(self.interval, max(0.0, last + self.interval - time.time()))

    def _lead_once(self) -> None:
        """What a new leader does first: the full check a recovery may have left pending."""

        def check() -> None:
            report = self.storage.full_check()
            if report is not None:
                log.warning(
                    "full check after a possible loss of unsynced data: %d problem(s),"
                    " %d repaired, %d unrepairable",
                    len(report.problems),
                    len(report.repaired),
                    len(report.unrepairable),
                )

        self._guard(check, "full check")

    def _guard(self, work: Callable[[], object], what: str) -> None:
        try:
            work()
        except Exception:  # noqa: BLE001 - the thread must outlive one bad run
            log.exception("%s failed", what)
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
    """Start this worker's housekeeping thread (gunicorn ``post_worker_init``); once per
    process."""
    global _started
    extensions = getattr(app, "extensions", None)
    if _started is not None or not extensions or "storage" not in extensions:
        return _started
    _started = Sweeper(app, float(app.config.get("SWEEP_INTERVAL", 0))).start()
    return _started


def startup_recovery(app: Flask) -> list[str]:
    """Take the storage root, repair what an unclean stop left and mark the server running
    (app/storage/tree/recovery.py).

    Raises RootBusy when another server holds the root: nothing is touched then. Returns
    the lines worth printing (empty after a clean shutdown). What cannot be repaired is
    reported, and the server still starts.
    """
    storage = storage_of(app)
    storage.recovery.acquire()
    lines: list[str] = []
    plan = storage.recovery.plan()
    try:
        try:
            lines += storage.recover(plan).lines()
        except Exception as exc:  # noqa: BLE001 - recovery must not keep the server down
            if is_no_space(exc):
                raise
            log.exception("start-up recovery failed")
            storage.recovery.mark_recovering(f"the recovery of in-flight writes failed: {exc}")
            lines.append(f"previous run did not shut down cleanly; recovery failed: {exc}")
        storage.recovery.renew()
    except Exception as exc:
        # A full disk must not keep reads down too (and systemd restarting a server that
        # cannot start): serve what is stored, and finish once there is room.
        if not is_no_space(exc):
            raise
        return lines + storage.serve_read_only(plan, exc)
    try:
        # Before any request: a root no sweep has marked yet, whose clock steps forward
        # before its first sweep, is guarded from its start.
        storage.mark_sweep_clock(datetime.now(UTC))
    except Exception:  # noqa: BLE001 - without it the first sweep compares with the newest write
        log.warning("the sweep's clock was not kept at start", exc_info=True)
    return lines


def worker_died(app: Flask) -> list[str]:
    """Repair the writes a worker left in flight (gunicorn's ``child_exit``, in the master):
    a worker killed mid-write leaves derived files stale, ``project.md`` and search included,
    until the next write on its lock stripe. The lines worth logging."""
    storage = storage_of(app)
    try:
        repaired = storage.repair_dead_writers()
    except Exception as exc:  # noqa: BLE001 - the master must outlive a failed repair
        return [f"a dead worker's writes in flight were not repaired: {exc}"]
    finally:
        storage.close()  # the master keeps no connection (the workers it forks make theirs)
    if not repaired:
        return []
    return [
        f"repaired {len(repaired)} write(s) a dead worker left in flight: {', '.join(repaired[:20])}"
    ]


def clean_shutdown(app: Flask) -> None:
    """Derived files are written without fsync: sync them all, then drop the sentinel."""
    storage = storage_of(app)
    storage.flush_derived()
    storage.recovery.stopped_cleanly()
