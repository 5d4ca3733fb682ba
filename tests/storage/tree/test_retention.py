"""The retention sweep on real files, with an injected clock (no time patching)."""

from __future__ import annotations

import io
import multiprocessing
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from app.storage.core.clock import parse_iso, to_us
from app.storage.core.digest import Section
from app.storage.core.errors import NotFound
from app.storage.core.names import TMP_PREFIX, Scope
from app.storage.tree.fs.txn import Key
from app.storage.tree.fsck import fsck
from app.storage.tree.retention import sweep
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.tasks import TaskStore
from tests.conftest import T0, FixedClock
from tests.storage._helpers import snapshot

DAY = timedelta(days=1)
SECOND = timedelta(seconds=1)


def put(store: TaskStore, scope: Scope, task: str, turn: int, text: str = "s") -> str:
    record = store.put_turn(scope, task, turn, meta={"n": turn}, summary_md=text, actor="tok")
    return record.retain_until


def digest(store: TaskStore, scope: Scope) -> str:
    fh, _ = store.open_digest(scope)
    with fh:
        return fh.read().decode()


def listed(store: TaskStore, scope: Scope) -> list[str]:
    return [t.task_id for t in store.list_tasks(scope, limit=100).tasks]


def test_boundary_one_second_before_nothing_goes_at_and_after_it_does(
    store: TaskStore, clock: FixedClock, scope: Scope
) -> None:
    deadline = parse_iso(put(store, scope, "old", 0, "old summary"))
    store.put_artifact(
        scope, "old", 0, "blob.bin", io.BytesIO(b"x" * 5000), content_type="text/plain"
    )
    deadline = parse_iso(store.get_turn(scope, "old", 0).retain_until)
    clock.advance(days=10)
    put(store, scope, "mixed", 0, "mixed zero")
    keep_until = parse_iso(put(store, scope, "keep", 0, "keep summary"))
    clock.set(deadline - SECOND)
    put(store, scope, "mixed", 1, "mixed one")
    old_dir = store.layout.task_dir(scope, "old")

    report = sweep(store, now=deadline - SECOND)
    assert report.turns == 0 and report.tasks == 0
    assert (old_dir / "0000-turn" / "artifacts" / "blob.bin").exists()
    assert "old summary" in digest(store, scope)

    clock.set(deadline)
    report = sweep(store, now=deadline)
    assert (report.turns, report.tasks) == (1, 1)
    assert report.bytes >= 5000
    assert [(p.tenant, p.project, p.turns, p.tasks) for p in report.projects] == [
        ("acme", "web", 1, 1)
    ]
    assert not old_dir.exists()
    assert "old" not in listed(store, scope)
    assert "old summary" not in digest(store, scope)
    assert "## keep" in digest(store, scope)
    rows, count = Listing(store.layout.listing(scope), timeout=1).all_tasks()
    assert "old" not in rows and count == len(rows) == 2

    # At the other deadline, "mixed" loses turn 0 only and keeps the task.
    mixed_deadline = keep_until
    clock.set(mixed_deadline + SECOND)
    report = sweep(store, now=mixed_deadline + SECOND)
    assert (report.turns, report.tasks) == (2, 1)  # keep/0 (whole task) and mixed/0
    assert not store.layout.task_dir(scope, "keep").exists()
    mixed = store.get_task(scope, "mixed")
    assert [t.turn for t in mixed.turns] == [1]
    assert not store.layout.turn_dir(scope, "mixed", 0).exists()
    text = digest(store, scope)
    assert "mixed one" in text and "keep summary" not in text
    assert listed(store, scope) == ["mixed"]
    assert fsck(store).clean


def test_turn_rewritten_just_before_deadline_survives(
    store: TaskStore, clock: FixedClock, scope: Scope
) -> None:
    deadline = parse_iso(put(store, scope, "t", 0, "first"))
    clock.set(deadline - SECOND)
    put(store, scope, "t", 0, "rewritten")
    report = sweep(store, now=deadline + SECOND)
    assert report.turns == 0
    assert store.get_turn(scope, "t", 0).summary_md == "rewritten"


def test_decision_is_taken_from_the_record_under_the_lock(
    store: TaskStore, clock: FixedClock, scope: Scope
) -> None:
    """A listing row that still says "expired" (the race: the rewrite landed after the
    candidate query) does not delete a turn whose record was refreshed."""
    deadline = parse_iso(put(store, scope, "t", 0, "first"))
    clock.set(deadline - SECOND)
    put(store, scope, "t", 0, "rewritten")
    stale = TurnRow(0, 1, to_us(deadline))
    section = Section(0, to_us(deadline), b"\n## t\n\nLatest turn: 0\n\n")
    Listing(store.layout.listing(scope), timeout=1).put_turn("t", stale, section)
    Listing(store.layout.listing(scope), timeout=1).set_task("t", [stale], section)
    report = sweep(store, now=deadline + SECOND)
    assert report.turns == 0
    assert store.get_turn(scope, "t", 0).summary_md == "rewritten"
    # The task was looked at under its lock, so its listing rows came back from the records.
    rows, _ = Listing(store.layout.listing(scope), timeout=1).all_tasks()
    assert rows["t"][0].retain_until_us > stale.retain_until_us
    assert fsck(store).clean


