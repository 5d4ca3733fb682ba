"""``project-memory import`` and ``export``: agents' memory files into a store and back.

Exit status: 0 when everything planned was written (files skipped for a reason reported are
not failures); 1 when some path was not (a conflict, a path or content the store refused, a
file left alone on export), or the API refused the run; 2 bad usage; 3 the server cannot be
reached.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

from ..commands import (
    CommandError,
    Context,
    Output,
    UsageError,
    add_common_options,
    configure,
    table,
)

if TYPE_CHECKING:  # loaded when the command runs: `--help` needs no httpx
    from ..mount.http import StoreClient

STORE_HELP = "the store: its id (memstore_...) or its name"


def register_import(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read a repository's agent memory files (CLAUDE.md and its @imports, AGENTS.md,"
        " Cursor rules, Claude Code's auto memory, an MCP memory.json) into a memory store."
        " Files already there with the same content are left alone. See docs/client.md."
    )
    add_common_options(parser)
    parser.add_argument(
        "--store",
        required=True,
        metavar="STORE",
        help=STORE_HELP + " (a name no store has: created)",
    )
    parser.add_argument(
        "root", nargs="?", default=".", metavar="ROOT", help="the repository (default: .)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would change; write nothing"
    )
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument(
        "--auto-memory",
        metavar="DIR",
        help="Claude Code's auto-memory folder (default: the project's, under ~/.claude/projects/)",
    )
    memory.add_argument(
        "--no-auto-memory", action="store_true", help="leave Claude Code's auto memory out"
    )
    parser.add_argument(
        "--codex-memories",
        nargs="?",
        const="",
        metavar="DIR",
        help="Codex's memories too (default DIR: $CODEX_HOME/memories, else ~/.codex/memories);"
        " they are the user's, of every project, so only when asked",
    )
    parser.add_argument(
        "--mcp-memory",
        action="append",
        default=[],
        metavar="FILE",
        help="an MCP memory server's file (repeat; ROOT/memory.json and memory.jsonl are read anyway)",
    )
    configure(parser, run_import)


def register_export(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a memory store back as files under DIR: each memory at its path, an imported"
        " MCP memory file regenerated from its entities. A file with other bytes is left alone"
        " unless --force. See docs/client.md."
    )
    add_common_options(parser)
    parser.add_argument("--store", required=True, metavar="STORE", help=STORE_HELP)
    parser.add_argument("dir", metavar="DIR", help="where to write (created if missing)")
    parser.add_argument("--force", action="store_true", help="overwrite files whose bytes differ")
    configure(parser, run_export)


def _client(ctx: Context) -> StoreClient:
    from ..mount.http import StoreClient

    settings = ctx.settings().require()
    assert settings.url is not None and settings.token is not None
    return StoreClient(
        settings.url,
        settings.token,
        tenant=settings.tenant,
        project=settings.project,
        timeout=settings.timeout,
        agent="project-memory-memfiles",
    )


def _home() -> str:
    return os.path.expanduser("~")


def _folder_flag(value: str, flag: str) -> str:
    if not os.path.isdir(value):
        raise UsageError(f"{flag}: not a folder: {value}")
    return value


def _counts(actions: list[str], keys: tuple[str, ...]) -> dict[str, int]:
    seen = Counter(actions)
    return {key: seen.get(key, 0) for key in keys}


def run_import(ctx: Context) -> Output:
    from .claude import auto_memory_dir
    from .sources import collect
    from .store import ACTIONS, apply, find_store, plan

    a = ctx.args
    if not os.path.isdir(a.root):
        raise UsageError(f"not a folder: {a.root}")
    home = _home()
    if a.no_auto_memory:
        auto_memory = None
    elif a.auto_memory is not None:
        auto_memory = _folder_flag(a.auto_memory, "--auto-memory")
    else:
        auto_memory = auto_memory_dir(os.path.realpath(a.root), home)
    codex = a.codex_memories
    if codex == "":
        codex = os.path.join(
            os.environ.get("CODEX_HOME") or os.path.join(home, ".codex"), "memories"
        )
    if codex is not None:
        codex = _folder_flag(codex, "--codex-memories")
    for given in a.mcp_memory:
        if not os.path.isfile(given):
            raise UsageError(f"--mcp-memory: not a file: {given}")
    found = collect(
        a.root, home=home, auto_memory=auto_memory, codex_memories=codex, mcp_files=a.mcp_memory
    )
    graph_folders = {
        m.path.rsplit("/", 1)[0] for m in found.memories.values() if m.kind == "mcp-entity"
    }
    client = _client(ctx)
    try:
        store = find_store(client, a.store, create=True, dry_run=a.dry_run)
        if store.archived and not a.dry_run:
            raise CommandError(
                f"the memory store {store.id} is archived: it takes no writes",
                exit_code=1,
                kind="api",
            )
        steps = plan(client, store, found.memories.values(), sorted(graph_folders))
        if not a.dry_run:
            assert store.id is not None
            apply(client, store.id, steps)
    finally:
        client.close()
    counts = _counts([s.action for s in steps], ACTIONS)
    counts["skipped"] = len(found.skipped)
    data = {
        "store": store.to_dict(),
        "root": os.path.abspath(a.root),
        "dry_run": a.dry_run,
        "counts": counts,
        "memories": [s.to_dict() for s in steps],
        "skipped": [
            {"source": s.source, "kind": s.kind, "reason": s.reason, "message": s.message}
            for s in found.skipped
        ],
        "notes": found.notes,
    }
    failed = counts["conflict"] + counts["refused"]
    summary = _import_summary(counts, a.dry_run)
    if ctx.json:
        return Output(data, summary if failed else None, 1 if failed else 0)
    return Output(data, _import_text(data, summary), 1 if failed else 0)


def _import_summary(counts: dict[str, int], dry_run: bool) -> str:
    if dry_run:
        head = f"dry run: {counts['create']} to create, {counts['update']} to update"
    else:
        head = f"{counts['create']} created, {counts['update']} updated"
    parts = [head, f"{counts['unchanged']} unchanged"]
    for key in ("conflict", "refused", "stale", "skipped"):
        if counts[key]:
            parts.append(f"{counts[key]} {key}")
    return ", ".join(parts) + ("; nothing written" if dry_run else "")


def _import_text(data: dict[str, Any], summary: str) -> str:
    store = data["store"]
    if store["id"] is None:
        head = f"store {store['name']!r}: would be created"
    else:
        head = f"store {store['id']} ({store['name']})" + (", created" if store["created"] else "")
    lines = [head, ""]
    rows = [
        (m["action"], m["path"], m["source"] or "-", m["message"] or "") for m in data["memories"]
    ]
    if rows:
        lines += [table(["action", "path", "source", "note"], rows, max_width=80), ""]
    if data["skipped"]:
        skipped = [(s["reason"], s["source"], s["message"]) for s in data["skipped"]]
        lines += [table(["skipped", "source", "why"], skipped, max_width=100), ""]
    for note in data["notes"]:
        lines += [f"note: {note['source']}: {note['message']}", ""]
    return "\n".join([*lines, summary])


EXPORT_ACTIONS = ("write", "overwrite", "unchanged", "differs", "refused")


def run_export(ctx: Context) -> Output:
    from ..mount.http import ApiError, TransportError
    from .export import plan_files, write_files
    from .store import find_store, refused, unreachable

    a = ctx.args
    client = _client(ctx)
    try:
        store = find_store(client, a.store, create=False)
        assert store.id is not None
        try:
            memories = client.list_memories(store.id, full=True)
        except TransportError as exc:
            raise unreachable(exc) from None
        except ApiError as exc:
            raise refused(exc, "listing the store") from None
    finally:
        client.close()
    files = plan_files(memories)
    write_files(a.dir, files, force=a.force)
    counts = _counts([f.action for f in files], EXPORT_ACTIONS)
    data = {
        "store": store.to_dict(),
        "dir": os.path.abspath(a.dir),
        "force": a.force,
        "counts": counts,
        "files": [f.to_dict() for f in files],
    }
    failed = counts["differs"] + counts["refused"]
    summary = (
        f"{counts['write']} written, {counts['overwrite']} overwritten,"
        f" {counts['unchanged']} unchanged"
    )
    if counts["differs"]:
        summary += f", {counts['differs']} left alone (they differ: --force overwrites them)"
    if counts["refused"]:
        summary += f", {counts['refused']} refused"
    if ctx.json:
        return Output(data, summary if failed else None, 1 if failed else 0)
    rows = [(f["action"], f["file"], f["message"] or "") for f in data["files"]]
    text = f"store {store.id} ({store.name}) -> {data['dir']}\n\n"
    if rows:
        text += table(["action", "file", "note"], rows, max_width=100) + "\n\n"
    return Output(data, text + summary, 1 if failed else 0)
