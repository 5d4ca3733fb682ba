"""The tree's ledger file (``_ledger.sqlite3``): a writer SIGKILLed between its records and the
ledger, or inside the ledger's transaction, leaves it equal to the records after the recovery;
fsck reports a ledger removed, damaged or edited by hand, and ``--repair`` makes it equal to a
recount of the records again."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from app.storage.core.errors import Corrupt, UnsafePath
from app.storage.core.ledger import LedgerQuery
from app.storage.core.names import Scope
from app.storage.core.recovery import Plan
from app.storage.tree.backend import TreeStorage
from app.storage.tree.sqlite.ledger import Ledger
from tests.conftest import FixedClock
from tests.ledger_oracle import assert_ledger_agrees
from tests.storage._helpers import assert_consistent

WEB = Scope("acme", "web")


def make(tmp_path: Path, clock: FixedClock) -> TreeStorage:
    return TreeStorage(
        tmp_path / "root",
        tokens_file=tmp_path / "tokens.json",
        clock=clock,
        lock_timeout=10.0,
        retention=timedelta(days=30),
    )


def meta(i: int, **more: Any) -> dict[str, Any]:
    return {
        "agent_id": ("claude-code", "codex")[i % 2],
        "model": ("opus", "sonnet", "gpt-5")[i % 3],
        "branch": f"b{i % 4}",
        "claude_session_id": f"s{i % 5}",
        "tokens": {"input": 100 * i, "output": 10 * i, "cache_read": i, "cache_creation": 1},
        "started_at": "2025-12-31T10:00:00Z",
        "ended_at": "2025-12-31T10:02:00Z",
        "exit_code": i % 3,
        **more,
    }


def seed(storage: TreeStorage, n: int = 12) -> None:
    for i in range(n):
        storage.tasks.put_turn(WEB, f"t{i % 4}", i // 4, meta=meta(i), summary_md=f"{i}")


def agrees(storage: TreeStorage) -> None:
    assert_ledger_agrees(storage.tasks, WEB, most=2)
    assert_consistent(storage.tasks, WEB)


# -- a writer killed mid-write ----------------------------------------------------------------
def _die_at(root: str, where: str) -> None:
    """Write once (a rewrite that moves a session's first turn), and SIGKILL this process at
    ``where``."""
    import app.storage.tree.sqlite.ledger as ledger_db

    def kill(*args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    storage = TreeStorage(Path(root), lock_timeout=10.0, clock=FixedClock())
    if where == "before the ledger":
        ledger_db.Ledger.put_turn = kill  # type: ignore[method-assign]
    else:  # in its transaction: the entry written, the session not yet placed
        ledger_db._settle_home = kill  # type: ignore[attr-defined]
    storage.tasks.put_turn(
        WEB, "t1", 0, meta=meta(1, model="haiku", started_at="2025-12-01T00:00:00Z"), summary_md="!"
    )


@pytest.mark.parametrize("where", ["before the ledger", "in the ledger's transaction"])
def test_a_write_killed_around_the_ledger_is_repaired_by_the_recovery(
    tmp_path: Path, clock: FixedClock, where: str
) -> None:
    storage = make(tmp_path, clock)
    seed(storage)
    before = storage.tasks.read_ledger(WEB, LedgerQuery(("model",)), {})
    proc = multiprocessing.get_context("spawn").Process(
        target=_die_at, args=(str(storage.layout.root), where)
    )
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    # The record committed; the ledger did not see it.
    assert storage.tasks.get_turn(WEB, "t1", 0).meta["model"] == "haiku"
    assert storage.tasks.read_ledger(WEB, LedgerQuery(("model",)), {}) == before
    assert not storage.fsck().clean
    restarted = make(tmp_path, clock)
    assert restarted.recover(Plan(False, False, "killed")).repaired
    agrees(restarted)
    assert restarted.fsck().clean


# -- fsck -------------------------------------------------------------------------------------
def test_fsck_remakes_a_ledger_removed_by_hand(tmp_path: Path, clock: FixedClock) -> None:
    storage = make(tmp_path, clock)
    seed(storage)
    path = storage.layout.ledger(WEB)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    report = storage.fsck()
    assert any("_ledger.sqlite3: missing" in p for p in report.problems), report.problems
    assert not path.exists(), "fsck without --repair made the file"
    storage.fsck(repair=True)
    assert storage.fsck().clean
    agrees(storage)


def test_the_start_makes_a_missing_ledger_before_serving(tmp_path: Path, clock: FixedClock) -> None:
    """A release that brings the ledger (or changes its format) finds projects without one:
    the start-up recovery makes each from its records, not the project's first write."""
    storage = make(tmp_path, clock)
    seed(storage)
    path = storage.layout.ledger(WEB)
    Ledger.forget(path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    report = make(tmp_path, clock).recover(Plan(True, False))
    assert "acme/web: ledger made from the records (4 task(s))" in report.lines()
    assert path.exists()
    again = make(tmp_path, clock).recover(Plan(True, False))
    assert not any("ledger" in line for line in again.lines())
    agrees(storage)


def test_a_removed_ledger_is_made_again_at_its_next_use(tmp_path: Path, clock: FixedClock) -> None:
    storage = make(tmp_path, clock)
    seed(storage)
    storage.tasks.read_ledger(WEB, LedgerQuery(), {})  # a pooled connection to the old file
    path = storage.layout.ledger(WEB)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    storage.tasks.put_turn(WEB, "t9", 0, meta=meta(9), summary_md="after")
    agrees(storage)


def test_fsck_remakes_a_damaged_ledger_and_writes_go_on_meanwhile(
    tmp_path: Path, clock: FixedClock
) -> None:
    storage = make(tmp_path, clock)
    seed(storage)
    path = storage.layout.ledger(WEB)
    Ledger.forget(path)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"not a database, " * 512)
    # A write is kept whole (the record and every other derived file); the ledger waits.
    storage.tasks.put_turn(WEB, "t9", 0, meta=meta(9), summary_md="kept")
    with pytest.raises(Corrupt, match="fsck"):
        storage.tasks.read_ledger(WEB, LedgerQuery(), {})
    report = storage.fsck()
    assert any("_ledger.sqlite3: damaged" in p for p in report.problems), report.problems
    storage.fsck(repair=True)
    assert storage.fsck().clean
    agrees(storage)


def test_fsck_repairs_entries_and_sums_changed_by_hand(tmp_path: Path, clock: FixedClock) -> None:
    storage = make(tmp_path, clock)
    seed(storage)
    with sqlite3.connect(storage.layout.ledger(WEB)) as conn:
        conn.execute("UPDATE ledger SET turns = turns + 1, cost_nusd = 5 WHERE day > 0")
        conn.execute("UPDATE ledger_tasks SET sessions = 7")
        conn.execute("UPDATE ledger_models SET wall_us = 1")
        conn.execute("DELETE FROM ledger_sessions WHERE session = 's1'")
        conn.execute("UPDATE ledger_turns SET input_tokens = 1 WHERE task_id = 't2'")
        conn.execute("DELETE FROM ledger_turns WHERE task_id = 't3' AND turn = 0")
    report = storage.fsck()
    found = "\n".join(report.problems)
    for what in (
        "ledger:",
        "ledger_models:",
        "ledger_tasks:",
        "ledger_sessions:",
        "task t2",
        "task t3",
    ):
        assert what in found, (what, found)
    storage.fsck(repair=True)
    assert storage.fsck().clean
    agrees(storage)


def test_fsck_counts_the_rollup_rows_that_differ_from_a_recount(
    tmp_path: Path, clock: FixedClock
) -> None:
    storage = make(tmp_path, clock)
    seed(storage)
    with sqlite3.connect(storage.layout.ledger(WEB)) as conn:
        key = conn.execute("SELECT day, model, agent FROM ledger_models LIMIT 1").fetchone()
        conn.execute(
            "UPDATE ledger_models SET wall_us = wall_us + 1"
            " WHERE day = ? AND model = ? AND agent = ?",
            key,
        )
        conn.execute("DELETE FROM ledger_sessions WHERE session = 's1'")
    found = "\n".join(storage.fsck().problems)
    # A changed row is one the recount lacks and one it has; a lost session is one.
    assert "ledger_models: 2 row(s) differ from a recount" in found, found
    assert "ledger_sessions: 1 session(s) misplaced" in found, found
    assert "ledger_tasks:" not in found and "ledger:" not in found.replace("ledger_", ""), found
    storage.fsck(repair=True)
    assert storage.fsck().clean


def test_a_linked_ledger_is_never_followed(tmp_path: Path, clock: FixedClock) -> None:
    storage = make(tmp_path, clock)
    seed(storage, 2)
    path = storage.layout.ledger(WEB)
    Ledger.forget(path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    outside = tmp_path / "outside.sqlite3"
    outside.write_bytes(b"theirs")
    path.symlink_to(outside)
    with pytest.raises(UnsafePath):
        storage.tasks.read_ledger(WEB, LedgerQuery(), {})
    report = storage.fsck(repair=True)
    assert any("_ledger.sqlite3: symlink" in p for p in report.problems), report.problems
    assert outside.read_bytes() == b"theirs"
