"""Backups, on every backend MEMORY_TEST_BACKENDS names: a round trip restores what the API
answers (and, exported again, the same members byte for byte); a corrupt, tampered or crafted
backup imports nothing."""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.storage.backends import open_backend
from app.storage.core.archive import PAX_SHA256, ArchiveError
from app.storage.core.names import Scope
from app.storage.core.store_models import VersionFilter
from app.storage.interface import StorageBackend
from app.storage.tree import backup as tree_export
from app.storage.tree.backend import TreeStorage
from app.storage.tree.fs import walk as tree_mod
from tests.conftest import FixedClock
from tests.storage._helpers import snapshot

pytestmark = pytest.mark.all_backends
SCOPE = Scope("acme", "web")
TASKS = {"alpha": 2, "beta": 1, "index.json": 1}  # a task named like a reserved file works
ACTOR = {"type": "api_actor", "api_key_id": "tok_owner"}
MiB = 1 << 20
Make = Callable[[str], Any]


@pytest.fixture
def make(
    backend_kind: str, request: pytest.FixtureRequest, tmp_path: Path, clock: FixedClock
) -> Iterator[Make]:
    """A deployment per name (its own root, or its own schema and key prefix); each call
    opens it anew, as a server started on it would."""
    settings: dict[str, dict[str, Any]] = {}
    opened: list[StorageBackend] = []

    def build(name: str) -> Any:
        if name not in settings:
            settings[name] = {
                "STORAGE_ROOT": str(tmp_path / name),
                "TOKENS_FILE": str(tmp_path / f"{name}-tokens.json"),
                "RETENTION_DAYS": 30.0,
                "LOCK_TIMEOUT": 5.0,
                "MAX_ARTIFACT_BYTES": 50 * MiB,
                "CLOCK": clock,
                "THREADS": 2,
                # No background embedding: a refused import must leave every byte as it was.
                "EMBEDDER": "off",
            }
            if backend_kind != "tree":
                settings[name].update(request.getfixturevalue("services").settings())
        backend = open_backend(settings[name])
        opened.append(backend)
        return backend

    yield build
    for backend in opened:
        backend.close()


@pytest.fixture
def source(make: Make, clock: FixedClock) -> Any:
    storage = make("root")
    tasks = storage.tasks
    for task, turns in TASKS.items():
        for turn in range(turns):
            tasks.put_turn(
                SCOPE,
                task,
                turn,
                meta={"n": turn, "text": "ünïcode"},
                summary_md=f"# {task}\n\nturn {turn}\n",
                actor="tok_owner",
            )
            clock.advance(seconds=1)
    tasks.put_artifact(
        SCOPE, "alpha", 1, "data.bin", io.BytesIO(os.urandom(300_000)), content_type="x/y"
    )
    tasks.put_artifact(SCOPE, "beta", 0, "empty", io.BytesIO(b""), content_type="text/plain")
    tasks.put_turn(Scope("acme", "mobile"), "m", 0, meta={}, summary_md="other project")
    tasks.put_turn(Scope("globex", "web"), "g", 0, meta={}, summary_md="other tenant")
    stores = storage.stores
    kept = stores.create_store(
        SCOPE, name="Prefs", description="d", metadata={"k": "v"}, creator="tok_owner"
    )
    mem = stores.create_memory(SCOPE, kept.id, path="/a/b.md", content="one", actor=ACTOR)
    stores.update_memory(SCOPE, kept.id, mem.id, content="two", actor=ACTOR)
    gone = stores.create_memory(SCOPE, kept.id, path="/gone.md", content="x", actor=ACTOR)
    stores.delete_memory(SCOPE, kept.id, gone.id, actor=ACTOR)
    stores.redact_version(SCOPE, kept.id, mem.memory_version_id, actor=ACTOR)
    old = stores.create_store(SCOPE, name="Old", creator=None)
    stores.create_memory(SCOPE, old.id, path="/x", content="x", actor=None)
    stores.archive_store(SCOPE, old.id)
    return storage


