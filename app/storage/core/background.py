"""Upkeep a request asks for but need not do itself: one daemon thread per job at a time.

A job asked for while the same job runs is run once more after it: the running one may have
passed the point where it would see what the new request changed (a purge that already
merged the index, a compaction that already read its snapshot), so folding the request into
it would leave that work to the next request or sweep. Requests that arrive during one run
are folded into that one rerun. A job that fails is logged; nothing depends on it for
correctness (digest compaction, search purges), and the next request or sweep asks again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

log = logging.getLogger("app.storage.background")


@dataclass
class _Runs:
    """One job key's thread: the run under way and the rerun asked for meanwhile."""

    job: Callable[[], object]
    current: threading.Event = field(default_factory=threading.Event)
    rerun: threading.Event | None = None
    started: bool = False  # the current run's job has begun (a request now needs a rerun)


class Later:
    def __init__(self, settle: float = 0.0) -> None:
        self._running: dict[Hashable, _Runs] = {}
        self._guard = threading.Lock()
        self._settle = settle

    def run(self, key: Hashable, job: Callable[[], object], what: str) -> threading.Event:
        """Start ``job`` in a thread, or have it run again after the run of ``key`` under way;
        the event is set once a run that started after this call has ended."""
        with self._guard:
            runs = self._running.get(key)
            if runs is not None:
                runs.job = job
                if not runs.started:
                    return runs.current  # still settling: this request is folded into it
                if runs.rerun is None:
                    runs.rerun = threading.Event()
                return runs.rerun
            runs = self._running[key] = _Runs(job)
            started = runs.current

        def work() -> None:
            while True:
                if self._settle > 0:
                    time.sleep(self._settle)
                with self._guard:
                    runs.started = True
                try:
                    runs.job()
                except Exception:
                    log.exception("%s failed; the next request or sweep tries again", what)
                with self._guard:
                    ended, rerun = runs.current, runs.rerun
                    if rerun is None:
                        del self._running[key]
                    else:
                        runs.current, runs.rerun, runs.started = rerun, None, False
                ended.set()
                if rerun is None:
                    return

        threading.Thread(target=work, name=what, daemon=True).start()
        return started

    def busy(self) -> bool:
        """Whether any job is running (tests wait for quiet)."""
        with self._guard:
            return bool(self._running)
