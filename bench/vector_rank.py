# ruff: noqa: S608 - table names are module constants.
"""Semantic query latency on the tree at 10k and 100k chunks: what ranking the stored vectors
costs a query (the query's own embedding excluded: a fixed random vector stands for it).

One root per size, one project of ``chunks / per_turn`` turns written through
Listing.put_turn (fsync skipped, as bench/search.py loads), each turn given ``per_turn``
random unit float32 vectors of ``--dims`` through the queue's own store (vectors.store),
as a drain stores them. Then ``--reps`` semantic searches through TreeStorage.search, in
this process, unpatched: p50/p99 in ms. The first query (which fills a resident matrix, when
there is one) is reported apart. Never part of `make test`; nothing asserts on time.

    python -m bench.vector_rank [--sizes 10000,100000] [--dims 256] [--reps 100]
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from app.embeddings.base import Kind, ModelId
from app.storage.core.digest import Section
from app.storage.core.names import Scope
from app.storage.core.vectors import to_blob
from app.storage.tree.backend import TreeStorage
from app.storage.tree.fs.atomic import make_dirs
from app.storage.tree.sqlite import vectors
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.sqlite.turn_search import TurnText

from .loader import unsafe_fast_mode

SCOPE = Scope("bench", "vectors")
PER_TURN = 10


class RandomEmbedder:
    """A random unit vector per text: the ranking's cost does not depend on what it means."""

    def __init__(self, dims: int) -> None:
        self.model = ModelId("bench:random", dims)
        self.rnd = np.random.default_rng(7)

    def embed(self, texts: Sequence[str], *, kind: Kind) -> npt.NDArray[np.float32]:
        out = self.rnd.standard_normal((len(texts), self.model.dims)).astype(np.float32)
        norms: npt.NDArray[np.float32] = np.linalg.norm(out, axis=1, keepdims=True)
        return out / norms


def load(root: str, chunks: int, dims: int) -> None:
    """The child process: the turns and their vectors, fsync skipped."""
    unsafe_fast_mode()
    embedder = RandomEmbedder(dims)
    storage = TreeStorage(Path(root))
    make_dirs(storage.layout.project_dir(SCOPE), storage.layout.root)
    listing = storage.tasks.listing(SCOPE)
    now = storage.tasks.now_us()
    retain = now + storage.tasks.retention_us
    turns = chunks // PER_TURN
    t0 = time.perf_counter()
    for i in range(turns):
        task = f"t{i:06d}"
        row = TurnRow(0, now - turns + i, retain, "tok", "claude-sonnet-4-5", None, 0)
        section = Section(0, retain, f"\n## {task}\n\nLatest turn: 0\n\n".encode())
        listing.put_turn(task, row, section, TurnText(task, "", f"turn {i} text"))
    key = embedder.model.key()
    with listing.maintain() as conn:
        vectors.create_schema(conn)
        vectors.queue_stale(conn, key)
        docs = [(int(d), int(g)) for d, g in conn.execute(f"SELECT doc, gen FROM {vectors.QUEUE}")]
        matrix = embedder.embed([""] * (len(docs) * PER_TURN), kind="document")
        done = [
            (doc, gen, [(o, to_blob(matrix[n * PER_TURN + o])) for o in range(PER_TURN)])
            for n, (doc, gen) in enumerate(docs)
        ]
        vectors.store(conn, key, done)
    print(f"loaded {turns} turns x {PER_TURN} vectors in {time.perf_counter() - t0:.0f} s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as root:
            child = multiprocessing.get_context("spawn").Process(
                target=load, args=(root, size, args.dims)
            )
            child.start()
            child.join()
            storage = TreeStorage(Path(root), embedder=RandomEmbedder(args.dims))
            t0 = time.perf_counter()
            storage.search(SCOPE, "anything", mode="semantic", limit=20)
            first = (time.perf_counter() - t0) * 1000
            line = [f"{size} chunks x {args.dims}: first query {first:.0f} ms;"]
            # "text" is in every turn: the keyword half's worst case.
            for mode, query in (("semantic", "anything"), ("hybrid", "text"), ("keyword", "text")):
                times = []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    page = storage.search(SCOPE, query, mode=mode, limit=20)
                    times.append((time.perf_counter() - t0) * 1000)
                assert len(page.hits) == 20, page
                line.append(
                    f"{mode} p50 {percentile(times, 0.5):.1f} ms p99"
                    f" {percentile(times, 0.99):.1f} ms"
                )
            print(" ".join(line), f"({args.reps} queries each)", flush=True)


if __name__ == "__main__":
    main()
