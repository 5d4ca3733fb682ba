"""SIGKILL during embedding: no embedding work is lost.

A real gunicorn with the bundled model (the default) takes turn and memory writes while a
killer SIGKILLs its workers: each respawned worker loads the model on its first drain, so
kills land in the middle of drains (a worker holding the project's embed lock, a batch read
and not stored). Then the whole server is killed at once and started again on the same root.
Every acknowledged write is there; a search that finds rows queued starts a drain, after which
every row has vectors of the current model and none is left queued; fsck is clean."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.robust.faultkit import flask
from tests.robust.helpers import BASE, Live, auth

pytestmark = pytest.mark.e2e
MS = "/v1/memory_stores"


def write_turns(
    server: Live, secret: str, prefix: str, n: int, acked: list[str], stop: threading.Event
) -> None:
    for i in range(n):
        if stop.is_set():
            return
        task = f"{prefix}{i:03d}"
        try:
            r = requests.put(
                f"{server.url}{BASE}/tasks/{task}/turns/0",
                json={"summary_md": f"## Decision {i}\n\nThe session TTL of service {i} expired."},
                headers=auth(secret),
                timeout=30,
            )
        except requests.RequestException:
            continue  # a worker killed mid-answer: not acknowledged
        if r.status_code == 200:
            acked.append(task)


def unembedded(root: Path) -> tuple[int, int, int]:
    """(rows, rows without vectors of one model, rows queued) of the project's listing."""
    conn = sqlite3.connect(root / "acme" / "web" / "_listing.sqlite3")
    try:
        rows = conn.execute("SELECT count(*) FROM search_docs").fetchone()[0]
        bare = conn.execute(
            "SELECT count(*) FROM search_docs d WHERE NOT EXISTS"
            " (SELECT 1 FROM search_embedded e WHERE e.doc = d.doc)"
        ).fetchone()[0]
        queued = conn.execute("SELECT count(*) FROM embed_queue").fetchone()[0]
        return int(rows), int(bare), int(queued)
    finally:
        conn.close()


def test_workers_killed_mid_drain_lose_no_embedding_work(live_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server: Live = live_factory(workers=2, threads=4, env_extra={"MEMORY_EMBEDDER": "bundled"})
    secret = server.token("writer")
    acked: list[str] = []
    stop = threading.Event()
    writers = [
        threading.Thread(target=write_turns, args=(server, secret, prefix, 150, acked, stop))
        for prefix in ("a", "b")
    ]
    for thread in writers:
        thread.start()
    kills = 0
    rnd = random.Random(7)
    deadline = time.monotonic() + 60
    while any(t.is_alive() for t in writers) and time.monotonic() < deadline:
        time.sleep(rnd.uniform(0.3, 0.9))
        pids = server.worker_pids()
        if pids:
            os.kill(rnd.choice(pids), signal.SIGKILL)
            kills += 1
    stop.set()
    for thread in writers:
        thread.join(60)
    store = requests.post(
        f"{server.url}{MS}", json={"name": "notes"}, headers=auth(secret), timeout=30
    )
    assert store.status_code == 200, store.text
    memory = requests.post(
        f"{server.url}{MS}/{store.json()['id']}/memories",
        json={"path": "/ops.md", "content": "rotate the deploy key monthly"},
        headers=auth(secret),
        timeout=30,
    )
    assert memory.status_code == 200
    # A last burst right after a kill (the respawned worker loads the model on its first
    # drain), then the whole server at once, whatever it was embedding.
    os.kill(rnd.choice(server.worker_pids()), signal.SIGKILL)
    burst: list[str] = []
    write_turns(server, secret, "c", 30, burst, threading.Event())
    server.kill_all()
    acked += burst
    assert kills >= 3 and acked
    rows, bare, queued = unembedded(server.root)
    assert rows >= len(set(acked))
    assert bare <= queued  # a row without vectors is queued: none was lost

    server.start()
    r = requests.get(
        f"{server.url}{BASE}/search",
        params={"q": "login cookie"},
        headers=auth(secret),
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["modes"] == ["keyword", "semantic"]
    deadline = time.monotonic() + 120
    while unembedded(server.root)[1:] != (0, 0):
        assert time.monotonic() < deadline, unembedded(server.root)
        time.sleep(0.2)
    for task in set(acked):
        got = requests.get(
            f"{server.url}{BASE}/tasks/{task}/turns/0", headers=auth(secret), timeout=30
        )
        assert got.status_code == 200, task
    found = requests.get(
        f"{server.url}{BASE}/search",
        params={"q": "deploy key rotation", "mode": "semantic"},
        headers=auth(secret),
        timeout=30,
    ).json()
    assert found["hits"][0]["path"] == "/ops.md"
    server.stop()
    done = flask(server.env, "fsck")
    assert done.returncode == 0, done.stdout
    assert "wait to be embedded" not in done.stdout
