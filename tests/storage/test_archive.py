"""Export/import: a byte-identical round trip; a corrupt archive imports nothing."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from app.storage import Scope, TaskStore
from app.storage.archive import ArchiveError, export_project, import_project
from app.storage.fsck import fsck
from app.storage.layout import PROJECT_DIGEST
from tests.conftest import FixedClock

TASKS = {"alpha": 2, "beta": 1, "index.json": 1}  # a task named like a reserved file works


def files(project_dir: Path) -> dict[str, bytes]:
    """Every file of the project's tasks and its digest (the SQLite listing is derived)."""
    out = {}
    for path in sorted(project_dir.rglob("*")):
        if path.is_file() and not path.name.startswith("_listing"):
            out[str(path.relative_to(project_dir))] = path.read_bytes()
    return out


@pytest.fixture
def source(store: TaskStore, clock: FixedClock, scope: Scope) -> TaskStore:
    for task, turns in TASKS.items():
        for turn in range(turns):
            store.put_turn(
                scope,
                task,
                turn,
                meta={"n": turn, "text": "ünïcode"},
                summary_md=f"# {task}\n\nturn {turn}\n",
                actor="tok_owner",
            )
            clock.advance(seconds=1)
    store.put_artifact(
        scope, "alpha", 1, "data.bin", io.BytesIO(os.urandom(300_000)), content_type="x/y"
    )
    store.put_artifact(scope, "beta", 0, "empty", io.BytesIO(b""), content_type="text/plain")
    return store


def other_store(tmp_path: Path, clock: FixedClock) -> TaskStore:
    return TaskStore(tmp_path / "other-root", clock=clock, lock_timeout=5.0)


def test_round_trip_is_byte_identical(
    source: TaskStore, scope: Scope, tmp_path: Path, clock: FixedClock
) -> None:
    archive = tmp_path / "web.tar.gz"
    summary = export_project(source, scope, archive)
    assert summary.tasks == 3
    target = other_store(tmp_path, clock)
    result = import_project(target, archive)
    assert (result.tenant, result.project, result.tasks) == ("acme", "web", 3)

    before = files(source.layout.project_dir(scope))
    after = files(target.layout.project_dir(scope))
    assert set(after) == set(before)
    assert after == before  # records, index.json, summaries, artifacts and _project.md
    assert PROJECT_DIGEST in after
    assert fsck(target).clean
    page = target.list_tasks(scope, limit=10)
    assert [t.task_id for t in page.tasks] == [t.task_id for t in source.list_tasks(scope).tasks]
    stream = target.open_artifact(scope, "alpha", 1, "data.bin")
    with stream.file:
        original = source.layout.artifact(scope, "alpha", 1, "data.bin").read_bytes()
        assert stream.file.read() == original


def test_import_into_another_tenant_and_project(
    source: TaskStore, scope: Scope, tmp_path: Path
) -> None:
    archive = tmp_path / "web.tar.gz"
    export_project(source, scope, archive)
    other = Scope("globex", "copy")
    import_project(source, archive, tenant=other.tenant, project=other.project)
    before = files(source.layout.project_dir(scope))
    after = files(source.layout.project_dir(other))
    digest_before, digest_after = before.pop(PROJECT_DIGEST), after.pop(PROJECT_DIGEST)
    assert after == before
    assert (
        b"globex/copy" in digest_after
        and digest_after.replace(b"globex/copy", b"acme/web") == digest_before
    )
    assert fsck(source).clean

    # Export of the copy carries the same files with the same hashes.
    again = tmp_path / "copy.tar.gz"
    export_project(source, other, again)
    manifests = [_manifest(archive), _manifest(again)]
    assert [m["tenant"] for m in manifests] == ["acme", "globex"]
    strip = [
        {f["path"]: f["sha256"] for f in m["files"] if f["path"] != "project.md"} for m in manifests
    ]
    assert strip[0] == strip[1]


def _manifest(archive: Path) -> dict:  # type: ignore[type-arg]
    with tarfile.open(archive, "r:gz") as tar:
        fh = tar.extractfile("manifest.json")
        assert fh is not None
        return json.loads(fh.read())  # type: ignore[no-any-return]


def _assert_nothing_imported(target: TaskStore, scope: Scope) -> None:
    project_dir = target.layout.project_dir(scope)
    leftovers = list(project_dir.iterdir()) if project_dir.exists() else []
    assert leftovers == [], leftovers


