"""Memory-store writes and reads with 1 store in the project and with 1,000.

A store is found by a path computation (its directory is named by its id), so the number of
stores beside it must not change what a create, an update or a retrieve costs. Two roots,
one with a single store and one with 1,000, measured interleaved in one process (engine
level, fsync on: what the service pays), medians of ``--reps`` rounds.

    python -m bench.stores_scale [--stores 1000] [--ops 200] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage

from . import workloads as w

SCOPE = Scope("bench", "stores")


def build(root: Path, stores: int) -> tuple[TreeStorage, str]:
    storage = TreeStorage(root)
    target = ""
    for i in range(stores):
        target = storage.stores.create_store(SCOPE, name=f"store {i}").id
    return storage, target


def timed(op: Callable[[int], object], count: int) -> list[float]:
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        op(i)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def round_of(storage: TreeStorage, store_id: str, ops: int, tag: str) -> dict[str, list[float]]:
    stores = storage.stores
    ids: list[str] = []

    def create(i: int) -> None:
        memory = stores.create_memory(
            SCOPE, store_id, path=f"/{tag}/m{i}.md", content=w.SUMMARY, actor=None
        )
        ids.append(memory.id)

    def update(i: int) -> None:
        stores.update_memory(SCOPE, store_id, ids[i], content=f"{w.SUMMARY} {i}", actor=None)

    def retrieve(i: int) -> None:
        stores.get_memory(SCOPE, store_id, ids[i], full=True)

    return {
        "create": timed(create, ops),
        "update": timed(update, ops),
        "retrieve": timed(retrieve, ops),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stores", type=int, default=1000)
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-stores-") as tmp:
        t0 = time.perf_counter()
        roots = {
            1: build(Path(tmp) / "one", 1),
            args.stores: build(Path(tmp) / "many", args.stores),
        }
        print(f"built 1 and {args.stores} stores in {time.perf_counter() - t0:.1f} s")
        medians: dict[int, dict[str, list[float]]] = {n: {} for n in roots}
        for rep in range(args.reps):
            order = list(roots.items())
            for n, (storage, store_id) in order if rep % 2 == 0 else order[::-1]:
                for op, times in round_of(storage, store_id, args.ops, f"r{rep}").items():
                    medians[n].setdefault(op, []).append(statistics.median(times))
    many = args.stores
    print(f"| op | p50 ms, 1 store | p50 ms, {many:,} stores | {many:,} / 1 |")
    print("|---|---:|---:|---:|")
    for op in ("create", "update", "retrieve"):
        one = statistics.median(medians[1][op])
        lots = statistics.median(medians[many][op])
        print(f"| {op} | {one:.2f} | {lots:.2f} | {lots / one:.2f} |")


if __name__ == "__main__":
    main()
