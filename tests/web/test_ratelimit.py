"""Rate limits: the bucket arithmetic (on an injected clock), the shared table, the limits that
apply to a project, and the settings."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import signal
import threading
from pathlib import Path

import pytest

from app import create_app
from app.config import ConfigError
from app.storage.core.limits import RateOverride, RateOverrides
from app.storage.core.names import LIMITS_FILE
from app.storage.tree.limits import LimitsFile
from app.web import ratelimit
from app.web.ratelimit import PROBES, BucketTable, Limiter, Outcome, table as buckets


class Clock:
    """Monotonic seconds that tests move by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def limiter_for(
    tmp_path: Path,
    clock: Clock,
    *,
    rps: float = 0,
    burst: int = 0,
    upload_bps: int = 0,
    upload_burst: int = 0,
    exempt_admin: bool = True,
) -> Limiter:
    defaults = RateOverride(rps=rps, burst=burst, upload_bps=upload_bps, upload_burst=upload_burst)
    return Limiter(
        defaults,
        LimitsFile(tmp_path / "root"),
        exempt_admin=exempt_admin,
        table=BucketTable(),
        clock=clock,
    )


def admitted(outcome: Outcome | None) -> bool:
    assert outcome is not None
    return not outcome.retry_after


def ask(
    limiter: Limiter, caller: str = "tok_a", project: str = "web", upload: int | None = None
) -> Outcome | None:
    """A writer token ``caller`` asks in acme/``project``."""
    return limiter.check(caller, "writer", "acme", project, upload)


# -- the arithmetic --------------------------------------------------------------------------
def test_a_burst_then_one_request_per_interval(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=4, burst=2)  # one request per 0.25 s
    first, second, third = ask(limiter), ask(limiter), ask(limiter)
    assert admitted(first) and admitted(second) and not admitted(third)
    assert first is not None and first.items == (("project", 1, 1), ("token", 1, 1))
    assert second is not None and second.items == (("project", 0, 1), ("token", 0, 1))
    assert third is not None and third.retry_after == 1  # 0.25 s, rounded up
    assert third.items == (("project", 0, 1), ("token", 0, 1))
    clock.advance(0.25)
    assert admitted(ask(limiter)) and not admitted(ask(limiter))
    clock.advance(0.5)  # the bucket is full again: two at once
    assert [admitted(ask(limiter)) for _ in range(3)] == [True, True, False]


def test_over_a_window_the_budget_is_burst_plus_rate_times_time(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=50, burst=10)
    count = 0
    for _ in range(2000):  # 10 s, a request every 5 ms: far more than the budget
        count += admitted(ask(limiter))
        clock.advance(0.005)
    assert count in (509, 510, 511)  # 10 + 50 * 10, give or take the edges


def test_retry_after_is_the_wait_until_the_request_fits(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=0.25, burst=1)  # one request per 4 s
    assert admitted(ask(limiter))
    refused = ask(limiter)
    assert refused is not None and refused.retry_after == 4
    headers = refused.headers()
    assert headers["Retry-After"] == "4"
    assert headers["RateLimit"] == '"project";r=0;t=4, "token";r=0;t=4'
    assert headers["RateLimit-Policy"] == '"project";q=1;w=4, "token";q=1;w=4'
    clock.advance(3.5)
    refused = ask(limiter)
    assert refused is not None and refused.retry_after == 1  # 0.5 s left, rounded up
    clock.advance(0.5)
    assert admitted(ask(limiter))


def test_a_refused_request_charges_no_budget(tmp_path: Path) -> None:
    """The project is spent by one token; another token refused there keeps its own budget."""
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1, burst=2)
    assert admitted(ask(limiter, "tok_a")) and admitted(ask(limiter, "tok_a"))
    for _ in range(5):
        assert not admitted(ask(limiter, "tok_b"))  # the project's budget is spent
    # tok_b (say a tenant_admin) in another project: its own budget is still whole.
    assert admitted(ask(limiter, "tok_b", "mobile")) and admitted(ask(limiter, "tok_b", "mobile"))
    assert not admitted(ask(limiter, "tok_b", "mobile"))