def test_corrupted_archive_is_refused_and_nothing_imported(
    source: TaskStore, scope: Scope, tmp_path: Path, clock: FixedClock
) -> None:
    archive = tmp_path / "web.tar.gz"
    export_project(source, scope, archive)
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(bytes(data))
    target = other_store(tmp_path, clock)
    with pytest.raises(ArchiveError, match="corrupt"):
        import_project(target, broken)
    _assert_nothing_imported(target, scope)

    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(archive.read_bytes()[: len(data) - 100])
    with pytest.raises(ArchiveError, match="corrupt or truncated"):
        import_project(target, truncated)
    _assert_nothing_imported(target, scope)


def _rewrite(archive: Path, out: Path, change: dict[str, bytes | None]) -> None:
    """Copy ``archive`` with some members replaced (bytes) or dropped (None)."""
    with tarfile.open(archive, "r:gz") as src, tarfile.open(out, "w:gz") as dst:
        for member in src:
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name in change:
                if change[member.name] is None:
                    continue
                data = change[member.name]  # type: ignore[assignment]
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tasks/alpha/0001-turn/artifacts/data.bin": b"swapped"}, "differ from the manifest"),
        ({"tasks/beta/0000-turn/summary.md": None}, "missing"),
        ({"manifest.json": None}, "manifest.json missing"),
        ({"tasks/alpha/0000-turn/meta.json": b'{"torn'}, "not valid JSON"),
    ],
)
def test_tampered_archive_is_refused(
    source: TaskStore,
    scope: Scope,
    tmp_path: Path,
    clock: FixedClock,
    change: dict[str, bytes | None],
    message: str,
) -> None:
    archive = tmp_path / "web.tar.gz"
    export_project(source, scope, archive)
    tampered = tmp_path / "tampered.tar.gz"
    _rewrite(archive, tampered, change)
    target = other_store(tmp_path, clock)
    with pytest.raises(ArchiveError, match=message):
        import_project(target, tampered)
    _assert_nothing_imported(target, scope)


def test_unsafe_member_names_are_refused(
    source: TaskStore, scope: Scope, tmp_path: Path, clock: FixedClock
) -> None:
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("tasks/../../../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    target = other_store(tmp_path, clock)
    with pytest.raises(ArchiveError, match="not a path this format allows"):
        import_project(target, evil)
    assert not (tmp_path / "escape.txt").exists()

    linky = tmp_path / "link.tar.gz"
    with tarfile.open(linky, "w:gz") as tar:
        info = tarfile.TarInfo("tasks/alpha/task.json")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(ArchiveError, match="not a regular file"):
        import_project(target, linky)


def test_existing_tasks_are_kept_unless_overwrite(
    source: TaskStore, scope: Scope, tmp_path: Path, clock: FixedClock
) -> None:
    archive = tmp_path / "web.tar.gz"
    export_project(source, scope, archive)
    target = other_store(tmp_path, clock)
    target.put_turn(scope, "beta", 0, meta={}, summary_md="local beta")
    target.put_turn(scope, "mine", 0, meta={}, summary_md="local only")
    with pytest.raises(ArchiveError, match="already exist.*beta.*--overwrite"):
        import_project(target, archive)
    assert target.get_turn(scope, "beta", 0).summary_md == "local beta"
    assert not target.layout.task_dir(scope, "alpha").exists()

    import_project(target, archive, overwrite=True)
    assert target.get_turn(scope, "beta", 0).summary_md == "# beta\n\nturn 0\n"
    assert target.get_turn(scope, "mine", 0).summary_md == "local only"
    assert target.list_tasks(scope).total == 4
    assert fsck(target).clean
    assert not any(target.layout.trash_dir().iterdir())


def test_gzip_of_export_is_a_plain_tar(source: TaskStore, scope: Scope, tmp_path: Path) -> None:
    """A person can read the archive with tar: names are the layout's names."""
    archive = tmp_path / "web.tar.gz"
    export_project(source, scope, archive)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(archive.read_bytes()))) as tar:
        names = tar.getnames()
    assert names[0] == "project.md" and names[-1] == "manifest.json"
    assert "tasks/alpha/0001-turn/artifacts/data.bin" in names
    assert "tasks/index.json/index.json" in names


def test_export_refuses_a_tree_fsck_would_flag(
    source: TaskStore, scope: Scope, tmp_path: Path
) -> None:
    source.layout.artifact(scope, "alpha", 1, "data.bin").unlink()
    archive = tmp_path / "web.tar.gz"
    with pytest.raises(ArchiveError, match="listed but missing.*fsck --repair"):
        export_project(source, scope, archive)
    assert not archive.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".~tmp")] == []
