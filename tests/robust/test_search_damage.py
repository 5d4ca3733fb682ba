"""A search index damaged under a live server (tree/sqlite/fts.py): the FTS5 structure record
of a project's listing and of a store's index is overwritten while clients write, delete and
search. Every write still answers 2xx; searches answer 503 with Retry-After while the
indexes are rebuilt from the records, then find what they should; fsck is clean after its
repair; and what was deleted meanwhile is in no file.
"""

# ruff: noqa: S608 - table names are module constants; every value is bound.
from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage
from tests.robust.helpers import auth
from tests.robust.test_removed_text import files_with

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,  # a server written to while its indexes are damaged and rebuilt
    pytest.mark.tree_only("damages the tree's SQLite files"),
]

PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"
SCOPE = Scope("acme", "web")
# A project big enough that its rebuild takes a while (the window searches answer 503 in).
TASKS = 400
SECRET = "Qqzxdamagedsecretkappa"
LIVE_WORD = "Qqzxlivewordlambda"


def _overwrite_structure(path: Path, table: str = "search_text") -> None:
    """What a torn write or a stray tool could leave: a structure record that claims more
    levels than FTS5 reads (varint 2,500 after the 4-byte cookie)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(
            f"UPDATE {table}_data SET block = ? WHERE id = 10",
            (b"\x00\x00\x00\x09" + bytes([0x93, 0x44]) + b"\x00\x00",),
        )
    finally:
        conn.close()


def _prepare(root: Path) -> str:
    """A project of TASKS tasks (one holding SECRET, deleted later) and a store, written
    straight to the root before the server starts; the store's id."""
    storage = TreeStorage(root, lock_timeout=10.0)
    for n in range(TASKS):
        summary = f"task {n} notes" + (f" {SECRET}" if n == 7 else "")
        storage.tasks.put_turn(SCOPE, f"t{n:04d}", 0, meta={}, summary_md=summary, actor="tok")
    store_id = storage.stores.create_store(SCOPE, name="notes").id
    for n in range(40):
        storage.stores.create_memory(
            SCOPE, store_id, path=f"/m{n}.md", content=f"memory {n} {LIVE_WORD}", actor=None
        )
    storage.close()
    return store_id


def test_writes_go_on_and_search_comes_back_when_an_index_is_damaged(
    live_factory: Any, tmp_path: Path
) -> None:
    root = tmp_path / "storage"
    store_id = _prepare(root)
    server = live_factory(root=root, workers=2, threads=4)
    h = auth(server.token("project_admin"))
    s = requests.Session()
    statuses: list[tuple[str, int]] = []
    stop = threading.Event()

    def writer(w: int) -> None:
        n = 0
        with requests.Session() as c:
            while not stop.is_set():
                task = f"w{w}-{n}"
                r = c.put(
                    f"{server.url}{PM}/tasks/{task}/turns/0",
                    json={"summary_md": f"writer {w} turn {n} {LIVE_WORD}"},
                    headers=h,
                    timeout=30,
                )
                statuses.append(("put turn", r.status_code))
                if n % 3 == 2:  # a delete among the writes
                    r = c.delete(f"{server.url}{PM}/tasks/w{w}-{n - 1}", headers=h, timeout=30)
                    statuses.append(("delete task", r.status_code))
                r = c.post(
                    f"{server.url}{MS}/{store_id}/memories",
                    json={"path": f"/w{w}/{n}.md", "content": f"writer memory {LIVE_WORD}"},
                    headers=h,
                    timeout=30,
                )
                statuses.append(("create memory", r.status_code))
                n += 1

    # Searches from before the damage on, each noted with when it was sent: the window in
    # which they answer 503 lasts as long as the rebuild, whenever a client meets it.
    answers: list[tuple[float, int]] = []
    damaged_at = [float("inf")]

    def searcher() -> None:
        with requests.Session() as c:
            while not stop.is_set():
                sent = time.monotonic()
                r = c.get(f"{server.url}{PM}/search", params={"q": LIVE_WORD}, headers=h)
                if r.status_code == 503:
                    assert int(r.headers["Retry-After"]) > 0
                    assert "rebuilt" in r.json()["detail"]
                answers.append((sent, r.status_code))
                if r.status_code == 200 and any(
                    code == 503 for at, code in answers if at > damaged_at[0]
                ):
                    return

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    threads.append(threading.Thread(target=searcher))
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        damaged_at[0] = time.monotonic()
        _overwrite_structure(root / "acme" / "web" / "_listing.sqlite3")
        _overwrite_structure(root / "acme" / "web" / "_stores" / store_id / "index.sqlite3")
        # Deleted while the index holding its text is damaged.
        r = s.delete(f"{server.url}{PM}/tasks/t0007", headers=h, timeout=30)
        assert r.status_code == 204, r.text
        threads[-1].join(timeout=120)
        after = [code for at, code in answers if at > damaged_at[0]]
        assert set(after) <= {200, 503}, after
        assert 503 in after, after
        assert after[-1] == 200, f"search did not come back: {after[-20:]}"
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    failed = [(what, code) for what, code in statuses if code >= 300]
    assert not failed, failed[:20]
    assert len(statuses) > 30

    def found(query: str) -> set[str]:
        r = s.get(f"{server.url}{PM}/search", params={"q": query, "limit": 100}, headers=h)
        assert r.status_code == 200, r.text
        return {str(hit["task_id"] or hit["path"]) for hit in r.json()["hits"]}

    # What was there before the damage and what was written after it, in both indexes.
    assert found('"task 5 notes"') == {"t0005"}
    assert found(f"{LIVE_WORD} writer turn")
    assert found('"memory 39"') == {"/m39.md"}
    assert found(f"{LIVE_WORD} writer memory")
    r = s.get(f"{server.url}{PM}/search", params={"q": SECRET}, headers=h, timeout=30)
    assert r.status_code == 200 and r.json()["hits"] == []
    server.stop()

    storage = TreeStorage(root, lock_timeout=10.0)
    try:
        repaired = storage.fsck(repair=True)
        assert repaired.unrepairable == [], repaired.unrepairable
        report = storage.fsck()
        assert report.problems == [], report.problems
    finally:
        storage.close()
    assert files_with(root, SECRET) == []
