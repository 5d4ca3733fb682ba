"""What a worker holds is bounded: an hour of mixed load levels off (``make soak``).

16 client threads against a real gunicorn (2 workers, the default 16 threads each) spread
turns, listings, ``project.md``, searches and memory writes and reads over 24 projects with
2 memory stores each, so every worker keeps connections open to many SQLite files. Each
worker's RSS is sampled every ``SAMPLE`` seconds; the growth over the last half of the run
must stay small, the peak below the bound the connection caches allow. The samples are
printed (``-s``) as ``RSS <seconds> <worker MiB> ...`` and the plateau as ``RSS_PLATEAU``.

``MEMORY_SOAK_RSS_SECONDS`` (default 3600) sets the length.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.robust.faultkit import MS, PM
from tests.robust.helpers import Live, auth

pytestmark = [pytest.mark.soak, pytest.mark.e2e]
MiB = 1 << 20
PROJECTS = [f"p{n:02d}" for n in range(24)]
CLIENTS = 16
SAMPLE = 30.0
# Growth allowed over the second half of the run, per worker.
LATE_GROWTH = 12 * MiB
# The ceiling a worker stays under: the interpreter, the app and its imports (~90 MiB), and
# the SQLite connections a worker keeps at their cap (app/storage/tree/sqlite/pool.py).
PEAK = 400 * MiB
# Memories one client creates per store; after that it only rewrites them, so the working set
# (what the caches can hold) stops growing and a plateau can show. The versions still pile up.
KNOWN = 50
_COUNTING = threading.Lock()


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _client(
    url: str,
    secret: str,
    stores: dict[str, list[str]],
    stop: threading.Event,
    errors: list[str],
    statuses: dict[int, int],
) -> None:
    rng = random.Random()
    session = requests.Session()
    memories: dict[tuple[str, str], list[str]] = {}
    while not stop.is_set():
        project = rng.choice(PROJECTS)
        h = auth(secret, **{"X-Sandbox-Project-Id": project})
        roll = rng.random()
        try:
            if roll < 0.25:
                task = f"t{rng.randrange(200)}"
                words = " ".join(
                    rng.choice(("alpha", "beta", "gamma", "delta", "build", "test"))
                    for _ in range(60)
                )
                r = session.put(
                    f"{url}{PM}/tasks/{task}/turns/{rng.randrange(3)}",
                    headers=h,
                    json={"summary_md": words, "meta": {"n": rng.randrange(9)}},
                    timeout=60,
                )
            elif roll < 0.40:
                r = session.get(f"{url}{PM}/tasks", headers=h, params={"limit": 20}, timeout=60)
            elif roll < 0.50:
                r = session.get(f"{url}{PM}/project.md", headers=h, timeout=60)
            elif roll < 0.60:
                r = session.get(
                    f"{url}{PM}/search",
                    headers=h,
                    params={"q": rng.choice(("alpha", "build test", "gamma"))},
                    timeout=60,
                )
            else:
                store = rng.choice(stores[project])
                known = memories.setdefault((project, store), [])
                if known and roll < 0.80:
                    r = session.post(
                        f"{url}{MS}/{store}/memories/{rng.choice(known)}",
                        headers=h,
                        json={"content": "v" * rng.randrange(10, 4000)},
                        timeout=60,
                    )
                elif known and roll < 0.90:
                    r = session.get(
                        f"{url}{MS}/{store}/memories/{rng.choice(known)}", headers=h, timeout=60
                    )
                elif len(known) < KNOWN:
                    r = session.post(
                        f"{url}{MS}/{store}/memories",
                        headers=h,
                        json={"path": f"/m{rng.randrange(10**9)}.md", "content": "m" * 200},
                        timeout=60,
                    )
                    if r.status_code == 200:
                        known.append(r.json()["id"])
                else:  # the store's working set is full: a new text replaces an old one
                    r = session.post(
                        f"{url}{MS}/{store}/memories/{rng.choice(known)}",
                        headers=h,
                        json={"content": "n" * rng.randrange(10, 400)},
                        timeout=60,
                    )
            with _COUNTING:
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code >= 500 and r.status_code != 503:
                errors.append(f"{r.status_code} {r.request.method} {r.request.url}: {r.text[:200]}")
        except requests.RequestException as exc:
            errors.append(repr(exc))


def test_worker_memory_levels_off(tmp_path: Path) -> None:
    seconds = float(os.environ.get("MEMORY_SOAK_RSS_SECONDS", "3600"))
    server = Live(
        tmp_path=tmp_path,
        root=tmp_path / "storage",
        workers=2,
        threads=16,
        # A floor of its own: what is measured is the workers' memory, not how full the
        # machine's disk happens to be (2% of it by default).
        env_extra={"MEMORY_RATE_LIMIT_RPS": "0", "MEMORY_MIN_FREE_BYTES": "256MiB"},
    ).start()
    try:
        secret = server.token("tenant_admin", project=None)
        stores = {}
        for project in PROJECTS:
            h = auth(secret, **{"X-Sandbox-Project-Id": project})
            stores[project] = [
                requests.post(
                    f"{server.url}{MS}", headers=h, json={"name": f"s{i}"}, timeout=60
                ).json()["id"]
                for i in range(2)
            ]
        stop = threading.Event()
        errors: list[str] = []
        statuses: dict[int, int] = {}
        clients = [
            threading.Thread(
                target=_client,
                args=(server.url, secret, stores, stop, errors, statuses),
                daemon=True,
            )
            for _ in range(CLIENTS)
        ]
        for thread in clients:
            thread.start()
        workers = server.worker_pids()
        samples: list[tuple[float, list[int]]] = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(SAMPLE)
            assert server.worker_pids() == workers, "a worker died or was replaced"
            sample = [_rss(pid) for pid in workers]
            samples.append((time.monotonic() - started, sample))
            print("RSS", f"{samples[-1][0]:.0f}", *(f"{v / MiB:.1f}" for v in sample), flush=True)
        stop.set()
        for thread in clients:
            thread.join(timeout=120)
        print("REQUESTS", sum(statuses.values()), dict(sorted(statuses.items())), flush=True)
        assert not errors, errors[:20]
        half = [s for t, s in samples if t >= seconds / 2]
        assert half, samples
        for index, pid in enumerate(workers):
            series = [s[index] for _, s in samples]
            late = [s[index] for s in half]
            print(
                f"RSS_PLATEAU worker={pid} first={series[0] / MiB:.1f}MiB half={late[0] / MiB:.1f}MiB last={series[-1] / MiB:.1f}MiB peak={max(series) / MiB:.1f}MiB",
                flush=True,
            )
            assert max(late) - late[0] <= LATE_GROWTH, series
            assert max(series) <= PEAK, series
    finally:
        server.stop()