def test_a_token_is_limited_across_projects(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1, burst=3)
    results = [admitted(ask(limiter, "tok_a", f"p{i}")) for i in range(4)]
    assert results == [True, True, True, False]
    refused = ask(limiter, "tok_a", "p9")
    assert refused is not None and refused.items == (("token", 0, 1),)
    assert "this token" in refused.message


def test_one_project_spent_leaves_another_alone(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1, burst=1)
    assert admitted(ask(limiter, "tok_a", "web")) and not admitted(ask(limiter, "tok_a", "web"))
    assert admitted(ask(limiter, "tok_b", "mobile"))


def received(limiter: Limiter, n: int, mine: int | None = None, caller: str = "tok_a") -> bool:
    """Charge ``n`` body bytes just read (``mine``: the request's bytes so far, n by
    default); whether the budgets still take them."""
    return limiter.charge_received(caller, "acme", "web", n, n if mine is None else mine) is None


def test_upload_bytes_are_checked_from_content_length_and_charged_as_received(
    tmp_path: Path,
) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1000, upload_bps=1024, upload_burst=4096)
    assert admitted(ask(limiter, upload=3072))
    assert admitted(ask(limiter, upload=3072))  # announced, never sent: nothing charged
    assert received(limiter, 3072)
    refused = ask(limiter, upload=2048)  # 1 KiB left; 2 KiB needs 1 s more
    assert refused is not None and refused.retry_after == 1
    assert [n for n, _, _ in refused.items] == ["project-upload", "token-upload"]
    assert "request bodies" in refused.message
    assert admitted(ask(limiter, upload=1024))
    assert admitted(ask(limiter, upload=None))  # a read or a write without a body
    clock.advance(1.0)
    assert admitted(ask(limiter, upload=1024))


def test_an_upload_over_the_burst_needs_a_full_bucket_and_overdraws_it(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1000, upload_bps=1000, upload_burst=1000)
    assert admitted(ask(limiter, upload=10)) and received(limiter, 10)
    refused = ask(limiter, upload=5000)  # bigger than the burst: only a full bucket takes it
    assert refused is not None and refused.retry_after == 1
    clock.advance(0.01)
    big = ask(limiter, upload=5000)
    assert admitted(big) and big is not None
    assert dict((n, (r, t)) for n, r, t in big.items)["project-upload"] == (0, 5)
    # Its bytes, as they come: it may overdraw the bucket by its own.
    assert all(received(limiter, 1000, mine) for mine in range(1000, 5001, 1000))
    clock.advance(3.9)  # 4 s of the 5 s borrowed are repaid; the bucket is still overdrawn
    assert not admitted(ask(limiter, upload=1))
    clock.advance(1.2)
    assert admitted(ask(limiter, upload=1000))


def test_concurrent_uploads_cannot_together_overdraw_the_burst(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1000, upload_bps=1000, upload_burst=1000)
    # Six uploads admitted on a full bucket, their bytes arriving interleaved.
    assert all(admitted(ask(limiter, f"tok_{i}", upload=0)) for i in range(6))
    taken = [received(limiter, 300, 300, f"tok_{i}") for i in range(6)]
    assert taken == [True, True, True, False, False, False]  # the project's burst is spent
    assert not received(limiter, 300, 600, "tok_0")  # nor may one go on beyond it


def test_bytes_received_without_a_length_are_charged_as_they_come(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1000, upload_bps=1000, upload_burst=1000)
    assert admitted(ask(limiter, upload=0))  # admitted while the budget is not overdrawn
    assert received(limiter, 3000)  # one request alone overdraws a full bucket
    refused = ask(limiter, upload=0)
    assert refused is not None and refused.retry_after == 2
    other_token = ask(limiter, "tok_b", upload=0)  # the project's upload budget is overdrawn too
    assert other_token is not None and other_token.retry_after == 2
    clock.advance(2.0)
    assert admitted(ask(limiter, upload=0))


