"""Writes over HTTP while the start-up recovery's full check still runs.

A lost page cache (the canary lost its last nonce) makes the next server check the whole
tree in the background while it serves (app/storage/tree/recovery.py). Clients write meanwhile,
to tasks the check has not reached, to tasks whose derived files the loss took back, and to
new tasks, from several workers. Afterwards every acknowledged write reads back whole, the
listing and the digest name it, and fsck finds the tree clean.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from app.storage.tree.backend import TreeStorage
from tests.e2e.conftest import REPO, flask_cli, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # 30 s of a server: `make slow`
API = "/sandbox/memory/v1"
# Enough tasks that the full check outlasts many writes (bench/loader.py builds them fast).
TASKS = 1000
CLIENTS = 4


def _task(i: int) -> str:
    return f"t{i:06d}"  # bench.loader.task_id


def _ready(url: str) -> bool:
    return requests.get(f"{url}/readyz", timeout=10).status_code == 200


def test_writes_during_the_full_check_of_a_lost_page_cache_survive_it(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    subprocess.run(
        [sys.executable, "-m", "bench.loader", str(root), "acme", "web", str(TASKS)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    first = start_server(tmp_path, root=root)
    try:
        auth = {"Authorization": f"Bearer {first.token('writer')}"}
        assert _ready(first.url)
        first.kill()
    finally:
        first.stop()
    # What a power loss leaves: the canary lost its nonce, and derived files lost their last
    # writes (here the index.json of every 7th task, across the whole tree).
    layout = TreeStorage(root).layout
    layout.canary().write_bytes(b"")
    stale = [_task(i) for i in range(0, TASKS, 7)]
    for task in stale:
        (root / "acme" / "web" / task / "index.json").write_text("{}")

    srv = start_server(tmp_path, root=root)
    try:
        assert "writes the kernel had not flushed were lost" in srv.log(), srv.log()
        # Writes go to half the stale tasks and to tasks the check reaches late, from the end
        # of the tree; the other stale tasks are left for the check alone to repair.
        written_stale, untouched_stale = stale[::2], stale[1::2]
        late = [_task(i) for i in reversed(range(TASKS)) if _task(i) not in stale]
        targets = [
            t for pair in zip(written_stale, late[: len(written_stale)], strict=True) for t in pair
        ]
        acked: dict[tuple[str, int], str] = {}
        during: set[tuple[str, int]] = set()
        failures: list[str] = []
        lock = threading.Lock()
        next_target = iter(range(10**6))
        recovered = threading.Event()

        def client(c: int) -> None:
            with requests.Session() as http:
                while True:
                    with lock:
                        n = next(next_target)
                    if recovered.is_set() and n % CLIENTS == c and n > 40 * CLIENTS:
                        return  # a few writes after the check, then stop
                    new = n % 5 == 4
                    task, turn = (f"new-{n}", 0) if new else (targets[n % len(targets)], 1)
                    text = f"written during recovery {n}"
                    r = http.put(
                        f"{srv.url}{API}/tasks/{task}/turns/{turn}",
                        json={"summary_md": text, "meta": {"n": n}},
                        headers=auth,
                        timeout=30,
                    )
                    if r.status_code != 200:
                        with lock:
                            failures.append(f"{task}/{turn}: {r.status_code} {r.text}")
                        return
                    busy = not _ready(srv.url)
                    with lock:
                        acked[(task, turn)] = text
                        if busy:
                            during.add((task, turn))
                    if not busy:
                        recovered.set()

        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 240
        for t in threads:
            t.join(max(1.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "the full check did not finish"
        assert not failures, failures[:5]
        # The point of the test: many writes were acknowledged while the check still ran.
        assert len(during) >= 20, f"only {len(during)} writes landed during the check"
        assert "full check after a possible loss of unsynced data" in srv.log(), srv.log()

        with requests.Session() as http:
            for (task, turn), text in acked.items():
                r = http.get(f"{srv.url}{API}/tasks/{task}/turns/{turn}", headers=auth, timeout=10)
                assert r.status_code == 200 and r.json()["summary_md"] == text, (task, r.text)
                r = http.get(f"{srv.url}{API}/tasks/{task}", headers=auth, timeout=10)
                assert [t["turn"] for t in r.json()["turns"]] == list(range(turn + 1)), r.text
            for task in untouched_stale:
                r = http.get(f"{srv.url}{API}/tasks/{task}", headers=auth, timeout=10)
                assert [t["turn"] for t in r.json()["turns"]] == [0], r.text
                index = json.loads((root / "acme" / "web" / task / "index.json").read_text())
                assert [t["turn"] for t in index["turns"]] == [0], task
            new_tasks = {task for task, _ in acked if task.startswith("new-")}
            r = http.get(f"{srv.url}{API}/tasks?limit=1", headers=auth, timeout=10)
            assert r.json()["total"] == TASKS + len(new_tasks), r.text
            digest = http.get(f"{srv.url}{API}/project.md", headers=auth, timeout=60).text
        missing = [text for text in acked.values() if text not in digest]
        assert not missing, missing[:5]
    finally:
        srv.stop()
    report = flask_cli(srv.env, "fsck")
    assert "clean" in report.lower(), report