def test_a_sweep_killed_after_the_rename_is_completed_by_the_next_run(
    store: TaskStore, clock: FixedClock, scope: Scope, monkeypatch: pytest.MonkeyPatch
) -> None:
    deadline = parse_iso(put(store, scope, "a", 0, "aa"))
    put(store, scope, "a", 1, "ab")
    clock.set(deadline - SECOND)
    put(store, scope, "a", 1, "ab again")  # turn 1 lives on, turn 0 expires
    clock.set(deadline)

    def die(*args: object, **kwargs: object) -> None:
        raise SystemExit("killed")  # like SIGKILL: no cleanup code of ours runs after it

    # Killed inside the task lock, right after the turn was renamed into the trash and
    # before the derived files were rebuilt (the repair on the way out dies too).
    monkeypatch.setattr(store, "repair_task", die)
    with pytest.raises(SystemExit):
        sweep(store, now=deadline)
    monkeypatch.undo()

    trash = store.layout.trash_dir()
    assert any(trash.iterdir()), "the killed sweep left its trash"
    assert store.txns.is_pending(Key(scope, "a"))
    assert not store.layout.turn_dir(scope, "a", 0).exists()
    with pytest.raises(NotFound):
        store.get_turn(scope, "a", 0)  # nothing half-visible
    assert not fsck(store).clean  # the stale index and the write in flight are visible to fsck

    report = sweep(store, now=deadline, grace=timedelta(0))  # its trash is young by the wall
    assert report.trash_entries >= 1
    assert not any(trash.iterdir())
    assert not store.txns.is_pending(Key(scope, "a"))
    assert [t.turn for t in store.get_task(scope, "a").turns] == [1]
    assert fsck(store).clean


def test_a_sweep_killed_before_emptying_the_trash(
    store: TaskStore, clock: FixedClock, scope: Scope, monkeypatch: pytest.MonkeyPatch
) -> None:
    deadline = parse_iso(put(store, scope, "a", 0))
    clock.set(deadline)

    def die(path: Path) -> None:
        raise SystemExit("killed")

    monkeypatch.setattr(store.layout.tree, "remove", die)
    with pytest.raises(SystemExit):
        sweep(store, now=deadline)
    monkeypatch.undo()
    assert not store.layout.task_dir(scope, "a").exists()
    assert listed(store, scope) == []
    report = sweep(store, now=deadline, grace=timedelta(0))
    assert report.trash_entries == 1
    assert not any(store.layout.trash_dir().iterdir())
    assert fsck(store).clean


def _sweep_in_child(
    root: str, now_iso: str, start: Any, out: multiprocessing.Queue[tuple[int, int]]
) -> None:
    now = parse_iso(now_iso)
    store = TaskStore(Path(root), lock_timeout=20.0, clock=FixedClock(now))
    start.wait(timeout=30)  # both processes are imported and ready: start together
    report = sweep(store, now=now, batch=3)
    out.put((report.turns, report.tasks))


