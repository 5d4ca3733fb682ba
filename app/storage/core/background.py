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
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

log = logging.getLogger("app.storage.background")


@dataclass
class _Runs:
    """One job key's thread: the run under way and the rerun asked for meanwhile."""

    job: Callable[[], object]
    current: threading.Event = field(default_factory=threading.Event)
    rerun: threading.Event | None = None


class Later:
    def __init__(self) -> None:
        self._running: dict[Hashable, _Runs] = {}
        self._guard = threading.Lock()

    def run(self, key: Hashable, job: Callable[[], object], what: str) -> threading.Event:
        """Start ``job`` in a thread, or have it run again after the run of ``key`` under way;
        the event is set once a run that started after this call has ended."""
        with self._guard:
            runs = self._running.get(key)
            if runs is not None:
                runs.job = job
                if runs.rerun is None:
                    runs.rerun = threading.Event()
                return runs.rerun
            runs = self._running[key] = _Runs(job)
            started = runs.current

        def work() -> None:
            while True:
                try:
                    runs.job()
                except Exception:
                    log.exception("%s failed; the next request or sweep tries again", what)
                with self._guard:
                    ended, rerun = runs.current, runs.rerun
                    if rerun is None:
                        del self._running[key]
                    else:
                        runs.current, runs.rerun = rerun, None
                ended.set()
                if rerun is None:
                    return

        threading.Thread(target=work, name=what, daemon=True).start()
        return started

    def busy(self) -> bool:
        """Whether any job is running (tests wait for quiet)."""
        with self._guard:
            return bool(self._running)