def records_and_derived(root: Path) -> dict[str, Any]:
    """Every file a backup restores (records) or rebuilds (derived), but the SQLite files."""
    keep = {}
    for name, data in snapshot(root).items():
        if name.startswith((".locks", ".trash", ".cursor-key", ".console-key")):
            continue
        if ".sqlite3" in name or name.endswith("_project.md"):
            continue
        keep[name] = data
    return keep


def answers(storage: Any) -> dict[str, Any]:
    """What the API would answer about everything (through the storage interface)."""
    out: dict[str, Any] = {}
    for scope in storage.projects():
        page = storage.tasks.list_tasks(scope, limit=1000)
        out[f"{scope}/tasks"] = page
        out[f"{scope}/tasks/2"] = storage.tasks.list_tasks(scope, limit=2)  # a cursor
        for t in page.tasks:
            index = storage.tasks.get_task(scope, t.task_id)
            out[f"{scope}/{t.task_id}"] = index
            for entry in index.turns:
                turn = storage.tasks.get_turn(scope, t.task_id, entry.turn)
                out[f"{scope}/{t.task_id}/{entry.turn}"] = turn
                for artifact in turn.artifacts:
                    opened = storage.tasks.open_artifact(scope, t.task_id, turn.turn, artifact.name)
                    with opened.file as fh:
                        out[f"{scope}/{t.task_id}/{entry.turn}/{artifact.name}"] = (
                            opened.info,
                            hashlib.sha256(fh.read()).hexdigest(),
                        )
        fh, _ = storage.tasks.open_digest(scope)
        with fh:
            out[f"{scope}/project.md"] = fh.read()
        stores = storage.stores.list_stores(scope, limit=100, include_archived=True)
        out[f"{scope}/stores"] = stores
        for store in stores.data:
            out[f"{store.id}/memories"] = storage.stores.list_memories(
                scope, store.id, limit=20, full=True
            )
            out[f"{store.id}/memories/1"] = storage.stores.list_memories(scope, store.id, limit=1)
            out[f"{store.id}/versions"] = storage.stores.list_versions(
                scope, store.id, filters=VersionFilter(), limit=100, full=True
            )
    return out


def members(backup: Path) -> list[tuple[str, bytes]]:
    """(name, bytes) of every member, in order."""
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(backup.read_bytes()))) as tar:
        found = []
        for info in tar:
            fh = tar.extractfile(info)
            found.append((info.name, fh.read() if fh else b""))
        return found


def test_a_whole_deployment_round_trips_and_answers_the_same(
    source: Any, make: Make, tmp_path: Path
) -> None:
    backup = tmp_path / "all.tar.gz"
    summary = source.export(backup)
    assert summary.counts == {
        "tasks": 5,
        "turns": 6,
        "artifacts": 2,
        "artifact_bytes": 300_000,
        "stores": 2,
        "versions": 5,
    }
    target = make("restored")
    with open(backup, "rb") as fh:
        result = target.import_(fh)
    assert (result.tasks, result.stores) == (5, 2)
    target = make("restored")  # a server started on the restored deployment
    assert answers(target) == answers(source)  # cursors too: the key came with the backup
    assert target.fsck().clean
    again = tmp_path / "again.tar.gz"
    target.export(again)
    assert members(again) == members(backup)  # the records' bytes, the artifacts, the key
    if isinstance(target, TreeStorage):
        assert records_and_derived(target.layout.root) == records_and_derived(source.layout.root)


