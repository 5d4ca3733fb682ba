"""Search's worst case: one turn whose summary is nothing but matching words, on a real server.

Each backend (the tree, PostgreSQL + SeaweedFS as tools/services.py starts them) gets a real
gunicorn (``-c gunicorn.conf.py``, ``--workers`` workers of ``--threads`` threads). For each
``--sizes`` (bytes), one task of project ``bench/worst`` is written through the API with a
summary of that size made of ``passed test`` repeated, plus a few ordinary tasks; then

* **one query**: the wall time of ``GET /search?q=passed test`` (the median of ``--reps``, the
  status of each answer shown: a 503 is a search its budget stopped);
* **under load** (``--load`` concurrent searches of the largest size, each client looping for
  ``--load-seconds``): the slowest ``/healthz`` and the slowest list of *another* project's
  tasks, polled every 0.1 s while they run, and the answers the searches got.

Every request has a client timeout of ``--timeout`` seconds; one that runs out shows as
``>N s``. Never part of `make test`; nothing asserts on time.

    python -m bench.search_worst [--backends tree,pg] [--sizes 250000,1040000] [--load 32]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from tools.services import Postgres, Seaweed, scratch_dir

from .servers import Server, start_ours

API = "/sandbox/memory/v1"
WORDS = "passed test "


def summary(size: int) -> str:
    return (WORDS * (size // len(WORDS) + 1))[:size].rstrip()


class Client:
    def __init__(self, server: Server, token: str, project: str, timeout: float) -> None:
        self.base = f"{server.url}{API}"
        self.headers = {"Authorization": f"Bearer {token}", "X-Sandbox-Project-Id": project}
        self.timeout = timeout
        self.session = requests.Session()

    def put_turn(self, task: str, text: str) -> None:
        r = self.session.put(
            f"{self.base}/tasks/{task}/turns/0",
            json={"summary_md": text},
            headers=self.headers,
            timeout=self.timeout,
        )
        r.raise_for_status()

    def timed(self, method: str, path: str, **params: Any) -> tuple[float, str]:
        """(seconds, status or 'timeout') of one request."""
        started = time.perf_counter()
        try:
            r = requests.request(
                method, path, params=params, headers=self.headers, timeout=self.timeout
            )
            status = str(r.status_code)
        except requests.Timeout:
            status = "timeout"
        except requests.ConnectionError as exc:
            status = f"error ({type(exc).__name__})"
        return time.perf_counter() - started, status

    def search(self, query: str) -> tuple[float, str]:
        return self.timed("GET", f"{self.base}/search", q=query, limit=20)


def shown(seconds: float, status: str, timeout: float) -> str:
    if status == "timeout":
        return f">{timeout:.0f} s"
    return f"{seconds:.2f} s ({status})"


def under_load(server: Server, client: Client, other: Client, args: argparse.Namespace) -> None:
    stop = threading.Event()
    answers: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def searcher() -> None:
        mine = Client(server, client.headers["Authorization"][7:], "worst", args.timeout)
        while not stop.is_set():
            _, status = mine.search("passed test")
            with lock:
                answers[status] += 1

    workers = [threading.Thread(target=searcher, daemon=True) for _ in range(args.load)]
    for t in workers:
        t.start()
    time.sleep(0.5)
    health: list[float] = []
    lists: list[float] = []
    failures: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + args.load_seconds
    while time.monotonic() < deadline:
        took, status = other.timed("GET", f"{server.url}/healthz")
        health.append(took if status == "200" else args.poll_timeout)
        if status != "200":
            failures[f"healthz {status}"] += 1
        took, status = other.timed("GET", f"{other.base}/tasks", limit=5)
        lists.append(took if status == "200" else args.poll_timeout)
        if status != "200":
            failures[f"list {status}"] += 1
        time.sleep(0.1)
    stop.set()
    # Searches still running finish (or run out of their client timeout) before the count.
    until = time.monotonic() + args.timeout + 5
    for t in workers:
        t.join(timeout=max(0.0, until - time.monotonic()))
    print(
        f"  {args.load} searches for {args.load_seconds:.0f} s: /healthz max"
        f" {max(health):.2f} s, p50 {statistics.median(health):.3f} s ({len(health)} polls);"
        f" another project's list max {max(lists):.2f} s, p50 {statistics.median(lists):.3f} s;"
        f" search answers {dict(answers)}; poll failures {dict(failures) or 'none'}"
    )


def run_backend(name: str, workdir: Path, args: argparse.Namespace) -> None:
    env: dict[str, str] = {"MEMORY_WORKERS": str(args.workers), "MEMORY_THREADS": str(args.threads)}
    services: list[Any] = []
    if name == "pg":
        pg = Postgres(workdir / "pg", durable=False).start()
        s3 = Seaweed(workdir / "s3").start()
        services += [s3, pg]
        os.environ.update(s3.env())
        env.update(
            MEMORY_DATABASE_URL=pg.database("bench_worst"),
            MEMORY_BLOB_URL=f"s3://{s3.bucket}/worst",
            MEMORY_S3_ENDPOINT_URL=s3.endpoint,
        )
    os.environ.update({k: v for k, v in env.items() if k.startswith("MEMORY_W")})
    server = start_ours(workdir / "server", **env)
    try:
        token = server.token("writer", tenant="bench", project="worst")
        other_token = server.token("writer", tenant="bench", project="other")
        client = Client(server, token, "worst", args.timeout)
        other = Client(server, other_token, "other", args.poll_timeout)
        for i in range(20):
            other.put_turn(f"task-{i}", f"ordinary turn {i}, passed test")
        print(f"{name}: {args.workers} workers x {args.threads} threads")
        for i, size in enumerate(args.sizes):
            client.put_turn(f"worst-{i}", summary(size))
            runs = [client.search("passed test") for _ in range(args.reps)]
            took = statistics.median(t for t, _ in runs)
            statuses = sorted({s for _, s in runs})
            if "timeout" in statuses:
                print(f"  {size:>9,} bytes: >{args.timeout:.0f} s (client timeout)")
            else:
                print(f"  {size:>9,} bytes: {took:.2f} s median of {args.reps} {statuses}")
            # Only the document of this size matches on the next round.
            client.put_turn(f"worst-{i}", "replaced")
        if args.load:
            client.put_turn("worst-load", summary(args.load_size or max(args.sizes)))
            under_load(server, client, other, args)
    finally:
        server.stop()
        for service in services:
            service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="tree,pg")
    parser.add_argument("--sizes", default="250000,1040000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--load", type=int, default=32)
    parser.add_argument("--load-seconds", type=float, default=20.0)
    parser.add_argument("--load-size", type=int, default=0, help="default: the largest size")
    parser.add_argument("--poll-timeout", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    for name in args.backends.split(","):
        workdir = scratch_dir("pm-bench-worst-") if name == "pg" else Path(tempfile.mkdtemp())
        try:
            run_backend(name, workdir, args)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
