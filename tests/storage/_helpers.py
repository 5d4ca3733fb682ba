"""Expected state computed from the records alone, and checks that the derived files match it.

Nothing here calls the engine's own derived-file code paths except ``records.rebuild_index``
(the documented rebuild that fsck and repair_task use); the digest and listing expectations
are computed independently from the turn records.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.storage.core.clock import parse_iso_us
from app.storage.core.ledger import LedgerTurn, entry_of
from app.storage.core.models import TurnRecord
from app.storage.core.names import TMP_PREFIX, TURN_SUMMARY, Scope, validate_id
from app.storage.tree.records import index_rows, read_json, read_turn, rebuild_index, turn_dirs
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.tasks import TaskStore
from tests.conftest import nested_summary

MiB = 1 << 20


def open_fds(under: Path, suffix: str) -> set[tuple[str, str]]:
    """This process's descriptors (number, target) of files under ``under`` ending in
    ``suffix``: what its SQLite connections hold open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(under)) and target.endswith(suffix):
            found.add((fd, target))
    return found


def run_released(
    target: Callable[..., None], argses: list[tuple[Any, ...]], timeout: float = 90.0
) -> list[Any]:
    """Spawn one process per ``args`` (each runs ``target(*args, start, results)``), release
    them all at once, and return the payload each put on ``results`` as (worker, status,
    payload); fail on a worker's error or a non-zero exit."""
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, start, results)) for args in argses]
    for p in procs:
        p.start()
    payloads: list[Any] = []
    try:
        start.set()
        for _ in procs:
            worker, status, payload = results.get(timeout=timeout)
            assert status == "ok", f"worker {worker} failed:\n{payload}"
            payloads.append(payload)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
        results.join_thread()
    assert all(p.exitcode == 0 for p in procs)
    return payloads


@dataclass
class Fault:
    """Make ``os.<name>`` raise ``OSError(err)`` on call number ``at`` (and later, if persistent).

    The SQLite test-VFS method: the real call is made on every other call. ``target``: the
    module whose function is replaced (``os``, or app.storage.atomic for its ``syncfs``).
    ``own_thread``: count only the calls of the thread that installed it (the operation's
    own steps, not the upkeep it starts in the background after its answer).
    """

    name: str
    at: int
    err: int
    persistent: bool = False
    only: Callable[[tuple[Any, ...]], bool] | None = None
    calls: int = 0
    fired: int = 0
    real: Callable[..., Any] | None = None
    target: Any = os
    own_thread: bool = False
    thread: int | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> Fault:
        self.real = getattr(self.target, self.name)
        self.thread = threading.get_ident() if self.own_thread else None
        monkeypatch.setattr(self.target, self.name, self)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        assert self.real is not None
        mine = self.thread is None or self.thread == threading.get_ident()
        if mine and (self.only is None or self.only(args)):
            self.calls += 1
            if self.calls == self.at or (self.persistent and self.calls > self.at):
                self.fired += 1
                raise OSError(self.err, os.strerror(self.err))
        return self.real(*args, **kwargs)