@pytest.mark.tree_only("the tree's snapshot under .trash/")
def test_a_task_or_store_past_the_held_bounds_is_hard_linked_and_still_round_trips(
    source: TreeStorage, make: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records past the byte bound and artifacts past the descriptor bound are taken as hard
    links in a snapshot under .trash/, removed once streamed: the backup is the same."""
    plain = tmp_path / "plain.tar.gz"
    source.export(plain)
    monkeypatch.setattr(tree_export, "_HELD_BYTES", 600)
    monkeypatch.setattr(tree_export, "_HELD_FILES", 1)
    linked = tmp_path / "linked.tar.gz"
    source.export(linked)
    assert members(linked) == members(plain)
    trash = source.layout.trash_dir()
    assert [p.name for p in trash.iterdir()] == []  # the snapshots went with the export
    target = make("restored")
    with open(linked, "rb") as fh:
        target.import_(fh)
    assert answers(make("restored")) == answers(source)


@pytest.mark.tree_only("the tree's walk of a project's task names")
def test_task_names_taken_a_few_at_a_time_make_the_same_backup_and_a_clean_check(
    source: TreeStorage, make: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Export, fsck and the usage check walk a project's task names in sorted batches
    (Tree.sorted_subdir_names); with a batch of one name, every walk takes a pass per name."""
    plain = tmp_path / "plain.tar.gz"
    source.export(plain)
    monkeypatch.setattr(tree_mod, "NAME_BATCH", 1)
    batched = tmp_path / "batched.tar.gz"
    source.export(batched)
    assert members(batched) == members(plain)
    target = make("restored")
    with open(batched, "rb") as fh:
        target.import_(fh)
    assert answers(make("restored")) == answers(source)
    assert target.fsck().clean and source.fsck().clean


def test_a_project_goes_into_another_tenant_and_project(
    source: Any, make: Make, tmp_path: Path
) -> None:
    backup = tmp_path / "web.tar.gz"
    summary = source.export(backup, tenant="acme", project="web")
    assert summary.counts["tasks"] == 3 and summary.counts["stores"] == 2
    copy = Scope("initech", "copy")
    target = make("target")
    with open(backup, "rb") as fh:
        target.import_(fh, tenant=copy.tenant, project=copy.project)
    assert target.projects() == [copy]
    assert [t.task_id for t in target.tasks.list_tasks(copy).tasks] == [
        t.task_id for t in source.tasks.list_tasks(SCOPE).tasks
    ]
    assert {s.id for s in target.stores.list_stores(copy, include_archived=True).data} == {
        s.id for s in source.stores.list_stores(SCOPE, include_archived=True).data
    }
    assert target.fsck().clean
    with open(backup, "rb") as fh, pytest.raises(ArchiveError, match="already exist"):
        target.import_(fh, tenant=copy.tenant, project=copy.project)
    with open(backup, "rb") as fh, pytest.raises(ArchiveError, match="go together"):
        target.import_(fh, tenant=copy.tenant)


def test_a_backup_of_several_projects_goes_into_none(source: Any, make: Make, tmp_path: Path):
    backup = tmp_path / "acme.tar.gz"
    source.export(backup, tenant="acme")
    import_refused(make("target"), backup, "more than one project", tenant="x", project="y")


def test_a_copy_beside_its_source(source: Any, backend_kind: str, tmp_path: Path) -> None:
    """Tasks copy into another project of the same deployment; memory stores do on the tree,
    and are refused on PostgreSQL, where a store id names one store in the deployment."""
    mobile = tmp_path / "mobile.tar.gz"
    source.export(mobile, tenant="acme", project="mobile")
    with open(mobile, "rb") as fh:
        source.import_(fh, tenant="acme", project="mobile2")
    assert source.tasks.get_turn(Scope("acme", "mobile2"), "m", 0).summary_md == "other project"
    backup = tmp_path / "web.tar.gz"
    source.export(backup, tenant="acme", project="web")
    copy = Scope("initech", "copy")
    if backend_kind == "tree":
        with open(backup, "rb") as fh:
            source.import_(fh, tenant=copy.tenant, project=copy.project)
        assert {s.id for s in source.stores.list_stores(copy, include_archived=True).data} == {
            s.id for s in source.stores.list_stores(SCOPE, include_archived=True).data
        }
    else:
        import_refused(source, backup, "exists in acme/web", tenant="initech", project="copy")
    assert source.fsck().clean


def test_a_tenant_backup_holds_that_tenant_only(source: Any, tmp_path: Path) -> None:
    backup = tmp_path / "acme.tar.gz"
    source.export(backup, tenant="acme")
    names = member_names(backup)
    assert any(n.startswith("tasks/acme/mobile/") for n in names)
    assert not any("globex" in n for n in names) and "keys/cursor-key" not in names
    assert names[-1] == "manifest.json"
    manifest = read_manifest(backup)
    assert manifest["scope"] == {"tenant": "acme", "project": None}
    assert manifest["counts"]["tasks"] == 4


def test_a_person_reads_the_backup_with_tar(source: Any, tmp_path: Path) -> None:
    backup = tmp_path / "web.tar.gz"
    source.export(backup, tenant="acme", project="web")
    names = member_names(backup)
    assert "tasks/acme/web/alpha/0001-turn/artifacts/data.bin" in names
    assert "tasks/acme/web/index.json/task.json" in names
    assert not any(n.endswith(("index.json/index.json", "summary.md", ".sqlite3")) for n in names)
    assert any(n.startswith("stores/acme/web/memstore_") and "/versions/" in n for n in names)


def member_names(backup: Path) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(backup.read_bytes()))) as tar:
        return tar.getnames()


