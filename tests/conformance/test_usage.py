"""Usage and quotas, the same on every backend: what each write counts, what a quota admits
(at, just under and over it), that a refused write leaves nothing behind, and that deletes and
sweeps free quota at once."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from app.storage.core.errors import NotFound
from app.storage.core.limits import QuotaOverride
from app.storage.core.names import Scope
from app.storage.core.usage import QuotaExceeded, ReservingStream
from app.storage.interface import StorageBackend
from tests.conftest import FixedClock

WEB = Scope("acme", "web")
MOBILE = Scope("acme", "mobile")
OTHER = Scope("globex", "web")
MiB = 1 << 20


def _turn_bytes(meta: bytes, summary: str) -> int:
    return len(meta) + len(summary.encode())


class Reads(io.BytesIO):
    """A body that counts what was read of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.taken = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.taken += len(chunk)
        return chunk


def test_each_write_is_counted_exactly(backend: StorageBackend) -> None:
    tasks, stores = backend.tasks, backend.stores
    assert backend.usage(WEB).to_json() == dict.fromkeys(backend.usage(WEB).to_json(), 0)
    tasks.put_turn(WEB, "a", 0, meta={"model": "m"}, summary_md="héllo")
    tasks.put_turn(WEB, "a", 1, meta={}, summary_md="")
    tasks.put_turn(WEB, "b", 0, meta={}, summary_md="x" * 10)
    tasks.put_artifact(WEB, "a", 0, "log", io.BytesIO(b"1" * 3000), content_type="x/y", size=3000)
    tasks.put_artifact(WEB, "a", 1, "log", io.BytesIO(b"2" * 700), content_type="x/y")
    store = stores.create_store(WEB, name="s")
    memory = stores.create_memory(WEB, store.id, path="/a.md", content="aaaa", actor=None)
    stores.update_memory(WEB, store.id, memory.id, content="bb", actor=None)
    other = stores.create_memory(WEB, store.id, path="/b.md", content="ccc", actor=None)
    stores.delete_memory(WEB, store.id, other.id, actor=None)
    turn_bytes = _turn_bytes(b'{"model":"m"}', "héllo") + _turn_bytes(b"{}", "") * 2 + 10
    assert backend.usage(WEB).to_json() == {
        "tasks": 2,
        "turns": 3,
        "artifacts": 2,
        "artifact_bytes": 3700,
        "turn_bytes": turn_bytes,
        "stores": 1,
        "memories": 1,
        "memory_bytes": 2,
        "versions": 4,  # created, modified, created, deleted
        "version_bytes": 4 + 2 + 3,
        "bytes": turn_bytes + 3700 + 9,
    }
    assert backend.usage(MOBILE).bytes == 0
    assert set(backend.usages(["acme"])) == {WEB}
    # A replacement counts the difference; deleting frees at once.
    tasks.put_artifact(WEB, "a", 0, "log", io.BytesIO(b"3" * 100), content_type="x/y", size=100)
    assert backend.usage(WEB).artifact_bytes == 800
    tasks.delete_task(WEB, "a")
    stores.delete_store(WEB, store.id)
    after = backend.usage(WEB)
    assert (after.tasks, after.turns, after.artifacts, after.artifact_bytes) == (1, 1, 0, 0)
    assert (after.stores, after.versions, after.bytes) == (0, 0, 12)


def test_a_sweep_frees_at_once(backend: StorageBackend, clock: FixedClock) -> None:
    backend.tasks.put_turn(WEB, "old", 0, meta={}, summary_md="x" * 100)
    backend.tasks.put_artifact(WEB, "old", 0, "a", io.BytesIO(b"a" * 50), content_type="x/y")
    clock.advance(days=20)
    backend.tasks.put_turn(WEB, "new", 0, meta={}, summary_md="y")
    clock.advance(days=15)
    backend.sweep(now=clock())
    usage = backend.usage(WEB)
    assert (usage.tasks, usage.turns, usage.artifacts, usage.bytes) == (1, 1, 0, 3)


def _quota(backend: StorageBackend, scope: Scope | None = None, **kw: int) -> None:
    backend.limits().set_quota(
        WEB.tenant if scope is None else scope.tenant,
        None if scope is None else scope.project,
        QuotaOverride(**kw),
    )


