"""Upkeep a request asks for but should not wait for: one daemon thread per job at a time.

A job asked for while the same job runs is not queued again: the running one is about to do
the same work, and what it misses the next request (or the sweeper) asks for. A job that
fails is logged; nothing depends on it for correctness (digest compaction, search purges).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

log = logging.getLogger("app.storage.background")


class Later:
    def __init__(self) -> None:
        self._running: set[Hashable] = set()
        self._guard = threading.Lock()

    def run(self, key: Hashable, job: Callable[[], object], what: str) -> bool:
        """Start ``job`` in a thread unless the job ``key`` is running; return whether it
        started."""
        with self._guard:
            if key in self._running:
                return False
            self._running.add(key)

        def work() -> None:
            try:
                job()
            except Exception:
                log.exception("%s failed; the next request or sweep tries again", what)
            finally:
                with self._guard:
                    self._running.discard(key)

        threading.Thread(target=work, name=what, daemon=True).start()
        return True

    def busy(self) -> bool:
        """Whether any job is running (tests wait for quiet)."""
        with self._guard:
            return bool(self._running)