def read_manifest(backup: Path) -> dict[str, Any]:
    with tarfile.open(backup, "r:gz") as tar:
        fh = tar.extractfile("manifest.json")
        assert fh is not None
        return dict(json.loads(fh.read()))


# -- refusals: nothing imported ------------------------------------------------------------------
def stored(target: Any) -> Any:
    """Everything a backend holds: the tree's files (but its locks and trash), or every row
    of PostgreSQL and every object under the deployment's prefix."""
    if isinstance(target, TreeStorage):
        files = snapshot(target.layout.root)
        return {k: v for k, v in files.items() if not k.startswith((".locks", ".trash"))}
    rows = {}
    with target.db.snapshot("test") as conn:
        for table, order in (
            ("projects", "1, 2"),
            ("tasks", "1, 2, 3"),
            ("turns", "1, 2, 3, 4"),
            ("artifacts", "1, 2, 3, 4, 5"),
            ("stores", "1"),
            ("memories", "1, 2"),
            ("versions", "1, 2"),
            ("keys", "1"),
        ):
            query = f"SELECT * FROM {table} ORDER BY {order}"  # noqa: S608 - fixed names
            rows[table] = conn.execute(query).fetchall()
    rows["objects"] = sorted(key for key, _, _ in target.blobs.listing())
    return rows


def import_refused(target: Any, backup: Path, message: str, **kwargs: Any) -> None:
    seen = answers(target)
    before = stored(target)
    with open(backup, "rb") as fh, pytest.raises(ArchiveError, match=message):
        target.import_(fh, **kwargs)
    assert stored(target) == before
    assert answers(target) == seen


@pytest.fixture
def target(make: Make) -> Any:
    storage = make("target")
    storage.tasks.put_turn(SCOPE, "mine", 0, meta={}, summary_md="kept")
    storage.tasks.put_artifact(SCOPE, "mine", 0, "a", io.BytesIO(b"a"), content_type="x/y")
    return storage