def test_admin_tokens_are_exempt_unless_configured_otherwise(tmp_path: Path) -> None:
    clock = Clock()
    exempt = limiter_for(tmp_path, clock, rps=1, burst=1)
    assert all(exempt.check("tok_admin", "admin", "acme", "web", None) is None for _ in range(5))
    limited = limiter_for(tmp_path, clock, rps=1, burst=1, exempt_admin=False)
    assert admitted(limited.check("tok_admin", "admin", "acme", "web", None))
    assert not admitted(limited.check("tok_admin", "admin", "acme", "web", None))
    # tenant_admin is not admin: always limited.
    assert admitted(exempt.check("tok_t", "tenant_admin", "acme", "web", None))
    assert not admitted(exempt.check("tok_t", "tenant_admin", "acme", "web", None))


def test_no_settings_and_no_overrides_mean_no_limit(tmp_path: Path) -> None:
    limiter = limiter_for(tmp_path, Clock())
    assert all(ask(limiter, upload=1 << 30) is None for _ in range(100))


# -- the limits that apply -------------------------------------------------------------------
def test_project_entry_over_tenant_entry_over_settings(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=10, burst=20, upload_bps=1 << 20)
    limiter.file.set_rate("acme", None, RateOverride(rps=5))
    limiter.file.set_rate("acme", "web", RateOverride(rps=100, burst=150, upload_bps=0))
    web = limiter.limits("acme", "web")
    other = limiter.limits("acme", "other")
    elsewhere = limiter.limits("globex", "web")
    assert web.requests is not None and (web.requests.per_second, web.requests.burst) == (100, 150)
    assert web.upload is None  # 0 in the project's entry: no upload limit there
    # A pair comes whole from where its rate is set: the tenant's rps without a burst gets
    # one second's worth, not the settings' burst.
    assert other.requests is not None and (other.requests.per_second, other.requests.burst) == (
        5,
        5,
    )
    assert other.upload is not None and other.upload.burst == 1 << 20
    assert elsewhere.requests is not None and elsewhere.requests.burst == 20
    assert web.policy == '"project";q=150;w=2, "token";q=150;w=2'
    assert other.policy == (
        '"project";q=5;w=1, "token";q=5;w=1, '
        '"project-upload";q=1048576;w=1;qu="content-bytes", '
        '"token-upload";q=1048576;w=1;qu="content-bytes"'
    )


def test_an_override_alone_turns_limits_on(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock)
    limiter.file.set_rate("acme", "web", RateOverride(rps=1, burst=1))
    assert admitted(ask(limiter)) and not admitted(ask(limiter))
    assert ask(limiter, project="mobile") is None


def test_the_file_is_looked_at_once_a_second(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1, burst=1)
    assert admitted(ask(limiter, "tok_a", "p0"))
    limiter.file.set_rate("acme", "p1", RateOverride(rps=1, burst=3))
    clock.advance(0.5)  # the change is not seen yet: p1 still has the settings' burst of 1
    assert [admitted(ask(limiter, f"t{i}", "p1")) for i in range(2)] == [True, False]
    clock.advance(0.5)
    assert [admitted(ask(limiter, f"u{i}", "p1")) for i in range(3)] == [True, True, False]
    limiter.file.clear_rate("acme", "p1")
    clock.advance(5.0)
    assert [admitted(ask(limiter, f"v{i}", "p1")) for i in range(2)] == [True, False]


