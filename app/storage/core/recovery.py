"""The start-up recovery's plan and report, and the refusal of a second server on one root.

Each backend's recovery (tree/recovery.py, pg/recovery.py) plans from what the last server
left; the backend's ``recover`` repairs it and reports what it did."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from app.storage.core.errors import StorageError


class RootBusy(StorageError):
    """Another server holds the storage root."""

    def __init__(self, root: Path, pid: int | None, why: str = "") -> None:
        who = f"PID {pid}" if pid else "another process"
        why = why or f"storage root {root} is already served by {who}"
        super().__init__(f"{why}; not starting")
        self.pid = pid


@dataclass(frozen=True, slots=True)
class Plan:
    """What the start-up recovery has to do."""

    clean: bool  # the last server stopped cleanly (or none ran)
    full: bool  # unsynced data may have been lost: a full check is needed
    reason: str = ""


@dataclass(slots=True)
class Report:
    plan: Plan
    repaired: list[str] = field(default_factory=list)
    trash: int = 0  # deletions a killed process left in the trash, emptied
    notes: list[str] = field(default_factory=list)  # what was found and left alone
    # What the check of the search indexes found and did (tree/search_health.py).
    search: list[str] = field(default_factory=list)
    # The schema migrations this process applied to the database at its start (pg/schema.py).
    schema: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        lines = list(self.schema)
        if not self.plan.clean:
            lines.append(f"previous run did not shut down cleanly ({self.plan.reason})")
        elif self.repaired or self.trash or self.notes:
            # A worker killed under a server that then stopped cleanly.
            lines.append("previous run stopped cleanly, after a process of it was killed")
        if self.repaired:
            lines.append(f"  repaired {len(self.repaired)} write(s) left in flight")
            lines += [f"    {key}" for key in self.repaired[:20]]
        if self.trash:
            lines.append(f"  emptied {self.trash} deletion(s) left in the trash")
        lines += [f"  {note}" for note in self.notes]
        if self.search:
            lines.append("  search indexes:")
            lines += [f"    {line}" for line in self.search[:20]]
        if self.plan.full:
            lines.append(
                "  unsynced data may have been lost: a full check (fsck --repair) runs in the"
                " background; /readyz answers 503 until it is done"
            )
        return lines
