"""SIGKILL under group commit: 8 writers, the whole server killed at random points, restarted.

Under group commit (app/storage/tree/fs/atomic.py) a writer lets go of its task or store lock before
the flush that makes its write durable, and answers after it; several threads, in several
worker processes, share one flush. This kills the whole server (master and workers at once)
at a random moment while 8 writers put turns and artifacts of their own tasks and create and
update memories of ONE memory store (so writers queue on its lock), starts it again on the
same root, and after each restart checks, through the engines (readers take no lock):

* every key holds its last acknowledged write, or a later write that got no answer (it may
  have reached its commit point before the kill); never an older state, never a mix;
* every artifact served has exactly the bytes its record names;
* every acknowledged memory version is there, read back by its id;
* ``fsck`` of both engines is clean once the start-up recovery ran (the journal repaired
  what the kill left in flight; temp files of killed writers are younger than fsck's grace).

Two kills run in `make test`, ten in `make slow` (CI runs both), 200 in `make soak`.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from app.storage.core.errors import NotFound
from app.storage.core.models import DEFAULT_GRACE
from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage
from tests.robust.helpers import BASE, Live, auth

pytestmark = pytest.mark.e2e
SCOPE = Scope("acme", "web")
WRITERS = 8
MS = "/v1/memory_stores"


@dataclass
class Model:
    """What each key may hold: the attempts on it, in order, and which were acknowledged."""

    attempts: dict[tuple[Any, ...], list[tuple[Any, bool]]] = field(default_factory=dict)
    versions: list[tuple[str, str]] = field(default_factory=list)  # acknowledged (id, sha)
    acked: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, key: tuple[Any, ...], content: Any, ok: bool) -> None:
        with self.lock:
            self.attempts.setdefault(key, []).append((content, ok))
            self.acked += ok

    def allowed(self, key: tuple[Any, ...]) -> list[Any]:
        log = self.attempts[key]
        last = max((i for i, (_, ok) in enumerate(log) if ok), default=None)
        if last is None:
            return [None] + [c for c, _ in log]
        return [c for c, _ in log[last:]]


@dataclass
class Writer:
    n: int
    rng: random.Random
    memories: dict[str, str] = field(default_factory=dict)  # memory id -> this writer's key
    has_turn0: set[str] = field(default_factory=set)
    seq: int = 0
    session: requests.Session | None = None

    def http(self, secret: str) -> requests.Session:
        if self.session is None:
            self.session = requests.Session()
            self.session.headers.update(auth(secret))
        return self.session

    def drop(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_once(server: Live, secret: str, store: str, w: Writer, model: Model) -> None:
    """One write of a random kind; its outcome goes to the model."""
    w.seq += 1
    rng, n, seq = w.rng, w.n, w.seq
    task = f"w{n}-{rng.randrange(2)}"
    url = server.url
    op = rng.random()
    key: tuple[Any, ...]
    content: Any
    s = w.http(secret)
    try:
        if task not in w.has_turn0 or op < 0.25:
            turn = 0 if task not in w.has_turn0 or rng.random() < 0.5 else rng.randrange(1, 4)
            content = (
                {"w": n, "seq": seq},
                f"writer {n} write {seq} " + "s" * rng.randrange(2000),
            )
            key = ("turn", task, turn)
            resp = s.put(
                f"{url}{BASE}/tasks/{task}/turns/{turn}",
                json={"meta": content[0], "summary_md": content[1]},
                timeout=30,
            )
            ok = resp.status_code == 200
            if ok and turn == 0:
                w.has_turn0.add(task)
        elif op < 0.5:
            name = rng.choice(["a.bin", "b.bin"])
            body = rng.randbytes(rng.choice([10, 4096, 16384, 200_000]))
            content = (hashlib.sha256(body).hexdigest(), f"application/x-w{n}-{seq}")
            key = ("artifact", task, 0, name)
            resp = s.put(
                f"{url}{BASE}/tasks/{task}/turns/0/artifacts/{name}",
                data=body,
                headers={"Content-Type": content[1]},
                timeout=30,
            )
            ok = resp.status_code == 200
        elif op < 0.75 or not w.memories:
            text = f"writer {n} memory {seq} " + "m" * rng.randrange(3000)
            path = f"/w{n}/m{seq}.md"
            key = ("memory", path)
            content = _sha(text)
            resp = s.post(
                f"{url}{MS}/{store}/memories", json={"path": path, "content": text}, timeout=30
            )
            ok = resp.status_code == 200
            if ok:
                body_json = resp.json()
                w.memories[body_json["id"]] = path
                with model.lock:
                    model.versions.append((body_json["memory_version_id"], content))
        else:
            memory_id = rng.choice(sorted(w.memories))
            text = f"writer {n} update {seq} " + "u" * rng.randrange(3000)
            key = ("memory", w.memories[memory_id])
            content = _sha(text)
            resp = s.post(
                f"{url}{MS}/{store}/memories/{memory_id}", json={"content": text}, timeout=30
            )
            ok = resp.status_code == 200
            if ok:
                with model.lock:
                    model.versions.append((resp.json()["memory_version_id"], content))
    except requests.RequestException:
        w.drop()
        model.record(key, content, False)
        return
    if not ok and resp.status_code not in (502, 503):
        raise AssertionError(f"{key}: {resp.status_code} {resp.text[:300]}")
    model.record(key, content, ok)


def _visible(storage: TreeStorage, store: str, key: tuple[Any, ...]) -> Any:
    try:
        if key[0] == "turn":
            rec = storage.tasks.get_turn(SCOPE, key[1], key[2])
            return (rec.meta, rec.summary_md)
        if key[0] == "memory":
            found = storage.stores.find_memory(SCOPE, store, key[1], full=False)
            return None if found is None else found.content_sha256
        art = storage.tasks.open_artifact(SCOPE, key[1], key[2], key[3])
    except NotFound:
        return None
    with art.file:
        data = art.file.read()
    sha = hashlib.sha256(data).hexdigest()
    assert len(data) == art.info.size and sha == art.info.sha256, f"{key}: bytes != record"
    return (sha, art.info.content_type)


def check(root: Path, store: str, model: Model) -> None:
    storage = TreeStorage(root, lock_timeout=10.0)
    wrong = []
    for key in model.attempts:
        got = _visible(storage, store, key)
        if got not in model.allowed(key):
            wrong.append(f"{key}: {str(got)[:80]} not in {len(model.allowed(key))} allowed")
    assert wrong == [], wrong[:10]
    for version_id, sha in model.versions:
        version = storage.stores.get_version(SCOPE, store, version_id, full=True)
        assert version.content_sha256 == sha, version_id
    report = storage.fsck(grace=DEFAULT_GRACE)
    assert report.clean, report.problems[:10]


def run_kills(live_factory: Any, kills: int, seed: int) -> tuple[int, int]:
    server: Live = live_factory(workers=3, threads=4)
    secret = server.token("writer")
    created = requests.post(
        f"{server.url}{MS}", json={"name": "kill"}, headers=auth(secret), timeout=30
    )
    assert created.status_code == 200, created.text
    store = created.json()["id"]
    model = Model()
    rng = random.Random(seed)
    writers = [Writer(n, random.Random(seed * 100 + n)) for n in range(WRITERS)]
    for _ in range(kills):
        stop = threading.Event()
        failures: list[BaseException] = []

        def loop(w: Writer, stop: threading.Event = stop, failures: list = failures) -> None:
            try:
                while not stop.is_set():
                    write_once(server, secret, store, w, model)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=loop, args=(w,), daemon=True) for w in writers]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.15, 0.6))
        server.kill_all()
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert failures == [], failures[:3]
        server.start()  # the start-up recovery repairs what the kill left in flight
        check(server.root, store, model)
    return model.acked, sum(len(a) for a in model.attempts.values()) - model.acked


def test_sigkill_under_group_commit_twice(live_factory: Any) -> None:
    acked, unanswered = run_kills(live_factory, kills=2, seed=19)
    assert acked > 10 and unanswered > 0, (acked, unanswered)


@pytest.mark.slow
def test_sigkill_under_group_commit(live_factory: Any) -> None:
    acked, unanswered = run_kills(live_factory, kills=10, seed=19)
    assert acked > 50 and unanswered > 0, (acked, unanswered)


@pytest.mark.soak
def test_sigkill_under_group_commit_soak(live_factory: Any) -> None:
    acked, unanswered = run_kills(live_factory, kills=200, seed=1919)
    print(f"200 kills: {acked} acknowledged writes all found, {unanswered} unanswered")
    assert acked > 1000 and unanswered > 0, (acked, unanswered)
