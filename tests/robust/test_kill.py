"""SIGKILL during writes: every acknowledged write survives, nothing torn is ever visible.

Clients put turns (new and overwritten) and artifacts (new and overwritten) while a killer
SIGKILLs random workers of a real gunicorn (variant 1), or the whole server, master and
workers at once, which is then started again on the same root (variant 2). Each client owns
its keys and writes them one at a time, so the model is simple: a key holds the content of
its last acknowledged write or of a later write that got no answer (it may have reached its
commit point before the kill); never anything else, never a mix.

Afterwards, before anything repairs the tree:

* every key holds an allowed content (turn meta + summary, artifact bytes + type);
* every artifact served has exactly the bytes its record describes (size and sha256);
* every JSON file parses, none is empty;
* fsck finds nothing wrong outside the tasks whose dirty marker says "a writer died here";
* the sweeper removes every temp file; fsck --repair then leaves a clean tree whose derived
  files equal a rebuild.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from app import create_app
from app.storage.core.errors import NotFound
from app.storage.core.models import FsckReport
from app.storage.core.names import Scope
from app.storage.tree.fsck import fsck
from app.storage.tree.retention import sweep
from app.storage.tree.stores.fsck import fsck_stores
from tests.robust.helpers import BASE, Live, auth, json_files_parse, store_for, temp_files

pytestmark = pytest.mark.e2e
SCOPE = Scope("acme", "web")
STORES_DIR = "_stores"  # the memory-stores tree inside a project
CLIENTS = 4


@dataclass
class KeyLog:
    """Attempts on one key, in order: (content, acknowledged)."""

    attempts: list[tuple[Any, bool]] = field(default_factory=list)

    def allowed(self) -> list[Any]:
        last_ack = max((i for i, (_, ok) in enumerate(self.attempts) if ok), default=None)
        if last_ack is None:
            return [None] + [c for c, _ in self.attempts]
        return [c for c, _ in self.attempts[last_ack:]]


@dataclass
class Run:
    server: Live
    secret: str
    keys: dict[tuple[Any, ...], KeyLog] = field(default_factory=dict)
    acked: int = 0
    failed: int = 0
    kills: int = 0
    memories: dict[int, str] = field(default_factory=dict)  # client -> memory path (no host)
    bad_status: list[str] = field(default_factory=list)
    # Half the turn writes as a form with an artifact (beyond the seed), or none.
    forms: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, key: tuple[Any, ...], content: Any, ok: bool) -> None:
        with self.lock:
            self.keys.setdefault(key, KeyLog()).attempts.append((content, ok))
            if ok:
                self.acked += 1
            else:
                self.failed += 1


def client(run: Run, c: int, seed: int) -> None:
    rng = random.Random(seed)
    tasks = [f"k{c}-{j}" for j in range(2)]
    next_turn = dict.fromkeys(tasks, 1)
    has_turn0: set[str] = set()
    with requests.Session() as session:
        session.headers.update(auth(run.secret))
        n = 0
        while not run.stop.is_set():
            n += 1
            task = rng.choice(tasks)
            op = rng.random()
            url = f"{run.server.url}{BASE}/tasks/{task}/turns"
            if task not in has_turn0 or op < 0.3:
                turn = 0
            elif op < 0.55:
                turn = next_turn[task]
                next_turn[task] = min(9998, turn + 1)
            else:
                turn = None  # an artifact of turn 0, or this client's memory
            also: tuple[tuple[Any, ...], Any] | None = None  # a second key the write sets
            try:
                if turn is None and op > 0.8 and c in run.memories:
                    text = f"memory of client {c}, write {n} " + "m" * rng.randint(0, 5000)
                    content = hashlib.sha256(text.encode()).hexdigest()
                    key = ("memory", c)
                    resp = session.post(
                        f"{run.server.url}{run.memories[c]}", json={"content": text}, timeout=60
                    )
                elif turn is not None and run.forms and rng.random() < 0.5:
                    # The turn and an artifact in one request (beyond the seed): each key
                    # holds what this write gave it, or what it held before.
                    content = ({"c": c, "n": n, "form": True}, f"client {c} form {n}")
                    key = ("turn", task, turn)
                    data = rng.randbytes(rng.choice([10, 5000, 200_000]))
                    kind = f"application/x-c{c}-n{n}"
                    also = (
                        ("artifact", task, turn, "f.bin"),
                        (hashlib.sha256(data).hexdigest(), kind),
                    )
                    resp = session.put(
                        f"{url}/{turn}",
                        files=[
                            (
                                "turn",
                                (
                                    None,
                                    json.dumps({"meta": content[0], "summary_md": content[1]}),
                                    "application/json",
                                ),
                            ),
                            ("artifact", ("f.bin", data, kind)),
                        ],
                        timeout=60,
                    )
                elif turn is not None:
                    content = (
                        {"c": c, "n": n},
                        f"client {c} write {n} " + "x" * rng.randint(0, 3000),
                    )
                    key: tuple[Any, ...] = ("turn", task, turn)
                    resp = session.put(
                        f"{url}/{turn}",
                        json={"meta": content[0], "summary_md": content[1]},
                        timeout=60,
                    )
                else:
                    name = rng.choice(["a.bin", "b.bin", f"n{n}.bin"])
                    body = rng.randbytes(rng.choice([10, 5000, 200_000, 1_000_000]))
                    kind = f"application/x-c{c}-n{n}"
                    content = (hashlib.sha256(body).hexdigest(), kind)
                    key = ("artifact", task, 0, name)
                    resp = session.put(
                        f"{url}/0/artifacts/{name}",
                        data=body,
                        headers={"Content-Type": kind},
                        timeout=60,
                    )
            except requests.RequestException:
                run.record(key, content, False)
                if also is not None:
                    run.record(*also, False)
                time.sleep(0.02)
                continue
            ok = resp.status_code == 200
            if not ok and resp.status_code not in (502, 503):
                with run.lock:
                    run.bad_status.append(f"{resp.status_code} {resp.text[:200]}")
            run.record(key, content, ok)
            if also is not None:
                run.record(*also, ok)
            if ok and key[0] == "turn" and turn == 0:
                has_turn0.add(task)


def visible(store: Any, key: tuple[Any, ...]) -> Any:
    """What a reader gets for ``key`` now, checking the bytes against their record."""
    try:
        if key[0] == "turn":
            rec = store.get_turn(SCOPE, key[1], key[2])
            return (rec.meta, rec.summary_md)
        art = store.open_artifact(SCOPE, key[1], key[2], key[3])
    except NotFound:
        return None
    with art.file:
        data = art.file.read()
    sha = hashlib.sha256(data).hexdigest()
    assert len(data) == art.size == art.info.size and sha == art.info.sha256, (
        f"{key}: served bytes ({len(data)}, {sha[:12]}) are not the bytes of the record "
        f"({art.info.size}, {art.info.sha256[:12]})"
    )
    return (sha, art.info.content_type)


def memories_after(run: Run) -> dict[tuple[Any, ...], Any]:
    """What a restarted server serves for each client's memory (content sha256)."""
    if not run.memories:
        return {}
    run.server.start()
    try:
        with requests.Session() as s:
            s.headers.update(auth(run.secret))
            out: dict[tuple[Any, ...], Any] = {}
            for c, path in run.memories.items():
                got = s.get(f"{run.server.url}{path}", timeout=30)
                assert got.status_code == 200, got.text
                body = got.json()
                if body.get("content") is not None:
                    assert (
                        hashlib.sha256(body["content"].encode()).hexdigest()
                        == body["content_sha256"]
                    )
                out[("memory", c)] = body["content_sha256"]
            return out
    finally:
        run.server.stop()


