"""Memory stores through StoreBackend: paths, versions, preconditions, redaction, retention."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.storage.core.errors import InvalidName, NotFound, NotOwner
from app.storage.core.names import Scope
from app.storage.core.store_models import (
    ContentPreconditionFailed,
    HeadVersion,
    MemoryPrefix,
    PathConflict,
    StoreArchived,
    VersionFilter,
)
from app.storage.interface import StorageBackend, StoreBackend
from tests.conftest import T0, FixedClock

ACTOR = {"type": "api_actor", "api_key_id": "tok_test"}


def test_stores_newest_first_scoped_and_paged(stores: StoreBackend, clock: FixedClock) -> None:
    scope, other = Scope("acme", "web"), Scope("acme", "mobile")
    made = []
    for i in range(5):
        made.append(stores.create_store(scope, name=f"s{i}", metadata={"i": str(i)}))
        clock.advance(seconds=1)
    stores.create_store(other, name="elsewhere")
    first = stores.list_stores(scope, limit=2)
    rest = stores.list_stores(scope, limit=10, page=first.next_page)
    assert [s.id for s in first.data + rest.data] == [s.id for s in reversed(made)]
    assert rest.next_page is None
    with pytest.raises(NotFound):
        stores.get_store(other, made[0].id)
    with pytest.raises(InvalidName):
        stores.list_stores(other, page=first.next_page)
    stores.archive_store(scope, made[0].id)
    assert made[0].id not in [s.id for s in stores.list_stores(scope, limit=100).data]
    assert made[0].id in [s.id for s in stores.list_stores(scope, include_archived=True).data]


def test_memory_lifecycle_and_preconditions(stores: StoreBackend, scope: Scope) -> None:
    store = stores.create_store(scope, name="s", creator="tok_a")
    mem = stores.create_memory(scope, store.id, path="/a/b.md", content="one", actor=ACTOR)
    with pytest.raises(PathConflict):
        stores.create_memory(scope, store.id, path="/a", content="x", actor=ACTOR)
    with pytest.raises(PathConflict):
        stores.create_memory(scope, store.id, path="/a/b.md/c", content="x", actor=ACTOR)
    with pytest.raises(ContentPreconditionFailed):
        stores.update_memory(
            scope, store.id, mem.id, content="two", precondition_sha256="0" * 64, actor=ACTOR
        )
    two = stores.update_memory(
        scope, store.id, mem.id, content="two", precondition_sha256=mem.content_sha256, actor=ACTOR
    )
    assert two.memory_version_id > mem.memory_version_id
    # A failed precondition whose requested state already holds is a success, and a no-op.
    same = stores.update_memory(
        scope, store.id, mem.id, content="two", precondition_sha256="0" * 64, actor=ACTOR
    )
    assert same.memory_version_id == two.memory_version_id
    moved = stores.update_memory(scope, store.id, mem.id, path="/c.md", actor=ACTOR, full=True)
    assert (moved.id, moved.path, moved.content) == (mem.id, "/c.md", "two")
    assert stores.find_memory(scope, store.id, "/c.md", full=True).content == "two"  # type: ignore[union-attr]
    assert stores.find_memory(scope, store.id, "/a/b.md", full=False) is None
    with pytest.raises(ContentPreconditionFailed):
        stores.delete_memory(scope, store.id, mem.id, expected_sha256="0" * 64, actor=ACTOR)
    stores.delete_memory(scope, store.id, mem.id, expected_sha256=two.content_sha256, actor=ACTOR)
    with pytest.raises(NotFound):
        stores.get_memory(scope, store.id, mem.id, full=False)
    history = stores.list_versions(
        scope, store.id, filters=VersionFilter(memory_id=mem.id), full=True
    )
    assert [v.operation for v in history.data] == ["deleted", "modified", "modified", "created"]
    assert [v.content for v in history.data] == [None, "two", "two", "one"]
    assert history.data[0].path == "/c.md" and history.data[0].created_by == ACTOR
    with pytest.raises(NotOwner):
        stores.update_store(scope, store.id, name="x", only_creator="tok_b")


def test_list_memories_by_prefix_and_depth(stores: StoreBackend, scope: Scope) -> None:
    store = stores.create_store(scope, name="s")
    for path in ("/a/x.md", "/a/y/z.md", "/b.md", "/a-c.md", "/a/y/w.md"):
        stores.create_memory(scope, store.id, path=path, content=path, actor=None)
    everything = stores.list_memories(scope, store.id, limit=100)
    assert [m.path for m in everything.data] == [
        "/a-c.md",
        "/a/x.md",
        "/a/y/w.md",
        "/a/y/z.md",
        "/b.md",
    ]
    top = stores.list_memories(scope, store.id, depth=1)
    assert [(type(m) is MemoryPrefix, m.path) for m in top.data] == [
        (False, "/a-c.md"),
        (True, "/a/"),
        (False, "/b.md"),
    ]
    under = stores.list_memories(scope, store.id, path_prefix="/a/", limit=1, full=True)
    seen = [m.path for m in under.data]
    while under.next_page:
        under = stores.list_memories(
            scope, store.id, path_prefix="/a/", limit=1, page=under.next_page, full=True
        )
        seen += [m.path for m in under.data]
    assert seen == ["/a/x.md", "/a/y/w.md", "/a/y/z.md"]
    with pytest.raises(InvalidName):
        stores.list_memories(scope, store.id, depth=2)


def test_version_ids_grow_even_when_the_clock_goes_back(
    stores: StoreBackend, scope: Scope, clock: FixedClock
) -> None:
    store = stores.create_store(scope, name="s")
    mem = stores.create_memory(scope, store.id, path="/a", content="0", actor=ACTOR)
    ids = [mem.memory_version_id]
    times = []
    for i in range(1, 5):
        clock.set(T0 - timedelta(hours=i))  # the clock steps back
        m = stores.update_memory(scope, store.id, mem.id, content=str(i), actor=ACTOR)
        ids.append(m.memory_version_id)
        times.append(m.updated_at)
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert times == sorted(times)
    page = stores.list_versions(scope, store.id, filters=VersionFilter(), limit=100)
    assert [v.id for v in page.data] == ids[::-1]


def test_redaction_and_archive(stores: StoreBackend, scope: Scope) -> None:
    store = stores.create_store(scope, name="s")
    mem = stores.create_memory(scope, store.id, path="/a", content="secret", actor=ACTOR)
    with pytest.raises(HeadVersion):
        stores.redact_version(scope, store.id, mem.memory_version_id, actor=ACTOR)
    stores.update_memory(scope, store.id, mem.id, content="clean", actor=ACTOR)
    red = stores.redact_version(scope, store.id, mem.memory_version_id, actor=ACTOR)
    assert (red.content, red.path, red.content_sha256, red.redacted_by) == (None, None, None, ACTOR)
    got = stores.get_version(scope, store.id, mem.memory_version_id, full=True)
    assert got.redacted_at is not None and got.content is None and got.created_by == ACTOR
    stores.archive_store(scope, store.id)
    with pytest.raises(StoreArchived):
        stores.create_memory(scope, store.id, path="/b", content="x", actor=ACTOR)
    assert stores.get_memory(scope, store.id, mem.id, full=True).content == "clean"
    stores.delete_store(scope, store.id)
    with pytest.raises(NotFound):
        stores.get_store(scope, store.id)


def test_sweep_keeps_recent_versions_of_live_memories(
    backend: StorageBackend, scope: Scope, clock: FixedClock
) -> None:
    stores = backend.stores
    sid = stores.create_store(scope, name="s").id
    busy = stores.create_memory(scope, sid, path="/busy", content="v0", actor=ACTOR)
    for i in range(1, 6):
        stores.update_memory(scope, sid, busy.id, content=f"v{i}", actor=ACTOR)
    gone = stores.create_memory(scope, sid, path="/gone", content="bye", actor=ACTOR)
    stores.delete_memory(scope, sid, gone.id, actor=ACTOR)
    quiet = stores.create_memory(scope, sid, path="/quiet", content="old but live", actor=ACTOR)
    clock.advance(days=20)
    fresh = stores.create_memory(scope, sid, path="/recent", content="r", actor=ACTOR)
    stores.delete_memory(scope, sid, fresh.id, actor=ACTOR)
    clock.advance(days=11)  # T0 + 31 days

    def version_ids() -> list[str]:
        return [
            v.id for v in stores.list_versions(scope, sid, filters=VersionFilter(), limit=100).data
        ]

    before = version_ids()
    assert len(before) == 11
    dry = backend.sweep(now=clock(), dry_run=True).to_dict()["memory_store_versions"]
    assert dry["versions_removed"] == 5 and dry["bytes_removed"] > 0  # type: ignore[index]
    assert version_ids() == before
    done = backend.sweep(now=clock()).to_dict()["memory_store_versions"]
    assert done["versions_removed"] == 5  # type: ignore[index]
    busy_history = stores.list_versions(
        scope, sid, filters=VersionFilter(memory_id=busy.id), limit=100, full=True
    )
    assert [v.content for v in busy_history.data] == ["v5", "v4", "v3"]
    assert stores.list_versions(scope, sid, filters=VersionFilter(memory_id=gone.id)).data == ()
    recent = stores.list_versions(scope, sid, filters=VersionFilter(memory_id=fresh.id))
    assert [v.operation for v in recent.data] == ["deleted", "created"]
    assert stores.get_memory(scope, sid, quiet.id, full=True).content == "old but live"
    again = backend.sweep(now=clock()).to_dict()["memory_store_versions"]
    assert again["versions_removed"] == 0  # type: ignore[index]
