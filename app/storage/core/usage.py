"""What each project and tenant stores, the quotas that bound it, and the free-space floor.

**Usage** is kept by counters, never by walking what is stored: each write changes them by
what it added or removed, in the same transaction as the index rows it writes (the tree:
the project's listing and each store's index, tree/usage.py; PostgreSQL: the
``projects`` row, pg/). fsck recounts them from the records. What is counted:

* ``tasks``, ``turns``, ``artifacts``, ``artifact_bytes``;
* ``turn_bytes``: each turn's meta as compact JSON plus its summary, in UTF-8;
* ``stores``, ``memories``, ``memory_bytes`` (the live memories' content), ``versions``,
  ``version_bytes`` (the content every kept version holds: a memory's history too);
* ``bytes`` = ``turn_bytes + artifact_bytes + version_bytes``: what the project stores.
  What the server derives from it (indexes, the digest, the live copy of a memory) and the
  filesystem's own overhead are not counted: the free-space floor keeps room for those.

**Quotas** (``"quota"`` sections of the limits document, core/limits.py) bound
``bytes`` and ``tasks``, per project and per tenant; both apply. A write that adds bytes (or
a task) is admitted only if, for each quota that applies, what is stored plus what writes in
flight have reserved plus what it adds stays within the quota; it then holds a reservation
of what it adds until its counters are written, in the same transaction that drops the
reservation. Writers of one quota are serialized only while they check and reserve, never
while they write. A write that replaces data reserves the difference; a write that frees
data, a delete or a sweep needs nothing and frees at once. A reservation is held by a live
process for a lease it renews while it streams: the reservation of a process that died, or
that stopped renewing, no longer counts.

**The free-space floor** (``MEMORY_MIN_FREE_BYTES``): a write that would leave less than the
floor free on the tree's filesystem is refused before it writes anything, so records,
indexes and SQLite never meet a full disk half-way; reads and deletes go on.

Both refusals are :class:`QuotaExceeded` / :class:`~app.storage.errors.InsufficientStorage`
(HTTP 507) raised before the first byte of the write is stored.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

from app.storage.core.errors import StorageError

if TYPE_CHECKING:
    from app.storage.core.limits import QuotaOverride
    from app.storage.core.names import Scope
    from app.storage.core.quota import FreeSpace

LEASE_SECONDS = 900.0  # a reservation not renewed for this long no longer counts
RENEW_SECONDS = 30.0  # a streaming write renews its lease at most this often


@dataclass(frozen=True, slots=True)
class Usage:
    """What one project (or a tenant, the sum of its projects) stores."""

    tasks: int = 0
    turns: int = 0
    artifacts: int = 0
    artifact_bytes: int = 0
    turn_bytes: int = 0
    stores: int = 0
    memories: int = 0
    memory_bytes: int = 0
    versions: int = 0
    version_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.turn_bytes + self.artifact_bytes + self.version_bytes

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Usage)))

    def to_json(self) -> dict[str, int]:
        out = {f.name: int(getattr(self, f.name)) for f in fields(Usage)}
        out["bytes"] = self.bytes
        return out


ZERO = Usage()
KINDS = tuple(f.name for f in fields(Usage))


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """What one turn stores: its artifacts, their bytes, and its meta and summary."""

    turn: int
    artifacts: int
    artifact_bytes: int
    turn_bytes: int


@dataclass(frozen=True, slots=True)
class StoreUsage:
    """What one memory store holds (its live memories and every version it keeps)."""

    memories: int = 0
    memory_bytes: int = 0
    versions: int = 0
    version_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Reserved:
    """What the writes in flight of one project hold."""

    bytes: int = 0
    tasks: int = 0


class QuotaExceeded(StorageError):
    """A write would take a project or a tenant over its quota (HTTP 507)."""

    def __init__(
        self, level: str, name: str, kind: str, limit: int, stored: int, needed: int
    ) -> None:
        self.level = level  # "project" or "tenant"
        self.name = name  # "acme/web" or "acme"
        self.kind = kind  # "bytes" or "tasks"
        self.limit = limit
        self.stored = stored  # stored, plus what the writes in flight have reserved
        self.needed = needed
        if kind == "bytes":
            text = (
                f"{level} {name} is over its storage quota: the quota is {_size(limit)},"
                f" {_size(stored)} is in use and this write needs {_size(needed)} more;"
                " nothing was written. Delete tasks or memory stores (or let them expire)"
                " to free space, or ask an operator to raise the quota"
            )
        else:
            text = (
                f"{level} {name} is at its task quota: the quota is {limit} task(s) and"
                f" {stored} exist; nothing was written. Delete a task (or let one expire),"
                " or ask an operator to raise the quota"
            )
        super().__init__(text)

    def details(self) -> dict[str, object]:
        return {
            "quota": {"level": self.level, "name": self.name, "kind": self.kind},
            "limit": self.limit,
            "used": self.stored,
            "needed": self.needed,
        }


def _size(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.3g} {unit} ({count} bytes)"
    return f"{count} bytes"


def over_quota(
    level: str,
    name: str,
    quota: QuotaOverride | None,
    stored: Usage,
    reserved: Reserved,
    add_bytes: int,
    add_tasks: int,
) -> QuotaExceeded | None:
    """The refusal of a write adding ``add_bytes`` and ``add_tasks``, or None when it fits."""
    if quota is None:
        return None
    if quota.tasks is not None and add_tasks > 0:
        have = stored.tasks + reserved.tasks
        if have + add_tasks > quota.tasks:
            return QuotaExceeded(level, name, "tasks", quota.tasks, have, add_tasks)
    if quota.bytes is not None and add_bytes > 0:
        have = stored.bytes + reserved.bytes
        if have + add_bytes > quota.bytes:
            return QuotaExceeded(level, name, "bytes", quota.bytes, have, add_bytes)
    return None


# -- who holds a reservation -------------------------------------------------------------------
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    # The command name is in parentheses and may hold spaces: fields count after the last ')'.
    rest = data[data.rfind(b")") + 2 :].split()
    return rest[19].decode() if len(rest) > 19 else ""


_BOOT = _boot_id()
_identity: tuple[int, str] = (-1, "")


def owner_identity() -> str:
    """This process, as a reservation names its holder: boot, pid and start time."""
    global _identity
    pid = os.getpid()
    if _identity[0] != pid:
        _identity = (pid, f"{_BOOT}/{pid}/{_start_ticks(pid) or ''}")
    return _identity[1]


def owner_alive(identity: str) -> bool:
    """Whether the process a reservation names still runs on this machine (the tree's
    writers all run on one; a name this machine cannot check counts as alive, and the
    reservation's lease decides)."""
    try:
        boot, pid_text, ticks = identity.split("/")
        pid = int(pid_text)
    except ValueError:
        return True
    if boot and _BOOT and boot != _BOOT:
        return False  # made before the machine restarted
    if ticks:
        found = _start_ticks(pid)
        if found is None:
            return False
        if found:
            return found == ticks  # another process that got the same pid since is not it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lease_until(now: float | None = None) -> int:
    """The wall-clock microsecond a reservation made (or renewed) now lapses at."""
    return int(((time.time() if now is None else now) + LEASE_SECONDS) * 1_000_000)


def wall_us() -> int:
    return int(time.time() * 1_000_000)


class Ticket(Protocol):
    """A reservation held by one write (or nothing to hold: :data:`NO_TICKET`)."""

    @property
    def id(self) -> str | None: ...

    def extend(self, add_bytes: int) -> None:
        """Reserve ``add_bytes`` more (QuotaExceeded / InsufficientStorage when it cannot)."""
        ...

    def cover(self, add_bytes: int, add_tasks: int) -> None:
        """Make the reservation at least ``add_bytes`` and ``add_tasks`` (what the write, now
        known exactly, adds)."""
        ...

    def renew(self) -> None:
        """Start the reservation's lease again (a write still streaming)."""
        ...

    def settled(self) -> None:
        """The write's counters were written with the reservation's removal."""
        ...

    def release(self) -> None:
        """Drop the reservation (the write failed); nothing when it was settled."""
        ...


class _NoTicket:
    id = None

    def extend(self, add_bytes: int) -> None:
        pass

    def cover(self, add_bytes: int, add_tasks: int) -> None:
        pass

    def renew(self) -> None:
        pass

    def settled(self) -> None:
        pass

    def release(self) -> None:
        pass


NO_TICKET: Ticket = _NoTicket()


class HeldTicket:
    """What every backend's ticket keeps: its reservation's id (made on the first
    reservation), what it reserved, and whether the write settled it. A backend gives
    ``_reserve`` (add to the reservation, or refuse), ``renew`` and ``_drop``."""

    def __init__(self, scope: Scope) -> None:
        self._scope = scope
        self._id: str | None = None
        self.bytes = 0
        self.tasks = 0
        self._done = False

    @property
    def id(self) -> str | None:
        return None if self._done else self._id

    def _reserve(self, add_bytes: int, add_tasks: int) -> None:
        raise NotImplementedError

    def _drop(self, ident: str) -> None:
        raise NotImplementedError

    def extend(self, add_bytes: int) -> None:
        if add_bytes > 0:
            self._reserve(add_bytes, 0)

    def cover(self, add_bytes: int, add_tasks: int) -> None:
        more_bytes, more_tasks = add_bytes - self.bytes, add_tasks - self.tasks
        if more_bytes > 0 or more_tasks > 0:
            self._reserve(max(0, more_bytes), max(0, more_tasks))

    def settled(self) -> None:
        self._done = True

    def release(self) -> None:
        if self._id is not None and not self._done:
            self._done = True
            # A failure here leaves a reservation its lease (or its process's end) frees.
            with contextlib.suppress(Exception):
                self._drop(self._id)


class ReservingStream:
    """A request body that keeps its write's reservation alive as it is read: it renews the
    lease while the body streams in and, for a body of unknown length (``known`` False),
    reserves (and checks against the floor) each piece it reads before handing it on to be
    written, past ``credit`` (the size of what it replaces): a body that would cross a quota
    or the floor stops at the piece that crosses, and what it stored never does."""

    PIECE = 256 << 10  # read at most this much at once

    def __init__(
        self,
        stream: Any,
        ticket: Ticket,
        floor: FreeSpace | None,
        *,
        known: bool,
        credit: int = 0,
    ) -> None:
        self.stream = stream
        self.ticket = ticket
        self.floor = floor
        self.known = known
        self.read_bytes = 0
        self.reserved = credit
        self._renewed = time.monotonic()

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > self.PIECE:
            size = self.PIECE
        data: bytes = self.stream.read(size)
        self.read_bytes += len(data)
        need = self.read_bytes - self.reserved
        if not self.known and need > 0:
            if self.floor is not None:
                self.floor.admit(need)
            self.ticket.extend(need)
            self.reserved += need
            self._renewed = time.monotonic()
        elif time.monotonic() - self._renewed >= RENEW_SECONDS:
            self.ticket.renew()
            self._renewed = time.monotonic()
        return data
