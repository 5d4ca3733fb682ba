# ruff: noqa: S608 - SQL text is fixed fragments; every value is bound.
"""Semantic and hybrid query latency on PostgreSQL at 10k and 100k chunks (the tree's:
``python -m bench.vector_rank``).

A PostgreSQL 15 as the tests start it (tools/services.py), one project of ``chunks / 10``
turns with bench/search.py's text (bench/pg_search.py's COPY load, the triggers queueing
each), each given 10 random unit float32 vectors of ``--dims`` straight into turn_vectors
(the change log's triggers number them at commit, as a drain's), then ``--reps`` searches
through PgSearch.search: semantic, hybrid and keyword for one query, p50/p99 in ms. The
query's embedding is a fixed random vector. The first query (which loads the resident
matrix) is reported apart. Never part of `make test`; nothing asserts on time.

    python -m bench.vector_rank_pg [--sizes 10000,100000] [--dims 256] [--reps 50]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import psycopg

from app.storage.core.cursor import CursorCodec
from app.storage.core.vectors import to_blob
from app.storage.pg.db import Database
from app.storage.pg.search import PgSearch
from app.storage.pg.vectors import PgEmbedding
from tools.services import Postgres, scratch_dir

from .pg_search import connect, load_turns, migrate
from .search import SCOPE, percentile, timed
from .vector_rank import PER_TURN, RandomEmbedder


def load_vectors(url: str, dims: int, model: str) -> None:
    rnd = np.random.default_rng(3)
    with psycopg.connect(url) as conn:
        turns = conn.execute("SELECT task_id, turn FROM turns ORDER BY task_id").fetchall()
        with conn.cursor().copy(
            "COPY turn_vectors (tenant, project, task_id, turn, ordinal, id, model, vec) FROM STDIN"
        ) as copy:
            for n, (task_id, turn) in enumerate(turns, 1):
                block = rnd.standard_normal((PER_TURN, dims)).astype(np.float32)
                block /= np.linalg.norm(block, axis=1, keepdims=True)
                for o in range(PER_TURN):
                    copy.write_row(
                        (SCOPE.tenant, SCOPE.project, task_id, turn, o, n, model, to_blob(block[o]))
                    )
        conn.execute("UPDATE turn_embeds SET queued = false, model = %s", (model,))
        conn.execute("SELECT setval('vector_ids', %s)", (len(turns) + 1,))
        conn.execute("ANALYZE")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    postgres = Postgres(scratch_dir("pm-bench-") / "pg", durable=True).start()
    try:
        base = postgres.database("vector_bench")
        for size in (int(s) for s in args.sizes.split(",")):
            url = connect(base, f"vectors{size}")
            migrate(url)
            started = time.perf_counter()
            load_turns(url, size // PER_TURN)
            embedder = RandomEmbedder(args.dims)
            load_vectors(url, args.dims, embedder.model.key())
            print(
                f"loaded {size // PER_TURN} turns x {PER_TURN} vectors in"
                f" {time.perf_counter() - started:.0f} s",
                flush=True,
            )
            db = Database(url, lock_timeout=10.0, pool_size=4)
            searcher = PgSearch(
                db,
                CursorCodec(b"k" * 32),
                lambda: int(time.time() * 1_000_000),
                timeout=30.0,
                embedding=PgEmbedding(db, embedder),
            )
            t0 = time.perf_counter()
            searcher.search(SCOPE, "database", mode="semantic")
            first = (time.perf_counter() - t0) * 1000
            line = [f"{size} chunks x {args.dims}: first query {first:.0f} ms;"]
            for mode in ("semantic", "hybrid", "keyword"):
                runs = timed(
                    lambda m=mode, s=searcher: s.search(SCOPE, "database", mode=m), args.reps
                )
                line.append(
                    f"{mode} p50 {percentile(runs, 0.5):.1f} ms p99 {percentile(runs, 0.99):.1f} ms"
                )
            print(" ".join(line), flush=True)
            db.close()
    finally:
        postgres.stop()


if __name__ == "__main__":
    main()
