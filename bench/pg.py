"""`python -m bench.pg` (run by `make bench`): the PostgreSQL + S3 backend against the tree on
this machine, one node against two, and its listing at 100 and 100,000 tasks.

* the tree: one server as `make run` starts it;
* PostgreSQL + S3: a PostgreSQL 15 and a SeaweedFS (tools/services.py, as the tests start
  them) and two nodes on them, each as `make run` starts it; "1 node" loads node A alone
  (node B paused), "2 nodes" splits the clients evenly over A and B;
* workloads as bench/workloads.py: record a turn (PUT turn + PUT a 16 KiB artifact), read a
  turn (of 64 preloaded), list (GET tasks?limit=50 of those 64);
* repetitions interleaved (tree, 1 node, 2 nodes, tree, ...); the servers not measured are
  paused (SIGSTOP), and every ratio is the median of the per-repetition ratios;
* listing growth: projects of 100 and 100,000 tasks (one turn each, meta and a 1 KB summary
  as the workloads write) loaded into the database with one INSERT ... SELECT each, then
  GET tasks?limit=50 on each, interleaved, through node A.

    python -m bench.pg [--reps 3] [--duration 2] [--only record read list growth]
"""

# ruff: noqa: S608 - SQL text is fixed fragments; every value is bound.

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

from app.storage.backends import open_backend
from app.storage.core.names import Scope
from tools.services import Postgres, Seaweed, scratch_dir

from . import growth, loadgen, servers, workloads as w
from .run import machine

RESULTS = servers.REPO / "bench" / "results"
RETENTION_US = 30 * 86400 * 1_000_000
LIST_LEVELS = {100: "p100", 100_000: "p100k"}


def node_env(postgres: Postgres, seaweed: Seaweed) -> dict[str, str]:
    return {
        **seaweed.env(),
        "MEMORY_DATABASE_URL": postgres.database("project_memory_bench"),
        "MEMORY_BLOB_URL": f"s3://{seaweed.bucket}/bench",
        "MEMORY_S3_ENDPOINT_URL": seaweed.endpoint,
    }


def engine(env: dict[str, str]) -> Any:
    """The PostgreSQL + S3 backend of ``node_env``'s servers, in this process."""
    from app.storage.backends import open_backend

    return open_backend(
        {
            "DATABASE_URL": env["MEMORY_DATABASE_URL"],
            "BLOB_URL": env["MEMORY_BLOB_URL"],
            "S3_ENDPOINT_URL": env["MEMORY_S3_ENDPOINT_URL"],
            "RETENTION_DAYS": 30.0,
            "LOCK_TIMEOUT": 60.0,
            "MAX_ARTIFACT_BYTES": 50 << 20,
            "THREADS": 1,
        }
    )


def _stamp(us: str) -> str:
    """SQL for the engine's text form of a time given in microseconds since the epoch."""
    return f"to_char(to_timestamp(({us}) / 1e6) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"


def load_tasks(database_url: str, project: str, count: int) -> float:
    """Tasks t000000.. of tenant bench, one turn each, written as the tasks engine writes them
    (listing columns included) in one transaction; return seconds taken."""
    started = time.perf_counter()
    now_us = int(time.time() * 1_000_000) - count
    meta = json.dumps(w.meta(0, 0), separators=(",", ":"))
    stamp, until = _stamp("%(base)s + i"), _stamp("%(base)s + i + %(ret)s")
    params = {
        "p": project,
        "n": count,
        "base": now_us,
        "ret": RETENTION_US,
        "meta": meta,
        "summary": w.SUMMARY.encode(),
    }
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO projects (tenant, project, tasks) VALUES ('bench', %(p)s, %(n)s)", params
        )
        conn.execute(
            "INSERT INTO tasks (tenant, project, task_id, owner, created_at, updated_us,"
            " retain_until_us, turn_count, latest_turn, min_retain_us, model, agent_id,"
            f" exit_code) SELECT 'bench', %(p)s, 't' || lpad(i::text, 6, '0'), NULL, {stamp},"
            " %(base)s + i, %(base)s + i + %(ret)s, 1, 0, %(base)s + i + %(ret)s,"
            " 'claude-sonnet-4-5', 'agent-0', 0 FROM generate_series(0, %(n)s - 1) i",
            params,
        )
        # Planned on counts, not on a table never analyzed: the foreign key check of each
        # turn below is then an index lookup.
        conn.execute("ANALYZE tasks")
        conn.execute(
            "INSERT INTO turns (tenant, project, task_id, turn, meta, summary, created_at,"
            " updated_at, retain_until, updated_us, retain_until_us, model, agent_id, exit_code)"
            f" SELECT 'bench', %(p)s, 't' || lpad(i::text, 6, '0'), 0, %(meta)s, %(summary)s,"
            f" {stamp}, {stamp}, {until}, %(base)s + i,"
            " %(base)s + i + %(ret)s, 'claude-sonnet-4-5', 'agent-0', 0"
            " FROM generate_series(0, %(n)s - 1) i",
            params,
        )
        conn.execute("ANALYZE tasks")
        conn.execute("ANALYZE turns")
    return time.perf_counter() - started


