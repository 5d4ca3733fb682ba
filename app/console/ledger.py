"""The ledger and the timeline of a project, as pages: what its turns cost and used by day and
model (SVG drawn here, app/console/charts.py), its costliest sessions, branches and tasks,
its failures, and its turns newest first. Both read through app/services/ledger.py, the
REST ledger's use cases, so a page and ``GET /ledger`` cannot disagree.

The filters are the API's (since, until, agent, model, branch) in the query string, so a view
is an address to share. An empty field means no filter here (the API reads ``agent=`` as "the
turns that name none"; a form cannot tell an empty field from one left alone).
"""

from __future__ import annotations

from datetime import date
from typing import Any

from flask import render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import BadRequest

from app.console import charts
from app.console.base import bp, principal, purl, storage
from app.services import ledger
from app.storage.core import ledger as lg
from app.storage.core.clock import iso_us
from app.storage.core.errors import InvalidName
from app.storage.core.ledger import Filters, TimelineQuery

FILTERS = ("since", "until", "agent", "model", "branch")
DEFAULT_SINCE = "30d"
MOST_DAYS = 366  # a chart of more days than this starts at its last MOST_DAYS
MODEL_COLOURS = 6  # the costliest models each get a colour; the rest are "other"
TIMELINE_PAGE = 50
_EPOCH = date(1970, 1, 1).toordinal()


def _asked() -> dict[str, str]:
    """The filters as the address names them (an empty one left out)."""
    asked = {name: request.args.get(name, "").strip() for name in FILTERS}
    return {k: v for k, v in asked.items() if v}


def _filters(asked: dict[str, str], default_since: str | None) -> Filters:
    """The service's filters, or a 400 naming the one that cannot be read."""
    try:
        return ledger.filters(
            storage(),
            since=asked.get("since", default_since),
            until=asked.get("until"),
            agent=asked.get("agent"),
            model=asked.get("model"),
            branch=asked.get("branch"),
        )
    except ValueError as exc:
        raise BadRequest(
            f"{exc}: a time (2026-05-01, 2026-05-01T09:00:00Z), 12h, 7d, 2w, today or yesterday"
        ) from None
    except InvalidName as exc:
        raise BadRequest(f"{exc.field}: {exc.message}") from None


def _day(iso: str) -> int:
    return date.fromisoformat(iso).toordinal() - _EPOCH


def _usd(value: float) -> str:
    if value == 0:
        return "$0"
    return f"${value:,.2f}" if value >= 0.995 else f"${value:.4f}".rstrip("0")


def _musd_label(value: int) -> str:
    return _usd(value / 1_000_000)


def _tokens(value: int) -> str:
    for unit, size in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if value >= size:
            return f"{value / size:.1f}".rstrip("0").rstrip(".") + unit
    return str(value)


def _tokens_label(value: int) -> str:
    return f"{value:,} tokens"