def test_a_changed_limit_keeps_how_full_a_bucket_is_not_how_long_it_is_busy(
    tmp_path: Path,
) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=50, burst=10)
    assert admitted(ask(limiter))  # the settings' limits are read now
    limiter.file.set_rate("acme", "web", RateOverride(rps=0.5, burst=4))
    clock.advance(1.0)
    assert [admitted(ask(limiter)) for _ in range(5)] == [True] * 4 + [False]
    # Four units owed at 2 s each: busy for 8 s. Back at the settings' 50/s, four units
    # owed are 0.08 s: six of the burst of ten are left at once.
    limiter.file.clear_rate("acme", "web")
    clock.advance(1.0)  # repays half a unit at 0.5/s, then the file is read again
    outcome = ask(limiter)
    assert admitted(outcome) and outcome is not None
    assert outcome.items == (("project", 5, 1), ("token", 5, 1))
    assert [admitted(ask(limiter)) for _ in range(6)] == [True] * 5 + [False]


def test_a_token_carries_its_units_between_projects_with_other_limits(tmp_path: Path) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1, burst=4)
    limiter.file.set_rate("acme", "fast", RateOverride(rps=100, burst=4))
    assert [admitted(ask(limiter, "tok_a", "fast")) for _ in range(3)] == [True] * 3
    # Three of the token's four units are spent, whichever project's limits priced them.
    assert [admitted(ask(limiter, "tok_a", "slow")) for _ in range(2)] == [True, False]


