"""Injected I/O faults through the HTTP API: the Nth write/fsync/rename/link/mkdir fails.

The SQLite test-VFS method, one level above tests/storage/tree/test_crash.py (which drives the
engine directly): for every write endpoint and every N, ``os.<call>`` raises ENOSPC or EIO
on its Nth call (once, or from then on); under group commit (app/storage/tree/fs/sync.py) the
shared flush (``syncfs``) may fail instead of a file's fsync. Then:

* the response is the documented one: 507 ``{"detail": "insufficient storage: ..."}`` for a
  full disk, 500 ``{"detail": "<message>"}`` otherwise, never a traceback, never a path;
* an injected fault is never answered with success (a failed fsync is a failed write);
* what readers see is the previous state or, when the fault hit after the commit point (a
  directory fsync after the rename), the new one: never a mix;
* no temp file is left;
* once the fault clears, the same request succeeds and the tree is consistent.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.models import FsckReport
from app.storage.tree.fs import sync
from app.storage.tree.fsck import fsck
from app.storage.tree.stores.fsck import fsck_stores
from app.storage.tree.tasks import TaskStore
from tests.conftest import Tokens
from tests.robust.helpers import BASE, Fault, temp_files
from tests.storage._helpers import upkeep_done

CALLS = ("write", "fsync", "replace", "rename", "link", "mkdir")
FULL_DISK = {"detail": "insufficient storage: the server's disk is full"}

# name -> (method, url, body, content type, expected success status)
OPS: dict[str, tuple[str, str, bytes, str, int]] = {
    "put_turn_new_task": (
        "PUT",
        "/tasks/t3/turns/0",
        b'{"summary_md": "t3"}',
        "application/json",
        200,
    ),
    "put_turn_update": (
        "PUT",
        "/tasks/t1/turns/0",
        b'{"meta": {"v": "new"}, "summary_md": "new"}',
        "application/json",
        200,
    ),
    "put_turn_new_turn": (
        "PUT",
        "/tasks/t1/turns/1",
        b'{"summary_md": "one"}',
        "application/json",
        200,
    ),
    "put_artifact_new": ("PUT", "/tasks/t1/turns/0/artifacts/b.bin", b"b" * 3000, "x/b", 200),
    "put_artifact_replace": (
        "PUT",
        "/tasks/t1/turns/0/artifacts/a.bin",
        b"new bytes",
        "x/new",
        200,
    ),
    "delete_task": ("DELETE", "/tasks/t2", b"", "", 204),
}


def _seed(client: FlaskClient, headers: dict[str, str]) -> None:
    client.put(
        f"{BASE}/tasks/t1/turns/0",
        json={"meta": {"v": "old"}, "summary_md": "old"},
        headers=headers,
    )
    client.put(
        f"{BASE}/tasks/t1/turns/0/artifacts/a.bin",
        data=b"old bytes",
        headers={**headers, "Content-Type": "x/old"},
    )
    client.put(f"{BASE}/tasks/t2/turns/0", json={"summary_md": "t2"}, headers=headers)


def visible(client: FlaskClient, headers: dict[str, str]) -> dict[str, Any]:
    """Everything a reader can get, with each artifact's bytes."""
    state: dict[str, Any] = {}
    listing = client.get(f"{BASE}/tasks", headers=headers)
    assert listing.status_code == 200, listing.data
    state["tasks"] = sorted((t["task_id"], t["turn_count"]) for t in listing.get_json()["tasks"])
    for task_id, _ in state["tasks"]:
        index = client.get(f"{BASE}/tasks/{task_id}", headers=headers)
        assert index.status_code == 200, index.data
        for entry in index.get_json()["turns"]:
            turn = client.get(f"{BASE}/tasks/{task_id}/turns/{entry['turn']}", headers=headers)
            assert turn.status_code == 200, turn.data
            body = turn.get_json()
            state[f"{task_id}/{entry['turn']}"] = (body["meta"], body["summary_md"])
            for art in body["artifacts"]:
                got = client.get(
                    f"{BASE}/tasks/{task_id}/turns/{entry['turn']}/artifacts/{art['name']}",
                    headers=headers,
                )
                assert got.status_code == 200
                # The bytes served must be the bytes the record describes (ETag = sha256).
                if got.headers["ETag"] != f'"{hashlib.sha256(got.data).hexdigest()}"':
                    state[f"{task_id}/{entry['turn']}/{art['name']}"] = (
                        "NOT THE RECORD'S BYTES",
                        got.data,
                    )
                    continue
                state[f"{task_id}/{entry['turn']}/{art['name']}"] = (got.data, art["content_type"])
    digest = client.get(f"{BASE}/project.md", headers=headers)
    assert digest.status_code == 200
    # A retried write is a new version: compare the digest without its timestamps.
    # Sections sorted: with the test's frozen clock a retry may reorder equal-time tasks.
    text = re.sub(rb"updated \S+", b"updated <t>", digest.data)
    state["project.md"] = sorted(text.split(b"\n## "))
    return state