def check_after(root: Path, run: Run) -> None:
    store = store_for(root)
    served = memories_after(run)
    wrong = []
    for key, log in run.keys.items():
        got = served[key] if key[0] == "memory" else visible(store, key)
        if got not in log.allowed():
            wrong.append(f"{key}: {str(got)[:80]} not in the {len(log.allowed())} allowed")
    assert wrong == [], wrong[:10]
    assert json_files_parse(root) == []
    empty = [p for p in root.rglob("*.json") if p.stat().st_size == 0]
    assert empty == []

    dirty = {key.id for _, key in store.txns.journal.pending()}

    def unexplained(problems: list[str], leftovers: tuple[str, ...]) -> list[str]:
        """Problems other than a dead writer's documented footprint."""
        return [
            p
            for p in problems
            if not any(text in p for text in leftovers)
            and not any(f"/{task}/" in p or f"/{task}:" in p for task in dirty)
            and "differs from a fresh render" not in p  # project.md follows a dirty task
        ]

    # What a killed writer may leave: temp files, trash, a turn directory it made before its
    # commit, artifact bytes it published before its commit. The sweeper collects all four;
    # everything else (a stale index, a torn record) must sit in a task marked dirty.
    crash_leftovers = (
        "temp file",
        ".trash",
        "a turn directory without meta.json",
        "unfinished turn of a writer that died",
        "an artifact file meta.json does not list",
    )
    report = fsck(store, grace=timedelta(0))
    assert unexplained(report.problems, crash_leftovers) == [], (report.problems, sorted(dirty))

    swept = sweep(store, now=datetime.now(UTC), grace=timedelta(0))
    assert swept.errors == (), swept.errors
    # The sweeper collects the project-memory tree's temp files; the memory-stores engine's
    # own fsck (run by `flask fsck` after the project one) collects those of its stores.
    assert [p for p in temp_files(root) if STORES_DIR not in p.parts] == []
    after_sweep = fsck(store, grace=timedelta(0))
    assert unexplained(after_sweep.problems, ()) == [], after_sweep.problems
    fsck(store, repair=True, grace=timedelta(0))
    final = fsck(store, grace=timedelta(0))
    assert final.clean, final.problems
    stores = (
        create_app({"STORAGE_ROOT": str(root), "TOKENS_FILE": str(run.server.tokens_file)})
        .extensions["storage"]
        .stores
    )
    if stores is not None:
        before_repair = FsckReport()
        fsck_stores(stores, before_repair)
        assert [p for p in before_repair.problems if "leftover temp file" not in p] == []
        fsck_stores(stores, FsckReport(), repair=True)
        after_repair = FsckReport()
        fsck_stores(stores, after_repair)
        assert after_repair.clean, after_repair.problems
    assert temp_files(root) == []
    # Repair changed only derived files: what readers see is what they saw before.
    for key, log in run.keys.items():
        if key[0] != "memory":
            assert visible(store, key) in log.allowed(), key