def test_a_turn_fits_at_the_quota_and_not_one_byte_over(backend: StorageBackend) -> None:
    tasks = backend.tasks
    tasks.put_turn(WEB, "a", 0, meta={}, summary_md="x" * 100)  # 102 bytes
    _quota(backend, WEB, bytes=302)
    tasks.put_turn(WEB, "a", 1, meta={}, summary_md="y" * 98)  # just under: 202
    tasks.put_turn(WEB, "a", 2, meta={}, summary_md="z" * 98)  # exactly at: 302
    with pytest.raises(QuotaExceeded) as refused:
        tasks.put_turn(WEB, "a", 3, meta={}, summary_md="")  # 2 bytes over
    assert refused.value.kind == "bytes" and refused.value.level == "project"
    assert "acme/web" in str(refused.value) and "302 bytes" in str(refused.value)
    with pytest.raises(NotFound):
        tasks.get_turn(WEB, "a", 3)  # nothing was written
    assert backend.usage(WEB).bytes == 302
    # A replacement pays the difference: smaller always fits, the same size too.
    tasks.put_turn(WEB, "a", 2, meta={}, summary_md="w" * 98)
    tasks.put_turn(WEB, "a", 1, meta={}, summary_md="v" * 8)
    tasks.put_turn(WEB, "a", 2, meta={}, summary_md="w" * 188)  # the 90 bytes just freed
    with pytest.raises(QuotaExceeded):
        tasks.put_turn(WEB, "a", 2, meta={}, summary_md="w" * 189)
    assert tasks.get_turn(WEB, "a", 2).summary_md == "w" * 188
    # Deleting frees quota at once.
    tasks.delete_task(WEB, "a")
    tasks.put_turn(WEB, "b", 0, meta={}, summary_md="q" * 300)


def test_an_artifact_over_quota_is_refused_before_its_body_is_read(
    backend: StorageBackend,
) -> None:
    tasks = backend.tasks
    tasks.put_turn(WEB, "a", 0, meta={}, summary_md="")  # 2 bytes
    _quota(backend, WEB, bytes=10_002)
    body = Reads(b"b" * 10_001)
    with pytest.raises(QuotaExceeded):
        tasks.put_artifact(WEB, "a", 0, "big", body, content_type="x/y", size=10_001)
    assert body.taken == 0
    assert tasks.get_turn(WEB, "a", 0).artifacts == ()
    tasks.put_artifact(WEB, "a", 0, "big", Reads(b"b" * 10_000), content_type="x/y", size=10_000)
    assert backend.usage(WEB).bytes == 10_002
    # Replacing it with the same size fits; one byte more does not.
    tasks.put_artifact(WEB, "a", 0, "big", Reads(b"c" * 10_000), content_type="x/y", size=10_000)
    with pytest.raises(QuotaExceeded):
        tasks.put_artifact(
            WEB, "a", 0, "big", Reads(b"d" * 10_001), content_type="x/y", size=10_001
        )
    art = tasks.open_artifact(WEB, "a", 0, "big")
    with art.file:
        assert art.file.read() == b"c" * 10_000


def test_a_body_of_unknown_length_stops_where_it_crosses_the_quota(
    backend: StorageBackend,
) -> None:
    tasks = backend.tasks
    tasks.put_turn(WEB, "a", 0, meta={}, summary_md="")  # 2 bytes
    _quota(backend, WEB, bytes=2 + 3 * MiB)
    body = Reads(b"x" * (10 * MiB))
    with pytest.raises(QuotaExceeded):
        tasks.put_artifact(WEB, "a", 0, "big", body, content_type="x/y")
    # Each piece is reserved as it is read, before it is written: refused at the piece that
    # crosses the quota, with nothing stored.
    assert 3 * MiB < body.taken <= 3 * MiB + ReservingStream.PIECE
    assert tasks.get_turn(WEB, "a", 0).artifacts == ()
    assert backend.usage(WEB).artifact_bytes == 0
    tasks.put_artifact(WEB, "a", 0, "all", Reads(b"y" * 3 * MiB), content_type="x/y")
    assert backend.usage(WEB).bytes == 2 + 3 * MiB


def test_the_task_quota(backend: StorageBackend) -> None:
    tasks = backend.tasks
    _quota(backend, WEB, tasks=2)
    tasks.put_turn(WEB, "a", 0, meta={}, summary_md="")
    tasks.put_turn(WEB, "b", 0, meta={}, summary_md="")
    tasks.put_turn(WEB, "b", 1, meta={}, summary_md="")  # a turn of an existing task
    with pytest.raises(QuotaExceeded) as refused:
        tasks.put_turn(WEB, "c", 0, meta={}, summary_md="")
    assert refused.value.kind == "tasks" and "2 task(s)" in str(refused.value)
    with pytest.raises(NotFound):
        tasks.get_task(WEB, "c")
    tasks.delete_task(WEB, "a")
    tasks.put_turn(WEB, "c", 0, meta={}, summary_md="")


