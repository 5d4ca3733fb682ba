"""Full-text search at 100,000 turns: query latency, the cost it adds to a turn write, and the
cost of making deleted text leave the files.

One root, one project of ``--turns`` turns (one per task, ~1 KB of generated text each: a
Zipf-distributed vocabulary with the words the queries look for sprinkled in at known rates,
meta as in bench/workloads.py with a ticket number), written through Listing.put_turn with
its search text, as a turn write does it (bench/loader.py's listing-only way: the task
directories are not needed to search), plus ``--stores`` memory stores of ``--memories``
memories each, written through the store engine. Loading runs in a child process that skips
fsync (bench.loader.unsafe_fast_mode); everything measured runs in this process, unpatched.

Printed: p50/p99 of TreeStorage.search (the storage call the API and the console make; HTTP
adds its ~2 ms) for each query, with 0, 16 and all stores; p50 of a turn write
(TaskStore.put_turn: records fsynced, listing and search rows) with and without the search
row, interleaved; the time a task delete spends purging the index, and a byte search of the
files for the deleted text. Never part of `make test`; nothing asserts on time.

    python -m bench.search [--turns 100000] [--stores 64] [--memories 20] [--reps 100]
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.storage.core.digest import Section
from app.storage.core.names import Scope
from app.storage.core.query import meta_text
from app.storage.tree.backend import TreeStorage
from app.storage.tree.fs.atomic import make_dirs
from app.storage.tree.search import TreeSearch
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.sqlite.turn_search import TurnText

from . import workloads as w
from .loader import unsafe_fast_mode

SCOPE = Scope("bench", "search")
DELETED_WORD = "Qqzxbenchsecretword"
# Words the queries look for, and the share of summaries that carry each.
PLANTED = {
    "login": 0.02,
    "bug": 0.03,
    "session": 0.02,
    "timeout": 0.02,
    "migration": 0.01,
    "migrate": 0.005,
    "database": 0.05,
}
QUERIES = [
    "login bug",  # two words, ~0.06% of turns have both
    '"session timeout"',  # a phrase
    "migrat*",  # a prefix
    "WEB-4242",  # a ticket number in meta: a handful of turns
    "database",  # one word in 5% of turns
    "claude",  # the model, in every turn's meta: every turn matches
]


def vocabulary(seed: int = 1) -> list[str]:
    rnd = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {"".join(rnd.choice(letters) for _ in range(rnd.randint(3, 9))) for _ in range(25000)}
    return sorted(words - set(PLANTED))[:20000]


class Text:
    """Summaries of ~150 words from a Zipf vocabulary, the planted words at their rates."""

    def __init__(self, seed: int = 2) -> None:
        self.rnd = random.Random(seed)
        self.words = vocabulary()
        self.cum = list(itertools.accumulate(1 / (i + 1) for i in range(20000)))

    def summary(self) -> str:
        words = self.rnd.choices(self.words, cum_weights=self.cum, k=150)
        for word, rate in PLANTED.items():
            if self.rnd.random() < rate:
                words.insert(self.rnd.randrange(len(words)), word)
        if self.rnd.random() < 0.01:
            at = self.rnd.randrange(len(words))
            words[at : at + 1] = ["session", "timeout"]
        return f"## Turn\n\n{' '.join(words)}."


def meta(i: int) -> dict[str, object]:
    return {**w.meta(i % 8, i), "ticket": f"WEB-{i % 20000}"}


def load(root: str, turns: int, stores: int, memories: int) -> None:
    """The child process: the whole project, fsync skipped."""
    unsafe_fast_mode()
    storage = TreeStorage(Path(root))
    make_dirs(storage.layout.project_dir(SCOPE), storage.layout.root)
    listing = storage.tasks.listing(SCOPE)
    text = Text()
    now = storage.tasks.now_us()
    retain = now + storage.tasks.retention_us
    t0 = time.perf_counter()
    for i in range(turns):
        task = f"t{i:06d}"
        row = TurnRow(0, now - turns + i, retain, "tok_loader", "claude-sonnet-4-5", None, 0)
        section = Section(0, retain, f"\n## {task}\n\nLatest turn: 0\n\n".encode())
        listing.put_turn(task, row, section, TurnText(task, meta_text(meta(i)), text.summary()))
    t1 = time.perf_counter()
    for s in range(stores):
        store_id = storage.stores.create_store(SCOPE, name=f"store {s}").id
        for m in range(memories):
            storage.stores.create_memory(
                SCOPE, store_id, path=f"/notes/m{m}.md", content=text.summary(), actor=None
            )
    print(
        f"loaded {turns} turns in {t1 - t0:.0f} s, {stores} x {memories} memories in"
        f" {time.perf_counter() - t1:.0f} s",
        flush=True,
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def search_table(storage: TreeStorage, reps: int, stores: int) -> None:
    print(f"\nsearch latency, ms ({reps} runs each; limit 20):")
    print(
        f"{'query':<22} {'hits p1':>8} "
        + " ".join(f"{f'{n} stores p50/p99':>20}" for n in (0, 16, stores))
    )
    overall: dict[int, list[float]] = {0: [], 16: [], stores: []}
    for query in QUERIES:
        cells = []
        hits = len(storage.search(SCOPE, query).hits)
        for n in (0, 16, stores):
            searcher = TreeSearch(storage.tasks, storage.stores, max_stores=n)
            runs = timed(lambda s=searcher, q=query: s.search(SCOPE, q), reps)
            overall[n] += runs
            cells.append(f"{percentile(runs, 0.5):9.1f} / {percentile(runs, 0.99):7.1f}")
        print(f"{query:<22} {hits:>8} " + " ".join(f"{c:>20}" for c in cells))
    print(
        f"{'all queries':<22} {'':>8} "
        + " ".join(
            f"{percentile(v, 0.5):9.1f} / {percentile(v, 0.99):7.1f}" for v in overall.values()
        )
    )


def write_cost(storage: TreeStorage, n: int) -> None:
    """put_turn with and without its search row, alternating write by write."""
    from app.storage.tree.sqlite import turn_search

    real = turn_search.put
    text = Text(seed=9)
    summaries = [text.summary() for _ in range(2 * n)]
    with_fts: list[float] = []
    without: list[float] = []
    for i, summary in enumerate(summaries):
        skip = i % 2 == 1
        turn_search.put = (lambda *a, **k: None) if skip else real  # type: ignore[assignment]
        t0 = time.perf_counter()
        storage.tasks.put_turn(SCOPE, f"w{i:05d}", 0, meta=meta(i), summary_md=summary)
        (without if skip else with_fts).append((time.perf_counter() - t0) * 1000)
    turn_search.put = real  # type: ignore[assignment]
    a, b = statistics.median(with_fts), statistics.median(without)
    print(
        f"\nturn write (TaskStore.put_turn, fsynced), {n} each, alternating: p50 {a:.2f} ms with"
        f" the search row, {b:.2f} ms without; ratio {a / b:.3f}"
        f" (p99 {percentile(with_fts, 0.99):.2f} / {percentile(without, 0.99):.2f} ms)"
    )
    listing = storage.tasks.listing(SCOPE)
    now = storage.tasks.now_us()
    row_with: list[float] = []
    row_without: list[float] = []
    for i, summary in enumerate(summaries):
        task = f"r{i:05d}"
        row = TurnRow(0, now + i, now + 10**12)
        body = TurnText(task, meta_text(meta(i)), summary) if i % 2 == 0 else None
        t0 = time.perf_counter()
        listing.put_turn(task, row, Section(0, now + 10**12, b"\n## x\n"), body)
        (row_with if body else row_without).append((time.perf_counter() - t0) * 1000)
    a, b = statistics.median(row_with), statistics.median(row_without)
    print(
        f"listing transaction alone (Listing.put_turn): p50 {a:.3f} ms with the search row,"
        f" {b:.3f} ms without (+{a - b:.3f} ms)"
    )


def files_hold(storage: TreeStorage, word: str) -> bool:
    db = storage.tasks.layout.listing(SCOPE)
    data = b"".join(
        p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists()
    )
    return word.encode() in data or word.lower().encode()[-10:] in data


def purge_cost(storage: TreeStorage) -> None:
    storage.tasks.put_turn(SCOPE, "leak", 0, meta={}, summary_md=f"token {DELETED_WORD}")
    before = files_hold(storage, DELETED_WORD)
    listing = storage.tasks.listing(SCOPE)
    real = listing.purge_search
    t0 = time.perf_counter()
    storage.tasks.delete_task(SCOPE, "leak")
    total = time.perf_counter() - t0
    t0 = time.perf_counter()
    real()  # the index is one segment again now: what a purge with nothing to merge costs
    idle = time.perf_counter() - t0
    print(
        f"\ntask delete at {SCOPE.project}: {total * 1000:.0f} ms including the purge (merge to one"
        f" segment + WAL truncation); a purge with nothing left to merge {idle * 1000:.1f} ms."
        f" Deleted word in the files: before {before}, after {files_hold(storage, DELETED_WORD)}"
    )
    size = storage.tasks.layout.listing(SCOPE).stat().st_size
    print(f"listing database: {size / 2**20:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--stores", type=int, default=64)
    parser.add_argument("--memories", type=int, default=20)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--writes", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        root = Path(tmp) / "root"
        child = multiprocessing.get_context("spawn").Process(
            target=load, args=(str(root), args.turns, args.stores, args.memories)
        )
        child.start()
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"loading failed ({child.exitcode})")
        storage = TreeStorage(root)
        search_table(storage, args.reps, args.stores)
        write_cost(storage, args.writes)
        purge_cost(storage)
        # The purges a delete asks for run in a thread: let them end before the root goes.
        while storage.tasks.later.busy():
            time.sleep(0.05)


if __name__ == "__main__":
    main()
