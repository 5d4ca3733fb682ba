"""The turn ledger's use cases (core/ledger.py): what a project's turns add up to, its
timeline, and the price table its cost is computed with. Every door (REST, the MCP tools, the
CLI through REST) comes through here.

Reads are any token's of the project (a reader's too): one storage call, priced with the
project's table as this process has it (looked at once a second, at once after a change made
here). The price table is a project_admin's (and above) to set; each change is audited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.services import access, audit, users
from app.services.access import Principal, Who, token_of
from app.storage.core import ledger as lg
from app.storage.core.clock import to_us
from app.storage.core.ledger import Filters, LedgerPage, LedgerQuery, Price, TimelinePage
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend, TokenStore


def filters(
    storage: StorageBackend,
    *,
    since: str | None = None,
    until: str | None = None,
    agent: str | None = None,
    model: str | None = None,
    branch: str | None = None,
) -> Filters:
    """The filters a request names, relative times read on the storage's clock; ValueError
    naming the parameter for a time that cannot be read, InvalidName for a bad value."""
    now_us = to_us(storage.tasks.clock())
    found: dict[str, int | None] = {}
    for name, text in (("since", since), ("until", until)):
        try:
            found[name] = None if text is None else lg.parse_when(text, now_us)
        except ValueError:
            raise ValueError(name) from None
    return Filters(
        found["since"],
        found["until"],
        lg.check_filter("agent", agent),
        lg.check_filter("model", model),
        lg.check_filter("branch", branch),
    )


def report(
    storage: StorageBackend,
    principal: Principal,
    query: LedgerQuery,
    registry: TokenStore | None = None,
) -> LedgerPage:
    """What the project's turns add up to: totals and a page of rows (any role). Grouped
    by owner, each row names the person behind the token as well (``owner_name``: "ana via
    laptop", users.label), read from ``registry``."""
    scope = principal.scope
    page = storage.tasks.read_ledger(scope, query, storage.ledger_prices.of(scope))
    if registry is not None and lg.OWNER in query.group_by:
        names: dict[str, str | None] = {}
        for row in page.rows:
            owner = str(row.get(lg.OWNER) or "")
            if owner not in names:
                token = registry.get(owner) if owner else None
                names[owner] = None if token is None else users.label(storage, token)
            row["owner_name"] = names[owner]
    return page


def timeline(
    storage: StorageBackend, principal: Principal, query: lg.TimelineQuery
) -> TimelinePage:
    """The project's turns across tasks, newest first (any role)."""
    scope = principal.scope
    return storage.tasks.read_timeline(scope, query, storage.ledger_prices.of(scope))


def prices_of(storage: StorageBackend, scope: Scope) -> dict[str, Price]:
    """The project's price table as stored now (what an answer shows)."""
    return dict(storage.limits().prices().of(scope))


def set_prices(storage: StorageBackend, by: Who, scope: Scope, table: object) -> None:
    """Replace the project's price table with ``table`` (JSON: model -> kind -> price), a
    project_admin's and above; InvalidLimit for one that breaks core/ledger.py's rules.
    Audited with the models it prices."""
    access.require_manage(by, "setting the ledger's prices")
    done = storage.limits().set_prices(scope.tenant, scope.project, table)
    audit.record(
        storage,
        scope.tenant,
        scope.project,
        actor=token_of(by).id,
        kind="limits",
        action="set",
        subject="ledger prices",
        detail={"models": sorted(done)[:10], "count": len(done)},
    )


@dataclass(frozen=True, slots=True)
class Overview:
    """What the console's ledger page shows: the project's cost and tokens by day and model,
    and its sessions, branches and tasks by cost (each list the ``top`` most costly of the
    first :data:`lg.MAX_LEDGER_LIMIT` keys; ``partial`` names the lists that had more)."""

    by_day: LedgerPage  # grouped by day and model, the totals with it
    sessions: list[dict[str, Any]]
    branches: list[dict[str, Any]]
    tasks: list[dict[str, Any]]
    failing: list[dict[str, Any]]  # tasks with a non-zero exit code, the most failures first
    partial: frozenset[str]
    today: int  # the storage clock's UTC day, where a range with no end stops


def overview(
    storage: StorageBackend, principal: Principal, filters: Filters, *, top: int = 10
) -> Overview:
    """The ledger's rollups a dashboard needs, from :func:`report` alone (any role)."""
    by_day = report(storage, principal, LedgerQuery(("day", "model"), filters, lg.MAX_LEDGER_LIMIT))
    ranked: dict[str, list[dict[str, Any]]] = {}
    partial = set()
    for name in ("session", "branch", "task"):
        page = report(storage, principal, LedgerQuery((name,), filters, lg.MAX_LEDGER_LIMIT))
        if page.next_cursor is not None:
            partial.add(name)
        ranked[name] = page.rows
    if by_day.next_cursor is not None:
        partial.add("day")

    def costliest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(rows, key=lambda r: (-r["cost_usd"], -r["turns"]))[:top]

    failing = sorted(
        (r for r in ranked["task"] if r["nonzero_exits"]),
        key=lambda r: (-r["nonzero_exits"], r["task"] or ""),
    )[:top]
    return Overview(
        by_day,
        costliest(ranked["session"]),
        costliest(ranked["branch"]),
        costliest(ranked["task"]),
        failing,
        frozenset(partial),
        to_us(storage.tasks.clock()) // lg.DAY_US,
    )