def test_a_tenant_quota_bounds_the_sum_of_its_projects(backend: StorageBackend) -> None:
    tasks = backend.tasks
    _quota(backend, bytes=1000)  # the tenant acme
    tasks.put_turn(WEB, "a", 0, meta={}, summary_md="x" * 598)  # 600
    tasks.put_turn(MOBILE, "a", 0, meta={}, summary_md="y" * 398)  # 1000 in the tenant
    with pytest.raises(QuotaExceeded) as refused:
        tasks.put_turn(MOBILE, "b", 0, meta={}, summary_md="")
    assert refused.value.level == "tenant" and refused.value.name == "acme"
    tasks.put_turn(OTHER, "a", 0, meta={}, summary_md="z" * 5000)  # another tenant
    tasks.delete_task(WEB, "a")
    tasks.put_turn(MOBILE, "b", 0, meta={}, summary_md="w" * 598)


def test_memory_writes_count_against_the_quota(backend: StorageBackend) -> None:
    stores = backend.stores
    store = stores.create_store(WEB, name="s")
    _quota(backend, WEB, bytes=100)
    memory = stores.create_memory(WEB, store.id, path="/a.md", content="a" * 60, actor=None)
    stores.update_memory(WEB, store.id, memory.id, content="b" * 40, actor=None)  # at 100
    with pytest.raises(QuotaExceeded):
        stores.create_memory(WEB, store.id, path="/c.md", content="c", actor=None)
    with pytest.raises(QuotaExceeded):
        stores.update_memory(WEB, store.id, memory.id, content="d", actor=None)
    assert stores.find_memory(WEB, store.id, "/c.md", full=False) is None
    # The history stays until it expires or is redacted; a delete writes no content.
    stores.delete_memory(WEB, store.id, memory.id, actor=None)
    assert backend.usage(WEB).version_bytes == 100
    first = stores.list_versions(WEB, store.id, filters=_filters(), limit=10).data[-1]
    stores.redact_version(WEB, store.id, first.id, actor=None)
    assert backend.usage(WEB).version_bytes == 40
    stores.create_memory(WEB, store.id, path="/c.md", content="c" * 60, actor=None)
    # Deleting the store frees all of it.
    stores.delete_store(WEB, store.id)
    assert backend.usage(WEB).bytes == 0


def _filters() -> Any:
    from app.storage.core.store_models import VersionFilter

    return VersionFilter()


def test_clearing_a_quota_admits_again(backend: StorageBackend) -> None:
    _quota(backend, WEB, bytes=0, tasks=0)
    with pytest.raises(QuotaExceeded):
        backend.tasks.put_turn(WEB, "a", 0, meta={}, summary_md="")
    limits = backend.limits()
    assert limits.clear_quota("acme", "web", ("bytes",))
    assert limits.quotas().projects[("acme", "web")] == QuotaOverride(tasks=0)
    assert limits.clear_quota("acme", "web")
    assert not limits.clear_quota("acme", "web")
    backend.tasks.put_turn(WEB, "a", 0, meta={}, summary_md="")
    assert backend.fsck().clean


def _minus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a[k] - b[k] for k in a}


def test_an_import_counts_what_it_brings_less_what_it_replaces(
    backend: StorageBackend, tmp_path: Path
) -> None:
    tasks, stores = backend.tasks, backend.stores
    tasks.put_turn(WEB, "a", 0, meta={"model": "m"}, summary_md="first")
    tasks.put_artifact(WEB, "a", 0, "log", io.BytesIO(b"1" * 500), content_type="x/y")
    tasks.put_turn(WEB, "b", 0, meta={}, summary_md="b")
    store = stores.create_store(WEB, name="s")
    memory = stores.create_memory(WEB, store.id, path="/a.md", content="aaaa", actor=None)
    stores.update_memory(WEB, store.id, memory.id, content="bb", actor=None)
    saved = backend.usage(WEB).to_json()
    backend.export(tmp_path / "web.tar", tenant="acme", project="web")

    # Changed after the backup: the import puts back what it holds of "a" and the store.
    tasks.put_turn(WEB, "a", 1, meta={}, summary_md="later" * 50)
    stores.create_memory(WEB, store.id, path="/b.md", content="c" * 70, actor=None)
    before_c = backend.usage(WEB).to_json()
    tasks.put_turn(WEB, "c", 0, meta={}, summary_md="not in the backup")
    only_c = _minus(backend.usage(WEB).to_json(), before_c)
    with (tmp_path / "web.tar").open("rb") as archive:
        backend.import_(archive, overwrite=True)
    assert backend.usage(WEB).to_json() == {k: saved[k] + only_c[k] for k in saved}
    assert backend.fsck().clean

    # Into a project that no longer holds them.
    for task_id in ("a", "b", "c"):
        tasks.delete_task(WEB, task_id)
    stores.delete_store(WEB, store.id)
    assert backend.usage(WEB).bytes == 0
    with (tmp_path / "web.tar").open("rb") as archive:
        backend.import_(archive)
    assert backend.usage(WEB).to_json() == saved
    assert backend.fsck().clean
