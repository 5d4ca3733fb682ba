"""Process entry points for the concurrency tests (imported by spawned children: keep it light)."""

from __future__ import annotations

import io
import traceback
from pathlib import Path
from typing import Any

from app.storage.core.names import Scope
from app.storage.tree.tasks import TaskStore

SHARED_ARTIFACT_TURN = 9999


def write_turns(
    root: str,
    worker: int,
    rounds: int,
    start: Any,
    results: Any,
) -> None:
    """Write turns to one shared task and to many tasks; report every acknowledged write."""
    acked: list[tuple[str, int, str]] = []
    try:
        store = TaskStore(Path(root), lock_timeout=60.0)
        scope = Scope("acme", "web")
        start.wait(30)
        for i in range(rounds):
            # One task, every worker: distinct turns, plus a turn they all overwrite.
            turn = 1 + worker * 1000 + i
            text = f"shared w{worker} i{i}"
            store.put_turn(scope, "shared", turn, meta={"w": worker, "i": i}, summary_md=text)
            acked.append(("shared", turn, text))
            text0 = f"contended w{worker} i{i}"
            store.put_turn(scope, "shared", 0, meta={"w": worker}, summary_md=text0)
            acked.append(("shared", 0, text0))
            # Many tasks: some private to this worker, some every worker writes.
            own = f"w{worker}-task{i % 4}"
            text = f"{own} i{i}"
            store.put_turn(scope, own, i, meta={}, summary_md=text)
            acked.append((own, i, text))
            common = f"common-{i % 3}"
            turn = worker * 1000 + i
            text = f"{common} w{worker} i{i}"
            store.put_turn(scope, common, turn, meta={}, summary_md=text)
            acked.append((common, turn, text))
            # Read-modify-write of ONE record by every worker: artifacts of the same turn.
            name = f"w{worker}-{i}.bin"
            body = f"artifact {name}"
            store.put_artifact(
                scope,
                "shared",
                SHARED_ARTIFACT_TURN,
                name,
                io.BytesIO(body.encode()),
                content_type="x/y",
            )
            acked.append(("shared", SHARED_ARTIFACT_TURN, f"artifact:{name}:{body}"))
            # Readers take no lock and never see a torn file.
            if i % 3 == 0:
                store.get_task(scope, "shared")
                store.list_tasks(scope, limit=5)
                fh, _ = store.open_digest(scope)
                fh.close()
        results.put((worker, "ok", acked))
    except BaseException:
        results.put((worker, "error", traceback.format_exc()))


def hold_lock(path: str, ready: Any, release: Any) -> None:
    """Hold an flock on ``path`` until ``release`` is set (another process, as in production)."""
    import filelock

    lock = filelock.FileLock(path, timeout=10)
    with lock:
        ready.set()
        release.wait(30)


def write_until_killed(root: str, seed: int, conn: Any) -> None:
    """Write turns and replace artifacts forever; send an ack after each call returns."""
    import hashlib
    import random

    rng = random.Random(seed)
    store = TaskStore(Path(root), lock_timeout=30.0)
    scope = Scope("acme", "web")
    i = seed * 1_000_000
    while True:
        i += 1
        task_id = f"k{rng.randrange(3)}"
        turn = rng.randrange(4)
        text = f"{i}"
        store.put_turn(scope, task_id, turn, meta={"i": i}, summary_md=text)
        conn.send(("turn", task_id, turn, i))
        body = (f"{i} " * rng.randrange(1, 200_000)).encode()
        info = store.put_artifact(
            scope, task_id, turn, f"a{rng.randrange(2)}.bin", io.BytesIO(body), content_type="x/y"
        )
        assert info.sha256 == hashlib.sha256(body).hexdigest()
        conn.send(("artifact", task_id, turn, info.name, info.sha256))


def write_after_rebuild(root: str, worker: int, start: Any, results: Any) -> None:
    """Open a listing of another schema version at the same moment as the others, then write."""
    try:
        store = TaskStore(Path(root), lock_timeout=60.0)
        scope = Scope("acme", "web")
        start.wait(30)
        store.put_turn(scope, f"new-{worker}", 0, meta={}, summary_md=f"w{worker}")
        page = store.list_tasks(scope, limit=100)
        results.put((worker, "ok", {t.task_id: t.turn_count for t in page.tasks}))
    except BaseException:
        results.put((worker, "error", traceback.format_exc()))


def take_lock_and_log(path: str, log: str, mark: str) -> None:
    """Take locks.locked(path), append ``mark`` to ``log`` while holding it for 50 ms."""
    import time

    from app.storage.tree.fs import locks

    with locks.locked(Path(path), 30.0):
        with open(log, "a") as fh:
            fh.write(mark)
        time.sleep(0.05)
