"""What a retention sweep did (or, in a dry run, would do), the same for every backend: the
tasks' part (expired turns, emptied tasks, leftovers), the memory stores' part (versions past
their retention) and the two together, as the CLI prints them and the sweeper records them."""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(frozen=True, slots=True)
class Census:
    """What the turns of a whole backend say about the clock: the newest write (µs since the
    epoch, 0 for none), how many turns there are, and how many expire at ``now``."""

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
    """The sweep refuses to remove more than ``share`` of the turns while the clock is more
    than ``margin_days`` ahead of the newest write (``MEMORY_SWEEP_CLOCK_MARGIN_DAYS``,
    ``MEMORY_SWEEP_CLOCK_SHARE``; a margin of 0 turns it off).

    Nothing else compares the clock with what is stored: a clock stepped forward past the
    retention would have the next sweep delete everything, for good. Turns written every
    day expire a few at a time; most of them at once, with nothing written for days, is
    what a jumped clock looks like (or a root nobody wrote to since: ``sweep --force``)."""

    margin_days: float = 1.0
    share: float = 0.5

    def refusal(self, census: Census, now_us: int) -> str:
        """Why a sweep at ``now_us`` must not run ("" when it may)."""
        if self.margin_days <= 0 or not census.turns or not census.newest_us:
            return ""
        ahead_us = now_us - census.newest_us
        if ahead_us <= self.margin_days * DAY_US or census.expiring <= self.share * census.turns:
            return ""
        return (
            f"the clock is {ahead_us / DAY_US:.1f} day(s) ahead of the newest write, and"
            f" {census.expiring} of {census.turns} turn(s) would expire at once (more than"
            f" {self.share:.0%}): a clock stepped forward looks like this. Check the clock;"
            " if it is right, run `flask --app wsgi sweep --force`"
        )


DEFAULT_CLOCK_GUARD = ClockGuard()
