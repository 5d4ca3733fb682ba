"""The quotas in force and the free-space floor (core/usage.py says what they bound)."""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from app.storage.core.errors import InsufficientStorage, StorageError
from app.storage.core.ledger import NO_PRICES, Price, PriceSettings
from app.storage.core.limits import NO_QUOTAS, QuotaOverride, Quotas, human_bytes, parse_bytes
from app.storage.core.names import Scope
from app.storage.core.secret_policy import (
    DEFAULT_POLICY,
    NO_SETTINGS,
    SecretPolicy,
    SecretSettings,
)

T = TypeVar("T")

QUOTA_CHECK_EVERY = 1.0  # seconds between two looks at the limits document, per process
FLOOR_CHECK_EVERY = 1.0  # seconds a statvfs of the root is trusted
DEFAULT_MIN_FREE = "2%"
DEFAULT_MIN_FREE_INODES = "2%"
# What a write puts on disk besides what it is asked to store: the records and indexes it
# rewrites (meta.json, index.json), the pages it appends to SQLite's write-ahead logs, new
# directories. Counted with each admitted write so that a burst of writes within one statvfs
# stays above the floor.
WRITE_OVERHEAD = 64 << 10
# The inodes a write may take: a task's and a turn's directories, task.json, meta.json,
# summary.md, index.json's temp file, an artifact, a memory's version and live file, the
# -wal and -shm of an index opened for the first time.
WRITE_INODES = 12

log = logging.getLogger("app.storage.quota")


# -- the quotas in force ----------------------------------------------------------------------
class LimitsDocument(Protocol):
    def stamp(self) -> tuple[int, int, int]: ...


class WatchedSection(Generic[T]):
    """One kind of section of the limits document (``read`` reads them all), looked at (its
    stamp) at most once every ``check_every`` seconds; ``what`` names them in the log."""

    def __init__(
        self,
        document: LimitsDocument | None,
        read: Callable[[], T],
        empty: T,
        what: str,
        *,
        check_every: float = QUOTA_CHECK_EVERY,
    ) -> None:
        self.document = document
        listeners = getattr(document, "listeners", None)
        if isinstance(listeners, list):
            listeners.append(self.forget)  # a change made through this process: at once
        self.read = read
        self.what = what
        self.check_every = check_every
        self._value = empty
        self._stamp: tuple[int, int, int] | None = None
        self._next = -math.inf
        self._mutex = threading.Lock()
        self._fault: str | None = None  # why the last look failed, said once per cause

    def current(self) -> T:
        now = time.monotonic()
        if now >= self._next and self.document is not None:
            # Threads that find the look due wait for the one making it: a write admitted on
            # the sections of before would, for quotas, reserve nothing (the rate limiter
            # can skip instead).
            with self._mutex:
                if now >= self._next:
                    self._refresh(now)
        return self._value

    def _refresh(self, now: float) -> None:
        assert self.document is not None
        try:
            stamp = self.document.stamp()
            if stamp != self._stamp:
                # A document that does not parse keeps what this process had (`quota show`
                # names the fault), as the rate limiter does.
                self._value = self.read()
                self._stamp = stamp
                for fault in getattr(self._value, "skipped", ()):
                    log.warning("%s skipped, it limits nothing: %s", self.what, fault)
        except (StorageError, OSError) as exc:
            # What this process read last stays in force (nothing before its first good
            # look): a planted link or a bad disk must not stop every write.
            if str(exc) != self._fault:
                self._fault = str(exc)
                log.warning(
                    "limits document not read (%s): the %s read before stay in force%s",
                    exc,
                    self.what,
                    "" if self._stamp is not None else f" (none read yet: no {self.what} apply)",
                )
        else:
            self._fault = None
        # Only now: a thread that finds the next look not due yet takes the value without
        # the mutex, so it must be the one this look read.
        self._next = now + self.check_every

    def forget(self) -> None:
        """Read the document again at the next look (after a change made in this process)."""
        self._next = -math.inf