def _drive(server: Live, seconds: float, killer: Any, *, forms: bool = False) -> Run:
    run = Run(server, server.token("writer"), forms=forms)
    with requests.Session() as s:
        s.headers.update(auth(run.secret))
        store = s.post(f"{server.url}/v1/memory_stores", json={"name": "kill"}, timeout=30)
        if store.status_code == 200:  # the memory-stores API is there: write memories too
            base = f"/v1/memory_stores/{store.json()['id']}/memories"
            for c in range(CLIENTS):
                mem = s.post(
                    f"{server.url}{base}", json={"path": f"/c{c}.md", "content": ""}, timeout=30
                )
                assert mem.status_code == 200, mem.text
                run.memories[c] = f"{base}/{mem.json()['id']}"
                run.record(("memory", c), hashlib.sha256(b"").hexdigest(), True)
    threads = [
        threading.Thread(target=client, args=(run, c, 1000 + c), daemon=True)
        for c in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    try:
        killer(run, time.monotonic() + seconds)
    finally:
        run.stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return run


def kill_workers(times: int) -> Any:
    def killer(run: Run, deadline: float) -> None:
        rng = random.Random(7)
        kills = 0
        while time.monotonic() < deadline and kills < times:
            time.sleep(rng.uniform(0.05, 0.4))
            pids = run.server.worker_pids()
            if pids:
                os.kill(rng.choice(pids), signal.SIGKILL)
                kills += 1
        time.sleep(1.0)  # let the last respawned worker serve a few acknowledged writes
        run.kills = kills

    return killer


def kill_server(times: int) -> Any:
    def killer(run: Run, deadline: float) -> None:
        rng = random.Random(11)
        kills = 0
        while time.monotonic() < deadline and kills < times:
            time.sleep(rng.uniform(0.3, 1.5))
            run.server.kill_all()
            kills += 1
            run.server.start()  # same root, new port; clients pick up the new url
        time.sleep(1.0)
        run.kills = kills

    return killer


def _worker_kills(live_factory: Any, times: int, seconds: float, *, forms: bool = False) -> None:
    server = live_factory(workers=2, threads=4)
    run = _drive(server, seconds, kill_workers(times), forms=forms)
    server.stop()
    assert run.kills >= min(times, 5), run.kills
    assert run.acked > 5 and run.failed > 0, (run.acked, run.failed)
    assert run.bad_status == [], run.bad_status[:5]
    check_after(server.root, run)


def _server_kills(live_factory: Any, times: int, seconds: float) -> None:
    server = live_factory(workers=2, threads=4)
    run = _drive(server, seconds, kill_server(times))
    server.stop()
    assert run.acked > 5 and run.failed > 0, (run.acked, run.failed)
    assert run.bad_status == [], run.bad_status[:5]
    check_after(server.root, run)


@pytest.mark.slow  # make test kills workers in the variant below
def test_sigkill_random_workers_during_writes(live_factory: Any) -> None:
    _worker_kills(live_factory, times=12, seconds=8)


def test_sigkill_random_workers_during_turns_written_with_their_artifacts(
    live_factory: Any,
) -> None:
    """Half the turn writes carry an artifact in the same request: the turn and the artifact
    each hold what their last acknowledged write put there, or what an unanswered one did."""
    _worker_kills(live_factory, times=8, seconds=6, forms=True)


def test_sigkill_whole_server_and_restart(live_factory: Any) -> None:
    _server_kills(live_factory, times=2, seconds=6)


@pytest.mark.soak
def test_sigkill_random_workers_during_writes_soak(live_factory: Any) -> None:
    _worker_kills(live_factory, times=200, seconds=180)


@pytest.mark.soak
def test_sigkill_whole_server_and_restart_soak(live_factory: Any) -> None:
    _server_kills(live_factory, times=40, seconds=180)
