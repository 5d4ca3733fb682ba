"""The ledger at size (``make slow``): 20,000 turns of 3 agents, 5 models and 30 branches over 60
days, then rewrites, deletes and a retention sweep; every grouping of up to three dimensions,
under several filters, equals a recount of the records, and so does the timeline. The small
mix of tests/conformance/test_ledger.py keeps the same checks in ``make test``."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from app.storage.core.clock import to_us
from app.storage.core.ledger import DAY_US, Filters, Price
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend
from tests.conftest import FixedClock
from tests.ledger_oracle import (
    assert_ledger_agrees,
    entries,
    expected_timeline,
    read_timeline,
)

pytestmark = pytest.mark.slow
WEB = Scope("acme", "seeded")
AGENTS = ("claude-code", "codex", "cursor")
MODELS = ("opus", "sonnet", "haiku", "gpt-5", "gpt-5-mini")
BRANCHES = tuple(["main"] + [f"feature/{i:02d}" for i in range(29)])
TURNS = 20_000
PRICES = {
    "opus": Price(15, 75, 1.5, 18.75),
    "sonnet": Price(3, 15, 0.3, 3.75),
    "gpt-5": Price(1.25, 10),
}


def meta(rng: random.Random, clock: FixedClock, task: int) -> dict[str, object]:
    start = clock() - timedelta(minutes=rng.randrange(0, 60 * 24 * 60))  # the last 60 days
    found: dict[str, object] = {
        "agent_id": AGENTS[task % 3],
        "model": rng.choice(MODELS),
        "branch": BRANCHES[task % 30],
        "started_at": start.isoformat(),
        "ended_at": (start + timedelta(seconds=rng.randrange(1, 1800))).isoformat(),
        "tokens": {
            "input": rng.randrange(0, 200_000),
            "output": rng.randrange(0, 20_000),
            "cache_read": rng.randrange(0, 500_000),
            "cache_creation": rng.randrange(0, 10_000),
        },
        "exit_code": rng.choice((0, 0, 0, 1)),
        "claude_session_id": f"s{task // 3}",
    }
    if rng.random() < 0.2:
        found["cost"] = round(rng.random() * 3, 6)
    return found


def test_twenty_thousand_turns_recount(backend: StorageBackend, clock: FixedClock) -> None:
    tasks = backend.tasks
    rng = random.Random(2026)
    per_task = 4
    written = 0
    # A tenth of them, then a month later the rest: the sweep below removes the first.
    for task in range(TURNS // per_task):
        if task == TURNS // per_task // 10:
            clock.advance(days=31)
        for turn in range(per_task):
            tasks.put_turn(WEB, f"t{task:05d}", turn, meta=meta(rng, clock, task), summary_md="s")
            written += 1
    assert written == TURNS
    ids = [f"t{task:05d}" for task in range(TURNS // per_task // 10, TURNS // per_task)]
    for task_id in rng.sample(ids, 300):  # rewrites: other figures, other sessions
        tasks.put_turn(
            WEB,
            task_id,
            rng.randrange(per_task),
            meta=meta(rng, clock, rng.randrange(999)),
            summary_md="r",
        )
    half = len(ids) // 2
    for task_id in rng.sample(ids[:half], 40):
        tasks.delete_task(WEB, task_id)
    for task_id in rng.sample(ids[half:], 40):
        tasks.delete_turn(WEB, task_id, 1)
    outcome = backend.sweep(now=clock(), force=True)
    assert outcome.tasks.turns >= TURNS // 10 - 200
    now = to_us(clock())
    filters = (
        Filters(),
        Filters(since_us=now - 30 * DAY_US),
        Filters(since_us=now - 45 * DAY_US, until_us=now - 7 * DAY_US, model="opus"),
        Filters(agent="codex", branch="feature/07"),
    )
    assert_ledger_agrees(tasks, WEB, PRICES, filters, most=3, limit=1000)
    found = entries(tasks, WEB)
    assert len(found) > TURNS * 0.85
    for f in (Filters(since_us=now - 2 * DAY_US), Filters(branch="main", agent="claude-code")):
        assert read_timeline(tasks, WEB, f, limit=200) == expected_timeline(found, f)
    assert backend.fsck().clean
