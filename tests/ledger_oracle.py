"""The ledger recounted by brute force from the records as the API gives them (every live turn,
read one by one), written apart from app/storage/core/ledger.py from the rules of docs/api.md
("The ledger"), to compare the engines' rollups and timeline with."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.storage.core.ledger import (
    DIMENSIONS,
    Filters,
    LedgerQuery,
    Price,
    TimelineQuery,
)
from app.storage.core.models import TurnRecord
from app.storage.core.names import Scope
from app.storage.interface import TaskBackend

DAY = timedelta(days=1)
NO_FILTERS = Filters()


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        found = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def expected(record: TurnRecord) -> dict[str, Any]:
    """One turn's entry, by the rules alone."""
    meta = record.meta
    tokens = meta.get("tokens") if isinstance(meta.get("tokens"), dict) else {}
    created = _time(record.created_at)
    started, ended = _time(meta.get("started_at")), _time(meta.get("ended_at"))
    assert created is not None
    at = started if started is not None and started <= created + DAY else created
    wall = (ended - started).total_seconds() if started and ended and ended >= started else 0.0
    cost = meta.get("cost")
    session = next(
        (meta[k] for k in ("session_id", "claude_session_id", "codex_session_id") if meta.get(k)),
        "",
    )
    code = meta.get("exit_code")

    def text(name: str) -> str:
        value = meta.get(name)
        return value if isinstance(value, str) else ""

    return {
        "task": record.task_id,
        "turn": record.turn,
        "at": at,
        "day": at.date().isoformat(),
        "agent": text("agent_id"),
        "model": text("model"),
        "branch": text("branch"),
        "session": session if isinstance(session, str) else "",
        "commit": text("commit"),
        "input": _count(tokens.get("input")),
        "output": _count(tokens.get("output")),
        "cache_read": _count(tokens.get("cache_read")),
        "cache_creation": _count(tokens.get("cache_creation")),
        "cost": float(cost)
        if isinstance(cost, int | float) and not isinstance(cost, bool)
        else None,
        "wall": wall,
        "exit_code": code if isinstance(code, int) and not isinstance(code, bool) else None,
    }


def all_task_ids(tasks: TaskBackend, scope: Scope) -> list[str]:
    found, cursor = [], None
    while True:
        page = tasks.list_tasks(scope, limit=500, cursor=cursor)
        found += [t.task_id for t in page.tasks]
        cursor = page.next_cursor
        if cursor is None:
            return found


def entries(tasks: TaskBackend, scope: Scope) -> list[dict[str, Any]]:
    """Every live turn's entry, read record by record."""
    out = []
    for task_id in all_task_ids(tasks, scope):
        index = tasks.get_task(scope, task_id)
        for entry in index.turns:
            found = expected(tasks.get_turn(scope, task_id, entry.turn))
            # The token that created the task (its record's), what a grouping by owner sums by.
            found["owner"] = index.owner or ""
            out.append(found)
    return out