class PatternStream:
    """A file-like body of ``size`` bytes made on the fly, so a test never holds it all."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size = size
        self.seed = seed
        self.pos = 0
        self._block = bytes((i * 31 + seed) % 251 for i in range(64 * 1024))

    def read(self, n: int = -1) -> bytes:
        left = self.size - self.pos
        if n < 0 or n > left:
            n = left
        if n <= 0:
            return b""
        start = self.pos % len(self._block)
        reps = (start + n) // len(self._block) + 1
        out = (self._block * reps)[start : start + n]
        self.pos += n
        return out

    def sha256(self) -> str:
        """The digest of the whole body, computed from a fresh copy (streams, never holds it)."""
        digest = hashlib.sha256()
        for chunk in iter_chunks(PatternStream(self.size, self.seed)):
            digest.update(chunk)
        return digest.hexdigest()


def upkeep_done(store: object, timeout: float = 30.0) -> None:
    """Wait for the upkeep a task store's writes and deletes started after their answers (a
    purge, a compaction): what fsck sees once the service is quiet. A store without such
    upkeep (PostgreSQL's does it in the call) has nothing to wait for."""
    later = getattr(store, "later", None)
    deadline = time.monotonic() + timeout
    while later is not None and later.busy():
        assert time.monotonic() < deadline, "background upkeep did not finish"
        time.sleep(0.01)


def embedded_now(storage: Any, timeout: float = 60.0) -> None:
    """Wait until what the writes queued is embedded (a tree storage's drains) and the purges
    and compactions they started ran."""
    embedding = getattr(storage, "embedding", None)
    deadline = time.monotonic() + timeout
    while embedding is not None and not embedding.idle():
        assert time.monotonic() < deadline, "embedding did not finish"
        time.sleep(0.01)
    upkeep_done(storage.tasks)
    upkeep_done(storage.stores.search_upkeep)


def vectors_of(db: Path, where: str) -> list[bytes]:
    """The vector bytes of the index rows ``where`` selects (of search_docs ``d``), as a byte
    search of the files can find them."""
    conn = sqlite3.connect(db)
    try:
        found = conn.execute(
            f"SELECT v.vec FROM search_vectors v JOIN search_docs d ON d.doc = v.doc WHERE {where}"  # noqa: S608 - the tests' own fixed conditions
        ).fetchall()
    finally:
        conn.close()
    assert found, where  # the checks of their absence below can fail
    # A vector of more than about 1,000 bytes spills onto an overflow page: then its first
    # and last 128 bytes are each stored whole (a shorter one is searched for whole: a part
    # of a sparse test vector could be another's too).
    return [
        part
        for (v,) in found
        for part in ((bytes(v),) if len(v) <= 512 else (bytes(v)[:128], bytes(v)[-128:]))
    ]


def temp_files(root: Path) -> list[Path]:
    """Every in-flight temp file left anywhere under ``root``."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            if name.startswith(TMP_PREFIX):
                found.append(Path(dirpath) / name)
    return found


def task_ids_on_disk(store: TaskStore, scope: Scope) -> list[str]:
    project = store.layout.project_dir(scope)
    if not project.exists():
        return []
    ids = []
    for entry in os.scandir(project):
        try:
            validate_id("task_id", entry.name)
        except Exception:  # noqa: S112 - engine files beside the tasks
            continue
        if entry.is_dir(follow_symlinks=False):
            ids.append(entry.name)
    return sorted(ids)


def records_of(store: TaskStore, scope: Scope, task_id: str) -> list[TurnRecord]:
    task_dir = store.layout.task_dir(scope, task_id)
    return [r for _, d in turn_dirs(store.layout.tree, task_dir) if (r := read_turn(d)) is not None]


def live_records(store: TaskStore, scope: Scope, task_id: str, now_us: int) -> list[TurnRecord]:
    return [r for r in records_of(store, scope, task_id) if parse_iso_us(r.retain_until) > now_us]


def expected_digest(store: TaskStore, scope: Scope) -> str:
    """project.md as the specification defines it, computed from the live turn records."""
    now_us = store.now_us()
    sections = []
    for task_id in task_ids_on_disk(store, scope):
        live = live_records(store, scope, task_id, now_us)
        if not live:
            continue
        all_turns = records_of(store, scope, task_id)
        updated = max(r.updated_us for r in all_turns)
        latest = max(live, key=lambda r: r.turn)
        sections.append((updated, task_id, latest))
    sections.sort(key=lambda s: (s[0], s[1]), reverse=True)
    text = f"# Project memory: {scope.tenant}/{scope.project}\n"
    if not sections:
        return text + "\nNo tasks yet.\n"
    for _, task_id, rec in sections:
        summary = nested_summary(rec.summary_md)
        if summary and not summary.endswith("\n"):
            summary += "\n"
        text += f"\n## {task_id}\n\nLatest turn: {rec.turn}, updated {rec.updated_at}\n\n{summary}"
    return text


def read_digest(store: TaskStore, scope: Scope) -> str:
    fh, size = store.open_digest(scope)
    with fh:
        data = fh.read()
    assert len(data) == size
    return data.decode("utf-8")


def listing_rows(store: TaskStore, scope: Scope) -> tuple[dict[str, list[TurnRow]], int]:
    listing = store.listing(scope)
    if not listing.exists():
        return {}, 0
    return listing.all_tasks()


def assert_consistent(store: TaskStore, scope: Scope) -> None:
    """index.json, summary.md, the listing rows, the ledger and project.md equal a rebuild from
    the records, once the upkeep the last write or delete started (a purge, a compaction) has
    run."""
    upkeep_done(store)
    expected_rows: dict[str, list[TurnRow]] = {}
    expected_entries: dict[str, list[LedgerTurn]] = {}
    for task_id in task_ids_on_disk(store, scope):
        task_dir = store.layout.task_dir(scope, task_id)
        rebuilt = rebuild_index(store.layout.tree, task_dir, task_id)
        on_disk = read_json(task_dir / "index.json")
        assert on_disk == rebuilt, f"index.json of {task_id} differs from a rebuild"
        if rebuilt is None:
            continue
        expected_rows[task_id] = index_rows(rebuilt)
        records = sorted(records_of(store, scope, task_id), key=lambda r: r.turn)
        expected_entries[task_id] = [entry_of(r) for r in records]
        for rec in records:
            summary = (task_dir / f"{rec.turn:04d}-turn" / TURN_SUMMARY).read_bytes()
            assert summary == rec.summary_md.encode(), f"summary.md of {task_id}/{rec.turn}"
    rows, counter = listing_rows(store, scope)
    assert {k: sorted(v, key=lambda r: r.turn) for k, v in rows.items()} == expected_rows
    assert counter == len(expected_rows)
    assert read_digest(store, scope) == expected_digest(store, scope)
    assert temp_files(store.layout.root) == []
    if store.layout.ledger(scope).exists():
        ledger = store.ledger(scope)
        have = {task_id: ledger.task_entries(task_id) for task_id in ledger.task_ids()}
        assert have == {k: v for k, v in expected_entries.items() if v}, "ledger entries"
        assert ledger.rollup_faults() == []


def snapshot(root: Path) -> dict[str, Any]:
    """Path -> bytes (files) or None (directories) under root, without following links."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            full = os.path.join(dirpath, name)
            link = ("link", os.readlink(full)) if os.path.islink(full) else None
            out[os.path.relpath(full, root)] = link
        for name in filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out[rel] = ("link", os.readlink(full))
            else:
                with open(full, "rb") as fh:
                    out[rel] = fh.read()
    return out


def iter_chunks(fh: Any, size: int = MiB) -> Iterator[bytes]:
    while chunk := fh.read(size):
        yield chunk


def record_files(root: Path) -> dict[str, bytes]:
    """Every record file below ``root``'s tenant acme: task.json, meta.json and artifacts."""
    found = {}
    for directory, dirs, files in os.walk(root / "acme"):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        for name in files:
            if name in ("task.json", "meta.json") or Path(directory).name == "artifacts":
                path = Path(directory) / name
                found[str(path.relative_to(root))] = path.read_bytes()
    return found