def test_a_broken_file_keeps_the_previous_overrides(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    limiter = limiter_for(tmp_path, clock)
    limiter.file.set_rate("acme", "web", RateOverride(rps=1, burst=1))
    assert admitted(ask(limiter)) and not admitted(ask(limiter))
    (tmp_path / "root" / LIMITS_FILE).write_text('{"version": 1, "projects": [1]}')
    clock.advance(60)
    with caplog.at_level(logging.ERROR, logger="app.ratelimit"):
        assert admitted(ask(limiter)) and not admitted(ask(limiter))
    assert "keeping the previous ones" in caplog.text


@pytest.mark.parametrize("now", [1000.0, 3333.3333, 3800.77])
def test_the_first_request_of_a_burst_of_one_is_admitted_whatever_the_clock_reads(
    tmp_path: Path, now: float
) -> None:
    # One request per 1000 s: the charge lands exactly on the limit, and ``now + 1000 - now``
    # rounds above 1000 for about half the clock values whose sum crosses a power of two
    # (3333.3333 and 3800.77 do: a machine up for about an hour).
    clock = Clock()
    clock.now = now
    limiter = limiter_for(tmp_path, clock, rps=0.001, burst=1)
    assert [admitted(ask(limiter, f"t{i}")) for i in range(2)] == [True, False]


def test_a_bad_entry_in_the_file_limits_nothing_and_stops_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry no change could write (a file edited by hand) is skipped and logged; every
    other project is limited as the file says, and later changes still apply."""
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1000, burst=1000)
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / LIMITS_FILE).write_text(
        '{"version": 1, "projects": {"acme/bad": {"rate": {"rps": 1e-320}},'
        ' "acme/worse": {"rate": {"rps": 1e-300}}, "acme/p1": {"rate": {"rps": 1, "burst": 1}}}}'
    )
    with caplog.at_level(logging.ERROR, logger="app.ratelimit"):
        assert [admitted(ask(limiter, "a", "p1")) for _ in range(2)] == [True, False]
        for project in ("bad", "worse", "other"):  # the settings' limits
            assert all(admitted(ask(limiter, "b", project)) for _ in range(5)), project
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2 and all("refill" in m for m in skipped), skipped
    limiter.file.set_rate("acme", "p2", RateOverride(rps=1, burst=2))
    clock.advance(5.0)
    assert [admitted(ask(limiter, "c", "p2")) for _ in range(3)] == [True, True, False]
    limiter.file.set_rate("acme", "bad", RateOverride(rps=1, burst=1))  # replaces the bad one
    clock.advance(5.0)
    assert [admitted(ask(limiter, "d", "bad")) for _ in range(2)] == [True, False]


def test_limits_that_cannot_be_computed_fall_back_for_their_project_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The last line: overrides that got past every check of the document (here built by
    hand) fail only their own project, which falls back to the next level."""
    clock = Clock()
    limiter = limiter_for(tmp_path, clock, rps=1000, burst=1000)
    assert admitted(ask(limiter, "z"))  # the file (none) is read now, not over what follows
    overrides = RateOverrides(
        {"acme": RateOverride(rps=2, burst=2)},
        {
            ("acme", "bad"): RateOverride(rps=1e-320),
            ("acme", "web"): RateOverride(rps=1, burst=1),
        },
    )
    with caplog.at_level(logging.ERROR, logger="app.ratelimit"):
        limiter._install(overrides)
    assert "project acme/bad not applied" in caplog.text
    assert limiter.limits("acme", "bad").describe() == "2 requests/s, burst 2"  # the tenant's
    assert limiter.limits("acme", "web").describe() == "1 requests/s, burst 1"
    assert [admitted(ask(limiter, "e", "bad")) for _ in range(3)] == [True, True, False]


# -- the table -------------------------------------------------------------------------------
def test_keys_on_the_same_slot_keep_their_own_buckets() -> None:
    table = BucketTable(slots=64)
    a, b = 5, 5 + 64  # the same first slot
    assert table.take([(a, 1.0, 1.0, 2.0)], 0.0) == [1.0]
    assert table.take([(b, 1.0, 1.0, 2.0)], 0.0) == [1.0]
    assert table.take([(a, 1.0, 1.0, 2.0)], 0.0) == [2.0]
    assert table.take([(a, 1.0, 1.0, 2.0)], 0.0) == [3.0]  # refused: stored time stays 2.0
    assert table.take([(b, 1.0, 0.0, 2.0)], 0.0) == [1.0]
    assert table.take([(a, 1.0, 0.0, 2.0)], 0.0) == [2.0]


def test_the_keys_of_one_request_never_share_a_slot() -> None:
    table = BucketTable(slots=64)
    keys = [7, 7 + 64, 7 + 128, 7 + 192]  # four new keys starting on the same slot
    table.take([(k, 1.0, 1.0, 5.0) for k in keys], 0.0)
    assert [table.take([(k, 1.0, 0.0, 5.0)], 0.0)[0] for k in keys] == [1.0, 1.0, 1.0, 1.0]


def test_a_slot_given_to_a_new_key_is_not_also_kept_by_its_old_key() -> None:
    """A's entry has expired, so B (new, same first slot) takes that slot; A, charged in the
    same call, must then get a slot of its own rather than share B's."""
    table = BucketTable(slots=64)
    a, b = 5, 5 + 64
    table.take([(a, 1.0, 1.0, 9.0)], 0.0)  # A's bucket is full again from t=1 on
    table.take([(b, 1.0, 1.0, 9.0), (a, 1.0, 2.0, 9.0)], 10.0)
    assert table.take([(b, 1.0, 0.0, 9.0)], 10.0) == [11.0]
    assert table.take([(a, 1.0, 0.0, 9.0)], 10.0) == [12.0]


def test_a_full_neighbourhood_gives_up_the_bucket_nearest_to_full() -> None:
    table = BucketTable(slots=PROBES)
    size = len(table._map)
    for k in range(1, PROBES + 1):  # every slot holds a live bucket, key k busy until k
        table.take([(k, 1.0, float(k), 1e9)], 0.0)
    table.take([(99, 1.0, 5.0, 1e9)], 0.0)  # no free slot: key 1 (nearest to full) gives way
    assert table.take([(1, 1.0, 0.0, 1e9)], 0.0) == [0.0]  # key 1 starts again from full
    assert table.take([(PROBES, 1.0, 0.0, 1e9)], 0.0) == [float(PROBES)]
    assert table.take([(99, 1.0, 0.0, 1e9)], 0.0) == [5.0]
    assert len(table._map) == size


def test_expired_buckets_make_room_for_new_keys() -> None:
    table = BucketTable(slots=PROBES)
    for k in range(1, PROBES + 1):
        table.take([(k, 1.0, 1.0, 1e9)], 0.0)
    for k in range(100, 100 + PROBES):  # an hour later every old bucket is full again
        assert table.take([(k, 1.0, 1.0, 1e9)], 3600.0) == [3601.0]
    assert table.take([(100, 1.0, 0.0, 1e9)], 3600.0) == [3601.0]


def _hammer(table: BucketTable, start: multiprocessing.synchronize.Event, takes: int) -> None:
    def run() -> None:
        for _ in range(takes):
            table.take([(12345, 1.0, 1.0, 1e12)], 0.0)

    workers = [threading.Thread(target=run) for _ in range(2)]
    start.wait(10)
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_forked_processes_share_one_table_and_lose_no_update() -> None:
    """4 processes x 2 threads each add 1.0 to one bucket 5000 times: it ends at 40000.0."""
    table = BucketTable()
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_hammer, args=(table, start, 5000)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()  # all at once, so that they overlap
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert table.take([(12345, 1.0, 0.0, 1e12)], 0.0) == [40000.0]


def _hold_the_lock(table: BucketTable, ready: multiprocessing.synchronize.Event) -> None:
    with table.locked():
        ready.set()
        signal.pause()


def test_a_worker_killed_holding_the_lock_does_not_stop_the_others() -> None:
    table = BucketTable()
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_the_lock, args=(table, ready))
    holder.start()
    try:
        assert ready.wait(10)
        done: list[float] = []
        taker = threading.Thread(
            target=lambda: done.extend(table.take([(1, 1.0, 1.0, 9.0)], 0.0)), daemon=True
        )
        taker.start()
        taker.join(0.2)
        assert taker.is_alive()  # the lock is held in the other process
    finally:
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
    taker.join(5)
    assert not taker.is_alive() and done == [1.0]