class QuotaDocument(LimitsDocument, Protocol):
    def quotas(self) -> Quotas: ...


class QuotaSource(WatchedSection[Quotas]):
    """The quotas of the limits document, looked at (its stamp) at most once a second."""

    def __init__(self, document: QuotaDocument | None, *, check_every: float = QUOTA_CHECK_EVERY):
        read = document.quotas if document is not None else (lambda: NO_QUOTAS)
        super().__init__(document, read, NO_QUOTAS, "quotas", check_every=check_every)

    def of(self, scope: Scope) -> tuple[QuotaOverride | None, QuotaOverride | None]:
        # A private space answers to its project's settings (here and below): it is the
        # project's, kept apart, and no one may set anything for it by its name.
        team = scope.team
        return self.current().of(team.tenant, team.project)


class PricesDocument(LimitsDocument, Protocol):
    def prices(self) -> PriceSettings: ...


class PriceSource(WatchedSection[PriceSettings]):
    """The price tables of the limits document (core/ledger.py), looked at (its stamp) at
    most once a second: what a ledger read prices tokens at."""

    def __init__(self, document: PricesDocument | None, *, check_every: float = QUOTA_CHECK_EVERY):
        read = document.prices if document is not None else (lambda: NO_PRICES)
        super().__init__(document, read, NO_PRICES, "ledger prices", check_every=check_every)

    def of(self, scope: Scope) -> Mapping[str, Price]:
        return self.current().of(scope.team)


class SecretsDocument(LimitsDocument, Protocol):
    def secrets(self) -> SecretSettings: ...


class SecretPolicySource(WatchedSection[SecretSettings]):
    """The secrets sections of the limits document (core/secret_policy.py), looked at (its
    stamp) at most once a second: what a write's secrets become."""

    def __init__(
        self,
        document: SecretsDocument | None,
        *,
        default: str = DEFAULT_POLICY,
        check_every: float = QUOTA_CHECK_EVERY,
    ):
        read = document.secrets if document is not None else (lambda: NO_SETTINGS)
        super().__init__(document, read, NO_SETTINGS, "secret policies", check_every=check_every)
        self.default = default  # a project's whose policy (and its tenant's) is not set

    def of(self, scope: Scope) -> SecretPolicy:
        team = scope.team
        return self.current().of(team.tenant, team.project, self.default)


# -- the free-space floor ---------------------------------------------------------------------
_PERCENT_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*%\s*")


def parse_floor(text: object) -> tuple[int, float]:
    """``MEMORY_MIN_FREE_BYTES``: a byte count (``2GiB``) or a share of the disk (``2%``).

    Returns (bytes, fraction); one of them is 0.
    """
    if isinstance(text, str):
        match = _PERCENT_RE.fullmatch(text)
        if match:
            share = float(match.group(1)) / 100
            if not 0 <= share < 1:
                raise ValueError(f"{text!r}: a share of the disk must be below 100%")
            return 0, share
    return parse_bytes(text), 0.0


def parse_inode_floor(text: object) -> tuple[int, float]:
    """``MEMORY_MIN_FREE_INODES``: a count (``10000``) or a share of the disk's (``2%``).

    Returns (count, fraction); one of them is 0."""
    if isinstance(text, str):
        match = _PERCENT_RE.fullmatch(text)
        if match:
            share = float(match.group(1)) / 100
            if not 0 <= share < 1:
                raise ValueError(f"{text!r}: a share of the inodes must be below 100%")
            return 0, share
    try:
        count = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a count of inodes nor a share like 2%") from None
    if count < 0:
        raise ValueError(f"{text!r}: a count of inodes cannot be negative")
    return count, 0.0


class FloorReached(InsufficientStorage):
    """A write would leave less than the free-space floor on the root's disk (HTTP 507)."""


