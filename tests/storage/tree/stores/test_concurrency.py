"""Memory stores under real concurrency: separate processes, real files, real locks."""

from __future__ import annotations

import json
import multiprocessing
import queue
import random
import time
from pathlib import Path
from typing import Any

from app.storage.core.models import FsckReport
from app.storage.core.names import VERSIONS_DIR, Scope
from app.storage.core.store_models import ContentPreconditionFailed, VersionFilter
from app.storage.tree.stores.engine import MemoryStoreEngine
from app.storage.tree.stores.fsck import fsck_stores

SCOPE = Scope("acme", "web")
WORKERS = 4
ROUNDS = 8


def _contend(
    root: str, store_id: str, memory_id: str, worker: int, barrier: Any, results: Any
) -> None:
    """Each round: read the head, wait for everyone, then update on that head's hash."""
    engine = MemoryStoreEngine(Path(root), lock_timeout=60.0)
    actor = {"type": "api_actor", "api_key_id": f"tok_w{worker}"}
    try:
        for round_no in range(ROUNDS):
            barrier.wait(60)
            head = engine.get_memory(SCOPE, store_id, memory_id, full=False).content_sha256
            barrier.wait(60)
            try:
                engine.update_memory(
                    SCOPE,
                    store_id,
                    memory_id,
                    content=f"round {round_no} by worker {worker}",
                    precondition_sha256=head,
                    actor=actor,
                )
                results.put((round_no, worker, "won"))
            except ContentPreconditionFailed:
                results.put((round_no, worker, "409"))
    except Exception as exc:  # report, don't hang the barrier silently
        results.put((-1, worker, repr(exc)))
        barrier.abort()


def test_one_winner_per_round_and_a_linear_version_chain(tmp_path: Path) -> None:
    root = tmp_path / "root"
    engine = MemoryStoreEngine(root, lock_timeout=60.0)
    store = engine.create_store(SCOPE, name="contended")
    mem = engine.create_memory(SCOPE, store.id, path="/shared.md", content="seed", actor=None)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [
        ctx.Process(target=_contend, args=(str(root), store.id, mem.id, w, barrier, results))
        for w in range(WORKERS)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in range(WORKERS * ROUNDS)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert not [o for o in outcomes if o[0] == -1], outcomes
    winners: dict[int, int] = {}
    for round_no, worker, outcome in outcomes:
        if outcome == "won":
            assert round_no not in winners, f"two winners in round {round_no}"
            winners[round_no] = worker
        else:
            assert outcome == "409"
    assert sorted(winners) == list(range(ROUNDS))  # exactly one winner in every round

    history = engine.list_versions(
        SCOPE, store.id, filters=VersionFilter(memory_id=mem.id), limit=20, full=True
    ).data
    expected = [f"round {r} by worker {winners[r]}" for r in reversed(range(ROUNDS))] + ["seed"]
    assert [v.content for v in history] == expected
    assert [v.operation for v in history] == ["modified"] * ROUNDS + ["created"]
    # No gaps or forks: each version names its predecessor, oldest to newest.
    directory = engine.layout.store_dir(SCOPE, store.id)
    chain = [json.loads((directory / VERSIONS_DIR / f"{v.id}.json").read_text()) for v in history]
    for newer, older in zip(chain, chain[1:], strict=False):
        assert newer["previous_version_id"] == older["id"]
    assert chain[-1]["previous_version_id"] is None
    head = engine.get_memory(SCOPE, store.id, mem.id, full=True)
    assert head.memory_version_id == history[0].id and head.content == expected[0]
    report = FsckReport()
    fsck_stores(engine, report)
    assert report.clean, report.problems


def _churn(root: str, store_id: str, seed: int, stop: Any, done: Any) -> None:
    """Create, rename (often past the reader's cursor), edit and delete memories until told."""
    rng = random.Random(seed)
    engine = MemoryStoreEngine(Path(root), lock_timeout=60.0)
    ops = 0
    try:
        while not stop.is_set() and ops < 400:
            live = [m for m in engine.list_memories(SCOPE, store_id, limit=100).data]
            choice = rng.random()
            try:
                if choice < 0.35 or not live:
                    engine.create_memory(
                        SCOPE,
                        store_id,
                        path=f"/{rng.choice('abcxyz')}/{rng.randrange(10_000):04d}",
                        content="c",
                        actor=None,
                    )
                elif choice < 0.7:
                    target = rng.choice(live)
                    engine.update_memory(
                        SCOPE,
                        store_id,
                        target.id,
                        path=f"/{rng.choice('abcxyz')}/{rng.randrange(10_000):04d}",
                        actor=None,
                    )
                elif choice < 0.85:
                    engine.update_memory(
                        SCOPE, store_id, rng.choice(live).id, content=str(ops), actor=None
                    )
                else:
                    engine.delete_memory(SCOPE, store_id, rng.choice(live).id, actor=None)
            except Exception as exc:  # a taken path or a memory another churner deleted
                if type(exc).__name__ not in ("PathConflict", "NotFound"):
                    raise
            ops += 1
        done.put(("ok", ops))
    except Exception as exc:
        done.put(("error", repr(exc)))


def test_paging_while_others_write_never_returns_a_memory_twice(tmp_path: Path) -> None:
    root = tmp_path / "root"
    engine = MemoryStoreEngine(root, lock_timeout=60.0)
    store = engine.create_store(SCOPE, name="busy")
    for i in range(60):
        engine.create_memory(
            SCOPE, store.id, path=f"/{'abcxyz'[i % 6]}/{i:04d}", content="x", actor=None
        )
    ctx = multiprocessing.get_context("spawn")
    stop, done = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_churn, args=(str(root), store.id, seed, stop, done))
        for seed in range(2)
    ]
    for p in procs:
        p.start()
    traversals = 0
    deadline = time.monotonic() + 8
    try:
        while time.monotonic() < deadline:
            for depth, limit in ((0, 3), (1, 1), (0, 7)):
                seen_ids: list[str] = []
                seen_keys: list[str] = []
                page = None
                while True:
                    result = engine.list_memories(
                        SCOPE, store.id, depth=depth, limit=limit, page=page, path_prefix="/"
                    )
                    for item in result.data:
                        seen_keys.append(item.path)
                        if item.type == "memory":
                            seen_ids.append(item.id)
                    page = result.next_page
                    if page is None:
                        break
                assert len(seen_ids) == len(set(seen_ids)), "a memory came back twice"
                assert seen_keys == sorted(seen_keys) and len(set(seen_keys)) == len(seen_keys)
                traversals += 1
    finally:
        stop.set()
        reports = []
        for _ in procs:
            try:
                reports.append(done.get(timeout=60))
            except queue.Empty:
                reports.append(("error", "no report"))
        for p in procs:
            p.join(60)
    assert all(r[0] == "ok" for r in reports), reports
    assert sum(r[1] for r in reports) > 20, reports  # the writers really wrote meanwhile
    assert traversals >= 3
    report = FsckReport()
    fsck_stores(engine, report)
    assert report.clean, report.problems
