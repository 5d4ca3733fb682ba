"""The ledger's reads at size, against the task list, on both backends, in process.

For each backend, a project of N tasks (100,000 by default), one turn each, spread over 60 days,
3 agents, 5 models and 30 branches, a session per 4 tasks; then, interleaved request by
request through the Flask test client (the whole app: auth, rate limits, the view, the
storage, the JSON), a reader's:

* ``list``: ``GET /tasks?limit=50``, the baseline;
* ``ledger``: ``GET /ledger?group_by=day,model&since=30d``;
* ``timeline``: ``GET /timeline`` (its first page, 50 turns).

It prints p50 and p99 of each, in milliseconds of wall time, and each one's p50 and p99 over
the baseline's (the target: at most 2). The tree's project is built as bench/loader.py builds
a listing-only one (``load_listing_only``: GET tasks reads only the listing) and its ledger
filled in bulk, both in this process with fsync off; PostgreSQL's as bench/pg.py loads tasks
(one INSERT ... SELECT) and its ledger entries likewise, the sums recounted once after (the
trigger that moves them per write is off while the rows are loaded).

    python -m bench.ledger [--tasks 100000] [--reps 300] [--backends tree,pg]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app import create_app
from app.storage.core.ledger import DAY_US, LedgerTurn
from app.storage.core.names import Scope

AGENTS = ("claude-code", "codex", "cursor")
MODELS = ("claude-opus-4-5", "claude-sonnet-4-5", "claude-haiku-4-5", "gpt-5", "gpt-5-mini")
BRANCHES = ("main", *(f"feature/{i:02d}" for i in range(29)))
DAYS = 60
API = "/sandbox/memory/v1"
REQUESTS = {
    "list": f"{API}/tasks?limit=50",
    "ledger": f"{API}/ledger?group_by=day,model&since=30d",
    "timeline": f"{API}/timeline",
}


def entry(i: int, now_us: int, count: int) -> LedgerTurn:
    """Task i's one turn: spread evenly over the last DAYS days."""
    at = now_us - DAYS * DAY_US + (DAYS * DAY_US) * i // count
    return LedgerTurn(
        task_id=f"t{i:06d}",
        turn=0,
        at_us=at,
        agent=AGENTS[i % 3],
        model=MODELS[(i // 3) % 5],
        branch=BRANCHES[(i // 7) % 30],
        session=f"s{i // 4}",
        git_commit="3f9c2d1e8b7a",
        input_tokens=50_000 + i % 997,
        output_tokens=2_000 + i % 97,
        cache_read_tokens=100_000,
        cache_creation_tokens=1_000,
        cost_nusd=None if i % 5 else 431_200_000,
        wall_us=250_000_000,
        exit_code=i % 11 and 0,
    )


def measure(get: Callable[[str], float], reps: int) -> dict[str, dict[str, float]]:
    for _ in range(10):  # warm: connections, caches, the first query plans
        for url in REQUESTS.values():
            get(url)
    times: dict[str, list[float]] = {name: [] for name in REQUESTS}
    for _ in range(reps):
        for name, url in REQUESTS.items():
            times[name].append(get(url))
    return {
        name: {"p50": statistics.median(t), "p99": sorted(t)[max(0, int(len(t) * 0.99) - 1)]}
        for name, t in times.items()
    }


def _client(app: Any, tenant: str, project: str) -> Callable[[str], float]:
    _, secret = app.extensions["token_registry"].create(
        role="reader", tenant=tenant, project=project
    )
    client = app.test_client()
    headers = {"Authorization": f"Bearer {secret}"}

    def get(url: str) -> float:
        started = time.perf_counter()
        r = client.get(url, headers=headers)
        elapsed = (time.perf_counter() - started) * 1000
        assert r.status_code == 200, r.get_data(as_text=True)[:500]
        return elapsed

    return get


def tree_row(count: int, reps: int) -> dict[str, Any]:
    from app.storage.tree.sqlite import ledger as ledger_db
    from app.storage.tree.tasks import TaskStore

    from .loader import load_listing_only

    work = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    try:
        root = work / "root"
        started = time.perf_counter()
        load_listing_only(root, "bench", "ledger", count)
        store = TaskStore(root)
        now_us = store.now_us()
        with store.ledger(Scope("bench", "ledger")).write() as conn:
            ledger_db.fill_entries(conn, (entry(i, now_us, count) for i in range(count)))
            ledger_db.rebuild_rollups(conn)
        loaded = time.perf_counter() - started
        app = create_app(
            {
                "STORAGE_ROOT": str(root),
                "TOKENS_FILE": str(work / "tokens.json"),
                "LOG_LEVEL": "WARNING",
            }
        )
        try:
            found = measure(_client(app, "bench", "ledger"), reps)
        finally:
            app.extensions["traffic"].close()
            app.extensions["storage"].close()
        return {"backend": "tree", "tasks": count, "load_s": loaded, **found}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def pg_row(count: int, reps: int) -> dict[str, Any]:
    import psycopg

    from app.storage.core import ledger as lg
    from app.storage.pg import ledger as pgl
    from tools.services import Postgres, Seaweed, scratch_dir

    from .pg import load_tasks, node_env

    work = scratch_dir("pm-bench-ledger-")
    try:
        postgres = Postgres(work / "pg", durable=True).start()
        seaweed = Seaweed(work / "s3").start()
        try:
            env = node_env(postgres, seaweed)
            settings = {
                "DATABASE_URL": env["MEMORY_DATABASE_URL"],
                "BLOB_URL": env["MEMORY_BLOB_URL"],
                "S3_ENDPOINT_URL": env["MEMORY_S3_ENDPOINT_URL"],
                "LOG_LEVEL": "WARNING",
                "TOKENS_FILE": str(work / "tokens.json"),
            }
            app = create_app(settings)  # migrates the schema
            started = time.perf_counter()
            load_tasks(env["MEMORY_DATABASE_URL"], "ledger", count)
            now_us = int(time.time() * 1_000_000)
            columns = ("tenant", "project", "task_id", "turn", *lg.TURN_COLUMNS)
            with psycopg.connect(env["MEMORY_DATABASE_URL"]) as conn:
                conn.execute("ALTER TABLE ledger_turns DISABLE TRIGGER ledger_turns_changed")
                with conn.cursor().copy(
                    f"COPY ledger_turns ({', '.join(columns)}) FROM STDIN"
                ) as copy:
                    for i in range(count):
                        e = entry(i, now_us, count)
                        copy.write_row(("bench", "ledger", e.task_id, e.turn, *e.values()))
                conn.execute("ALTER TABLE ledger_turns ENABLE TRIGGER ledger_turns_changed")
                pgl.rebuild_rollups(conn, Scope("bench", "ledger"))
                conn.execute("ANALYZE ledger_turns")
                conn.execute("ANALYZE ledger")
                conn.execute("ANALYZE ledger_tasks")
            loaded = time.perf_counter() - started
            try:
                found = measure(_client(app, "bench", "ledger"), reps)
            finally:
                app.extensions["traffic"].close()
                app.extensions["storage"].close()
            return {"backend": "pg", "tasks": count, "load_s": loaded, **found}
        finally:
            seaweed.stop()
            postgres.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--backends", default="tree,pg")
    args = parser.parse_args()
    rows = []
    if "tree" in args.backends:
        rows.append(tree_row(args.tasks, args.reps))
    if "pg" in args.backends:
        rows.append(pg_row(args.tasks, args.reps))
    print(
        "| backend | tasks | GET tasks?limit=50 p50 / p99 ms | ledger?group_by=day,model&since=30d"
        " p50 / p99 ms (/ tasks) | timeline, first page, p50 / p99 ms (/ tasks) |"
    )
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        base = row["list"]
        cells = [f"{base['p50']:.2f} / {base['p99']:.2f}"]
        for name in ("ledger", "timeline"):
            found = row[name]
            cells.append(
                f"{found['p50']:.2f} / {found['p99']:.2f}"
                f" ({found['p50'] / base['p50']:.2f} / {found['p99'] / base['p99']:.2f})"
            )
        print(f"| {row['backend']} | {row['tasks']:,} | {' | '.join(cells)} |")
    loads = ", ".join(f"{r['backend']} {r['load_s']:.0f} s" for r in rows)
    print(f"(loading the projects: {loads})")


if __name__ == "__main__":
    main()
