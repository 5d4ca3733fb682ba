"""Build large projects quickly, through the storage engine itself (app.storage.tree.tasks.TaskStore).

For speed this process alone skips fsync (os.fsync is replaced by a no-op and the listing's
SQLite runs with synchronous=OFF): the data is the same tree the server would write, only not
crash-safe while loading. The server that is measured afterwards is never patched.

    python -m bench.loader ROOT TENANT PROJECT COUNT [--start N]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import time
from pathlib import Path

from app.storage.core.digest import Section
from app.storage.core.names import Scope
from app.storage.tree.fs.atomic import make_dirs
from app.storage.tree.sqlite import listing as listing_mod
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.tasks import TaskStore

from . import workloads as w


def _no_fsync(fd: int) -> None:  # noqa: ARG001 - loader only, never the server
    return None


def unsafe_fast_mode() -> None:
    """Loader process only: no fsync, SQLite synchronous=OFF."""
    os.fsync = _no_fsync
    real_connect = sqlite3.connect

    def connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = real_connect(*args, **kwargs)  # type: ignore[arg-type]
        original_execute = conn.execute

        class Conn:
            def __getattr__(self, name: str) -> object:
                return getattr(conn, name)

            def execute(self, sql: str, *a: object) -> sqlite3.Cursor:
                if sql.strip().upper() == "PRAGMA SYNCHRONOUS=FULL":
                    sql = "PRAGMA synchronous=OFF"
                return original_execute(sql, *a)

        return Conn()  # type: ignore[return-value]

    listing_mod.sqlite3 = type(  # type: ignore[assignment]
        "sqlite3_shim", (), {**vars(sqlite3), "connect": staticmethod(connect)}
    )


def task_id(i: int) -> str:
    return f"t{i:06d}"


def load(root: Path, tenant: str, project: str, count: int, start: int = 0) -> float:
    """Write tasks start..count-1 (one turn each, ~1 KB summary); return seconds taken."""
    unsafe_fast_mode()
    store = TaskStore(root)
    scope = Scope(tenant, project)
    t0 = time.perf_counter()
    for i in range(start, count):
        store.put_turn(
            scope,
            task_id(i),
            0,
            meta=w.meta(i % 8, i),
            summary_md=w.SUMMARY,
            actor="loader",
        )
    return time.perf_counter() - t0


def load_listing_only(root: Path, tenant: str, project: str, count: int) -> float:
    """Write only the listing rows of ``count`` tasks (no task directories); return seconds.

    GET tasks reads nothing but this index, so a listing-only project measures the same work
    as a full tree; `python -m bench.growth` without --quick builds the full tree instead.
    """
    unsafe_fast_mode()
    store = TaskStore(root)
    scope = Scope(tenant, project)
    make_dirs(store.layout.project_dir(scope), store.layout.root)
    listing = store.listing(scope)
    now = store.now_us()
    retain = now + store.retention_us
    t0 = time.perf_counter()
    for i in range(count):
        listing.put_turn(task_id(i), TurnRow(0, now - count + i, retain), row_section(i, retain))
    return time.perf_counter() - t0


def row_section(i: int, retain_us: int) -> Section:
    """A digest section for a listing-only row (its text is not the record's: there is none)."""
    return Section(0, retain_us, f"\n## {task_id(i)}\n\nLatest turn: 0\n\n".encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("tenant")
    parser.add_argument("project")
    parser.add_argument("count", type=int)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--listing-only", action="store_true")
    args = parser.parse_args()
    if args.listing_only:
        seconds = load_listing_only(args.root, args.tenant, args.project, args.count)
    else:
        seconds = load(args.root, args.tenant, args.project, args.count, args.start)
    print(
        f"loaded {args.count - args.start} tasks into {args.tenant}/{args.project} in {seconds:.1f} s"
    )


if __name__ == "__main__":
    main()
