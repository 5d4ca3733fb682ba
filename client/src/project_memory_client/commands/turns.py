"""``turn put TASK N|next`` and ``turn get TASK N``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import (
    Context,
    Output,
    UsageError,
    conditions,
    fields,
    leaf,
    subcommands,
    table,
    task_and_turn,
    turn_number,
)

if TYPE_CHECKING:
    from ..models import TurnRecord

# The seed's numeric meta fields: ``exit_code=0`` sends the number 0 (any other ``key=value``
# is a string; ``key:=JSON`` sends any JSON value).
NUMERIC_META = frozenset({"exit_code", "tokens", "cost", "started_at", "ended_at"})


def register(parser: argparse.ArgumentParser) -> None:
    sub = subcommands(parser)
    put = leaf(
        sub,
        "put",
        put_turn,
        help="upsert one turn's meta and summary",
        description="Upsert one turn's meta and summary. N=next takes the next free number"
        " safely, however many writers race for it.",
    )
    task_and_turn(put, "N|next", _turn_or_next)
    summary = put.add_mutually_exclusive_group()
    summary.add_argument(
        "--summary-file", metavar="F", help="the Markdown summary from file F ('-': stdin)"
    )
    summary.add_argument("--summary", metavar="TEXT", help="the Markdown summary itself")
    put.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a meta field (repeat): KEY=text, KEY:=JSON; exit_code, tokens, cost,"
        " started_at, ended_at take numbers as numbers",
    )
    put.add_argument(
        "--meta-json", metavar="F", help="meta fields from the JSON object in F ('-': stdin)"
    )
    conditions(put, "the turn")

    get = leaf(sub, "get", get_turn, help="one turn: meta, summary, artifacts")
    task_and_turn(get)


def _turn_or_next(text: str) -> int | str:
    return "next" if text == "next" else turn_number(text)


def _read_text(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    return Path(name).read_text(encoding="utf-8")


def meta_from_args(pairs: list[str], meta_json: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if meta_json is not None:
        try:
            loaded = json.loads(_read_text(meta_json))
        except ValueError as exc:
            raise UsageError(f"--meta-json {meta_json}: not JSON ({exc})") from None
        if not isinstance(loaded, dict):
            raise UsageError(f"--meta-json {meta_json}: not a JSON object")
        meta.update(loaded)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--meta {pair!r}: expected KEY=VALUE or KEY:=JSON")
        if key.endswith(":"):
            key = key[:-1]
            try:
                meta[key] = json.loads(value)
            except ValueError as exc:
                raise UsageError(f"--meta {pair!r}: not JSON ({exc})") from None
        elif key in NUMERIC_META:
            meta[key] = _number_or_text(value)
        else:
            meta[key] = value
    return meta


def _number_or_text(value: str) -> Any:
    try:
        number = json.loads(value)
    except ValueError:
        return value
    return number if isinstance(number, (int, float)) and not isinstance(number, bool) else value


def put_turn(ctx: Context) -> Output:
    a = ctx.args
    if a.summary_file == "-" and a.meta_json == "-":
        raise UsageError("--summary-file and --meta-json cannot both read stdin")
    if a.turn == "next" and a.if_match:
        raise UsageError("--if-match names one version of one turn; it cannot go with 'next'")
    meta = meta_from_args(a.meta, a.meta_json)
    summary = a.summary or ""
    if a.summary_file is not None:
        summary = _read_text(a.summary_file)
    record = ctx.client().put_turn(
        a.task,
        a.turn,
        meta=meta,
        summary_md=summary,
        if_match=a.if_match,
        if_none_match="*" if a.if_none_match else None,
    )
    text = f"stored turn {record.turn} of task {record.task_id} (ETag {record.etag})"
    return Output(record.to_dict(), text)


def get_turn(ctx: Context) -> Output:
    record = ctx.client().get_turn(ctx.args.task, ctx.args.turn)
    return Output(record.to_dict(), render_turn(record))


def render_turn(record: TurnRecord) -> str:
    parts = [
        fields(
            [
                ("task", record.task_id),
                ("turn", record.turn),
                ("created", record.created_at),
                ("updated", record.updated_at),
                ("retain until", record.retain_until),
                ("etag", record.etag),
            ]
        )
    ]
    if record.meta:
        rows = [(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in record.meta.items()]
        parts.append(table(["meta", "value"], rows, max_width=80))
    if record.artifacts:
        parts.append(
            table(
                ["artifact", "type", "size", "updated"],
                [(a.name, a.content_type, a.size, a.updated_at) for a in record.artifacts],
            )
        )
    parts.append(record.summary_md.rstrip("\n") if record.summary_md else "(no summary)")
    return "\n\n".join(parts)
