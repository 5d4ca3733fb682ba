"""Full-text search on PostgreSQL at 100,000 turns: query latency, and what the search column
adds to a turn write (the tree's figures: `python -m bench.search`).

A PostgreSQL 15 as the tests start it (tools/services.py; no object store: a search reads
only the database), one project of ``--turns`` turns (one per task) with bench/search.py's
generated text, meta and planted words, written with COPY (the generated column computed as
a write computes it), plus ``--stores`` memory stores of ``--memories`` memories each,
written through the store engine. Then ANALYZE, as autovacuum would after such a load.

Printed: p50/p99 of the storage call (PgSearch.search, limit 20; HTTP adds its ~2 ms) for
bench/search.py's queries; p50 of one turn INSERT (a 1 KB summary) into a table with and
without the search column, interleaved; the time the migration took to index the rows of a
database upgraded from schema 3. Never part of `make test`; nothing asserts on time.

    python -m bench.pg_search [--turns 100000] [--stores 16] [--memories 20] [--reps 30]
"""

# ruff: noqa: S608 - SQL text is fixed fragments; every value is bound.

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import psycopg

from app.storage.core.clock import iso_us
from app.storage.core.cursor import CursorCodec
from app.storage.pg import schema
from app.storage.pg.db import Database
from app.storage.pg.search import PgSearch
from app.storage.pg.stores import PgMemoryStores
from tools.services import Postgres, scratch_dir

from .search import QUERIES, SCOPE, Text, meta, percentile, timed

RETENTION_US = 30 * 86400 * 1_000_000
_TURN_COLUMNS = (
    "tenant, project, task_id, turn, meta, summary, created_at, updated_at, retain_until,"
    " updated_us, retain_until_us, model, agent_id, exit_code"
)


def connect(url: str, schema_name: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema_name}")
    return f"{url}?options=-csearch_path%3D{schema_name}"


def migrate(url: str, upto: int | None = None) -> float:
    """Apply the migrations (the first ``upto`` only); return seconds taken."""
    saved = schema.MIGRATIONS
    if upto is not None:
        schema.MIGRATIONS = saved[:upto]
    try:
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as conn:
            schema.migrate(conn)
        return time.perf_counter() - started
    finally:
        schema.MIGRATIONS = saved


def load_turns(url: str, turns: int) -> float:
    """Tasks t000000.. with one turn each, bench/search.py's text; return seconds taken."""
    started = time.perf_counter()
    text = Text()
    now_us = int(time.time() * 1_000_000) - turns
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO projects (tenant, project, tasks) VALUES (%s, %s, %s)",
            (SCOPE.tenant, SCOPE.project, turns),
        )
        with conn.cursor().copy(
            "COPY tasks (tenant, project, task_id, created_at, updated_us, retain_until_us,"
            " turn_count, latest_turn, min_retain_us, model, exit_code) FROM STDIN"
        ) as copy:
            for i in range(turns):
                us, until = now_us + i, now_us + i + RETENTION_US
                copy.write_row(
                    (SCOPE.tenant, SCOPE.project, f"t{i:06d}", iso_us(us), us, until, 1, 0)
                    + (until, "claude-sonnet-4-5", 0)
                )
        # Planned on counts, not on a table never analyzed: the foreign key check of each
        # turn below is then an index lookup (bench/pg.py).
        conn.execute("ANALYZE tasks")
        with conn.cursor().copy(f"COPY turns ({_TURN_COLUMNS}) FROM STDIN") as copy:
            for i in range(turns):
                us, until = now_us + i, now_us + i + RETENTION_US
                copy.write_row(
                    (SCOPE.tenant, SCOPE.project, f"t{i:06d}", 0, json.dumps(meta(i)))
                    + (text.summary().encode(), iso_us(us), iso_us(us), iso_us(until), us)
                    + (until, "claude-sonnet-4-5", None, 0)
                )
        conn.execute("ANALYZE")
    return time.perf_counter() - started


def load_stores(db: Database, cursors: CursorCodec, stores: int, memories: int) -> None:
    engine = PgMemoryStores(db, cursors)
    text = Text(seed=3)
    for s in range(stores):
        store_id = engine.create_store(SCOPE, name=f"store {s}").id
        for m in range(memories):
            engine.create_memory(
                SCOPE, store_id, path=f"/notes/m{m}.md", content=text.summary(), actor=None
            )


def search_table(searcher: PgSearch, reps: int) -> None:
    print(f"\nsearch latency, ms ({reps} runs each; limit 20):")
    print(f"{'query':<22} {'hits p1':>8} {'p50':>8} {'p99':>8}")
    overall: list[float] = []
    for query in QUERIES:
        hits = len(searcher.search(SCOPE, query).hits)
        runs = timed(lambda q=query: searcher.search(SCOPE, q), reps)
        overall += runs
        print(f"{query:<22} {hits:>8} {percentile(runs, 0.5):8.1f} {percentile(runs, 0.99):8.1f}")
    print(
        f"{'all queries':<22} {'':>8} {percentile(overall, 0.5):8.1f} {percentile(overall, 0.99):8.1f}"
    )


def write_cost(with_search: str, without: str, n: int) -> None:
    """One turn INSERT (its own transaction) into each schema, alternating."""
    text = Text(seed=4)
    times: dict[str, list[float]] = {with_search: [], without: []}
    conns = {u: psycopg.connect(u, autocommit=True) for u in times}
    try:
        for conn in conns.values():
            conn.execute(
                "INSERT INTO projects (tenant, project) VALUES ('w', 'w');"
                " INSERT INTO tasks (tenant, project, task_id, created_at) VALUES"
                " ('w', 'w', 'w', 'x')"
            )
        for i in range(n):
            row: tuple[Any, ...] = ("w", "w", "w", i, json.dumps(meta(i)), text.summary().encode())
            row += ("x", "x", "x", 0, 0, None, None, None)
            for u, conn in conns.items():
                started = time.perf_counter()
                conn.execute(
                    f"INSERT INTO turns ({_TURN_COLUMNS}) VALUES ({', '.join(['%s'] * 14)})", row
                )
                times[u].append((time.perf_counter() - started) * 1e6)
    finally:
        for conn in conns.values():
            conn.close()
    a, b = (statistics.median(times[u]) for u in (with_search, without))
    print(
        f"\nturn INSERT p50 ({n} each, interleaved): {a:.0f} µs with the search column,"
        f" {b:.0f} µs without (+{a - b:.0f} µs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--stores", type=int, default=16)
    parser.add_argument("--memories", type=int, default=20)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--writes", type=int, default=300)
    args = parser.parse_args()
    postgres = Postgres(scratch_dir("pm-bench-") / "pg", durable=True).start()
    try:
        base = postgres.database("search_bench")
        url = connect(base, "searched")
        migrate(url, upto=3)
        loaded = load_turns(url, args.turns)
        upgrade = migrate(url)
        print(
            f"loaded {args.turns} turns at schema 3 in {loaded:.0f} s;"
            f" migration 4 indexed them in {upgrade:.1f} s"
        )
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")
        db = Database(url, lock_timeout=10.0)
        cursors = CursorCodec(b"bench" * 8)
        load_stores(db, cursors, args.stores, args.memories)
        searcher = PgSearch(db, cursors, lambda: int(time.time() * 1_000_000))
        search_table(searcher, args.reps)
        plain = connect(base, "plain")
        migrate(plain, upto=3)
        write_cost(url, plain, args.writes)
        db.close()
    finally:
        postgres.stop()


if __name__ == "__main__":
    main()