def test_two_concurrent_sweeps_leave_a_consistent_tree(
    store: TaskStore, clock: FixedClock, scope: Scope
) -> None:
    deadline = parse_iso(put(store, scope, "t00", 0))
    for i in range(1, 24):
        put(store, scope, f"t{i:02d}", 0)
        put(store, scope, f"t{i:02d}", 1)
    clock.set(deadline + DAY)
    for i in range(0, 24, 4):
        put(store, scope, f"t{i:02d}", 2, "alive")  # every 4th task keeps a live turn
    now = deadline + 2 * DAY
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[tuple[int, int]] = ctx.Queue()
    start = ctx.Barrier(2)
    args = (str(store.layout.root), now.isoformat(), start, out)
    procs = [ctx.Process(target=_sweep_in_child, args=args) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert sum(r[0] for r in results) == 47  # every expired turn removed exactly once
    assert sum(r[1] for r in results) == 18
    clock.set(now)
    assert sorted(listed(store, scope)) == [f"t{i:02d}" for i in range(0, 24, 4)]
    assert fsck(store).clean
    assert not any(store.layout.trash_dir().iterdir())


def test_batches_reach_every_candidate(store: TaskStore, clock: FixedClock, scope: Scope) -> None:
    deadline = parse_iso(put(store, scope, "t0", 0))
    for i in range(1, 7):
        put(store, scope, f"t{i}", 0)
    report = sweep(store, now=deadline + DAY, batch=2)
    assert (report.turns, report.tasks) == (7, 7)
    assert not any(p.name.startswith("t") for p in store.layout.project_dir(scope).iterdir())


def test_dry_run_changes_nothing_and_reports_the_same(
    store: TaskStore, clock: FixedClock, scope: Scope
) -> None:
    deadline = parse_iso(put(store, scope, "a", 0))
    put(store, scope, "b", 0)
    clock.advance(days=5)
    put(store, scope, "b", 1)
    digest(store, scope)
    stale = store.layout.project_dir(scope) / f"{TMP_PREFIX}dead"
    stale.write_bytes(b"junk")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    Listing.forget(store.layout.listing(scope))  # no connection keeps the WAL open
    before = snapshot(store.layout.root)
    dry = sweep(store, now=deadline, dry_run=True)
    assert snapshot(store.layout.root) == before
    assert (dry.turns, dry.tasks, dry.temp_files) == (2, 1, 1)
    real = sweep(store, now=deadline)
    assert (real.turns, real.tasks, real.bytes, real.temp_files) == (
        dry.turns,
        dry.tasks,
        dry.bytes,
        dry.temp_files,
    )


def test_stale_temp_files_and_leftovers_go_after_grace_lock_files_stay(
    store: TaskStore, scope: Scope
) -> None:
    put(store, scope, "t", 0)
    store.put_artifact(scope, "t", 0, "kept.txt", io.BytesIO(b"k"), content_type="text/plain")
    task_dir = store.layout.task_dir(scope, "t")
    old = time.time() - 3600
    planted = {
        "temp_root": store.layout.root / f"{TMP_PREFIX}a",
        "temp_task": task_dir / f"{TMP_PREFIX}b",
        "temp_artifacts": task_dir / "0000-turn" / "artifacts" / f"{TMP_PREFIX}c",
        "orphan_artifact": task_dir / "0000-turn" / "artifacts" / "orphan.bin",
    }
    for path in planted.values():
        path.write_bytes(b"x" * 10)
    no_meta = task_dir / "0007-turn" / "artifacts"
    no_meta.mkdir(parents=True)
    empty_task = store.layout.project_dir(scope) / "ghost"
    empty_task.mkdir()
    for path in [*planted.values(), no_meta, no_meta.parent, empty_task]:
        os.utime(path, (old, old))
    young = task_dir / f"{TMP_PREFIX}young"
    young.write_bytes(b"in flight")
    locks = sorted(p for p in store.layout.locks_dir().rglob("*") if p.is_file())
    assert locks

    report = sweep(store, now=T0, grace=timedelta(minutes=10))
    assert report.temp_files == 3
    assert report.leftovers == 3  # orphan artifact, turn dir without meta, empty task dir
    assert report.turns == 0
    for path in [*planted.values(), no_meta.parent, empty_task]:
        assert not path.exists(), path
    assert young.exists()
    assert (task_dir / "0000-turn" / "artifacts" / "kept.txt").read_bytes() == b"k"
    assert all(p.exists() for p in locks)
    report = fsck(store)
    assert report.problems == []


def _sweep_and_die_mid_task(root: str, now_iso: str) -> None:
    """Sweep, and SIGKILL this process the moment the first task's turn is in the trash."""
    import signal

    now = parse_iso(now_iso)
    store = TaskStore(Path(root), lock_timeout=20.0, clock=FixedClock(now))

    def killed(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)  # no finally, no except, no atexit runs

    store.repair_task = killed  # type: ignore[method-assign]
    sweep(store, now=now)


def test_a_sweep_process_killed_by_sigkill_is_completed_by_the_next_run(
    store: TaskStore, clock: FixedClock, scope: Scope
) -> None:
    deadline = parse_iso(put(store, scope, "a", 0, "expires"))
    put(store, scope, "b", 0, "expires too")
    clock.set(deadline - SECOND)
    put(store, scope, "a", 1, "lives")
    clock.set(deadline)
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(
        target=_sweep_and_die_mid_task, args=(str(store.layout.root), deadline.isoformat())
    )
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -9
    assert any(store.layout.trash_dir().iterdir())
    assert store.txns.is_pending(Key(scope, "a"))
    assert store.layout.task_dir(scope, "b").exists(), "killed before reaching task b"

    report = sweep(store, now=deadline, grace=timedelta(0))
    assert (report.turns, report.tasks) == (1, 1)  # b/0 and with it task b; a/0 was gone
    assert report.trash_entries == 1
    assert not any(store.layout.trash_dir().iterdir())
    assert [t.turn for t in store.get_task(scope, "a").turns] == [1]
    assert listed(store, scope) == ["a"]
    assert fsck(store).clean


def test_a_temp_directory_with_a_young_file_inside_is_kept(store: TaskStore, scope: Scope) -> None:
    """A long import stages deep inside one temp directory: young content keeps it alive."""
    put(store, scope, "t", 0)
    staging = store.layout.project_dir(scope) / f"{TMP_PREFIX}import-0123"
    (staging / "big" / "0000-turn").mkdir(parents=True)
    fresh = staging / "big" / "0000-turn" / "meta.json"
    fresh.write_text("{}")
    old = time.time() - 3600
    for path in (staging, staging / "big", staging / "big" / "0000-turn"):
        os.utime(path, (old, old))
    assert sweep(store, now=T0).temp_files == 0
    assert fresh.exists()
    os.utime(fresh, (old, old))
    assert sweep(store, now=T0).temp_files == 1
    assert not staging.exists()
