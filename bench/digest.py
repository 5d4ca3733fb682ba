"""project.md after a write, in projects of 1,000 to 100,000 tasks: engine-level figures.

For each size, one storage root holds a project of N tasks (listing rows with their digest
sections, ~1.5 KB each, written straight into the listing as bench/loader.py's listing-only
mode does) and a compacted base. Then, repeated:

* one turn is written (a real task, through TaskStore.put_turn), and project.md is opened
  and read: time to the first byte, to the last, and the CPU the read spent;
* the same read again with nothing written in between (the base, as it is).

And once per size: the compaction that folds the changes back into the base (it runs in the
background, or in the sweeper), and the peak of the read's memory.

    python -m bench.digest [--sizes 1000,10000,100000] [--reps 20]

The HTTP figures (gunicorn in between) are bench/scale.py's rows.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

from app.storage.core.digest import Section
from app.storage.core.names import Scope
from app.storage.tree.fs.atomic import make_dirs
from app.storage.tree.sqlite import digestdb
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.tasks import TaskStore

from . import workloads as w
from .loader import unsafe_fast_mode

SCOPE = Scope("bench", "digest")


def build(root: Path, count: int) -> TaskStore:
    unsafe_fast_mode()
    store = TaskStore(root)
    make_dirs(store.layout.project_dir(SCOPE), store.layout.root)
    listing = store.listing(SCOPE)
    now = store.now_us()
    retain = now + store.retention_us
    body = w.SUMMARY.encode()
    for i in range(count):
        task = f"t{i:07d}"
        head = f"\n## {task}\n\nLatest turn: 0, updated 2026-01-01T00:00:00.000000Z\n\n"
        listing.put_turn(
            task, TurnRow(0, now - count + i, retain), Section(0, retain, head.encode() + body)
        )
    store.compact_digest(SCOPE)
    return store


def read(store: TaskStore) -> tuple[float, float, float, int]:
    """(first byte ms, last byte ms, CPU ms, bytes) of one read of project.md."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    fh, size = store.open_digest(SCOPE)
    with fh:
        fh.read(1)
        first = time.perf_counter()
        got = 1
        while chunk := fh.read(1 << 16):
            got += len(chunk)
    last = time.perf_counter()
    assert got == size
    return (first - t0) * 1000, (last - t0) * 1000, (time.process_time() - cpu0) * 1000, size


def measure(count: int, reps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-digest-") as tmp:
        t0 = time.perf_counter()
        store = build(Path(tmp), count)
        built = time.perf_counter() - t0
        after_write, repeat = [], []
        for rep in range(reps):
            store.put_turn(SCOPE, "writer", rep, meta=w.meta(0, rep), summary_md=w.SUMMARY)
            after_write.append(read(store))
            repeat.append(read(store))
        # Enough changes to ask for a compaction, then the compaction itself.
        for i in range(digestdb.COMPACT_AFTER):
            store.put_turn(SCOPE, f"w{i:04d}", 0, meta={}, summary_md=w.SUMMARY)
        t0 = time.perf_counter()
        store.digests.compact(SCOPE, wait=True)
        compact = time.perf_counter() - t0
        size = after_write[-1][3]
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    return {
        "tasks": count,
        "built_s": built,
        "bytes": size,
        "write_ttfb_ms": med(after_write, 0),
        "write_total_ms": med(after_write, 1),
        "write_cpu_ms": med(after_write, 2),
        "repeat_ttfb_ms": med(repeat, 0),
        "repeat_total_ms": med(repeat, 1),
        "compact_s": compact,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    results = [measure(int(n), args.reps) for n in args.sizes.split(",")]
    print(
        "| tasks | digest | after a write: TTFB / all / CPU | unchanged: TTFB / all |"
        " compaction | process peak RSS |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['tasks']:,} | {r['bytes'] / (1 << 20):.1f} MiB"
            f" | {r['write_ttfb_ms']:.2f} / {r['write_total_ms']:.0f} / {r['write_cpu_ms']:.1f} ms"
            f" | {r['repeat_ttfb_ms']:.2f} / {r['repeat_total_ms']:.0f} ms"
            f" | {r['compact_s']:.2f} s | {r['peak_rss_mib']:.0f} MiB |"
        )
    small = results[0]
    for r in results[1:]:
        print(
            f"{r['tasks']:,} / {small['tasks']:,} tasks: TTFB after a write"
            f" x{r['write_ttfb_ms'] / small['write_ttfb_ms']:.2f},"
            f" CPU before the first byte is what changed, not the project"
        )


if __name__ == "__main__":
    main()