def _cpu(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (those that exited count nothing)."""
    total = 0.0
    for pid in pids:
        try:
            total += sum(servers.proc_cpu(pid))
        except (OSError, IndexError):
            continue
    return total


def _group(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def backing_pids(postgres: Postgres, seaweed: Seaweed) -> list[int]:
    """PostgreSQL's postmaster and its backends, and SeaweedFS: the CPU the tree has no
    counterpart for."""
    head = (postgres.directory / "data" / "postmaster.pid").read_text().split()
    master = int(head[0])
    children = subprocess.run(
        ["pgrep", "-P", str(master)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert seaweed.proc is not None
    return [master, *(int(c) for c in children), *_group(seaweed.proc.pid)]


def measure(
    target: list[servers.Server],
    others: list[servers.Server],
    secret: str,
    op: loadgen.Op,
    args: Any,
    backing: Callable[[], list[int]] | None = None,
) -> dict[str, float]:
    """Load ``target`` (one server, or the nodes of one deployment split evenly) with the
    other servers paused; count the CPU of the servers measured (and of ``backing``)."""
    for s in others:
        s.pause()
    nodes = [p for t in target for p in _group(t.proc.pid)]
    behind = backing() if backing else []
    cpu = _cpu(nodes), _cpu(behind)
    try:
        auth = {"Authorization": f"Bearer {secret}"}
        res = loadgen.run(
            target[0].host,
            [s.port for s in target],
            op,
            headers=auth,
            clients=args.clients,
            duration=args.duration,
            warmup=args.warmup,
        )
        cpu = _cpu(nodes) - cpu[0], _cpu(behind) - cpu[1]
    finally:
        for s in others:
            s.resume()
    if res.errors:
        print(f"  !! {res.errors} errors, first: {res.first_error}", file=sys.stderr)
    # Every op of the run, warm-up included, used the CPU counted.
    ops = res.throughput * (args.warmup + args.duration)
    return {
        "throughput": res.throughput,
        "median_ms": res.median_ms,
        "p99_ms": res.p99_ms,
        "cpu_ms_per_op": 1000 * sum(cpu) / ops if ops else float("nan"),
        "backing_cpu_ms_per_op": 1000 * cpu[1] / ops if ops else float("nan"),
    }


def compare(
    tree: servers.Server,
    a: servers.Server,
    b: servers.Server,
    secrets: list[str],
    backing: Callable[[], list[int]],
    args: Any,
) -> list[dict[str, Any]]:
    cases = {"record a turn": None, "read a turn": w.ours_read(), "list": w.ours_list()}
    names = [n for n in cases if not args.only or n.split()[0] in args.only]
    setups = {
        "tree": ([tree], [a, b], secrets[0], None),
        "pg 1 node": ([a], [tree, b], secrets[1], backing),
        "pg 2 nodes": ([a, b], [tree], secrets[1], backing),
    }
    data: dict[str, dict[str, list[dict[str, float]]]] = {n: {k: [] for k in setups} for n in names}
    for rep in range(args.reps):
        for name in names:
            for label, (target, others, secret, more) in setups.items():
                op = cases[name] or w.ours_record(f"r{rep}-{label.replace(' ', '')}")
                found = measure(target, others, secret, op, args, more)
                data[name][label].append(found)
                print(
                    f"  rep {rep} {name:<14} {label:<11} {found['throughput']:7.0f} op/s"
                    f" p50 {found['median_ms']:6.2f} ms, {found['cpu_ms_per_op']:5.2f} ms CPU/op"
                    f" ({found['backing_cpu_ms_per_op']:.2f} in PostgreSQL and SeaweedFS)",
                    file=sys.stderr,
                )
    rows = []
    for name, by in data.items():
        row: dict[str, Any] = {"workload": name, "reps": by}
        for label, found in by.items():
            row[label] = {
                "ops_s": statistics.median(f["throughput"] for f in found),
                "median_ms": statistics.median(f["median_ms"] for f in found),
                "p99_ms": statistics.median(f["p99_ms"] for f in found),
                "cpu_ms_per_op": statistics.median(f["cpu_ms_per_op"] for f in found),
                "backing_cpu_ms_per_op": statistics.median(
                    f["backing_cpu_ms_per_op"] for f in found
                ),
            }
        pairs = zip(by["pg 1 node"], by["tree"], by["pg 2 nodes"], strict=True)
        per_rep = [(p1["throughput"] / t["throughput"], p2["throughput"] / p1["throughput"])
                   for p1, t, p2 in pairs]  # fmt: skip
        row["pg_over_tree"] = statistics.median(r[0] for r in per_rep)
        row["two_over_one"] = statistics.median(r[1] for r in per_rep)
        row["pg_over_tree_reps"] = [r[0] for r in per_rep]
        row["two_over_one_reps"] = [r[1] for r in per_rep]
        rows.append(row)
    return rows


def in_process(env: dict[str, str], rounds: int = 5, calls: int = 100) -> dict[int, float]:
    """p50 of PgTaskStore.list_tasks(limit=50) alone, in this process, one caller: the
    storage layer's share of a listing, without HTTP or the other clients."""
    storage = open_backend(
        {
            "DATABASE_URL": env["MEMORY_DATABASE_URL"],
            "BLOB_URL": env["MEMORY_BLOB_URL"],
            "S3_ENDPOINT_URL": env["MEMORY_S3_ENDPOINT_URL"],
            "RETENTION_DAYS": 30.0,
            "LOCK_TIMEOUT": 10.0,
            "MAX_ARTIFACT_BYTES": 50 << 20,
            "THREADS": 1,
        }
    )
    times: dict[int, list[float]] = {n: [] for n in LIST_LEVELS}
    try:
        for _ in range(rounds):
            for n, project in LIST_LEVELS.items():
                for _ in range(calls):
                    started = time.perf_counter()
                    storage.tasks.list_tasks(Scope("bench", project), limit=50)
                    times[n].append(1000 * (time.perf_counter() - started))
    finally:
        storage.close()
    return {n: statistics.median(v) for n, v in times.items()}


def list_growth(a: servers.Server, env: dict[str, str], args: Any) -> dict[str, Any]:
    loaded = {p: load_tasks(env["MEMORY_DATABASE_URL"], p, n) for n, p in LIST_LEVELS.items()}
    print(
        f"  loaded (s): {json.dumps({k: round(v, 1) for k, v in loaded.items()})}", file=sys.stderr
    )
    secret = a.token(project=None)
    curve = growth.latency_curve(a, secret, LIST_LEVELS, w.ours_list(), args)
    alone = in_process(env)
    print(
        f"  in process: {json.dumps({k: round(v, 2) for k, v in alone.items()})} ms",
        file=sys.stderr,
    )
    return {
        "load_seconds": loaded,
        "list_p50_ms": {n: statistics.median(v) for n, v in curve.items()},
        "list_samples_ms": curve,
        "list_ratio": statistics.median(
            big / small for big, small in zip(curve[100_000], curve[100], strict=True)
        ),
        "in_process_p50_ms": alone,
        "in_process_ratio": alone[100_000] / alone[100],
    }


def markdown(report: dict[str, Any]) -> str:
    """The README's table of a pg-*.json report."""
    out = [
        "| workload | tree: op/s (p50 ms; CPU ms/op) | PG+S3, 1 node | PG+S3, 2 nodes"
        " | PG+S3 ÷ tree"
        " | 2 nodes ÷ 1 | per rep: ÷ tree; 2 ÷ 1 |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in report["rows"]:
        cells = [
            f"{r[k]['ops_s']:.0f} ({r[k]['median_ms']:.1f}; {r[k]['cpu_ms_per_op']:.1f}"
            + (f", {r[k]['backing_cpu_ms_per_op']:.1f} in PG/S3)" if k != "tree" else ")")
            for k in ("tree", "pg 1 node", "pg 2 nodes")
        ]
        reps = ", ".join(f"{x:.2f}" for x in r["pg_over_tree_reps"])
        reps += "; " + ", ".join(f"{x:.2f}" for x in r["two_over_one_reps"])
        out.append(
            f"| {r['workload']} | {' | '.join(cells)} | {r['pg_over_tree']:.2f}"
            f" | {r['two_over_one']:.2f} | {reps} |"
        )
    grown = report.get("growth")
    if grown:
        p50 = {int(k): v for k, v in grown["list_p50_ms"].items()}
        samples = {int(k): v for k, v in grown["list_samples_ms"].items()}
        alone = {int(k): v for k, v in grown["in_process_p50_ms"].items()}
        reps = ", ".join(
            f"{b / a:.2f}" for a, b in zip(samples[100], samples[100_000], strict=True)
        )
        out.append(
            f"\nlist p50 on PostgreSQL: {p50[100]:.2f} ms at 100 tasks, {p50[100_000]:.2f} ms at"
            f" 100,000: ratio {grown['list_ratio']:.2f} (per rep {reps}); in process, one"
            f" caller: {alone[100]:.2f} / {alone[100_000]:.2f} ms,"
            f" ratio {grown['in_process_ratio']:.2f}"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--growth", action="store_true", help="accepted, as bench.run takes it")
    parser.add_argument("--only", nargs="*", help="record read list growth")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    facts = machine()
    work = scratch_dir("pm-bench-pg-")  # PostgreSQL runs as its own user below it
    try:
        postgres = Postgres(work / "pg", durable=True).start()
        seaweed = Seaweed(work / "s3").start()
        started_servers: list[servers.Server] = []
        try:
            env = node_env(postgres, seaweed)
            tree = servers.start_ours(work / "tree")
            started_servers.append(tree)
            a = servers.start_ours(work / "node-a", **env)
            started_servers.append(a)
            b = servers.start_ours(work / "node-b", **env)
            started_servers.append(b)
            secrets = [tree.token(), a.token()]  # nodes A and B share one registry
            for server, secret in zip((tree, a), secrets, strict=True):
                s = loadgen.Session(server.host, server.port, {"Authorization": f"Bearer {secret}"})
                w.ours_preload(s)
                s.close()
            rows = compare(tree, a, b, secrets, lambda: backing_pids(postgres, seaweed), args)
            grown = None
            if not args.only or "growth" in args.only:
                b.pause()
                tree.pause()
                try:
                    grown = list_growth(a, env, args)
                finally:
                    b.resume()
                    tree.resume()
        finally:
            for server in started_servers:
                server.stop()
            seaweed.stop()
            postgres.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "kind": "pg",
        "started": started,
        "machine": facts,
        "settings": vars(args),
        "rows": rows,
        "growth": grown,
    }
    out = RESULTS / f"pg-{started}.json"
    out.write_text(json.dumps(report, indent=1))
    (RESULTS / "pg-latest.json").write_text(json.dumps(report, indent=1))
    print()
    print(
        f"pg: {args.clients} clients, {args.reps} interleaved reps of {args.duration:g} s;"
        " ratios = median over reps of the per-rep throughput ratio"
    )
    print(markdown(report))
    print(f"JSON: {out.relative_to(servers.REPO)}")


if __name__ == "__main__":
    main()