class Bench:
    """One app; each case gets a fresh copy of a seeded tree and its own TaskStore (group
    commit on, as the service runs, unless :meth:`per_file_fsync` says otherwise)."""

    def __init__(self, app: Flask, client: FlaskClient, tokens: Tokens, tmp_path: Path) -> None:
        self.app, self.client, self.tmp_path = app, client, tmp_path
        self.group = True
        self.headers = tokens.headers("project_admin")
        self.template = tmp_path / "template"
        self.cases = 0
        self._use(self.template)
        _seed(client, self.headers)
        self.before = visible(client, self.headers)
        self.after: dict[str, dict[str, Any]] = {}

    def _use(self, root: Path) -> None:
        old: TaskStore = self.app.extensions["storage"].tasks
        self.app.extensions["storage"].tasks = TaskStore(
            root,
            clock=old.clock,
            lock_timeout=5.0,
            max_artifact_bytes=old.max_artifact_bytes,
            group_commit=self.group,
        )
        engine = self.app.extensions["storage"].stores
        if engine is not None:
            self.app.extensions["storage"].stores = type(engine)(
                root, lock_timeout=5.0, clock=engine.clock, group_commit=self.group
            )

    def per_file_fsync(self) -> None:
        """Every durable write fsyncs for itself (no group commit), from the next case on."""
        self.group = False

    def grouped(self) -> bool:
        """Whether this bench's writes go through group commit (its filesystem allows it)."""
        return self.group and sync._flusher_for(self.template) is not None

    def fresh(self) -> Path:
        self.cases += 1
        root = self.tmp_path / f"case-{self.cases}"
        shutil.copytree(self.template, root, symlinks=True)
        self._use(root)
        return root

    def send(self, op: str) -> Any:
        method, url, body, ctype, _ = OPS[op]
        headers = {**self.headers, **({"Content-Type": ctype} if ctype else {})}
        return self.client.open(f"{BASE}{url}", method=method, data=body, headers=headers)

    def expected_after(self, op: str) -> dict[str, Any]:
        if op not in self.after:
            self.fresh()
            assert self.send(op).status_code == OPS[op][4]
            self.after[op] = visible(self.client, self.headers)
        return self.after[op]


@pytest.fixture
def bench(app: Flask, client: FlaskClient, tokens: Tokens, tmp_path: Path) -> Bench:
    return Bench(app, client, tokens, tmp_path)