def test_a_corrupt_or_truncated_backup_imports_nothing(
    source: Any, target: Any, tmp_path: Path
) -> None:
    backup = tmp_path / "web.tar.gz"
    source.export(backup, tenant="acme", project="web")
    data = bytearray(backup.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "flipped.tar.gz").write_bytes(bytes(data))
    import_refused(target, tmp_path / "flipped.tar.gz", "corrupt")
    (tmp_path / "cut.tar.gz").write_bytes(backup.read_bytes()[: len(data) - 100])
    import_refused(target, tmp_path / "cut.tar.gz", "corrupt or truncated|no manifest")
    (tmp_path / "half.tar.gz").write_bytes(backup.read_bytes()[: len(data) // 2])
    import_refused(target, tmp_path / "half.tar.gz", "corrupt or truncated")  # mid-artifact


class Craft:
    """Build a backup member by member, with correct headers and manifest unless told."""

    def __init__(self) -> None:
        self.raw = io.BytesIO()
        self.tar = tarfile.open(  # noqa: SIM115 - closed by finish()
            fileobj=self.raw, mode="w|gz", format=tarfile.PAX_FORMAT
        )
        self.chain = hashlib.sha256()
        self.n = 0
        self.tasks: set[str] = set()
        self.counts = {
            "tasks": 0,
            "turns": 0,
            "artifacts": 0,
            "artifact_bytes": 0,
            "stores": 0,
            "versions": 0,
        }

    def add(
        self,
        name: str,
        data: bytes,
        *,
        kind: str | None = None,
        size: int | None = None,
        type_: bytes = tarfile.REGTYPE,
        sha: str | None = None,
    ) -> Craft:
        info = tarfile.TarInfo(name)
        info.type = type_
        info.size = len(data) if size is None else size
        sha = sha or hashlib.sha256(data).hexdigest()
        info.pax_headers = {PAX_SHA256: sha}
        self.tar.addfile(info, io.BytesIO(data) if type_ == tarfile.REGTYPE else None)
        self.chain.update(f"{name}\0{info.size}\0{sha}\n".encode())
        self.n += 1
        if kind == "artifact":
            self.counts["artifacts"] += 1
            self.counts["artifact_bytes"] += info.size
        elif kind:
            self.counts[kind] += 1
        return self

    def turn(
        self,
        task: str,
        turn: int,
        dirname: str | None = None,
        artifacts: tuple[tuple[str, bytes], ...] = (),
    ) -> Craft:
        record = {
            "version": 1,
            "task_id": task,
            "turn": turn,
            "meta": {},
            "summary_md": "s",
            "artifacts": [
                {
                    "name": n,
                    "content_type": "x/y",
                    "size": len(d),
                    "sha256": hashlib.sha256(d).hexdigest(),
                    "updated_at": "2026-01-01T00:00:00.000000Z",
                }
                for n, d in artifacts
            ],
            "created_at": "2026-01-01T00:00:00.000000Z",
            "updated_at": "2026-01-01T00:00:00.000000Z",
            "retain_until": "2099-01-01T00:00:00.000000Z",
            "updated_us": 1767225600000000,
        }
        if task not in self.tasks:
            self.tasks.add(task)
            record_json = {
                "version": 1,
                "task_id": task,
                "owner": None,
                "created_at": "2026-01-01T00:00:00.000000Z",
            }
            self.add(
                f"tasks/acme/web/{task}/task.json", json.dumps(record_json).encode(), kind="tasks"
            )
        prefix = f"tasks/acme/web/{task}/{dirname or f'{turn:04d}-turn'}"
        self.add(f"{prefix}/meta.json", json.dumps(record).encode(), kind="turns")
        for n, d in artifacts:
            self.add(f"{prefix}/artifacts/{n}", d, kind="artifact")
        return self

    def finish(self, path: Path, **override: Any) -> Path:
        manifest = {
            "format": "project-memory-backup",
            "version": 2,
            "scope": {"tenant": "acme", "project": "web"},
            "exported_at": "x",
            "counts": self.counts,
            "members": self.n,
            "digest": self.chain.hexdigest(),
            **override,
        }
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))
        self.tar.close()
        path.write_bytes(self.raw.getvalue())
        return path


def test_a_crafted_backup_that_passes_every_check_imports(target: Any, tmp_path: Path) -> None:
    backup = Craft().turn("ok", 0, artifacts=(("a.bin", b"abc"),)).finish(tmp_path / "ok.tar.gz")
    with open(backup, "rb") as fh:
        target.import_(fh)
    assert target.tasks.get_turn(SCOPE, "ok", 0).artifacts[0].size == 3
    assert target.fsck().clean


