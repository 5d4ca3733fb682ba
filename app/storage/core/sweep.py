"""What a retention sweep did (or, in a dry run, would do), the same for every backend: the
tasks' part (expired turns, emptied tasks, leftovers), the memory stores' part (versions past
their retention) and the two together, as the CLI prints them and the sweeper records them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.storage.core.clock import iso_us
from app.storage.core.files import is_no_space


@dataclass(frozen=True, slots=True)
class VersionSweep:
    """What a version sweep removed (or, in a dry run, would remove)."""

    stores_scanned: int = 0
    versions_removed: int = 0
    bytes_removed: int = 0
    errors: tuple[str, ...] = ()
    links: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        return {
            "stores_scanned": self.stores_scanned,
            "versions_removed": self.versions_removed,
            "bytes_removed": self.bytes_removed,
            "errors": list(self.errors),
            "links": list(self.links),
        }


@dataclass(frozen=True, slots=True)
class ProjectSweep:
    """What one project lost (or, in a dry run, would lose)."""

    tenant: str
    project: str
    turns: int
    tasks: int
    bytes: int


@dataclass(frozen=True, slots=True)
class SweepReport:
    now: str
    dry_run: bool
    projects: tuple[ProjectSweep, ...] = ()
    temp_files: int = 0
    leftovers: int = 0
    leftover_bytes: int = 0
    trash_entries: int = 0
    errors: tuple[str, ...] = field(default=())
    # Symlinks met under the root, relative to it: logged, skipped, never followed.
    links: tuple[str, ...] = field(default=())

    @property
    def turns(self) -> int:
        return sum(p.turns for p in self.projects)

    @property
    def tasks(self) -> int:
        return sum(p.tasks for p in self.projects)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.projects) + self.leftover_bytes

    def to_dict(self) -> dict[str, object]:
        return {
            "now": self.now,
            "dry_run": self.dry_run,
            "turns": self.turns,
            "tasks": self.tasks,
            "bytes": self.bytes,
            "temp_files": self.temp_files,
            "leftovers": self.leftovers,
            "trash_entries": self.trash_entries,
            "projects": [
                {
                    "tenant": p.tenant,
                    "project": p.project,
                    "turns": p.turns,
                    "tasks": p.tasks,
                    "bytes": p.bytes,
                }
                for p in self.projects
            ],
            "errors": list(self.errors),
            "links": list(self.links),
        }


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    """One retention sweep of both engines (``refused``: why it removed nothing at all)."""

    tasks: SweepReport
    versions: VersionSweep
    refused: str = ""

    @property
    def errors(self) -> tuple[str, ...]:
        return self.tasks.errors + self.versions.errors

    def to_dict(self) -> dict[str, object]:
        return {
            **self.tasks.to_dict(),
            "memory_store_versions": self.versions.to_dict(),
            "refused": self.refused or None,
        }

    def lines(self) -> list[str]:
        """What a person reads after ``flask --app wsgi sweep``."""
        t, v = self.tasks, self.versions
        if self.refused:
            return [f"sweep as of {t.now}: refused, nothing removed: {self.refused}"]
        verb = "would remove" if t.dry_run else "removed"
        out = [f"sweep as of {t.now}{' (dry run: nothing changed)' if t.dry_run else ''}"]
        out += [
            f"  {p.tenant}/{p.project}: {verb} {p.turns} turn(s), {p.tasks} task(s), "
            f"{p.bytes} byte(s)"
            for p in t.projects
        ]
        out.append(
            f"total: {verb} {t.turns} turn(s), {t.tasks} task(s), {t.bytes} byte(s); "
            f"{t.temp_files} stale temp file(s), {t.leftovers} leftover(s); "
            f"{t.trash_entries} unfinished deletion(s) completed"
        )
        out.append(
            f"memory stores: {verb} {v.versions_removed} version(s), {v.bytes_removed} byte(s)"
            f" from {v.stores_scanned} store(s)"
        )
        out += [f"link (never followed): {link}" for link in (*t.links, *v.links)]
        return out


# -- a clock that jumped -------------------------------------------------------------------------
DAY_US = 86_400_000_000

# The backend's shared state (StorageBackend.load_state) that keeps the last sweep's clock:
# the tree's <root>/.sweep-clock.json, a row on PostgreSQL.
SWEEP_CLOCK = "sweep-clock"


@dataclass(frozen=True, slots=True)
class Census:
    """What the turns of a whole backend say about the clock at ``now``, against ``since``
    (the clock of the last sweep): the newest write at or before ``since`` (µs since the
    epoch, 0 for none), the turns that were stored by then or expire at ``now``, and how
    many expire at ``now``.

    A live turn written after ``since`` is not counted: under a clock stepped forward it is
    a write made after the step, and enough of them would make the expiring share look
    small."""

    newest_us: int = 0
    turns: int = 0
    expiring: int = 0

    def __add__(self, other: Census) -> Census:
        return Census(
            max(self.newest_us, other.newest_us),
            self.turns + other.turns,
            self.expiring + other.expiring,
        )


@dataclass(frozen=True, slots=True)
class ClockGuard:
    """The sweep removes nothing when the clock is more than ``margin_days`` ahead of the
    last sweep and more than ``share`` of the turns stored then would expire at once
    (``MEMORY_SWEEP_CLOCK_MARGIN_DAYS``, ``MEMORY_SWEEP_CLOCK_SHARE``; a margin of 0 turns
    it off).

    Nothing else compares the clock with what is stored: a clock stepped forward past the
    retention would have the next sweep delete everything, for good. The reference is the
    clock of the last sweep the guard let through (:class:`SweepClock`), never a write:
    the first write after a step is stamped with the stepped clock, and would vouch for it.
    A server in use sweeps every hour, so the clock never gets far ahead of its last sweep
    and turns expire as they come due, a few or many at once; a clock far ahead of the last
    sweep with most of what was stored expiring at once is what a step looks like (or a
    root no sweep ran on for longer than the retention: ``sweep --force``). A root no sweep
    has marked yet compares with its newest write."""

    margin_days: float = 1.0
    share: float = 0.5

    def refusal(self, census: Census, now_us: int, last_sweep_us: int | None) -> str:
        """Why a sweep at ``now_us`` must not run ("" when it may); ``census`` counted
        against ``last_sweep_us`` (against ``now_us`` when no sweep left its clock)."""
        if self.margin_days <= 0 or not census.turns:
            return ""
        if last_sweep_us is not None:
            since, what = last_sweep_us, "the last sweep"
        elif census.newest_us:
            since, what = census.newest_us, "the newest write"
        else:
            return ""
        ahead_us = now_us - since
        if ahead_us <= self.margin_days * DAY_US or census.expiring <= self.share * census.turns:
            return ""
        return (
            f"the clock is {ahead_us / DAY_US:.1f} day(s) ahead of {what} ({iso_us(since)}),"
            f" and {census.expiring} of {census.turns} turn(s) would expire at once (more than"
            f" {self.share:.0%}): a clock stepped forward looks like this. Check the clock; if"
            " it is right, run `flask --app wsgi sweep --force`"
        )


DEFAULT_CLOCK_GUARD = ClockGuard()


# A backend's census: (now_us, since_us) -> Census.
CensusOf = Callable[[int, int], Census]


class SweepClock:
    """The clock of the last sweep the guard let through, kept in the backend's shared
    state (every node, worker and CLI run reads the same one): the guard's reference.

    Only a sweep that passed the guard moves it: a refused sweep is no evidence of the
    clock, a forced one or a dry run is a person's choice (after a forced sweep nothing
    expired is left, so the next sweep passes and moves it). A server's start keeps the
    newest write, or its clock on an empty root, when nothing is kept yet: a root written
    by a server and then stepped before its first sweep is guarded too."""

    def __init__(
        self,
        load: Callable[[str], dict[str, Any] | None],
        save: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self._load = load
        self._save = save

    def last_us(self) -> int | None:
        """The clock of the last sweep (µs since the epoch), or None when none is kept."""
        state = self._load(SWEEP_CLOCK) or {}
        found = state.get("last_us")
        # bool is an int: a hand-edited `true` is not a time.
        if isinstance(found, int) and not isinstance(found, bool) and found > 0:
            return found
        return None

    def record(self, now_us: int) -> None:
        self._save(SWEEP_CLOCK, {"last_us": now_us, "last": iso_us(now_us)})

    def admit(
        self, guard: ClockGuard, census: CensusOf, now_us: int, *, dry_run: bool, force: bool
    ) -> str:
        """Why a sweep at ``now_us`` must not run (``guard``'s refusal), or "" after keeping
        ``now_us`` as the last sweep's clock (not for a dry run, nor a forced sweep)."""
        if force:
            return ""
        last = self.last_us()
        if guard.margin_days > 0:
            why = guard.refusal(census(now_us, now_us if last is None else last), now_us, last)
            if why:
                return why
        if not dry_run:
            try:
                self.record(now_us)
            except Exception as exc:
                # A full disk is when a sweep is needed most: the next sweep keeps the clock.
                if not is_no_space(exc):
                    raise
        return ""

    def start(self, now_us: int, census: CensusOf) -> None:
        """At a server's start: keep the newest write (``now_us`` on an empty root) when no
        sweep left its clock yet."""
        if self.last_us() is None:
            self.record(census(now_us, now_us).newest_us or now_us)
