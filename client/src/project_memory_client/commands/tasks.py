"""``tasks`` (a page, or ``--all``), ``task show TASK`` and ``task delete TASK``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from . import Context, Output, add_common_options, configure, fields, leaf, subcommands, table


def _limit(high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not 1 <= value <= high:
            raise argparse.ArgumentTypeError(f"must be 1 to {high}")
        return value

    return parse


def paging_options(parser: argparse.ArgumentParser, *, default: int, high: int) -> None:
    parser.add_argument(
        "--limit",
        type=_limit(high),
        default=default,
        help=f"per page, 1..{high} (default {default})",
    )
    parser.add_argument("--cursor", help="the next_cursor a previous page gave")
    parser.add_argument("--all", action="store_true", help="every page, to the end")


def register_tasks(parser: argparse.ArgumentParser) -> None:
    add_common_options(parser)
    paging_options(parser, default=50, high=1000)
    configure(parser, list_tasks)


def register_task(parser: argparse.ArgumentParser) -> None:
    sub = subcommands(parser)
    show = leaf(sub, "show", show_task, help="the task index: turns, meta, artifact names")
    show.add_argument("task", metavar="TASK")
    delete = leaf(
        sub,
        "delete",
        delete_task,
        help="delete a task and all its turns (its owner, or project_admin and above)",
    )
    delete.add_argument("task", metavar="TASK")


def list_tasks(ctx: Context) -> Output:
    a = ctx.args
    client = ctx.client()
    if a.all:
        tasks = list(client.iter_tasks(page_size=a.limit))
        data = {"tasks": [t.to_dict() for t in tasks], "total": len(tasks), "next_cursor": None}
        rows, more = tasks, None
    else:
        page = client.list_tasks(limit=a.limit, cursor=a.cursor)
        data = page.to_dict()
        rows, more = list(page.tasks), page.next_cursor
    text = table(
        ["task", "latest", "turns", "updated", "retain until"],
        [(t.task_id, t.latest_turn, t.turn_count, t.updated_at, t.retain_until) for t in rows],
    )
    text += f"\n{data['total']} task(s)"
    if more:
        text += f"; more: --cursor {more}"
    return Output(data, text)


def show_task(ctx: Context) -> Output:
    index = ctx.client().get_task(ctx.args.task)
    head = fields(
        [
            ("task", index.task_id),
            ("owner", index.owner),
            ("created", index.created_at),
            ("updated", index.updated_at),
            ("retain until", index.retain_until),
            ("turns", index.turn_count),
        ]
    )
    rows = [
        (
            t.turn,
            t.updated_at,
            t.meta.get("model"),
            t.meta.get("exit_code"),
            ", ".join(t.artifacts) or None,
        )
        for t in index.turns
    ]
    text = head + "\n\n" + table(["turn", "updated", "model", "exit", "artifacts"], rows)
    return Output(index.to_dict(), text)


def delete_task(ctx: Context) -> Output:
    task_id = ctx.args.task
    ctx.client().delete_task(task_id)
    return Output({"task_id": task_id, "deleted": True}, f"deleted task {task_id}")
