"""The turn ledger, the same on every backend: its totals and rows equal a recount of the records
for every grouping and filter after writes, rewrites, deletes and a retention sweep; the
timeline pages through the same turns newest first; projects never see each other's."""

from __future__ import annotations

import io
import random
from datetime import timedelta

import pytest

from app.storage.core.clock import to_us
from app.storage.core.errors import InvalidName
from app.storage.core.ledger import Filters, LedgerQuery, Price, TimelineQuery
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend, TaskBackend
from tests.conftest import FixedClock
from tests.ledger_oracle import assert_ledger_agrees, entries, expected_timeline, read_timeline

WEB = Scope("acme", "web")
MOBILE = Scope("acme", "mobile")
AGENTS = ("claude-code", "codex", "")
MODELS = ("opus", "sonnet", "gpt-5", "")
BRANCHES = ("main", "feature/x", "")
PRICES = {"opus": Price(15, 75, 1.5, 18.75), "sonnet": Price(3, 15, 0.3, 3.75)}


def turn_meta(rng: random.Random, clock: FixedClock) -> dict[str, object]:
    """A hook's meta, with the figures the ledger reads present, absent or malformed."""
    start = clock() - timedelta(hours=rng.randrange(0, 80))
    meta: dict[str, object] = {
        "agent_id": rng.choice(AGENTS),
        "model": rng.choice(MODELS),
        "branch": rng.choice(BRANCHES),
        "started_at": start.isoformat().replace("+00:00", "Z"),
        "ended_at": (start + timedelta(seconds=rng.randrange(0, 900))).isoformat(),
        "tokens": {
            "input": rng.randrange(0, 5000),
            "output": rng.randrange(0, 900),
            "cache_read": rng.choice([0, 100, "x"]),
            "cache_creation": rng.randrange(0, 50),
        },
        "exit_code": rng.choice([0, 0, 1, 2, None, "1"]),
    }
    session = rng.choice(["s1", "s2", "s3", "s4", None])
    if session:
        meta[rng.choice(["claude_session_id", "codex_session_id"])] = session
    if rng.random() < 0.3:
        meta["cost"] = round(rng.random(), 4)
    if rng.random() < 0.1:
        meta["started_at"] = (clock() + timedelta(days=3)).isoformat()  # a clock ahead
    return {k: v for k, v in meta.items() if v is not None}


def write_mix(tasks: TaskBackend, clock: FixedClock, rng: random.Random, n: int) -> None:
    for i in range(n):
        task_id = f"t{rng.randrange(0, 8)}"
        turn = rng.randrange(0, 4)
        tasks.put_turn(WEB, task_id, turn, meta=turn_meta(rng, clock), summary_md=f"turn {i}")
        clock.advance(minutes=rng.randrange(1, 300))


