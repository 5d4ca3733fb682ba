"""Concurrent searchers on one server: how many searches are answered, how many refused (503),
their latency, and the server's CPU per search.

    python -m bench.search_concurrency [--threads 16] [--workers 2] [--clients 24]
                                       [--turns 5000] [--seconds 10]

One server as `make bench` starts it, with ``--workers`` × ``--threads`` (`make run`'s defaults
are 2 × 16; the bench's other servers use 4 threads); ``--turns`` turns written through the
API (one per task, ~1 KB of words, a fifth of them holding the query's words); then
``--clients`` threads, one connection each, search in a loop for ``--seconds``. Printed: the
searches answered and refused, p50/p99 of the answered ones, server CPU per answered search,
and the slowest ``/healthz`` polled every 0.1 s meanwhile. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import requests

from . import servers

API = "/sandbox/memory/v1"
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]
QUERIES = ["session timeout", "login cookie", "migration", "session", "cookie expired"]


def load(base: str, token: str, turns: int) -> None:
    rng = random.Random(7)

    def writer(start: int) -> None:
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {token}"
        for i in range(start, turns, 4):
            words = [rng.choice(WORDS) for _ in range(150)]
            if i % 5 == 0:
                words[rng.randrange(150)] = "session timeout expired the login cookie"
            if i % 7 == 0:
                words[rng.randrange(150)] = "database migration"
            r = http.put(
                f"{base}{API}/tasks/t{i:06d}/turns/0",
                json={"summary_md": " ".join(words)},
                timeout=30,
            )
            r.raise_for_status()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--turns", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pm-searchc-") as tmp:
        server = servers.start_ours(
            Path(tmp) / "ours", MEMORY_THREADS=str(args.threads), MEMORY_WORKERS=str(args.workers)
        )
        try:
            token = server.token("writer")
            load(server.url, token, args.turns)
            statuses: Counter[int] = Counter()
            took: list[float] = []
            lock = threading.Lock()
            stop = time.monotonic() + args.seconds
            slowest_health = [0.0]

            def searcher(n: int) -> None:
                http = requests.Session()
                http.headers["Authorization"] = f"Bearer {token}"
                i = n
                while time.monotonic() < stop:
                    q = QUERIES[i % len(QUERIES)]
                    i += 1
                    t0 = time.perf_counter()
                    r = http.get(f"{server.url}{API}/search", params={"q": q}, timeout=60)
                    spent = time.perf_counter() - t0
                    with lock:
                        statuses[r.status_code] += 1
                        if r.status_code == 200:
                            took.append(spent)

            def health() -> None:
                while time.monotonic() < stop:
                    t0 = time.perf_counter()
                    requests.get(f"{server.url}/healthz", timeout=60)
                    slowest_health[0] = max(slowest_health[0], time.perf_counter() - t0)
                    time.sleep(0.1)

            load_at_start = Path("/proc/loadavg").read_text().split()[0]
            cpu = server.cpu_seconds()
            threads = [threading.Thread(target=searcher, args=(n,)) for n in range(args.clients)]
            threads.append(threading.Thread(target=health))
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            cpu = server.cpu_seconds() - cpu
            load_at_end = Path("/proc/loadavg").read_text().split()[0]
        finally:
            server.stop()
    answered = statuses[200]
    total = sum(statuses.values())
    took.sort()
    p50 = statistics.median(took) * 1000 if took else float("nan")
    p99 = took[int(len(took) * 0.99) - 1] * 1000 if took else float("nan")
    print(
        f"{args.workers} workers x {args.threads} threads, {args.clients} searchers,"
        f" {args.turns} turns, {args.seconds:g} s; load {load_at_start} -> {load_at_end}"
    )
    print(
        f"searches {total}: answered {answered}, 503 {statuses[503]}"
        f" ({100 * statuses[503] / max(1, total):.0f}%), other {total - answered - statuses[503]}"
    )
    print(
        f"answered p50 {p50:.1f} ms, p99 {p99:.1f} ms; server CPU {cpu / max(1, answered) * 1000:.2f}"
        f" ms per answered search; slowest /healthz {slowest_health[0] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