def test_apps_made_after_share_across_workers_share_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(buckets, "_shared", None)
    ratelimit.share_across_workers()
    config = {
        "STORAGE_ROOT": str(tmp_path / "root"),
        "TOKENS_FILE": str(tmp_path / "tokens.json"),
        "RATE_LIMIT_RPS": 1,
        "RATE_LIMIT_BURST": 1,
    }
    first, second = create_app(config), create_app(config)
    one, two = first.extensions["rate_limiter"], second.extensions["rate_limiter"]
    assert one.table() is two.table() is buckets._shared
    assert admitted(one.check("tok_a", "writer", "acme", "web", None))
    assert not admitted(two.check("tok_a", "writer", "acme", "web", None))


def test_without_the_hook_each_app_has_a_table_of_its_own(tmp_path: Path) -> None:
    config = {
        "STORAGE_ROOT": str(tmp_path / "root"),
        "TOKENS_FILE": str(tmp_path / "tokens.json"),
        "RATE_LIMIT_RPS": 1,
    }
    one = create_app(config).extensions["rate_limiter"]
    two = create_app(config).extensions["rate_limiter"]
    assert one.table() is not two.table()


def test_a_claimed_length_past_the_route_limit_is_refused_without_a_charge(
    tmp_path: Path,
) -> None:
    app = create_app(
        {
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "RATE_LIMIT_UPLOAD_BPS": 1000,
            "RATE_LIMIT_UPLOAD_BURST": 1000,
        }
    )
    _, secret = app.extensions["token_registry"].create(role="writer", tenant="acme", project="web")
    client, auth = app.test_client(), {"Authorization": f"Bearer {secret}"}
    url = "/sandbox/memory/v1/tasks/t/turns/0"
    r = client.put(url, headers=auth, json={})  # 2 bytes of the 1,000
    assert r.status_code in (200, 201), r.json
    for route, claimed in [(f"{url}/artifacts/a.bin", 10**23), (url, (4 << 20) + 1)]:
        r = client.put(
            route,
            headers=auth,
            data=b"{}",
            content_type="application/octet-stream",
            environ_overrides={"CONTENT_LENGTH": str(claimed)},
        )
        assert r.status_code == 413, (route, r.json)
    # Both budgets are (nearly) whole: 998 bytes are admitted at once.
    r = client.put(
        f"{url}/artifacts/b.bin",
        headers=auth,
        data=b"x" * 998,
        content_type="application/octet-stream",
    )
    assert r.status_code == 200, r.json


