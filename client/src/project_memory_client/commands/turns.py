"""``turn put TASK N|next``, ``turn get TASK N`` and ``turn delete TASK N``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .. import rules
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
    from ..client import Upload
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
        " safely, however many writers race for it. With --artifact, the turn and its"
        " artifacts are written in one request: all of them or none (the turn's other"
        " artifacts stay).",
        epilog="example: project-memory turn put fix-login next --summary-file notes.md"
        " --artifact test.log --artifact 'out/report.html:report.html'"
        " --artifact 'trace.bin;type=application/vnd.tcpdump.pcap'",
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
    put.add_argument(
        "--artifact",
        action="append",
        default=[],
        metavar="PATH[:NAME][;type=TYPE]",
        help="store file PATH with the turn, in the same request (repeat, at most"
        f" {rules.MAX_ARTIFACTS_PER_WRITE}; each at most 50 MiB, streamed from disk). NAME: the"
        " artifact's name (default: PATH's file name; needed when PATH has a ':'); TYPE: its"
        f" Content-Type (default: guessed from NAME, a text type for {rules.TEXT_TYPES_HELP};"
        " else application/octet-stream)",
    )
    conditions(put, "the turn")

    get = leaf(sub, "get", get_turn, help="one turn: meta, summary, artifacts")
    task_and_turn(get)

    delete = leaf(
        sub,
        "delete",
        delete_turn,
        help="delete one turn and its artifacts (the task's owner, or project_admin and above)",
    )
    task_and_turn(delete)
    delete.add_argument("--if-match", metavar="ETAG", help="only this version of the turn")


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


@dataclass(frozen=True)
class ArtifactArg:
    """One ``--artifact PATH[:NAME][;type=TYPE]``, parsed."""

    path: str
    name: str
    content_type: str | None


def parse_artifact(spec: str) -> ArtifactArg:
    """Split ``PATH[:NAME][;type=TYPE]`` and check the name and the type by the server's rules.

    The type starts at the first ``;type=`` (a media type's own parameters may follow it:
    ``;type=text/plain; charset=utf-8``). NAME follows the last ``:`` before it: a name never
    holds a ``:``, so ``a:b.log:b.log`` is the file ``a:b.log`` named ``b.log``.
    """
    where = f"--artifact {spec!r}"
    rest, sep, kind = spec.partition(";type=")
    content_type = None
    if sep:
        content_type = kind.strip()
        if not rules.is_content_type(content_type):
            raise UsageError(f"{where}: {content_type!r} is not a media type (type/subtype)")
    path, sep, name = rest.rpartition(":")
    if not sep:
        path, name = rest, os.path.basename(rest.rstrip("/"))
    elif not name:
        raise UsageError(f"{where}: no NAME after ':'")
    if not path:
        raise UsageError(f"{where}: no PATH")
    fault = rules.artifact_name_fault(name)
    if fault is not None:
        hint = "" if sep else " (give one as PATH:NAME)"
        raise UsageError(f"{where}: the artifact name {name!r} {fault}{hint}")
    return ArtifactArg(path, name, content_type)


def open_artifacts(specs: list[str], stack: contextlib.ExitStack) -> list[Upload]:
    """Each ``--artifact`` opened for reading, its size checked: every fault is a UsageError
    here, before a byte is sent. The uploads stream from these open files, so a file
    renamed or replaced after the check is not the one sent."""
    from ..client import Upload

    parsed = [parse_artifact(spec) for spec in specs]
    if len(parsed) > rules.MAX_ARTIFACTS_PER_WRITE:
        raise UsageError(
            f"{len(parsed)} --artifact options: a turn takes at most"
            f" {rules.MAX_ARTIFACTS_PER_WRITE} in one write (add more with artifact put)"
        )
    seen: dict[str, str] = {}
    for arg in parsed:
        if arg.name in seen:
            raise UsageError(
                f"--artifact {arg.path} and --artifact {seen[arg.name]} are both named"
                f" {arg.name!r}: name one with PATH:NAME"
            )
        seen[arg.name] = arg.path
    uploads = []
    for arg in parsed:
        try:
            # O_NONBLOCK: opening a FIFO would otherwise wait for a writer; a regular file
            # ignores it.
            fd = os.open(arg.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise UsageError(f"--artifact {arg.path}: {exc.strerror or exc}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise UsageError(f"--artifact {arg.path}: {kind}")
        file: IO[bytes] = stack.enter_context(os.fdopen(fd, "rb"))
        if info.st_size > rules.MAX_ARTIFACT_BYTES:
            raise UsageError(
                f"--artifact {arg.path}: {info.st_size} bytes, over the"
                f" {rules.MAX_ARTIFACT_BYTES} bytes (50 MiB) an artifact may hold"
            )
        uploads.append(Upload(arg.name, file, arg.content_type))
    return uploads


def put_turn(ctx: Context) -> Output:
    a = ctx.args
    if a.summary_file == "-" and a.meta_json == "-":
        raise UsageError("--summary-file and --meta-json cannot both read stdin")
    if a.turn == "next" and a.if_match:
        raise UsageError("--if-match names one version of one turn; it cannot go with 'next'")
    with contextlib.ExitStack() as stack:
        uploads = open_artifacts(a.artifact, stack)
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
            artifacts=uploads,
            progress=ctx.progress(f"turn {a.turn} of {a.task}") if uploads else None,
        )
    text = f"stored turn {record.turn} of task {record.task_id} (ETag {record.etag})"
    names = {u.name for u in uploads}
    stored = [
        f"{x.name} ({x.size} bytes, {x.content_type})" for x in record.artifacts if x.name in names
    ]
    if stored:
        text += "\nwith " + ", ".join(stored)
    return Output(record.to_dict(), text)


def get_turn(ctx: Context) -> Output:
    record = ctx.client().get_turn(ctx.args.task, ctx.args.turn)
    return Output(record.to_dict(), render_turn(record))


def delete_turn(ctx: Context) -> Output:
    a = ctx.args
    ctx.client().delete_turn(a.task, a.turn, if_match=a.if_match)
    return Output(
        {"task_id": a.task, "turn": a.turn, "deleted": True}, f"deleted turn {a.turn} of {a.task}"
    )


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
