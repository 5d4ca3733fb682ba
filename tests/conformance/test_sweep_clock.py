"""The sweep's guard against a clock stepped forward, on every backend (core/sweep.py
ClockGuard): the clock is compared with the last sweep the guard let through, so writes made
after a step do not open the sweep; turns that come due as days pass are swept without
``--force``. The same with a real gunicorn and libfaketime: tests/robust/test_clock_step.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.storage.core.names import Scope
from app.storage.interface import StorageBackend
from tests.conformance.conftest import Factory, all_tasks
from tests.conftest import T0, FixedClock


def _twelve_tasks(backend: StorageBackend, scope: Scope) -> None:
    for n in range(12):
        for turn in (0, 1):
            backend.tasks.put_turn(scope, f"task-{n}", turn, meta={}, summary_md=f"{n}/{turn}")


def _stored_expired(backend: StorageBackend, clock: FixedClock) -> int:
    """The expired turns still stored (a forced dry run counts them and changes nothing)."""
    return backend.sweep(now=clock(), dry_run=True, force=True).tasks.turns


def test_writes_after_a_step_forward_do_not_open_the_sweep(
    backend: StorageBackend, scope: Scope, clock: FixedClock
) -> None:
    _twelve_tasks(backend, scope)
    assert not backend.sweep(now=clock()).refused  # the hourly sweep before the step
    clock.advance(days=31)
    backend.tasks.put_turn(scope, "next", 0, meta={}, summary_md="an agent's next Stop hook")
    outcome = backend.sweep(now=clock())
    assert "clock" in outcome.refused and "--force" in outcome.refused, outcome.refused
    assert "24 of 24 turn(s)" in outcome.refused  # the write after the step is not counted
    assert outcome.tasks.turns == 0 and outcome.tasks.tasks == 0
    assert backend.sweep(now=clock(), dry_run=True).refused
    for n in range(40):  # a server in use goes on writing: more than was stored before
        backend.tasks.put_turn(scope, f"after-{n}", 0, meta={}, summary_md="")
        clock.advance(minutes=30)
    assert backend.sweep(now=clock()).refused
    assert _stored_expired(backend, clock) == 24
    clock.set(T0 + timedelta(hours=2))  # the clock is put right: everything is back
    assert not backend.sweep(now=clock()).refused
    assert sorted(all_tasks(backend.tasks, scope)) == sorted(
        [f"task-{n}" for n in range(12)] + ["next"] + [f"after-{n}" for n in range(40)]
    )


@pytest.mark.all_backends
def test_a_step_before_the_first_sweep_is_guarded_from_the_servers_start(
    make_backend: Factory, scope: Scope, clock: FixedClock
) -> None:
    first = make_backend()
    first.mark_sweep_clock(clock())  # the first start, on an empty root
    _twelve_tasks(first, scope)
    clock.advance(days=31)
    restarted = make_backend()  # started again under the stepped clock
    restarted.mark_sweep_clock(clock())  # keeps what the first start kept
    restarted.tasks.put_turn(scope, "next", 0, meta={}, summary_md="")
    outcome = restarted.sweep(now=clock())
    assert "clock" in outcome.refused and outcome.tasks.turns == 0, outcome.refused
    assert _stored_expired(restarted, clock) == 24
    forced = restarted.sweep(now=clock(), force=True)  # the clock is right: a person says so
    assert not forced.refused and forced.tasks.turns == 24 and forced.tasks.tasks == 12
    assert all_tasks(restarted.tasks, scope) == ["next"]
    assert not restarted.sweep(now=clock() + timedelta(hours=1)).refused


@pytest.mark.all_backends
def test_turns_coming_due_as_days_pass_are_swept_without_force(
    make_backend: Factory, scope: Scope, clock: FixedClock
) -> None:
    """A 6-day retention; two turns every 12 hours and a sweep 6 hours later, for 9 days;
    the server is stopped for 1.5 days in the middle (2 days between two sweeps, past the
    margin: what came due meanwhile, a fifth of what was stored, goes at once). Nothing is
    refused, and every turn goes in the sweep after it comes due."""
    backend = make_backend(RETENTION_DAYS=6.0)
    removed = 0
    stopped = range(10, 13)
    for half_day in range(18):
        backend.tasks.put_turn(scope, f"day-{half_day}", 0, meta={}, summary_md="")
        backend.tasks.put_turn(scope, f"day-{half_day}", 1, meta={}, summary_md="")
        clock.advance(hours=6)
        if half_day not in stopped:
            outcome = backend.sweep(now=clock())
            assert not outcome.refused, (half_day, outcome.refused)
            removed += outcome.tasks.turns
            assert _stored_expired(backend, clock) == 0
        clock.advance(hours=6)
    # The last sweep ran 8.75 days in: what was written on half-days 0..5 (more than 6
    # days before) went, the rest is kept.
    assert removed == 2 * 6
    clock.set(T0 + timedelta(days=8.75))
    assert len(all_tasks(backend.tasks, scope)) == 12


def test_a_root_no_sweep_ran_on_for_longer_than_the_retention_asks_for_force(
    backend: StorageBackend, scope: Scope, clock: FixedClock
) -> None:
    """What this guard costs: a server stopped for longer than the retention looks like a
    step, and a person says which it was."""
    _twelve_tasks(backend, scope)
    assert not backend.sweep(now=clock()).refused
    clock.advance(days=40)
    assert backend.sweep(now=clock()).refused
    assert backend.sweep(now=clock(), force=True).tasks.turns == 24
    backend.tasks.put_turn(scope, "new", 0, meta={}, summary_md="")
    assert not backend.sweep(now=clock()).refused  # nothing expired left: the clock is kept
    clock.advance(days=2)
    assert not backend.sweep(now=clock()).refused
