"""project.md after a write on the PostgreSQL + S3 backend, in projects of 1,000 to 100,000
tasks: engine-level figures, as bench/digest.py gives them for the tree.

A PostgreSQL 15 and a SeaweedFS start as the tests start them (tools/services.py). For each
size, a project of N tasks (one turn each, meta and a ~1 KB summary as the workloads write)
is loaded with one INSERT ... SELECT (bench/pg.py's ``load_tasks``), then, in this process:

* the first read of project.md (what a read costs after an upgrade or a bulk load);
* repeated: one turn written through the engine (``put_turn``), then project.md opened
  and read whole: time to the first byte, to the last, the CPU this process spent (the
  worker's share) and the CPU PostgreSQL spent;
* the same read again with nothing written in between.

    python -m bench.pg_digest [--sizes 1000,10000,100000] [--reps 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time

from app.storage.core.names import Scope
from tools.services import Postgres, Seaweed, scratch_dir

from . import workloads as w
from .pg import _cpu as cpu_of, backing_pids, engine, load_tasks, node_env

CHUNK = 64 * 1024


def read_once(tasks: object, scope: Scope, pids: list[int]) -> dict[str, float]:
    """Open and read project.md whole: seconds to the first byte and the last, and CPU."""
    cpu0, pg0 = time.process_time(), cpu_of(pids)
    started = time.perf_counter()
    file, size = tasks.open_digest(scope)  # type: ignore[attr-defined]
    with file:
        first = file.read(CHUNK)
        ttfb = time.perf_counter() - started
        got = len(first)
        while chunk := file.read(CHUNK):
            got += len(chunk)
    total = time.perf_counter() - started
    if got != size:
        raise SystemExit(f"project.md: read {got} bytes, announced {size}")
    return {
        "ttfb_ms": 1000 * ttfb,
        "total_ms": 1000 * total,
        "cpu_ms": 1000 * (time.process_time() - cpu0),
        "pg_cpu_ms": 1000 * (cpu_of(pids) - pg0),
        "bytes": size,
    }


def med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = scratch_dir("pm-bench-pgdigest-")
    try:
        postgres = Postgres(work / "pg", durable=True).start()
        seaweed = Seaweed(work / "s3").start()
        try:
            env = node_env(postgres, seaweed)
            storage = engine(env)
            pids = backing_pids(postgres, seaweed)
            print(
                "| tasks | first read s | after a write: TTFB ms | whole ms | worker CPU ms"
                " | PostgreSQL CPU ms | unchanged: TTFB ms | whole ms | worker CPU ms | MB |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            try:
                for n in sizes:
                    project = f"d{n}"
                    load_tasks(env["MEMORY_DATABASE_URL"], project, n)
                    scope = Scope("bench", project)
                    first = read_once(storage.tasks, scope, pids)
                    after, again = [], []
                    for rep in range(args.reps):
                        storage.tasks.put_turn(
                            scope, f"t{rep * 7919 % n:06d}", 1,
                            meta=w.meta(0, rep), summary_md=w.SUMMARY,
                        )  # fmt: skip
                        after.append(read_once(storage.tasks, scope, pids))
                        again.append(read_once(storage.tasks, scope, pids))
                    print(
                        f"| {n:,} | {first['total_ms'] / 1000:.2f}"
                        f" | {med(after, 'ttfb_ms'):.1f} | {med(after, 'total_ms'):.0f}"
                        f" | {med(after, 'cpu_ms'):.0f} | {med(after, 'pg_cpu_ms'):.0f}"
                        f" | {med(again, 'ttfb_ms'):.1f} | {med(again, 'total_ms'):.0f}"
                        f" | {med(again, 'cpu_ms'):.0f} | {after[-1]['bytes'] / 1e6:.1f} |",
                        flush=True,
                    )
            finally:
                storage.close()
        finally:
            seaweed.stop()
            postgres.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
