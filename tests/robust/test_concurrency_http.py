"""16 clients against a real gunicorn on one task: no lost or duplicated turn, no fork.

Each client writes its own turns of one hot task and, in between, overwrites one turn that
every client shares. Afterwards:

* the task index holds exactly the acknowledged turns (a lost read-modify-write of
  ``index.json`` drops one; a 503 must have written nothing), at the end and in every read
  a client makes after an acknowledgement;
* every acknowledged write got its own ``updated_at`` (the per-task version counter never
  hands out the same version twice, i.e. the chain never forks);
* the shared turn holds the acknowledged write with the highest version, byte for byte;
* every status is 200, or 503 with ``Retry-After`` (lock timeout), nothing else;
* ``index.json`` equals a rebuild from the records.

The control run serves the same app with the locks switched off
(``tests/robust/nolock_app.py``) and asserts that the same checks report lost updates.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from app.storage.core.names import Scope
from app.storage.tree.records import read_json, rebuild_index
from tests.robust.helpers import BASE, Live, auth, store_for

pytestmark = pytest.mark.e2e
CLIENTS = 16
SHARED_TURN = 9999


@dataclass
class History:
    """Every request of the run: invoke → ok/fail, as a checker reads it."""

    acked: dict[int, str] = field(default_factory=dict)  # own turn -> summary
    shared: list[tuple[str, str]] = field(default_factory=list)  # (updated_at, summary)
    versions: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)
    missing_on_read: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_clients(server: Live, secret: str, per_client: int, deadline_s: float) -> History:
    history = History()
    deadline = time.monotonic() + deadline_s

    def client(c: int) -> None:
        with requests.Session() as session:
            session.headers.update(auth(secret))
            for i in range(per_client):
                if time.monotonic() > deadline:
                    return
                shared = i % 4 == 3
                turn = SHARED_TURN if shared else c * 500 + i
                summary = f"client {c} write {i}"
                resp = session.put(
                    f"{server.url}{BASE}/tasks/hot/turns/{turn}",
                    json={"meta": {"client": c, "i": i}, "summary_md": summary},
                    timeout=60,
                )
                with history.lock:
                    history.statuses[resp.status_code] += 1
                    if resp.status_code == 200:
                        body = resp.json()
                        history.versions.append(body["updated_at"])
                        if shared:
                            history.shared.append((body["updated_at"], summary))
                        else:
                            history.acked[turn] = summary
                    elif resp.status_code == 503:
                        if "Retry-After" not in resp.headers:
                            history.bad.append(f"503 without Retry-After: {resp.text[:200]}")
                    else:
                        history.bad.append(f"{resp.status_code}: {resp.text[:200]}")
                    seen_before = set(history.acked)
                # Read your (and everyone's) writes: a turn acknowledged before this read
                # started must be in the index it returns. A lost read-modify-write of
                # index.json shows up here even if a later repair puts the turn back.
                index = session.get(f"{server.url}{BASE}/tasks/hot", timeout=60)
                if index.status_code == 200:
                    missing = seen_before - {t["turn"] for t in index.json()["turns"]}
                    if missing:
                        with history.lock:
                            history.missing_on_read += len(missing)

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    return history


def violations(server: Live, secret: str, history: History) -> list[str]:
    """Everything the run got wrong; empty when the service kept every promise."""
    found = list(history.bad)
    if history.missing_on_read:
        found.append(
            f"lost updates: acknowledged turns missing from later reads of the index "
            f"{history.missing_on_read} times"
        )
    with requests.Session() as s:
        s.headers.update(auth(secret))
        index = s.get(f"{server.url}{BASE}/tasks/hot", timeout=30).json()
        turns = [t["turn"] for t in index["turns"]]
        if len(turns) != len(set(turns)):
            found.append(f"duplicated turns in the index: {len(turns) - len(set(turns))}")
        expected = set(history.acked) | ({SHARED_TURN} if history.shared else set())
        lost = expected - set(turns)
        if lost:
            found.append(f"lost updates: {len(lost)} acknowledged turns missing from the index")
        extra = set(turns) - expected
        if extra:
            found.append(f"turns nobody got acknowledged: {sorted(extra)[:5]}")
        if index.get("turn_count") != len(expected):
            found.append(f"turn_count {index.get('turn_count')} != {len(expected)} acknowledged")
        for turn, summary in list(history.acked.items())[:: max(1, len(history.acked) // 40)]:
            got = s.get(f"{server.url}{BASE}/tasks/hot/turns/{turn}", timeout=30).json()
            if got.get("summary_md") != summary:
                found.append(f"turn {turn}: {got.get('summary_md')!r} != acknowledged {summary!r}")
        if history.shared:
            last_version, last_summary = max(history.shared)
            got = s.get(f"{server.url}{BASE}/tasks/hot/turns/{SHARED_TURN}", timeout=30).json()
            if (got["updated_at"], got["summary_md"]) != (last_version, last_summary):
                found.append(
                    f"shared turn holds {got['summary_md']!r}@{got['updated_at']}, "
                    f"not the last acknowledged {last_summary!r}@{last_version}"
                )
    dupes = [v for v, n in Counter(history.versions).items() if n > 1]
    if dupes:
        found.append(f"version chain forked: {len(dupes)} versions handed out twice")
    store = store_for(server.root)
    task_dir = store.layout.task_dir(Scope("acme", "web"), "hot")
    if read_json(task_dir / "index.json") != rebuild_index(store.layout.tree, task_dir, "hot"):
        found.append("index.json differs from a rebuild from the records")
    return found


def _run(live_factory: Any, per_client: int, **server_kwargs: Any) -> tuple[History, list[str]]:
    # A short lock timeout makes 503s likely, so the test sees that they are clean.
    server = live_factory(env_extra={"MEMORY_LOCK_TIMEOUT": "2"}, **server_kwargs)
    secret = server.token("writer")
    history = run_clients(server, secret, per_client, deadline_s=240)
    return history, violations(server, secret, history)


@pytest.mark.parametrize(
    "server_kwargs",
    [
        pytest.param({"worker_class": "sync", "workers": 4}, id="sync-w4"),
        pytest.param({"worker_class": "gthread", "workers": 2, "threads": 8}, id="gthread-w2t8"),
    ],
)
def test_sixteen_clients_on_one_task(live_factory: Any, server_kwargs: dict[str, Any]) -> None:
    history, found = _run(live_factory, 8, **server_kwargs)
    assert found == [], found
    assert history.statuses[200] >= CLIENTS * 8 // 2, history.statuses
    assert set(history.statuses) <= {200, 503}, history.statuses


@pytest.mark.soak
@pytest.mark.parametrize(
    "server_kwargs",
    [
        pytest.param({"worker_class": "sync", "workers": 4}, id="sync-w4"),
        pytest.param({"worker_class": "gthread", "workers": 2, "threads": 8}, id="gthread-w2t8"),
    ],
)
def test_sixteen_clients_on_one_task_soak(live_factory: Any, server_kwargs: dict[str, Any]) -> None:
    history, found = _run(live_factory, 100, **server_kwargs)
    assert found == [], found
    assert set(history.statuses) <= {200, 503}, history.statuses


def test_control_without_locks_the_checks_see_lost_updates(live_factory: Any) -> None:
    """The same run with the locks disabled must be caught losing acknowledged turns."""
    history, found = _run(
        live_factory, 8, app="tests.robust.nolock_app:app", worker_class="sync", workers=4
    )
    assert any(
        v.startswith(("lost updates", "index.json differs", "version chain")) for v in found
    ), f"the checks did not notice the missing lock: {found} {history.statuses}"
    print(f"control run: {found[:3]}")


def test_readers_of_an_artifact_being_replaced_get_the_bytes_of_the_etag(live_factory: Any) -> None:
    """A reader racing a replacement gets old bytes with the old ETag or new with new."""
    server = live_factory(workers=2, threads=4)
    secret = server.token("writer")
    turn = f"{server.url}{BASE}/tasks/t/turns/0"
    url = f"{turn}/artifacts/a.bin"
    assert requests.put(turn, json={}, headers=auth(secret), timeout=30).status_code == 200
    assert requests.put(url, data=b"0" * 4096, headers=auth(secret), timeout=30).status_code == 200
    stop = threading.Event()
    torn: list[str] = []
    reads = [0]

    def reader() -> None:
        with requests.Session() as s:
            s.headers.update(auth(secret))
            while not stop.is_set():
                got = s.get(url, timeout=30)
                reads[0] += 1
                sha = hashlib.sha256(got.content).hexdigest()
                if got.headers["ETag"] != f'"{sha}"':
                    torn.append(f"ETag {got.headers['ETag'][:14]} for bytes {sha[:12]}")

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        with requests.Session() as s:
            s.headers.update(auth(secret))
            deadline = time.monotonic() + 4
            n = 0
            while time.monotonic() < deadline:
                n += 1
                # Same size every time: only the bytes tell the versions apart.
                assert s.put(url, data=str(n % 10).encode() * 4096, timeout=30).status_code == 200
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert reads[0] > 50
    assert torn == [], f"{len(torn)} of {reads[0]} reads: {torn[:5]}"


def _versions(s: requests.Session, base: str, memory_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    page = None
    for _ in range(1000):
        params = {"memory_id": memory_id, "limit": 100, **({"page": page} if page else {})}
        body = s.get(f"{base}/memory_versions", params=params, timeout=60).json()
        out += body["data"]
        page = body.get("next_page")
        if not page:
            return out
    raise AssertionError("the version list does not end")


def _one_memory(live_factory: Any, per_client: int, **server_kwargs: Any) -> None:
    server = live_factory(env_extra={"MEMORY_LOCK_TIMEOUT": "2"}, **server_kwargs)
    secret = server.token("writer")
    with requests.Session() as s:
        s.headers.update(auth(secret))
        store = s.post(f"{server.url}/v1/memory_stores", json={"name": "hot"}, timeout=30)
        if store.status_code != 200:
            pytest.skip("the memory-stores API is not there")
        base = f"{server.url}/v1/memory_stores/{store.json()['id']}"
        mem = s.post(
            f"{base}/memories", json={"path": "/hot.md", "content": "v0"}, timeout=30
        ).json()
    url = f"{base}/memories/{mem['id']}"
    acked: dict[str, str] = {}  # version id -> sha256 of the content acknowledged with it
    statuses: Counter[int] = Counter()
    bad: list[str] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        with requests.Session() as session:
            session.headers.update(auth(secret))
            for i in range(per_client):
                content = f"client {c} write {i}"
                resp = session.post(url, json={"content": content}, timeout=60)
                with lock:
                    statuses[resp.status_code] += 1
                    if resp.status_code == 200:
                        body = resp.json()
                        if body["content_sha256"] != hashlib.sha256(content.encode()).hexdigest():
                            bad.append(f"acknowledged with another content: {body}")
                        if body["memory_version_id"] in acked:
                            bad.append(f"version {body['memory_version_id']} handed out twice")
                        acked[body["memory_version_id"]] = body["content_sha256"]
                    elif resp.status_code != 503 or "Retry-After" not in resp.headers:
                        bad.append(f"{resp.status_code}: {resp.text[:200]}")

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    assert bad == [], bad[:5]
    assert set(statuses) <= {200, 503}, statuses
    with requests.Session() as s:
        s.headers.update(auth(secret))
        versions = _versions(s, base, mem["id"])
        final = s.get(url, timeout=30).json()
    modified = [v for v in versions if v["operation"] == "modified"]
    ids = [v["id"] for v in versions]
    assert len(ids) == len(set(ids)), "a version is listed twice"
    # Every acknowledged update is one version with its content; a 503 left none behind.
    assert {v["id"]: v["content_sha256"] for v in modified} == acked
    # The chain is linear: the newest version is the memory's current state.
    assert versions[0]["id"] == final["memory_version_id"]
    assert final["content_sha256"] == versions[0]["content_sha256"]


@pytest.mark.parametrize(
    "server_kwargs",
    [
        pytest.param({"worker_class": "sync", "workers": 4}, id="sync-w4"),
        pytest.param({"worker_class": "gthread", "workers": 2, "threads": 8}, id="gthread-w2t8"),
    ],
)
def test_sixteen_clients_on_one_memory(live_factory: Any, server_kwargs: dict[str, Any]) -> None:
    _one_memory(live_factory, 6, **server_kwargs)


@pytest.mark.soak
def test_sixteen_clients_on_one_memory_soak(live_factory: Any) -> None:
    _one_memory(live_factory, 100, worker_class="gthread", workers=2, threads=8)
