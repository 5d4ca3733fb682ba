"""PostgreSQL's ledger against a recount of its turns: fsck finds entries and sums changed or
removed by hand (the whole ledger emptied included) and --repair sets them from the turns; a
writer killed inside its transaction leaves nothing of its write (tests/storage/tree/
test_ledger.py does it for the tree)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from typing import Any

import psycopg
import pytest

from app.storage.backends import open_backend
from app.storage.core.ledger import LedgerQuery
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend
from tests.ledger_oracle import assert_ledger_agrees

pytestmark = pytest.mark.all_backends
WEB = Scope("acme", "web")
MOBILE = Scope("acme", "mobile")


def meta(i: int, **more: Any) -> dict[str, Any]:
    return {
        "agent_id": ("claude-code", "codex")[i % 2],
        "model": ("opus", "sonnet", "gpt-5")[i % 3],
        "branch": f"b{i % 4}",
        "codex_session_id": f"s{i % 5}",
        "tokens": {"input": 100 * i, "output": 10 * i, "cache_read": i, "cache_creation": 1},
        "cost": i / 10 if i % 2 else None,
        "exit_code": i % 3,
        **more,
    }


def seed(storage: StorageBackend, scope: Scope = WEB) -> None:
    for i in range(12):
        storage.tasks.put_turn(scope, f"t{i % 4}", i // 4, meta=meta(i), summary_md=f"{i}")


@pytest.fixture
def storage(backend_kind: str, backend_settings: dict[str, Any]) -> Any:
    if backend_kind == "tree":
        pytest.skip("the tree's ledger file: tests/storage/tree/test_ledger.py")
    found = open_backend(backend_settings)
    yield found
    found.close()


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE ledger SET turns = turns + 1, cost_nusd = 5",
        "UPDATE ledger_tasks SET sessions = 7",
        "UPDATE ledger_models SET wall_us = 1",
        "DELETE FROM ledger_sessions WHERE session = 's1'",
        "UPDATE ledger_turns SET input_tokens = 1 WHERE task_id = 't2'",
        "DELETE FROM ledger_turns WHERE task_id = 't3' AND turn = 0",
        # The whole ledger gone (TRUNCATE moves no sum: the trigger is per row).
        "TRUNCATE ledger, ledger_models, ledger_tasks, ledger_sessions, ledger_turns",
    ],
)
def test_fsck_repairs_a_ledger_changed_by_hand(
    storage: StorageBackend, backend_config: dict[str, Any], edit: str
) -> None:
    seed(storage)
    seed(storage, MOBILE)
    with psycopg.connect(backend_config["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(edit)
    report = storage.fsck()
    assert any("ledger" in p for p in report.problems), report.problems
    storage.fsck(repair=True)
    assert storage.fsck().clean
    assert_ledger_agrees(storage.tasks, WEB, most=2)
    assert_ledger_agrees(storage.tasks, MOBILE, most=2)


def _die_in_the_transaction(settings: dict[str, Any]) -> None:
    import app.storage.pg.ledger as pgl

    def kill(*args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    storage = open_backend(settings)
    pgl.put = kill  # type: ignore[assignment]
    storage.tasks.put_turn(WEB, "t1", 0, meta=meta(1, model="haiku"), summary_md="!")


def test_a_writer_killed_in_its_transaction_leaves_nothing(
    storage: StorageBackend, backend_settings: dict[str, Any]
) -> None:
    seed(storage)
    before = storage.tasks.read_ledger(WEB, LedgerQuery(("model",)), {})
    settings = {k: v for k, v in backend_settings.items() if k != "CLOCK"}
    proc = multiprocessing.get_context("spawn").Process(
        target=_die_in_the_transaction, args=(settings,)
    )
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    assert storage.tasks.get_turn(WEB, "t1", 0).meta["model"] != "haiku"
    assert storage.tasks.read_ledger(WEB, LedgerQuery(("model",)), {}) == before
    assert storage.fsck().clean
    assert_ledger_agrees(storage.tasks, WEB, most=2)