def _homes(found: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """The (task, turn) where each session is counted: its earliest turn."""
    first: dict[str, dict[str, Any]] = {}
    for e in found:
        if not e["session"]:
            continue
        best = first.get(e["session"])
        if best is None or (e["at"], e["task"], e["turn"]) < (
            best["at"],
            best["task"],
            best["turn"],
        ):
            first[e["session"]] = e
    return {(e["task"], e["turn"]) for e in first.values()}


def _selected(e: dict[str, Any], f: Filters) -> bool:
    day_start = datetime.fromisoformat(e["day"]).replace(tzinfo=UTC)
    if f.since_us is not None and day_start + DAY <= _from_us(f.since_us):
        return False
    if f.until_us is not None and day_start >= _from_us(f.until_us):
        return False
    return all(getattr(f, n) is None or e[n] == getattr(f, n) for n in ("agent", "model", "branch"))


def _from_us(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


def figures(
    group: Iterable[dict[str, Any]], homes: set[tuple[str, int]], prices: dict[str, Price]
) -> dict[str, Any]:
    group = list(group)
    reported = sum(e["cost"] for e in group if e["cost"] is not None)
    priced = 0.0
    unpriced = 0
    for e in group:
        if e["cost"] is not None:
            continue
        price = prices.get(e["model"])
        if price is None:
            unpriced += 1
            continue
        priced += (
            e["input"] * price.input
            + e["output"] * price.output
            + e["cache_read"] * price.cache_read
            + e["cache_creation"] * price.cache_creation
        ) / 1e6
    return {
        "turns": len(group),
        "sessions": sum((e["task"], e["turn"]) in homes for e in group),
        "input_tokens": sum(e["input"] for e in group),
        "output_tokens": sum(e["output"] for e in group),
        "cache_read_tokens": sum(e["cache_read"] for e in group),
        "cache_creation_tokens": sum(e["cache_creation"] for e in group),
        "cost_usd": pytest.approx(reported + priced, abs=1e-6),
        "reported_cost_usd": pytest.approx(reported, abs=1e-6),
        "unpriced_turns": unpriced,
        "wall_seconds": pytest.approx(sum(e["wall"] for e in group), abs=1e-6),
        "nonzero_exits": sum(e["exit_code"] not in (None, 0) for e in group),
    }


def _key(e: dict[str, Any], group_by: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(e[d] for d in group_by)


def _sort_key(key: tuple[Any, ...], group_by: tuple[str, ...]) -> tuple[Any, ...]:
    # Newest day first; every other key in byte order ("" first).
    out: list[Any] = []
    for name, value in zip(group_by, key, strict=True):
        if name == "day":
            out.append(-datetime.fromisoformat(value).toordinal())
        else:
            out.append(value.encode())
    return tuple(out)


def expected_ledger(
    found: list[dict[str, Any]],
    group_by: tuple[str, ...],
    filters: Filters = NO_FILTERS,
    prices: dict[str, Price] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(totals, rows) as the API answers them, rows in the ledger's order."""
    prices = prices or {}
    homes = _homes(found)
    chosen = [e for e in found if _selected(e, filters)]
    totals = figures(chosen, homes, prices)
    if not group_by:
        return totals, []  # the totals alone
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for e in chosen:
        groups.setdefault(_key(e, group_by), []).append(e)
    rows = []
    for key in sorted(groups, key=lambda k: _sort_key(k, group_by)):
        names = {n: (v or None) for n, v in zip(group_by, key, strict=True)}
        rows.append({**names, **figures(groups[key], homes, prices)})
    return totals, rows


def read_ledger(
    tasks: TaskBackend,
    scope: Scope,
    group_by: tuple[str, ...],
    filters: Filters = NO_FILTERS,
    prices: dict[str, Price] | None = None,
    limit: int = 7,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every page of a ledger read, joined."""
    rows: list[dict[str, Any]] = []
    cursor = None
    totals: dict[str, Any] = {}
    while True:
        page = tasks.read_ledger(
            scope, LedgerQuery(group_by, filters, limit=limit, cursor=cursor), prices or {}
        )
        totals = page.totals.to_json()
        rows += page.rows
        cursor = page.next_cursor
        if cursor is None:
            return totals, rows


def groupings(most: int = 6) -> Iterator[tuple[str, ...]]:
    """Every grouping of up to ``most`` dimensions (in their canonical order)."""
    for n in range(0, most + 1):
        yield from itertools.combinations(DIMENSIONS, n)


def assert_ledger_agrees(
    tasks: TaskBackend,
    scope: Scope,
    prices: dict[str, Price] | None = None,
    filters: Iterable[Filters] = (Filters(),),
    most: int = 6,
    limit: int = 7,
) -> None:
    found = entries(tasks, scope)
    for f in filters:
        for group_by in groupings(most):
            want = expected_ledger(found, group_by, f, prices)
            have = read_ledger(tasks, scope, group_by, f, prices, limit)
            assert have == want, (group_by, f)


def expected_timeline(found: list[dict[str, Any]], f: Filters) -> list[tuple[str, int]]:
    since = None if f.since_us is None else _from_us(f.since_us)
    until = None if f.until_us is None else _from_us(f.until_us)
    chosen = [
        e
        for e in found
        if (since is None or e["at"] >= since)
        and (until is None or e["at"] < until)
        and all(
            getattr(f, n) is None or e[n] == getattr(f, n) for n in ("agent", "model", "branch")
        )
    ]
    chosen.sort(key=lambda e: (e["at"], e["task"].encode(), e["turn"]), reverse=True)
    return [(e["task"], e["turn"]) for e in chosen]


def read_timeline(
    tasks: TaskBackend, scope: Scope, f: Filters, limit: int = 5
) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    cursor = None
    while True:
        page = tasks.read_timeline(scope, TimelineQuery(f, limit=limit, cursor=cursor), {})
        out += [(e.turn.task_id, e.turn.turn) for e in page.entries]
        cursor = page.next_cursor
        if cursor is None:
            return out