def run_case(
    bench: Bench,
    monkeypatch: pytest.MonkeyPatch,
    op: str,
    call: str,
    n: int,
    err: int,
    persistent: bool,
) -> bool:
    """One fault at call ``n``; False once ``n`` is past the operation's last such call."""
    after = bench.expected_after(op)
    root = bench.fresh()
    # Only the request's own calls: the upkeep it starts after its answer (a delete's purge)
    # runs in a thread of its own, and is not the operation.
    if call == "syncfs":
        fault = Fault("_syncfs_error", n, err, persistent=persistent, target=sync, own_thread=True)
    else:
        fault = Fault(call, n, err, persistent=persistent, own_thread=True)
    fault.install(monkeypatch)
    try:
        resp = bench.send(op)
    finally:
        monkeypatch.setattr(fault.target, fault.name, fault.real)
    where = f"{op}: {call} #{n} {errno.errorcode[err]}{' persistent' if persistent else ''}"
    if not fault.fired:
        assert resp.status_code == OPS[op][4], (where, resp.status_code, resp.data)
        return False
    if resp.status_code == OPS[op][4]:
        # Only a failed mkdir of a directory that turned out to exist may be absorbed; then
        # the write really happened, completely.
        assert call == "mkdir", f"{where}: an injected failure was answered with success"
        assert visible(bench.client, bench.headers) == after, where
        return True
    body = resp.get_json()
    if err == errno.ENOSPC:
        assert (resp.status_code, body) == (507, FULL_DISK), (where, resp.status_code, body)
    else:
        assert resp.status_code == 500, (where, resp.status_code, body)
        assert set(body) == {"detail"} and isinstance(body["detail"], str), body
        text = resp.get_data(as_text=True)
        assert "Traceback" not in text and str(root) not in text, (where, text)
    assert resp.content_type == "application/json"
    now = visible(bench.client, bench.headers)
    if not persistent:
        # The failed request repaired what it had started: nothing left, nothing mixed.
        assert temp_files(root) == [], (where, temp_files(root))
        assert now in (bench.before, after), (
            f"{where}: neither the old nor the new state: "
            f"{[(k, now.get(k)) for k in {*now, *after} if now.get(k) not in (bench.before.get(k), after.get(k))]}"
        )
    else:
        # While the disk keeps failing, the repair cannot run either: derived views (the
        # listing, project.md) may lag until the next writer, but every record is old or new
        # and only the kept previous copy of an artifact may wait for that writer.
        assert all(p.name.startswith(".~tmp-prev-") for p in temp_files(root)), temp_files(root)
        mixed = [
            (k, now.get(k))
            for k in {*now, *after} - {"tasks", "project.md"}
            if now.get(k) not in (bench.before.get(k), after.get(k))
        ]
        assert mixed == [], f"{where}: {mixed}"
    # The fault cleared: the same request succeeds and leaves a consistent tree.
    again = bench.send(op)
    if op == "delete_task" and now == after:
        assert again.status_code == 404  # it is already gone
    else:
        assert again.status_code == OPS[op][4], (where, again.status_code, again.data)
    assert visible(bench.client, bench.headers) == after, where
    tasks = bench.app.extensions["storage"].tasks
    upkeep_done(tasks)
    report = fsck(tasks)
    assert report.clean, (where, report.problems)
    return True


def sweep_n(
    bench: Bench,
    monkeypatch: pytest.MonkeyPatch,
    op: str,
    call: str,
    errs: tuple[int, ...],
    persistent: bool,
) -> int:
    for n in range(1, 80):
        err = errs[n % len(errs)]
        if not run_case(bench, monkeypatch, op, call, n, err, persistent):
            return n - 1
    pytest.fail(f"{op} made more than 80 calls of os.{call}")


def _use_mode(bench: Bench, call: str) -> None:
    """A file's fsync fails only where files fsync for themselves; the shared flush only
    under group commit."""
    if call == "syncfs":
        if not bench.grouped():
            pytest.skip("the test's filesystem has no group commit")
    elif call == "fsync":
        bench.per_file_fsync()


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("call", ["write", "fsync", "syncfs", "replace", "mkdir"])
def test_single_fault_at_every_step(
    bench: Bench, monkeypatch: pytest.MonkeyPatch, op: str, call: str
) -> None:
    _use_mode(bench, call)
    fired = sweep_n(bench, monkeypatch, op, call, (errno.ENOSPC, errno.EIO), persistent=False)
    if call in ("fsync", "syncfs", "replace", "mkdir") and op != "delete_task":
        assert fired > 0, f"{op} never called {call}: the test would prove nothing"


PERSISTENT = [
    (op, call)
    for op in ("put_turn_update", "put_artifact_replace")
    for call in ("write", "fsync", "syncfs", "replace")
]


@pytest.mark.parametrize(("op", "call"), PERSISTENT)
def test_persistent_fault_then_recovery(
    bench: Bench, monkeypatch: pytest.MonkeyPatch, op: str, call: str
) -> None:
    _use_mode(bench, call)
    sweep_n(bench, monkeypatch, op, call, (errno.EIO, errno.ENOSPC), persistent=True)