def _charts(view: ledger.Overview) -> tuple[Any, Any, list[tuple[str, str]]]:
    """Cost and tokens per day, stacked by model; the legend (model, CSS class)."""
    page = view.by_day
    days = [_day(r["day"]) for r in page.rows]
    # From the range's first day (else the first turn's) to its last, never past today (or
    # the last turn, should a clock run ahead): an "until" in the future draws no empty year.
    last = max([view.today, *days])
    if page.until_day is not None:
        last = min(last, page.until_day)
    first = page.since_day if page.since_day is not None else min([last, *days])
    first = max(first, last - MOST_DAYS + 1)
    slots = [lg.day_iso(d) for d in range(first, last + 1)]
    # The costliest models get the colours; among those that cost nothing, the busiest.
    weight: dict[str, tuple[float, int]] = {}
    for r in page.rows:
        model = r["model"] or ""
        spent, turns = weight.get(model, (0.0, 0))
        weight[model] = (spent + r["cost_usd"], turns + r["turns"])
    ranked = sorted(weight, key=lambda m: (-weight[m][0], -weight[m][1], m))
    coloured = (
        ranked[:MODEL_COLOURS] if len(ranked) <= MODEL_COLOURS else ranked[: MODEL_COLOURS - 1]
    )
    keys = [*coloured, *(["\0other"] if len(ranked) > len(coloured) else [])]
    cost = {k: [0] * len(slots) for k in keys}
    tokens = {k: [0] * len(slots) for k in keys}
    for r, d in zip(page.rows, days, strict=True):
        if not first <= d <= last:
            continue
        key = r["model"] or ""
        key = key if key in coloured else "\0other"
        cost[key][d - first] += round(r["cost_usd"] * 1_000_000)
        tokens[key][d - first] += (
            r["input_tokens"]
            + r["output_tokens"]
            + r["cache_read_tokens"]
            + r["cache_creation_tokens"]
        )
    legend = [
        (
            "other models" if k == "\0other" else (k or "(no model)"),
            "m-other" if k == "\0other" else f"m{i}",
        )
        for i, k in enumerate(keys)
    ]
    every = max(1, len(slots) // 6)
    cost_chart = charts.bars(
        slots,
        [
            charts.Series("cost-musd", css, cost[k], _labelled(name, _musd_label))
            for k, (name, css) in zip(keys, legend, strict=True)
        ],
        title="Cost per day (US dollars), by model",
        axis=_musd_label,
        every=every,
    )
    token_chart = charts.bars(
        slots,
        [
            charts.Series("tokens", css, tokens[k], _labelled(name, _tokens_label))
            for k, (name, css) in zip(keys, legend, strict=True)
        ],
        title="Tokens per day (input, output and cache), by model",
        axis=_tokens,
        every=every,
    )
    return cost_chart, token_chart, legend


def _labelled(name: str, label: Any) -> Any:
    return lambda value: f"{name}: {label(value)}"


@bp.get("/p/<tenant>/<project>/ledger")
def ledger_page(tenant: str, project: str) -> ResponseReturnValue:
    """What this project's turns cost and used, by day and model; the costliest of each kind."""
    asked = _asked()
    view = ledger.overview(storage(), principal(), _filters(asked, DEFAULT_SINCE))
    cost_chart, token_chart, legend = _charts(view)
    return render_template(
        "console/ledger.html",
        view=view,
        totals=view.by_day.totals,
        cost_chart=cost_chart,
        token_chart=token_chart,
        legend=legend,
        asked=asked,
        default_since=DEFAULT_SINCE,
        usd=_usd,
        tokens=_tokens,
        since=lg.day_iso(view.by_day.since_day) if view.by_day.since_day is not None else None,
        until=lg.day_iso(view.by_day.until_day) if view.by_day.until_day is not None else None,
        timeline_url=purl("timeline", **asked),
        task_link=lambda task_id: purl("task", task_id=task_id),
        branch_link=lambda branch: purl("ledger_page", **{**asked, "branch": branch}),
    )


@bp.get("/p/<tenant>/<project>/timeline")
def timeline(tenant: str, project: str) -> ResponseReturnValue:
    """This project's turns across its tasks, newest first."""
    asked = _asked()
    filters = _filters(asked, None)
    cursor = request.args.get("cursor") or None
    try:
        page = ledger.timeline(
            storage(), principal(), TimelineQuery(filters, TIMELINE_PAGE, cursor)
        )
    except InvalidName as exc:  # a cursor of another view, or of other filters
        raise BadRequest(f"{exc.field}: {exc.message}") from None
    return render_template(
        "console/timeline.html",
        entries=page.entries,
        asked=asked,
        default_since=None,
        usd=_usd,
        tokens=_tokens,
        next_url=purl("timeline", cursor=page.next_cursor, **asked) if page.next_cursor else None,
        first_url=purl("timeline", **asked) if cursor else None,
        ledger_url=purl("ledger_page", **asked),
        iso=iso_us,
    )
