"""Usage counters on the tree: equal to a recount of the files after any mix of writes,
replacements, deletes and sweeps, after a SIGKILL mid-write and start-up recovery, and after
fsck --repair of counters someone changed by hand.

The recount reads the records and files directly (json, os.stat), not through the engine.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import random
import signal
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from app.storage.core.errors import NotFound
from app.storage.core.names import TURN_DIR_RE, Scope
from app.storage.core.recovery import Plan
from app.storage.core.store_models import MemoryStore
from app.storage.core.usage import KINDS
from app.storage.tree.backend import TreeStorage
from tests.conftest import FixedClock

WEB = Scope("acme", "web")
MOBILE = Scope("acme", "mobile")


def _compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def recount(root: Path, scope: Scope) -> dict[str, int]:
    """What the files of a project say it stores."""
    project = root / scope.tenant / scope.project
    out = dict.fromkeys(KINDS, 0)
    if not project.is_dir():
        return {**out, "bytes": 0}
    for task in project.iterdir():
        if task.name.startswith(("_", ".")) or not task.is_dir():
            continue
        metas = [
            d / "meta.json"
            for d in task.iterdir()
            if TURN_DIR_RE.fullmatch(d.name) and (d / "meta.json").exists()
        ]
        out["tasks"] += bool(metas)
        for meta in metas:
            record = json.loads(meta.read_text())
            out["turns"] += 1
            out["artifacts"] += len(record["artifacts"])
            out["artifact_bytes"] += sum(
                os.stat(meta.parent / "artifacts" / a["name"]).st_size for a in record["artifacts"]
            )
            out["turn_bytes"] += len(_compact(record["meta"])) + len(
                record["summary_md"].encode("utf-8")
            )
    stores = project / "_stores"
    for store in stores.iterdir() if stores.is_dir() else ():
        if store.name.startswith("."):
            continue
        out["stores"] += 1
        for version in (store / "versions").iterdir():
            record = json.loads(version.read_text())
            out["versions"] += 1
            out["version_bytes"] += record["content_size_bytes"] or 0
        for dirpath, _, files in os.walk(store / "memories"):
            for name in files:
                out["memories"] += 1
                out["memory_bytes"] += os.stat(Path(dirpath) / name).st_size
    out["bytes"] = out["turn_bytes"] + out["artifact_bytes"] + out["version_bytes"]
    return out


def assert_counts(storage: TreeStorage, *scopes: Scope) -> None:
    for scope in scopes:
        assert storage.usage(scope).to_json() == recount(storage.layout.root, scope), scope


def make(tmp_path: Path, clock: FixedClock, **kw: Any) -> TreeStorage:
    return TreeStorage(
        tmp_path / "root",
        tokens_file=tmp_path / "tokens.json",
        clock=clock,
        lock_timeout=10.0,
        retention=timedelta(days=1),
        **kw,
    )


@pytest.mark.parametrize(
    ("seed", "steps"),
    [(20260101, 150), pytest.param(7, 3000, marks=pytest.mark.soak)],
)
def test_counters_equal_a_recount_after_a_random_mix(
    tmp_path: Path, clock: FixedClock, seed: int, steps: int
) -> None:
    storage = make(tmp_path, clock)
    tasks, engine = storage.tasks, storage.stores
    rng = random.Random(seed)
    stores: dict[Scope, list[MemoryStore]] = {WEB: [], MOBILE: []}
    memories: dict[str, dict[str, str]] = {}  # store id -> path -> memory id
    for step in range(steps):
        scope = rng.choice((WEB, MOBILE))
        op = rng.random()
        task = f"t{rng.randrange(6)}"
        turn = rng.randrange(3)
        if op < 0.3:
            text = "é" * rng.randrange(0, 300)
            tasks.put_turn(
                scope, task, turn, meta={"i": step, "m": "x" * rng.randrange(9)}, summary_md=text
            )
        elif op < 0.45:
            data = os.urandom(rng.randrange(0, 5000))
            with contextlib.suppress(NotFound):  # a turn not written (or expired) yet
                tasks.put_artifact(
                    scope,
                    task,
                    turn,
                    f"a{rng.randrange(3)}.bin",
                    io.BytesIO(data),
                    content_type="application/octet-stream",
                    # Declared, or streamed without a length (chunked).
                    size=None if rng.random() < 0.5 else len(data),
                )
        elif op < 0.5:
            with contextlib.suppress(NotFound):
                tasks.delete_task(scope, task)
        elif op < 0.55:
            stores[scope].append(engine.create_store(scope, name=f"s{step}"))
        elif op < 0.8 and stores[scope]:
            store = rng.choice(stores[scope])
            held = memories.setdefault(store.id, {})
            path = f"/d{rng.randrange(2)}/m{rng.randrange(4)}.md"
            if path in held and rng.random() < 0.3:
                engine.delete_memory(scope, store.id, held.pop(path), actor=None)
            elif path in held:
                engine.update_memory(
                    scope, store.id, held[path], content="y" * rng.randrange(50), actor=None
                )
            else:
                held[path] = engine.create_memory(
                    scope, store.id, path=path, content="z" * rng.randrange(80), actor=None
                ).id
        elif op < 0.83 and stores[scope]:
            store = stores[scope].pop(rng.randrange(len(stores[scope])))
            engine.delete_store(scope, store.id)
            memories.pop(store.id, None)
        elif op < 0.88:
            clock.advance(hours=rng.choice((1, 30)))  # some turns expire
            storage.sweep(now=clock())
        elif op < 0.9 and stores[scope]:
            store = rng.choice(stores[scope])
            versions = engine.list_versions(scope, store.id, filters=_all(), limit=100)
            heads = {
                m.memory_version_id for m in engine.list_memories(scope, store.id, limit=100).data
            }
            old = [v for v in versions.data if v.id not in heads and v.redacted_at is None]
            if old:
                engine.redact_version(scope, store.id, old[0].id, actor=None)
        if step % 20 == 0:
            assert_counts(storage, WEB, MOBILE)
    clock.advance(days=40)
    storage.sweep(now=clock())
    assert_counts(storage, WEB, MOBILE)
    report = storage.fsck()
    assert report.clean, report.problems


def _all() -> Any:
    from app.storage.core.store_models import VersionFilter

    return VersionFilter()


def test_an_artifact_of_unknown_length_and_a_replacement_are_counted(
    tmp_path: Path, clock: FixedClock
) -> None:
    storage = make(tmp_path, clock)
    tasks = storage.tasks
    tasks.put_turn(WEB, "a", 0, meta={"model": "m"}, summary_md="hello")
    tasks.put_artifact(WEB, "a", 0, "x", io.BytesIO(b"1" * 3000), content_type="x/y")
    tasks.put_artifact(WEB, "a", 0, "x", io.BytesIO(b"2" * 1000), content_type="x/y", size=1000)
    usage = storage.usage(WEB)
    assert (usage.artifacts, usage.artifact_bytes) == (1, 1000)
    assert usage.turn_bytes == len(b'{"model":"m"}') + 5
    assert_counts(storage, WEB)


# -- a writer killed mid-write ----------------------------------------------------------------
def _die_at(root: str, where: str, op: str) -> None:
    """Write once, and SIGKILL this process at ``where`` (a function it calls)."""
    import app.storage.tree.sqlite.listing as listing
    import app.storage.tree.sqlite.listing_usage as lu

    def kill(*args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    target = {"listing": (lu, "put_turn"), "store_row": (listing.Listing, "set_store_usage")}
    module, name = target[where]
    storage = TreeStorage(
        Path(root), lock_timeout=10.0, clock=FixedClock(), retention=timedelta(days=1)
    )
    setattr(module, name, kill)
    if op == "turn":
        storage.tasks.put_turn(WEB, "killed", 1, meta={"a": 1}, summary_md="x" * 500)
    elif op == "artifact":
        storage.tasks.put_artifact(WEB, "t", 0, "big", io.BytesIO(b"b" * 7000), content_type="x/y")
    else:
        store_id = (Path(root) / "store-id").read_text()
        storage.stores.create_memory(WEB, store_id, path="/k.md", content="k" * 900, actor=None)


@pytest.mark.parametrize(
    ("where", "op"),
    [("listing", "turn"), ("listing", "artifact"), ("store_row", "memory")],
)
def test_a_write_killed_after_its_records_is_counted_after_recovery(
    tmp_path: Path, clock: FixedClock, where: str, op: str
) -> None:
    storage = make(tmp_path, clock)
    storage.tasks.put_turn(WEB, "t", 0, meta={}, summary_md="first")
    store = storage.stores.create_store(WEB, name="s")
    storage.stores.create_memory(WEB, store.id, path="/a.md", content="a", actor=None)
    (storage.layout.root / "store-id").write_text(store.id)
    # A quota, so the killed write holds a reservation too.
    storage.limits().set_quota("acme", "web", _quota(bytes=1 << 30))
    before = storage.usage(WEB)
    proc = multiprocessing.get_context("spawn").Process(
        target=_die_at, args=(str(storage.layout.root), where, op)
    )
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    (storage.layout.root / "store-id").unlink()
    # The records committed, the counters did not: they lag until the recovery.
    assert storage.usage(WEB) == before
    # The dead writer's reservation is still in the listing, and counts for nothing: its
    # process is gone (the next reservation in the project deletes it).
    with sqlite3.connect(storage.layout.listing(WEB)) as conn:
        (held,) = conn.execute("SELECT sum(bytes) FROM usage_reservations").fetchone()
    assert held > 0
    assert storage.usage_counters.project(WEB)[1].bytes == 0
    restarted = make(tmp_path, clock)
    report = restarted.recover(Plan(False, False, "killed"))
    assert report.repaired
    assert_counts(restarted, WEB)
    assert restarted.usage(WEB) != before
    restarted.tasks.put_turn(WEB, "t", 2, meta={}, summary_md="next")
    with sqlite3.connect(storage.layout.listing(WEB)) as conn:
        assert conn.execute("SELECT count(*) FROM usage_reservations").fetchone() == (0,)
    assert restarted.fsck().clean


def _quota(**kw: int) -> Any:
    from app.storage.core.limits import QuotaOverride

    return QuotaOverride(**kw)


def test_fsck_repairs_counters_changed_by_hand(tmp_path: Path, clock: FixedClock) -> None:
    storage = make(tmp_path, clock)
    storage.tasks.put_turn(WEB, "t", 0, meta={}, summary_md="s" * 100)
    storage.tasks.put_artifact(WEB, "t", 0, "a", io.BytesIO(b"a" * 500), content_type="x/y")
    store = storage.stores.create_store(WEB, name="s")
    storage.stores.create_memory(WEB, store.id, path="/m.md", content="m" * 40, actor=None)
    listing = storage.layout.listing(WEB)
    index = storage.layout.store_index(storage.layout.store_dir(WEB, store.id))
    with sqlite3.connect(listing) as conn:
        conn.execute("UPDATE counters SET value = 7 WHERE name = 'artifact_bytes'")
        conn.execute("UPDATE usage_turns SET turn_bytes = 3")
        conn.execute("UPDATE usage_stores SET versions = 9")
    with sqlite3.connect(index) as conn:
        conn.execute("UPDATE usage_counters SET value = 5 WHERE name = 'memory_bytes'")
    report = storage.fsck()
    assert len([p for p in report.problems if "usage" in p]) >= 3, report.problems
    storage.fsck(repair=True)
    assert storage.fsck().clean
    assert_counts(storage, WEB)
