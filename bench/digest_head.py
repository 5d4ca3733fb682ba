"""``project.md?limit=N`` (open_digest_head) against the whole digest, by project size, on
both backends, in process.

For each size, a project of N tasks (the tree: listing rows with their sections and a
compacted base, as bench/digest.py builds it; PostgreSQL: one turn per task loaded with one
INSERT ... SELECT, as bench/pg_digest.py does), a few turns written after it (so the tree
splices changes in), then, interleaved rep by rep:

* ``head``: open_digest_head(limit=10), read to the end;
* ``whole``: open_digest, read to the end;

and, as the baseline, the head of the smallest project. The figure that matters is
``head / head at the smallest size``: about 1 when the head costs what it returns.

    python -m bench.digest_head [--sizes 1000,10000,100000] [--reps 15] [--backends tree,pg]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from app.storage.core.names import Scope

from . import workloads as w
from .digest import SCOPE, build

LIMIT = 10


def timed(open_: Any) -> tuple[float, int]:
    started = time.perf_counter()
    file, _ = open_()
    try:
        size = 0
        while chunk := file.read(256 * 1024):
            size += len(chunk)
    finally:
        file.close()
    return (time.perf_counter() - started) * 1000, size


def measure(tasks: Any, scope: Scope, reps: int) -> dict[str, float]:
    for rep in range(3):  # changes since the base: the tree splices them in
        tasks.put_turn(scope, f"t{rep:07d}", 1, meta=w.meta(0, rep), summary_md=w.SUMMARY)
    heads, wholes, size = [], [], 0
    for _ in range(reps):
        heads.append(timed(lambda: tasks.open_digest_head(scope, limit=LIMIT))[0])
        ms, size = timed(lambda: tasks.open_digest(scope))
        wholes.append(ms)
    return {
        "head_ms": statistics.median(heads),
        "whole_ms": statistics.median(wholes),
        "bytes": size,
    }


def tree_rows(sizes: list[int], reps: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        root = Path(tempfile.mkdtemp(prefix="bench-head-"))
        try:
            store = build(root / "root", n)
            rows.append({"backend": "tree", "tasks": n, **measure(store, SCOPE, reps)})
            while store.later.busy():  # a compaction the reads asked for, in the background
                time.sleep(0.05)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def pg_rows(sizes: list[int], reps: int) -> list[dict[str, Any]]:
    from tools.services import Postgres, Seaweed, scratch_dir

    from .pg import engine, load_tasks, node_env

    work = scratch_dir("pm-bench-head-")
    rows = []
    try:
        postgres = Postgres(work / "pg", durable=True).start()
        seaweed = Seaweed(work / "s3").start()
        try:
            env = node_env(postgres, seaweed)
            storage = engine(env)
            try:
                for n in sizes:
                    project = f"h{n}"
                    load_tasks(env["MEMORY_DATABASE_URL"], project, n)
                    scope = Scope("bench", project)
                    timed(lambda scope=scope: storage.tasks.open_digest(scope))  # fills sections
                    rows.append(
                        {"backend": "pg", "tasks": n, **measure(storage.tasks, scope, reps)}
                    )
            finally:
                storage.close()
        finally:
            seaweed.stop()
            postgres.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--backends", default="tree,pg")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict[str, Any]] = []
    if "tree" in args.backends:
        rows += tree_rows(sizes, args.reps)
    if "pg" in args.backends:
        rows += pg_rows(sizes, args.reps)
    print(
        f"| backend | tasks | head (limit={LIMIT}) ms | head / smallest's | whole ms | whole MB |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        smallest = next(r for r in rows if r["backend"] == row["backend"])
        ratio = row["head_ms"] / smallest["head_ms"]
        print(
            f"| {row['backend']} | {row['tasks']:,} | {row['head_ms']:.2f} | {ratio:.2f}"
            f" | {row['whole_ms']:.1f} | {row['bytes'] / 1e6:.1f} |"
        )


if __name__ == "__main__":
    main()
