"""The start-up recovery's side of the PostgreSQL backend (tree/recovery.py for the tree).

There is no root to take and no sentinel to keep: several nodes serve one database at once,
every write is one transaction (a killed writer's is rolled back by the database), and bytes a
killed upload left in the object store are orphans the sweeper collects.
"""

from __future__ import annotations

from collections.abc import Callable

from app.storage.core.recovery import Plan


class DatabaseRecovery:
    """Recovery state of a database: nothing to plan, mark or renew; a clean stop closes the
    process's connections (``close``)."""

    def __init__(self, close: Callable[[], None]) -> None:
        self._close = close

    def acquire(self) -> None: ...

    def plan(self) -> Plan:
        return Plan(clean=True, full=False)

    def mark_recovering(self, reason: str) -> None: ...

    def recovering_reason(self) -> str | None:
        return None

    def recovered(self) -> None: ...

    def running(self) -> bool:
        return False

    def renew(self) -> None: ...

    def stopped_cleanly(self) -> None:
        self._close()