# -- settings ----------------------------------------------------------------------------------
def test_settings_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_STORAGE_ROOT", str(tmp_path / "r"))
    monkeypatch.setenv("MEMORY_TOKENS_FILE", str(tmp_path / "t.json"))
    monkeypatch.setenv("MEMORY_RATE_LIMIT_RPS", "2.5")
    monkeypatch.setenv("MEMORY_RATE_LIMIT_BURST", "10")
    monkeypatch.setenv("MEMORY_RATE_LIMIT_UPLOAD_BPS", "10MiB")
    monkeypatch.setenv("MEMORY_RATE_LIMIT_UPLOAD_BURST", "52428800")
    monkeypatch.setenv("MEMORY_RATE_LIMIT_EXEMPT_ADMIN", "false")
    app = create_app()
    assert app.config["RATE_LIMIT_RPS"] == 2.5
    assert app.config["RATE_LIMIT_UPLOAD_BPS"] == 10 << 20
    assert app.config["RATE_LIMIT_UPLOAD_BURST"] == 50 << 20
    limits = app.extensions["rate_limiter"].limits("acme", "web")
    assert limits.requests.per_second == 2.5 and limits.requests.burst == 10
    assert limits.upload.per_second == 10 << 20 and limits.upload.burst == 50 << 20
    assert app.extensions["rate_limiter"].exempt_admin is False


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RATE_LIMIT_RPS", "-1"),
        ("RATE_LIMIT_RPS", "fast"),
        ("RATE_LIMIT_RPS", "Infinity"),
        ("RATE_LIMIT_RPS", "1e-320"),  # the ranges of an override: it would never refill
        ("RATE_LIMIT_RPS", "2e6"),
        ("RATE_LIMIT_BURST", "-3"),
        ("RATE_LIMIT_UPLOAD_BPS", "10XB"),
        ("RATE_LIMIT_UPLOAD_BURST", "-1"),
        ("RATE_LIMIT_EXEMPT_ADMIN", "maybe"),
    ],
)
def test_bad_settings_stop_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv("MEMORY_STORAGE_ROOT", str(tmp_path / "r"))
    monkeypatch.setenv("MEMORY_TOKENS_FILE", str(tmp_path / "t.json"))
    monkeypatch.setenv(f"MEMORY_{name}", value)
    with pytest.raises(ConfigError, match=f"MEMORY_{name}"):
        create_app()


@pytest.mark.parametrize("burst", ["RATE_LIMIT_BURST", "RATE_LIMIT_UPLOAD_BURST"])
def test_a_burst_without_its_rate_stops_the_start(tmp_path: Path, burst: str) -> None:
    with pytest.raises(ConfigError, match=f"MEMORY_{burst} is set"):
        create_app(
            {
                "STORAGE_ROOT": str(tmp_path / "r"),
                "TOKENS_FILE": str(tmp_path / "t.json"),
                burst: 100,
            }
        )


def test_policy_windows_are_whole_seconds(tmp_path: Path) -> None:
    limiter = limiter_for(tmp_path, Clock(), rps=3, burst=5)
    limits = limiter.limits("acme", "web")
    assert limits.requests is not None and math.isclose(limits.requests.window, 5 / 3)
    assert limits.policy == '"project";q=5;w=2, "token";q=5;w=2'