def test_the_ledger_is_a_recount_of_the_records(backend: StorageBackend, clock: FixedClock) -> None:
    tasks = backend.tasks
    rng = random.Random(7)
    write_mix(tasks, clock, rng, 30)
    # Gone at the sweep below: written before the retention period.
    clock.advance(days=31)
    write_mix(tasks, clock, rng, 30)
    # Rewrites (the same turns, other figures), an artifact (which changes nothing it
    # counts), deletes of a turn and of a task.
    for page in tasks.list_tasks(WEB, limit=3).tasks:
        tasks.put_turn(WEB, page.task_id, 0, meta=turn_meta(rng, clock), summary_md="again")
    some = tasks.list_tasks(WEB, limit=1).tasks[0].task_id
    tasks.put_artifact(WEB, some, 0, "log", io.BytesIO(b"x"), content_type="text/plain")
    index = tasks.get_task(WEB, some)
    if len(index.turns) > 1:
        tasks.delete_turn(WEB, some, index.turns[-1].turn)
    tasks.delete_task(WEB, tasks.list_tasks(WEB, limit=1).tasks[-1].task_id)
    swept = backend.sweep(now=clock(), force=True)
    assert swept.tasks.turns, "the sweep removed nothing: the test would not test it"
    now = to_us(clock())
    filters = (
        Filters(),
        Filters(since_us=now - 2 * 86_400_000_000),
        Filters(until_us=now - 86_400_000_000 // 2, agent="codex"),
        Filters(model="opus", branch="main"),
        Filters(agent=""),
    )
    assert_ledger_agrees(tasks, WEB, PRICES, filters, most=3)
    assert_ledger_agrees(tasks, WEB, {}, (Filters(),), most=6, limit=50)
    found = entries(tasks, WEB)
    for f in filters:
        assert read_timeline(tasks, WEB, f) == expected_timeline(found, f)


def test_projects_never_see_each_others_ledger(backend: StorageBackend, clock: FixedClock) -> None:
    tasks = backend.tasks
    meta = {"agent_id": "codex", "model": "m", "tokens": {"input": 5}, "session_id": "s"}
    tasks.put_turn(WEB, "a", 0, meta=meta, summary_md="")
    tasks.put_turn(MOBILE, "a", 0, meta={**meta, "tokens": {"input": 7}}, summary_md="")
    web = tasks.read_ledger(WEB, LedgerQuery(("session",)), {})
    mobile = tasks.read_ledger(MOBILE, LedgerQuery(("session",)), {})
    assert (web.totals.input_tokens, mobile.totals.input_tokens) == (5, 7)
    assert (web.totals.sessions, mobile.totals.sessions) == (1, 1)
    never = tasks.read_ledger(Scope("globex", "web"), LedgerQuery(), {})
    assert never.totals.turns == 0 and never.rows == []
    assert tasks.read_timeline(Scope("acme", "none"), TimelineQuery(), {}).entries == []


def test_a_cursor_resumes_only_the_question_it_was_issued_for(
    backend: StorageBackend, clock: FixedClock
) -> None:
    tasks = backend.tasks
    for i in range(4):
        tasks.put_turn(WEB, f"t{i}", 0, meta={"model": f"m{i}"}, summary_md="")
    page = tasks.read_ledger(WEB, LedgerQuery(("model",), limit=2), {})
    assert page.next_cursor is not None
    later = tasks.read_ledger(WEB, LedgerQuery(("model",), limit=2, cursor=page.next_cursor), {})
    assert [r["model"] for r in page.rows + later.rows] == ["m0", "m1", "m2", "m3"]
    for other in (
        LedgerQuery(("agent",), limit=2, cursor=page.next_cursor),
        LedgerQuery(("model",), Filters(agent="x"), limit=2, cursor=page.next_cursor),
    ):
        with pytest.raises(InvalidName):
            tasks.read_ledger(WEB, other, {})
    with pytest.raises(InvalidName):
        tasks.read_ledger(MOBILE, LedgerQuery(("model",), limit=2, cursor=page.next_cursor), {})
    timeline = tasks.read_timeline(WEB, TimelineQuery(limit=2), {})
    assert timeline.next_cursor is not None
    with pytest.raises(InvalidName):
        tasks.read_ledger(WEB, LedgerQuery(("model",), cursor=timeline.next_cursor), {})
    with pytest.raises(InvalidName):
        tasks.read_timeline(
            WEB, TimelineQuery(Filters(model="m1"), cursor=timeline.next_cursor), {}
        )


def test_cost_is_reported_or_priced_at_the_read(backend: StorageBackend) -> None:
    tasks = backend.tasks
    tokens = {"input": 1_000_000, "output": 100_000, "cache_read": 0, "cache_creation": 0}
    tasks.put_turn(WEB, "a", 0, meta={"model": "opus", "tokens": tokens}, summary_md="")
    tasks.put_turn(
        WEB, "a", 1, meta={"model": "opus", "tokens": tokens, "cost": 2.5}, summary_md=""
    )
    tasks.put_turn(WEB, "b", 0, meta={"model": "haiku", "tokens": tokens}, summary_md="")
    unpriced = tasks.read_ledger(WEB, LedgerQuery(()), {}).totals
    assert (unpriced.cost_usd, unpriced.reported_cost_usd, unpriced.unpriced_turns) == (2.5, 2.5, 2)
    priced = tasks.read_ledger(WEB, LedgerQuery(("model",)), {"opus": Price(15, 75)})
    assert priced.totals.cost_usd == pytest.approx(2.5 + 15 + 7.5)
    assert priced.totals.unpriced_turns == 1
    assert {r["model"]: r["cost_usd"] for r in priced.rows} == {
        "haiku": 0.0,
        "opus": pytest.approx(25.0),
    }
    timeline = tasks.read_timeline(WEB, TimelineQuery(), {"opus": Price(15, 75)})
    assert {(e.turn.task_id, e.turn.turn): e.cost_usd for e in timeline.entries} == {
        ("a", 1): 2.5,
        ("a", 0): pytest.approx(22.5),
        ("b", 0): None,
    }
