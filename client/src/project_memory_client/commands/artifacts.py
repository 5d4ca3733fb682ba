"""``artifact put TASK N FILE``, ``artifact get TASK N NAME`` (streamed both ways) and
``artifact delete TASK N NAME``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import rules
from . import Context, Output, UsageError, conditions, leaf, subcommands, task_and_turn


def register(parser: argparse.ArgumentParser) -> None:
    sub = subcommands(parser)
    put = leaf(
        sub,
        "put",
        put_artifact,
        help="store a file as an artifact of a turn (max 50 MiB)",
        description="Store FILE as an artifact of turn N of TASK, streamed (a progress bar"
        " on a terminal for anything over 1 MiB). The turn must exist.",
    )
    task_and_turn(put)
    put.add_argument("file", metavar="FILE", help="the file to send ('-': stdin, with --name)")
    put.add_argument("--name", help="the artifact's name (default: FILE's name)")
    put.add_argument(
        "--content-type",
        metavar="TYPE",
        help="default: from the name (a text type for"
        f" {rules.TEXT_TYPES_HELP}), else application/octet-stream",
    )
    conditions(put, "the artifact")

    get = leaf(
        sub,
        "get",
        get_artifact,
        help="download an artifact of a turn",
        description="Download artifact NAME of turn N of TASK into a file (written whole or"
        " not at all, its SHA-256 checked), or to stdout with -o -.",
    )
    task_and_turn(get)
    get.add_argument("name", metavar="NAME")
    get.add_argument(
        "-o", "--output", metavar="FILE", help="where to write it (default: ./NAME; '-': stdout)"
    )

    delete = leaf(
        sub,
        "delete",
        delete_artifact,
        help="delete one artifact of a turn (the task's owner, or project_admin and above)",
    )
    task_and_turn(delete)
    delete.add_argument("name", metavar="NAME")
    delete.add_argument("--if-match", metavar="ETAG", help="only this version of the artifact")


def delete_artifact(ctx: Context) -> Output:
    a = ctx.args
    ctx.client().delete_artifact(a.task, a.turn, a.name, if_match=a.if_match)
    return Output(
        {"task_id": a.task, "turn": a.turn, "name": a.name, "deleted": True},
        f"deleted artifact {a.name} of turn {a.turn} of {a.task}",
    )


def put_artifact(ctx: Context) -> Output:
    a = ctx.args
    if a.file == "-":
        if not a.name:
            raise UsageError("--name is required when FILE is '-' (stdin)")
        source: object = sys.stdin.buffer
        name = a.name
    else:
        path = Path(a.file)
        if not path.is_file():
            raise UsageError(f"{a.file}: no such file")
        source, name = path, a.name or path.name
    record = ctx.client().put_artifact(
        a.task,
        a.turn,
        name,
        source,  # type: ignore[arg-type]
        content_type=a.content_type,
        if_match=a.if_match,
        if_none_match="*" if a.if_none_match else None,
        progress=ctx.progress(name),
    )
    text = (
        f"stored {record.name} ({record.size} bytes, {record.content_type}) in turn"
        f" {record.turn} of task {record.task_id} (ETag {record.etag})"
    )
    return Output(record.to_dict(), text)


def get_artifact(ctx: Context) -> Output:
    a = ctx.args
    target = a.output or os.path.basename(a.name) or a.name
    client = ctx.client()
    if target == "-":
        if ctx.json:
            raise UsageError("-o - writes the artifact to stdout, where --json writes the envelope")
        out = sys.stdout.buffer
        info = client.get_artifact(a.task, a.turn, a.name, out, progress=ctx.progress(a.name))
        out.flush()
        return Output(info.to_dict(), None)
    info = client.get_artifact(a.task, a.turn, a.name, target, progress=ctx.progress(a.name))
    text = f"wrote {info.path} ({info.size} bytes, {info.content_type})"
    return Output(info.to_dict(), text)
