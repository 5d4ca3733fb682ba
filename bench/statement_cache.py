"""What an index connection's statement cache costs and saves (app/storage/tree/sqlite/db.py
``STATEMENT_CACHE``), against Python's default of 128, in the same run.

A worker keeps dozens of index connections open (pool.py); what each holds besides its pages
is its prepared statements. This runs one project's mixed traffic in process (turn writes,
a delete per five, a search of 1 to 4 words and a task list per write) through the tree
backend, in interleaved rounds per setting, each on a fresh root, and reports:

* the time of one round's iteration (median over rounds);
* the SQLite heap after the round (``sqlite3_memory_used``) over the index connections open
  then: what one connection of a long-lived worker holds.

    python -m bench.statement_cache [--rounds 4] [--iterations 600] [--settings 128,32]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import random
import statistics
import tempfile
import time
from pathlib import Path

from app.storage.core.errors import NotFound
from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage
from app.storage.tree.sqlite import db, listing, store_index

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
]


def _sqlite() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return lib


def _close_pools() -> None:
    for pool in (listing.Listing._pool, store_index.StoreIndex._pool):
        pool.forget(lambda _key: True)
    gc.collect()


def one_round(cache: int, iterations: int, seed: int) -> tuple[float, float, int]:
    """(ms per iteration, SQLite heap KiB per open index connection, connections)."""
    db.STATEMENT_CACHE = cache
    rng = random.Random(seed)
    storage = TreeStorage(Path(tempfile.mkdtemp(prefix="bench-stmt-")))
    scope = Scope("acme", "web")

    def step() -> None:
        task = f"t{rng.randrange(60)}"
        storage.tasks.put_turn(
            scope,
            task,
            rng.randrange(5),
            meta={"model": "m"},
            summary_md=" ".join(rng.choices(WORDS, k=20)),
        )
        if rng.randrange(5) == 0:
            # A turn that is not there (404): the mix goes on.
            with contextlib.suppress(NotFound):
                storage.tasks.delete_turn(scope, f"t{rng.randrange(60)}", rng.randrange(5))
        storage.search(scope, " ".join(rng.sample(WORDS, rng.randint(1, 4))))
        storage.tasks.list_tasks(scope, limit=20)

    for _ in range(iterations // 6):  # warm: the files exist, the pools hold connections
        step()
    started = time.perf_counter()
    for _ in range(iterations):
        step()
    elapsed = (time.perf_counter() - started) / iterations * 1e3
    conns = len(listing.Listing._pool._idle) + len(store_index.StoreIndex._pool._idle)
    heap = _sqlite().sqlite3_memory_used() / 1024 / max(conns, 1)
    _close_pools()
    return elapsed, heap, conns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=600)
    parser.add_argument("--settings", default="128,32")
    args = parser.parse_args()
    settings = [int(s) for s in args.settings.split(",")]
    found: dict[int, list[tuple[float, float, int]]] = {s: [] for s in settings}
    for n in range(args.rounds):
        order = settings if n % 2 == 0 else settings[::-1]
        for cache in order:
            found[cache].append(one_round(cache, args.iterations, seed=n))
    base = statistics.median(r[0] for r in found[settings[0]])
    base_heap = statistics.median(r[1] for r in found[settings[0]])
    print(f"{'statements':>10} {'ms/iter':>8} {'ratio':>6} {'KiB/conn':>9} {'ratio':>6}")
    for cache in settings:
        ms = statistics.median(r[0] for r in found[cache])
        heap = statistics.median(r[1] for r in found[cache])
        print(f"{cache:>10} {ms:8.2f} {ms / base:6.2f} {heap:9.0f} {heap / base_heap:6.2f}")


if __name__ == "__main__":
    main()
