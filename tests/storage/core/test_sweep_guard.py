"""The sweep's clock guard as a rule (core/sweep.py ClockGuard, SweepClock), without a backend:
what it weighs, and what moves its reference."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from app.storage.core.sweep import DAY_US, SWEEP_CLOCK, Census, ClockGuard, SweepClock

GUARD = ClockGuard(margin_days=1.0, share=0.5)
LAST = 1_800_000_000 * 1_000_000  # the last sweep's clock (µs)


@pytest.mark.parametrize(
    ("ahead_days", "expiring", "turns", "refused"),
    [
        (31.0, 24, 24, True),  # a step past the retention: everything at once
        (31.0, 13, 25, True),  # just over half
        (31.0, 12, 24, False),  # half exactly: not more than the share
        (31.0, 2, 24, False),  # far ahead, but only what came due: a long stop of a used server
        (1.0, 24, 24, False),  # within the margin: a day of sweeps missed, whatever expires
        (0.01, 24, 24, False),  # the hourly sweep of a server in use, a burst coming due
        (-3.0, 24, 24, False),  # behind the last sweep: a step back expires nothing early
    ],
)
def test_the_rule_weighs_the_clock_against_the_last_sweep_and_the_share(
    ahead_days: float, expiring: int, turns: int, refused: bool
) -> None:
    census = Census(newest_us=LAST - DAY_US, turns=turns, expiring=expiring)
    why = GUARD.refusal(census, LAST + int(ahead_days * DAY_US), LAST)
    assert bool(why) is refused, why
    if refused:
        assert "the last sweep" in why and "--force" in why
        assert f"{expiring} of {turns} turn(s)" in why


def test_the_newest_write_does_not_vouch_for_the_clock_once_a_sweep_left_it() -> None:
    """A write made after a step is stamped with the stepped clock: with a last sweep kept,
    the newest write is not what the clock is compared with."""
    now = LAST + 31 * DAY_US
    census = Census(newest_us=now, turns=24, expiring=24)
    assert GUARD.refusal(census, now, LAST)


def test_with_no_sweep_kept_the_newest_write_is_the_reference() -> None:
    now = LAST + 31 * DAY_US
    assert GUARD.refusal(Census(newest_us=LAST, turns=24, expiring=24), now, None)
    assert "the newest write" in GUARD.refusal(Census(LAST, 24, 24), now, None)
    assert not GUARD.refusal(Census(newest_us=now, turns=24, expiring=24), now, None)
    assert not GUARD.refusal(Census(), now, None)  # nothing stored: nothing to lose


def test_a_margin_of_zero_turns_the_guard_off() -> None:
    now = LAST + 31 * DAY_US
    assert not ClockGuard(margin_days=0).refusal(Census(LAST, 24, 24), now, LAST)


class State:
    """The backend's shared state, as load_state and save_state see it."""

    def __init__(self) -> None:
        self.kept: dict[str, dict[str, Any]] = {}
        self.saves = 0

    def load(self, name: str) -> dict[str, Any] | None:
        return self.kept.get(name)

    def save(self, name: str, state: dict[str, Any]) -> None:
        self.saves += 1
        self.kept[name] = dict(state)


class Counted:
    """A backend's census that always finds the same, and remembers what it was asked."""

    def __init__(self, turns: int, expiring: int, newest_us: int = 0) -> None:
        self.found = Census(newest_us, turns, expiring)
        self.seen: list[tuple[int, int]] = []

    def __call__(self, now_us: int, since_us: int) -> Census:
        self.seen.append((now_us, since_us))
        return self.found


def test_only_a_sweep_the_guard_let_through_moves_the_reference() -> None:
    state = State()
    clock = SweepClock(state.load, state.save)
    assert clock.last_us() is None
    quiet = Counted(turns=24, expiring=0)
    assert clock.admit(GUARD, quiet, LAST, dry_run=False, force=False) == ""
    assert clock.last_us() == LAST
    stepped = LAST + 31 * DAY_US
    everything = Counted(turns=24, expiring=24, newest_us=LAST)
    assert clock.admit(GUARD, everything, stepped, dry_run=False, force=False)
    assert everything.seen == [(stepped, LAST)]  # counted against the last sweep
    assert clock.last_us() == LAST  # refused: no evidence of the clock
    assert clock.admit(GUARD, everything, stepped, dry_run=True, force=False)
    assert clock.admit(GUARD, everything, stepped, dry_run=False, force=True) == ""
    assert clock.last_us() == LAST  # forced: a person's choice, not the guard's
    assert clock.admit(GUARD, quiet, LAST + DAY_US, dry_run=True, force=False) == ""
    assert clock.last_us() == LAST  # a dry run changes nothing
    assert clock.admit(GUARD, quiet, stepped, dry_run=False, force=False) == ""
    assert clock.last_us() == stepped
    assert state.kept[SWEEP_CLOCK]["last"].startswith("2027-")


def test_a_start_keeps_the_newest_write_only_when_nothing_is_kept() -> None:
    state = State()
    clock = SweepClock(state.load, state.save)
    clock.start(LAST, Counted(turns=3, expiring=0, newest_us=LAST - DAY_US))
    assert clock.last_us() == LAST - DAY_US
    clock.start(LAST + 31 * DAY_US, Counted(turns=3, expiring=3, newest_us=LAST))
    assert clock.last_us() == LAST - DAY_US  # a later start, stepped or not, keeps it
    other = State()
    empty = SweepClock(other.load, other.save)
    empty.start(LAST, Counted(turns=0, expiring=0))
    assert empty.last_us() == LAST  # an empty root: the start's own clock


@pytest.mark.parametrize("kept", [None, {}, {"last_us": "soon"}, {"last_us": True}, {"last_us": 0}])
def test_a_kept_clock_that_is_not_a_time_counts_as_none(kept: dict[str, Any] | None) -> None:
    state = State()
    if kept is not None:
        state.kept[SWEEP_CLOCK] = kept
    assert SweepClock(state.load, state.save).last_us() is None


def test_a_full_disk_does_not_stop_the_sweep_that_would_free_it() -> None:
    state = State()

    def full(name: str, kept: dict[str, Any]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    clock = SweepClock(state.load, full)
    assert clock.admit(GUARD, Counted(turns=24, expiring=2), LAST, dry_run=False, force=False) == ""
    assert clock.last_us() is None  # kept by the next sweep that has room

    def denied(name: str, kept: dict[str, Any]) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError):
        SweepClock(state.load, denied).admit(
            GUARD, Counted(turns=24, expiring=2), LAST, dry_run=False, force=False
        )