class FreeSpace:
    """Refuse writes that would leave less than the floor free on the root's filesystem.

    ``statvfs`` is trusted for ``check_every`` seconds; what this process admitted since is
    subtracted from it, so a burst of writes in that second cannot run far past the floor.
    ``measure`` is the statvfs of a path (tests inject one only where no small filesystem can
    be mounted).
    """

    def __init__(
        self,
        root: Path,
        floor: str | int = DEFAULT_MIN_FREE,
        *,
        inodes: str | int = DEFAULT_MIN_FREE_INODES,
        check_every: float = FLOOR_CHECK_EVERY,
        measure: Callable[[Path], os.statvfs_result] | None = None,
    ) -> None:
        self.root = root
        self.floor_bytes, self.floor_share = parse_floor(floor)
        self.floor_inodes, self.floor_inode_share = parse_inode_floor(inodes)
        self.check_every = check_every
        self.measure = measure or (lambda path: os.statvfs(path))
        self._mutex = threading.Lock()
        self._free = 0
        self._total = 0
        self._admitted = 0
        self._free_inodes = 0
        self._total_inodes = 0
        self._admitted_inodes = 0
        self._until = -math.inf

    def _refresh(self) -> None:
        st = self.measure(self.root)
        # f_bavail, f_favail: what a process without root's reserved share may still use.
        self._free = st.f_bavail * st.f_frsize
        self._total = st.f_blocks * st.f_frsize
        self._admitted = 0
        # 0 inodes in all: a filesystem that makes them as it goes (btrfs), with no limit.
        self._free_inodes = st.f_favail
        self._total_inodes = st.f_files
        self._admitted_inodes = 0
        self._until = time.monotonic() + self.check_every

    def forget(self) -> None:
        """Look at the disk again at the next write (something was just freed)."""
        with self._mutex:
            self._until = -math.inf

    def floor(self) -> int:
        """The floor in bytes (a share of the disk is computed from its size)."""
        with self._mutex:
            if self._total == 0:
                self._refresh_quietly()
            return max(self.floor_bytes, math.ceil(self.floor_share * self._total))

    def _refresh_quietly(self) -> None:
        try:
            self._refresh()
        except OSError:
            self._free = self._total = 0
            self._until = -math.inf

    def free(self) -> int:
        """Bytes free now (statvfs, at most ``check_every`` old, less what was admitted)."""
        with self._mutex:
            if time.monotonic() >= self._until:
                self._refresh_quietly()
            return self._free - self._admitted

    def admit(self, need: int) -> None:
        """Refuse (InsufficientStorage) a write of ``need`` bytes that would go below the floor."""
        with self._mutex:
            if time.monotonic() >= self._until:
                try:
                    self._refresh()
                except FileNotFoundError:
                    return  # no root yet: the write creating it meets the disk itself
            floor = max(self.floor_bytes, math.ceil(self.floor_share * self._total))
            free = self._free - self._admitted
            need = max(need, 0) + WRITE_OVERHEAD
            if free - need < floor:
                raise FloorReached(
                    f"the server's disk is at its free-space floor: {human_bytes(max(free, 0))}"
                    f" free, the floor is {human_bytes(floor)} and this write needs"
                    f" about {human_bytes(need)}; nothing was written. Reads and deletes"
                    " still work; writes resume once space is freed"
                )
            if self._total_inodes:
                # A disk of small files runs out of inodes with bytes to spare: every file
                # and directory a write makes takes one.
                inode_floor = max(
                    self.floor_inodes, math.ceil(self.floor_inode_share * self._total_inodes)
                )
                inodes = self._free_inodes - self._admitted_inodes
                if inodes - WRITE_INODES < inode_floor:
                    raise FloorReached(
                        f"the server's disk is at its free-space floor: {max(inodes, 0)}"
                        f" inode(s) (files and directories) free, the floor is {inode_floor}"
                        f" and a write may need {WRITE_INODES}; nothing was written. Reads and"
                        " deletes still work; writes resume once files are removed"
                    )
                self._admitted_inodes += WRITE_INODES
            self._admitted += need