CRAFTED = {
    "non-ASCII digits": (lambda c: c.turn("t", 1234, dirname="١٢٣٤-turn"), "not a member name"),
    "a turn under another number": (
        lambda c: c.turn("t", 7, dirname="0008-turn"),
        "names task t turn 7",
    ),
    "a member twice": (lambda c: c.turn("t", 0).turn("t", 0), "appears twice"),
    "an artifact named '.'": (
        lambda c: c.turn("t", 0).add(
            "tasks/acme/web/t/0000-turn/artifacts/.", b"x", kind="artifact"
        ),
        "not artifact names",
    ),
    "an artifact named '..'": (
        lambda c: c.add("tasks/acme/web/t/0000-turn/artifacts/..", b"x"),
        "not artifact names",
    ),
    "a path that climbs": (
        lambda c: c.add("tasks/acme/web/../../../../escape", b"x"),
        "not a member name",
    ),
    "an absolute path": (lambda c: c.add("/etc/cron.d/evil", b"x"), "not a member name"),
    "a symlink": (
        lambda c: c.add("tasks/acme/web/t/task.json", b"", type_=tarfile.SYMTYPE),
        "not a regular file",
    ),
    "a hard link": (
        lambda c: c.add("tasks/acme/web/t/task.json", b"", type_=tarfile.LNKTYPE),
        "not a regular file",
    ),
    "a device": (
        lambda c: c.add("tasks/acme/web/t/task.json", b"", type_=tarfile.CHRTYPE),
        "not a regular file",
    ),
    "an artifact over the limit": (
        lambda c: c.turn("t", 0).add(
            "tasks/acme/web/t/0000-turn/artifacts/huge.bin", b"\0" * (300 << 20), kind="artifact"
        ),
        "over the limit",
    ),
    "an artifact meta.json does not list": (
        lambda c: c.turn("t", 0).add(
            "tasks/acme/web/t/0000-turn/artifacts/extra", b"x", kind="artifact"
        ),
        "artifacts differ",
    ),
    "bytes that differ from their SHA-256": (
        lambda c: c.turn("t", 0).add(
            "tasks/acme/web/t/0000-turn/artifacts/x", b"{}", kind="artifact", sha="0" * 64
        ),
        "do not match",
    ),
    "a torn record": (
        lambda c: c.add("tasks/acme/web/t/0000-turn/meta.json", b'{"torn', kind="turns"),
        "not valid JSON",
    ),
    "a task split in two": (lambda c: c.turn("b", 0).turn("a", 0).turn("b", 1), "out of order"),
}