@pytest.mark.soak
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("call", [*CALLS, "syncfs"])
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
@pytest.mark.parametrize("persistent", [False, True], ids=["once", "persistent"])
def test_every_fault_both_errors_soak(
    bench: Bench, monkeypatch: pytest.MonkeyPatch, op: str, call: str, err: int, persistent: bool
) -> None:
    _use_mode(bench, call)
    sweep_n(bench, monkeypatch, op, call, (err,), persistent)


def _is_file_fd(args: tuple[Any, ...]) -> bool:
    import stat

    return not stat.S_ISDIR(os.fstat(args[0]).st_mode)


@pytest.mark.parametrize("op", ["put_turn_update", "put_artifact_replace", "put_artifact_new"])
def test_failed_fsync_that_would_succeed_on_retry_is_never_success(
    bench: Bench, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    """fsyncgate: the first fsync of a file fails, every later one would succeed."""
    bench.per_file_fsync()
    root = bench.fresh()
    fault = Fault("fsync", 1, errno.EIO, only=_is_file_fd).install(monkeypatch)
    resp = bench.send(op)
    monkeypatch.undo()
    assert fault.fired == 1
    assert resp.status_code == 500, resp.data
    assert visible(bench.client, bench.headers) == bench.before
    assert temp_files(root) == []


@pytest.mark.parametrize("op", ["put_turn_update", "put_artifact_replace", "put_artifact_new"])
def test_a_failed_shared_flush_that_would_succeed_on_retry_is_never_success(
    bench: Bench, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    """fsyncgate under group commit: the flush after the write fails, the next would succeed.
    The write was renamed into place before the flush, so readers may see it (its outcome is
    unknown to the client, as for any error past the commit point); never a mix."""
    if not bench.grouped():
        pytest.skip("the test's filesystem has no group commit")
    after = bench.expected_after(op)
    root = bench.fresh()
    fault = Fault("_syncfs_error", 1, errno.EIO, target=sync).install(monkeypatch)
    resp = bench.send(op)
    monkeypatch.undo()
    assert fault.fired == 1
    assert resp.status_code == 500, resp.data
    assert visible(bench.client, bench.headers) in (bench.before, after)
    assert temp_files(root) == []
    assert fsck(bench.app.extensions["storage"].tasks).clean


def test_full_disk_on_the_lock_tree_is_507(
    bench: Bench, monkeypatch: pytest.MonkeyPatch, tokens: Tokens
) -> None:
    """A new project's first mkdir is in the lock tree: a full disk there is still a full disk."""
    root = bench.fresh()
    headers = tokens.headers("tenant_admin", **{"X-Sandbox-Project-Id": "fresh"})
    fault = Fault("mkdir", 1, errno.ENOSPC, persistent=True).install(monkeypatch)
    resp = bench.client.put(f"{BASE}/tasks/t/turns/0", json={}, headers=headers)
    monkeypatch.undo()
    assert fault.fired
    assert (resp.status_code, resp.get_json()) == (507, FULL_DISK)
    assert temp_files(root) == []
    assert bench.client.put(f"{BASE}/tasks/t/turns/0", json={}, headers=headers).status_code == 200


def test_responses_are_json_in_the_documented_shape(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench.fresh()
    Fault("write", 1, errno.EIO, persistent=True).install(monkeypatch)
    resp = bench.send("put_artifact_new")
    monkeypatch.undo()
    assert resp.status_code == 500
    assert json.loads(resp.data) == {"detail": resp.get_json()["detail"]}
    assert resp.headers.get("x-correlation-id")


# -- the memory-stores API ------------------------------------------------------------------
STORE_OPS = ("create_store", "create_memory", "update_memory", "delete_memory")


class StoreBench:
    """A memory store with one memory, copied fresh for each case (like Bench)."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.client = bench.client
        self.h = bench.headers
        root = bench.fresh()
        created = self.client.post("/v1/memory_stores", json={"name": "s"}, headers=self.h)
        if created.status_code != 200:
            pytest.skip("the memory-stores API is not there")
        self.sid = created.get_json()["id"]
        mem = self.client.post(
            f"/v1/memory_stores/{self.sid}/memories",
            json={"path": "/a.md", "content": "old"},
            headers=self.h,
        )
        self.mid = mem.get_json()["id"]
        shutil.rmtree(bench.template)
        shutil.copytree(root, bench.template, symlinks=True)

    def fresh(self) -> Path:
        return self.bench.fresh()

    def send(self, op: str) -> Any:
        base = f"/v1/memory_stores/{self.sid}"
        if op == "create_store":
            return self.client.post("/v1/memory_stores", json={"name": "t"}, headers=self.h)
        if op == "create_memory":
            return self.client.post(
                f"{base}/memories", json={"path": "/b.md", "content": "b"}, headers=self.h
            )
        if op == "update_memory":
            return self.client.post(
                f"{base}/memories/{self.mid}", json={"content": "new"}, headers=self.h
            )
        return self.client.delete(f"{base}/memories/{self.mid}", headers=self.h)

    def state(self) -> Any:
        base = f"/v1/memory_stores/{self.sid}"
        memories = self.client.get(f"{base}/memories?view=full&limit=20", headers=self.h)
        versions = self.client.get(f"{base}/memory_versions?limit=100", headers=self.h)
        stores = self.client.get("/v1/memory_stores?limit=100", headers=self.h)
        assert memories.status_code == versions.status_code == stores.status_code == 200
        return (
            sorted((m["path"], m.get("content")) for m in memories.get_json()["data"]),
            sorted((v["operation"], v["path"]) for v in versions.get_json()["data"]),
            sorted(s["name"] for s in stores.get_json()["data"]),
        )


@pytest.fixture
def store_bench(bench: Bench) -> StoreBench:
    return StoreBench(bench)


def run_store_case(
    sb: StoreBench, monkeypatch: pytest.MonkeyPatch, op: str, call: str, n: int, err: int
) -> bool:
    if op not in sb.bench.after:
        sb.fresh()
        assert sb.send(op).status_code == 200
        sb.bench.after[op] = sb.state()
    after = sb.bench.after[op]
    root = sb.fresh()
    before = sb.state()
    fault = Fault("_syncfs_error", n, err, target=sync) if call == "syncfs" else Fault(call, n, err)
    fault.install(monkeypatch)
    try:
        resp = sb.send(op)
    finally:
        monkeypatch.setattr(fault.target, fault.name, fault.real)
    where = f"{op}: {call} #{n} {errno.errorcode[err]}"
    if not fault.fired:
        assert resp.status_code == 200, (where, resp.status_code, resp.data)
        return False
    if resp.status_code == 200:
        assert call == "mkdir", f"{where}: an injected failure was answered with success"
        assert sb.state() == after, where
        return True
    body = resp.get_json()
    assert resp.status_code == (507 if err == errno.ENOSPC else 500), (
        where,
        resp.status_code,
        body,
    )
    assert body["type"] == "error" and set(body["error"]) >= {"type", "message"}, body
    text = resp.get_data(as_text=True)
    assert "Traceback" not in text and str(root) not in text, (where, text)
    assert temp_files(root) == [], (where, temp_files(root))
    now = sb.state()
    assert now in (before, after), (where, now, before, after)
    if now == after:
        # The failure came after the commit: the operation happened. A retry is a new
        # request (a second store, a conflicting path, a memory already gone).
        assert sb.send(op).status_code in (200, 404, 409)
    else:
        again = sb.send(op)
        assert again.status_code == 200, (where, again.status_code, again.data)
        assert sb.state() == after, where
    report = FsckReport()
    fsck_stores(sb.bench.app.extensions["storage"].stores, report)
    assert report.clean, (where, report.problems)
    return True


@pytest.mark.parametrize("op", STORE_OPS)
@pytest.mark.parametrize(
    "call",
    [
        "write",
        "fsync",
        "syncfs",
        "link",
        pytest.param("replace", marks=pytest.mark.soak),
        pytest.param("mkdir", marks=pytest.mark.soak),
    ],
)
def test_memory_stores_single_fault_at_every_step(
    store_bench: StoreBench, monkeypatch: pytest.MonkeyPatch, op: str, call: str
) -> None:
    _use_mode(store_bench.bench, call)
    for n in range(1, 80):
        err = (errno.ENOSPC, errno.EIO)[n % 2]
        if not run_store_case(store_bench, monkeypatch, op, call, n, err):
            return
    pytest.fail(f"{op} made more than 80 calls of os.{call}")
