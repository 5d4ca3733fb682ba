"""Two checkouts of the service side by side: this one against another (a base commit).

    python -m bench.ab --base /path/to/other/checkout [--workloads read list record ...]
                       [--reps 5] [--duration 3] [--this-env NAME=VALUE ...] [--base-env ...]
                       [--search-turns 2000]

Both servers run as `make bench` starts ours (gunicorn -c gunicorn.conf.py, 2 workers x 4
threads, storage roots under $TMPDIR), each from its own checkout (its working directory
and PYTHONPATH) with this venv's packages. Repetitions are interleaved (this, base, this,
base, ...), the server not measured is paused (SIGSTOP), and each workload reports the median
over repetitions of this ÷ base throughput, with both sides' p50 and p99 latency and the
CPU per operation of their workers (user + kernel) and of the whole machine (the load
generator, jbd2 and the loop device included). A worktree of the base is the usual other
side: `git worktree add --detach ../base <commit>`; or this checkout twice, with a setting
told apart by ``--this-env`` / ``--base-env`` (e.g. ``MEMORY_GROUP_COMMIT=false``).

``--workloads search`` (not in the default set) first writes the same ``--search-turns``
turns to both servers over HTTP (bench/workloads.py's corpus: 1-3 KB Markdown summaries and
meta), then each client walks a rotation of twelve queries (words, prefixes, phrases, several
terms, one with no hit), 20 hits a page: its CPU per op is CPU per search.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import loadgen, servers, workloads as w
from .measure import measure as measure_one
from .run import RESULTS, machine

WORKLOADS = ("read", "list", "record", "record-one", "put-turn", "ms-create", "ms-update")
# Not in the default run: seeding its corpus takes a minute per server.
MORE_WORKLOADS = ("search",)


def start(name: str, checkout: Path, workdir: Path, extra: list[str]) -> servers.Server:
    """Our server from ``checkout``: its code, this venv's packages, ``extra`` settings."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = servers.free_port()
    settings = dict(item.split("=", 1) for item in extra)
    env = servers.gunicorn_env(workdir, port, PYTHONPATH=str(checkout), **settings)
    args = [str(servers.VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"]
    log_path = workdir / f"{name}-{port}.log"
    import subprocess

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    server = servers.Server(name, port, proc, env, log_path)
    servers._wait_up(proc, f"{server.url}/healthz", log_path, 60)
    return server


def token(server: servers.Server, checkout: Path) -> str:
    import subprocess

    args = [str(servers.VENV_BIN / "flask"), "--app", "wsgi", "tokens", "create"]
    args += ["--role", "writer", "--tenant", "bench", "--project", "bench"]
    out = subprocess.run(
        args, cwd=checkout, env=server.env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return out.strip().splitlines()[-1]


def seed_search(server: servers.Server, auth: dict[str, str], turns: int) -> None:
    """The search corpus (bench/workloads.py) through the API, four connections at once."""

    def part(start: int) -> None:
        s = loadgen.Session(server.host, server.port, auth)
        try:
            w.search_seed(s, turns, start, 4)
        finally:
            s.close()

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(part, range(4)))


def ops_for(server: servers.Server, auth: dict[str, str], search_turns: int = 0) -> dict[str, Any]:
    """Each workload's op factory (by repetition) on ``server``; the search corpus is
    written first when ``search_turns``."""
    if search_turns:
        seed_search(server, auth, search_turns)
    s = loadgen.Session(server.host, server.port, auth)
    store, memories = w.ms_setup(s)
    for client in range(8):  # put-turn upserts turn 1 of an existing task per client
        s.request("PUT", f"{w.API}/tasks/pt-{client}/turns/1", w.turn_body(client, 0), w.JSON)
    for i in range(w.READ_TASKS):  # what read picks from
        s.request("PUT", f"{w.API}/tasks/pre-{i}/turns/0", w.turn_body(i, 0), w.JSON)
    s.close()
    return {
        "read": lambda rep: w.ours_read(),
        "list": lambda rep: w.ours_list(),
        "record": lambda rep: w.ours_record(f"ab{rep}"),
        "record-one": lambda rep: w.ours_record_one(f"ab1-{rep}"),
        "put-turn": lambda rep: w.ours_put_turn("pt-{client}"),
        "ms-create": lambda rep: w.ms_create(store, f"r{rep}"),
        "ms-update": lambda rep: w.ms_update(store, memories),
        "search": lambda rep: w.ours_search(),
    }


def measure(
    server: servers.Server, other: servers.Server, op: loadgen.Op, auth: dict[str, str], args: Any
) -> dict[str, Any]:
    return measure_one(
        server, op, auth, clients=args.clients, duration=args.duration, warmup=args.warmup,
        paused=[other],
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument(
        "--workloads", nargs="*", default=list(WORKLOADS),
        help=f"of {', '.join(WORKLOADS + MORE_WORKLOADS)}; THIS:BASE runs one on this side,"
        " the other on the base (record-one:record: a record in one request against the two"
        " of a checkout without it); search: a rotation of queries over --search-turns"
        " turns of 1-3 KB Markdown written to both servers first",
    )  # fmt: skip
    parser.add_argument("--search-turns", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--this-env", nargs="*", default=[], help="NAME=VALUE for this side")
    parser.add_argument("--base-env", nargs="*", default=[], help="NAME=VALUE for the base")
    args = parser.parse_args()
    this = servers.REPO
    base = args.base.resolve()
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    at_start = machine()
    with tempfile.TemporaryDirectory(prefix="pm-ab-") as tmp:
        new = start("this", this, Path(tmp) / "this", args.this_env)
        old = start("base", base, Path(tmp) / "base", args.base_env)
        try:
            auth_new = {"Authorization": f"Bearer {token(new, this)}"}
            auth_old = {"Authorization": f"Bearer {token(old, base)}"}
            searched = any("search" in name.split(":") for name in args.workloads)
            turns = args.search_turns if searched else 0
            ops_new, ops_old = ops_for(new, auth_new, turns), ops_for(old, auth_old, turns)
            data: dict[str, list[tuple[dict, dict]]] = {k: [] for k in args.workloads}
            for rep in range(args.reps):
                for name in args.workloads:
                    # Alternate which side goes first, so neither always follows the other.
                    first_new = rep % 2 == 0
                    mine, theirs = name.split(":") if ":" in name else (name, name)
                    if first_new:
                        a = measure(new, old, ops_new[mine](rep), auth_new, args)
                        b = measure(old, new, ops_old[theirs](rep), auth_old, args)
                    else:
                        b = measure(old, new, ops_old[theirs](rep), auth_old, args)
                        a = measure(new, old, ops_new[mine](rep), auth_new, args)
                    data[name].append((a, b))
                    print(
                        f"  rep {rep} {name:<10} this {a['throughput']:7.0f} op/s p99"
                        f" {a['p99_ms']:6.1f} ms  base {b['throughput']:7.0f} op/s p99"
                        f" {b['p99_ms']:6.1f} ms  load {os.getloadavg()[0]:.1f}",
                        file=sys.stderr,
                    )
        finally:
            new.stop()
            old.stop()
    rows = []
    for name, pairs in data.items():
        row: dict[str, Any] = {"workload": name}
        for side, i in (("this", 0), ("base", 1)):
            for key in ("throughput", "p50_ms", "p99_ms", "worker_cpu_ms", "machine_cpu_ms"):
                row[f"{side} {key}"] = statistics.median(p[i][key] for p in pairs)
            row[f"{side} errors"] = sum(p[i]["errors"] for p in pairs)
        ratios = [p[0]["throughput"] / p[1]["throughput"] for p in pairs]
        row["ratio"] = statistics.median(ratios)
        row["ratios"] = ratios
        row["reps"] = pairs
        rows.append(row)
    report = {
        "kind": "ab",
        "started": started,
        "machine": at_start,
        "settings": {**vars(args), "base": str(base), "this": str(this)},
        "load_avg_at_end": os.getloadavg(),
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"ab-{started}.json"
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"ab: {args.reps} interleaved reps of {args.duration:g} s, {args.clients} clients;")
    print(f"this = {this} {' '.join(args.this_env)}, base = {base} {' '.join(args.base_env)}")
    print(f"storage roots: {report['machine']['storage']}")
    load = ", ".join(f"{x:.1f}" for x in report["machine"]["load_avg_at_start"])
    print(f"load average at start {load}; at end {report['load_avg_at_end'][0]:.1f}")
    head = (
        f"{'workload':<10}{'this op/s':>10}{'base op/s':>10}{'ratio':>7}{'this p50':>9}"
        f"{'base p50':>9}{'this p99':>9}{'base p99':>9}{'this cpu':>9}{'base cpu':>9}"
        f"{'this mach':>10}{'base mach':>10}  per rep"
    )
    print(head)
    for r in rows:
        print(
            f"{r['workload']:<10}{r['this throughput']:>10.0f}{r['base throughput']:>10.0f}"
            f"{r['ratio']:>7.2f}{r['this p50_ms']:>9.1f}{r['base p50_ms']:>9.1f}"
            f"{r['this p99_ms']:>9.1f}{r['base p99_ms']:>9.1f}{r['this worker_cpu_ms']:>9.2f}"
            f"{r['base worker_cpu_ms']:>9.2f}{r['this machine_cpu_ms']:>10.2f}"
            f"{r['base machine_cpu_ms']:>10.2f}  " + ", ".join(f"{x:.2f}" for x in r["ratios"])
        )
    for r in rows:
        if r["this errors"] or r["base errors"]:
            print(
                f"{r['workload']}: errors (non-2xx, a search's 503 included) this"
                f" {r['this errors']}, base {r['base errors']}: op/s counts the answered"
                " ops only, and CPU per op is all the CPU over them"
            )
    print("(latency in ms; cpu = worker user+kernel ms per op, mach = whole machine)")
    print(f"JSON: {out.relative_to(servers.REPO)}")


if __name__ == "__main__":
    main()
