"""``ledger`` and ``timeline``: what the project's turns add up to, and what happened lately
(GET /ledger and GET /timeline, docs/api.md "The ledger")."""

from __future__ import annotations

import argparse
from typing import Any

from . import Context, Output, add_common_options, configure, table

DIMENSIONS = ("day", "agent", "model", "branch", "task", "session", "owner")
FIGURES = (
    ("turns", "turns"),
    ("sessions", "sessions"),
    ("input_tokens", "in"),
    ("output_tokens", "out"),
    ("cache_read_tokens", "cache read"),
    ("cache_creation_tokens", "cache write"),
    ("cost_usd", "cost usd"),
    ("wall_seconds", "wall"),
    ("nonzero_exits", "failed"),
)


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="from this moment on: an RFC 3339 time, 30m, 12h, 7d, 2w, today or yesterday",
    )
    parser.add_argument("--until", metavar="WHEN", help="before this moment (the same forms)")
    parser.add_argument("--agent", help="only this agent (meta agent_id), exactly")
    parser.add_argument("--model", help="only this model, exactly")
    parser.add_argument("--branch", help="only this git branch, exactly")
    parser.add_argument("--cursor", help="the next page, from the last output")


def _dimensions(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in DIMENSIONS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"not a dimension: {', '.join(unknown)} (one of {', '.join(DIMENSIONS)})"
        )
    return names


def register_ledger(parser: argparse.ArgumentParser) -> None:
    add_common_options(parser)
    parser.add_argument(
        "--by",
        type=_dimensions,
        default=["day"],
        metavar="DIMS",
        help=f"group by these, comma-separated: {', '.join(DIMENSIONS)} (default: day;"
        " '' for the totals alone)",
    )
    _filters(parser)
    parser.add_argument("--limit", type=int, metavar="N", help="rows per page (100; up to 1000)")
    configure(parser, show_ledger)


def register_timeline(parser: argparse.ArgumentParser) -> None:
    add_common_options(parser)
    _filters(parser)
    parser.add_argument("--limit", type=int, metavar="N", help="turns per page (50; up to 500)")
    configure(parser, show_timeline)


def _filter_values(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    return {
        "since": a.since,
        "until": a.until,
        "agent": a.agent,
        "model": a.model,
        "branch": a.branch,
        "limit": a.limit,
        "cursor": a.cursor,
    }


def _figure(name: str, value: Any) -> Any:
    if name == "cost_usd":
        return f"{value:.4f}"
    if name == "wall_seconds":
        return _duration(value)
    return value


def _duration(seconds: float) -> str:
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _key(row: dict[str, Any], name: str) -> Any:
    """A row's key as the table shows it: an owner by the name of its person and token."""
    if name == "owner":
        return row.get("owner_name") or row.get("owner")
    return row.get(name)


def show_ledger(ctx: Context) -> Output:
    by: list[str] = ctx.args.by
    report = ctx.client().ledger(group_by=by, **_filter_values(ctx))
    labels = [label for _, label in FIGURES]
    totals = report["totals"]
    total = [_figure(k, totals[k]) for k, _ in FIGURES]
    rows = [
        [_key(row, d) for d in by] + [_figure(k, row[k]) for k, _ in FIGURES]
        for row in report["rows"]
    ]
    # The totals last, under the first key column ("total" alone without a grouping).
    rows.append(["total", *[""] * (len(by) - 1), *total] if by else ["total", *total])
    headers = [*by, *labels] if by else ["", *labels]
    lines = [table(headers, rows)]
    since, until = report["since"], report["until"]
    span = (
        "every day" if since is None and until is None else f"days {since or '…'} to {until or '…'}"
    )
    notes = [span, "cost in US dollars"]
    if totals["unpriced_turns"]:
        notes.append(
            f"{totals['unpriced_turns']} turn(s) with no cost of their own and no price for"
            " their model are not in it (a project_admin sets prices: PUT /ledger/prices)"
        )
    lines.append("; ".join(notes))
    if report["next_cursor"]:
        lines.append(f"more rows: --cursor {report['next_cursor']}")
    return Output(report, "\n".join(lines))


def show_timeline(ctx: Context) -> Output:
    found = ctx.client().timeline(**_filter_values(ctx))
    rows = [
        (
            t["at"],
            f"{t['task_id']} #{t['turn']}",
            t["agent"],
            t["model"],
            t["branch"],
            f"{t['input_tokens']}/{t['output_tokens']}",
            None if t["cost_usd"] is None else f"{t['cost_usd']:.4f}",
            _duration(t["wall_seconds"]),
            t["exit_code"],
        )
        for t in found["turns"]
    ]
    headers = ["at", "turn", "agent", "model", "branch", "in/out", "cost usd", "wall", "exit"]
    text = table(headers, rows) + f"\n{len(rows)} turn(s), newest first"
    if found["next_cursor"]:
        text += f"; older: --cursor {found['next_cursor']}"
    return Output(found, text)