@functools.cache
def crafted(case: str) -> bytes:
    """The crafted backup of ``case``, built once for every backend (300 MiB of zeros take
    seconds to compress)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = CRAFTED[case][0](Craft().turn("first", 0)).finish(Path(tmp) / "crafted.tar.gz")
        return path.read_bytes()


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_backup_is_refused_and_imports_nothing(
    target: Any, tmp_path: Path, case: str
) -> None:
    message = CRAFTED[case][1]
    backup = tmp_path / "crafted.tar.gz"
    backup.write_bytes(crafted(case))
    if case == "an artifact over the limit":
        assert backup.stat().st_size < 1 << 20  # it would have been small on disk
    import_refused(target, backup, message)
    assert not (tmp_path / "escape").exists() and target.tasks.get_turn(SCOPE, "mine", 0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"members": 99}, "do not match the manifest"),
        ({"digest": "0" * 64}, "do not match the manifest"),
        ({"counts": {}}, "counts do not match"),
        ({"format": "tar"}, "not a project-memory backup"),
        ({"version": 1}, "unsupported backup version"),
        # relabelled: its members are acme/web's
        ({"scope": {"tenant": "other", "project": "proj"}}, "says a backup of tenant 'other'"),
        ({"scope": {"tenant": "acme", "project": "mobile"}}, "holds acme/web"),
        ({"scope": None}, "names no scope"),
    ],
)
def test_a_manifest_that_disagrees_is_refused(
    target: Any, tmp_path: Path, override: dict[str, Any], message: str
) -> None:
    backup = Craft().turn("t", 0).finish(tmp_path / "m.tar.gz", **override)
    import_refused(target, backup, message)


def test_existing_tasks_and_stores_are_kept_unless_overwrite(
    source: Any, make: Make, tmp_path: Path
) -> None:
    backup = tmp_path / "web.tar.gz"
    source.export(backup, tenant="acme", project="web")
    target = make("target")
    target.tasks.put_turn(SCOPE, "beta", 0, meta={}, summary_md="local beta")
    target.tasks.put_turn(SCOPE, "mine", 0, meta={}, summary_md="local only")
    import_refused(target, backup, "already exist.*beta.*--overwrite")
    assert target.tasks.get_turn(SCOPE, "beta", 0).summary_md == "local beta"
    with open(backup, "rb") as fh:
        target.import_(fh, overwrite=True)
    assert target.tasks.get_turn(SCOPE, "beta", 0).summary_md == "# beta\n\nturn 0\n"
    assert target.tasks.get_turn(SCOPE, "mine", 0).summary_md == "local only"
    assert target.tasks.list_tasks(SCOPE).total == 4
    assert target.fsck().clean


@pytest.mark.tree_only("the tree's importer")
def test_a_task_created_while_the_import_runs_is_kept_unless_overwrite(
    source: Any, make: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client writes a task of an id the backup holds after the import checked for
    existing ones: without --overwrite its acknowledged turn is kept, not replaced."""
    from app.storage.tree import restore as tree_import

    backup = tmp_path / "web.tar.gz"
    source.export(backup, tenant="acme", project="web")
    checked = tree_import._Importer.conflicts

    for overwrite, kept in ((False, ("acme/web/beta",)), (True, ())):
        target = make(f"target-{overwrite}")

        def conflicts_then_a_write(importer: Any, target: Any = target) -> None:
            checked(importer)  # nothing exists yet: the import goes ahead
            target.tasks.put_turn(SCOPE, "beta", 0, meta={}, summary_md="written meanwhile")

        monkeypatch.setattr(tree_import._Importer, "conflicts", conflicts_then_a_write)
        with open(backup, "rb") as fh:
            summary = target.import_(fh, overwrite=overwrite)
        assert summary.kept == kept
        assert summary.tasks == 3 - len(kept)
        beta = target.tasks.get_turn(SCOPE, "beta", 0).summary_md
        assert beta == ("# beta\n\nturn 0\n" if overwrite else "written meanwhile")
        assert target.tasks.get_turn(SCOPE, "alpha", 1).summary_md == "# alpha\n\nturn 1\n"
        assert target.tasks.list_tasks(SCOPE).total == 3
        assert target.fsck().clean


@pytest.mark.tree_only("removes an artifact's file")
def test_export_refuses_a_tree_fsck_would_flag(source: TreeStorage, tmp_path: Path) -> None:
    source.tasks.layout.artifact(SCOPE, "alpha", 1, "data.bin").unlink()
    backup = tmp_path / "web.tar.gz"
    with pytest.raises(ArchiveError, match="listed but missing.*fsck --repair"):
        source.export(backup, tenant="acme", project="web")
    assert not backup.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".~tmp")] == []
    trash = source.layout.trash_dir()
    assert not trash.exists() or list(trash.iterdir()) == []  # nothing of the taking is left


@pytest.mark.tree_only("a storage root")
def test_export_refuses_to_write_inside_the_root(source: TreeStorage) -> None:
    with pytest.raises(ArchiveError, match="inside the storage root"):
        source.export(source.layout.root / "b.tar.gz")


def test_the_cursor_key_comes_only_into_an_empty_deployment(
    source: Any, make: Make, tmp_path: Path
) -> None:
    backup = tmp_path / "all.tar.gz"
    source.export(backup)
    busy = make("busy")
    busy.tasks.put_turn(Scope("other", "p"), "t", 0, meta={}, summary_md="")
    own = busy.key(".cursor-key")
    with open(backup, "rb") as fh:
        busy.import_(fh)
    assert make("busy").key(".cursor-key") == own  # its cursors in flight stay valid
    cursor = source.tasks.list_tasks(SCOPE, limit=1).next_cursor
    with pytest.raises(Exception, match="cursor"):
        make("busy").tasks.list_tasks(SCOPE, limit=1, cursor=cursor)
    empty = make("empty")
    with open(backup, "rb") as fh:
        empty.import_(fh)
    assert empty.key(".cursor-key") == source.key(".cursor-key")
    assert make("empty").tasks.list_tasks(SCOPE, limit=1, cursor=cursor).tasks
