"""Export a project to a ``.tar.gz`` and import it back, verified file by file.

The archive holds the project's files exactly as they are on disk, under names a person can
read, and a manifest with the size and sha256 of each::

    manifest.json                               format, source tenant/project, files
    project.md                                  the digest at export time
    tasks/<task>/task.json, index.json
    tasks/<task>/0000-turn/meta.json, summary.md, artifacts/<name>

Import reads the whole archive once to verify it (every member a regular file with a name
the layout allows, every size and sha256 as the manifest says, every record parseable)
before it writes anything; then it stages each task under a temp name inside the target
project, checks the bytes again while writing them, and only when every task is staged
renames them into place, one task lock at a time. A corrupt archive therefore changes
nothing, and an interrupted import leaves only temp directories the sweeper removes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

from .atomic import CHUNK, atomic_file, fsync_dir, make_dirs, write_atomic
from .clock import iso
from .errors import Corrupt, StorageError
from .fsck import is_id
from .layout import (
    ARTIFACT_NAME_PATTERN,
    ARTIFACTS_DIR,
    ID_PATTERN,
    TASK_INDEX,
    TASK_RECORD,
    TMP_PREFIX,
    TURN_META,
    TURN_SUMMARY,
    Scope,
    turn_dirname,
)
from .locks import locked
from .records import read_turn, turn_dirs, turn_from_json
from .tasks import TaskStore

FORMAT = "project-memory-export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DIGEST = "project.md"
MAX_MANIFEST_BYTES = 64 << 20

_MEMBER_RE = re.compile(
    rf"tasks/(?P<task>{ID_PATTERN})/(?:(?P<file>{TASK_RECORD}|{TASK_INDEX})"
    rf"|(?P<turn>\d{{4}})-turn/(?:(?P<turnfile>{TURN_META}|{TURN_SUMMARY})"
    rf"|artifacts/(?P<artifact>{ARTIFACT_NAME_PATTERN})))"
)


class ArchiveError(StorageError):
    """The archive is corrupt, incomplete, or would overwrite tasks without leave."""


@dataclass(frozen=True, slots=True)
class ArchiveSummary:
    tenant: str
    project: str
    tasks: int
    files: int
    bytes: int


class _Hashing(io.RawIOBase):
    """Read-through wrapper hashing what tarfile reads from an open file."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.digest = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        self.digest.update(data)
        self.size += len(data)
        return data


# -- export ---------------------------------------------------------------------------------
def _open_below(store: TaskStore, path: Path) -> IO[bytes] | None:
    """Open a file of the tree, refusing a link anywhere on the way (None when absent)."""
    fd = store.layout.open_read(str(path))
    return None if fd is None else os.fdopen(fd, "rb")


def _refuse_links(store: TaskStore, directory: Path) -> None:
    """Refuse to export a directory holding a planted link: a backup that silently left
    something out would be found out only at restore time."""
    for entry in store.layout.tree.entries(directory):
        if entry.is_link:
            raise ArchiveError(
                f"{entry.path.relative_to(store.layout.root)} is a symlink; the export never"
                " follows one (fsck lists every link: remove them and export again)"
            )


def prefix(task_id: str, turn: int) -> str:
    return f"tasks/{task_id}/{turn_dirname(turn)}"


def _snapshot_task(store: TaskStore, scope: Scope, task_id: str) -> list[tuple[str, IO[bytes]]]:
    """Open every file of a task under its lock; the open files stay a consistent snapshot.

    Writers replace files by rename, never in place, so an open descriptor keeps the bytes
    it had when the lock was held, and the lock is not held while 50 MiB artifacts stream.
    """
    task_dir = store.layout.task_dir(scope, task_id)
    opened: list[tuple[str, IO[bytes]]] = []
    with locked(
        store.layout.check_inside(store.layout.task_lock(scope, task_id)), store.lock_timeout
    ):
        try:
            for name in (TASK_RECORD, TASK_INDEX):
                fh = _open_below(store, task_dir / name)
                if fh is not None:
                    opened.append((f"tasks/{task_id}/{name}", fh))
            _refuse_links(store, task_dir)
            for turn, turn_dir in turn_dirs(store.layout.tree, task_dir):
                _refuse_links(store, turn_dir)
                _refuse_links(store, turn_dir / ARTIFACTS_DIR)
                meta = _open_below(store, turn_dir / TURN_META)
                if meta is None:
                    continue  # no commit point: not part of the project
                opened.append((f"{prefix(task_id, turn)}/{TURN_META}", meta))
                record = read_turn(turn_dir)
                if record is None:
                    continue
                summary = _open_below(store, turn_dir / TURN_SUMMARY)
                if summary is not None:
                    opened.append((f"{prefix(task_id, turn)}/{TURN_SUMMARY}", summary))
                for art in record.artifacts:
                    path = store.layout.artifact(scope, task_id, turn, art.name)
                    fh = _open_below(store, path)
                    if fh is None:
                        raise ArchiveError(
                            f"{task_id} turn {turn}: artifact {art.name} is listed but missing;"
                            " run `flask --app wsgi fsck --repair` first"
                        ) from None
                    opened.append((f"{prefix(task_id, turn)}/artifacts/{art.name}", fh))
        except BaseException:
            for _, fh in opened:
                fh.close()
            raise
    return opened


def export_project(store: TaskStore, scope: Scope, out: Path) -> ArchiveSummary:
    """Write ``scope``'s tasks, turns, artifacts and digest to the .tar.gz ``out``."""
    project_dir = store.layout.project_dir(scope)
    if not store.layout.tree.is_dir(project_dir):
        raise ArchiveError(f"project {scope.tenant}/{scope.project} does not exist")
    digest_fh, _ = store.open_digest(scope)
    with digest_fh:
        digest = digest_fh.read()
    out = Path(os.path.abspath(out))
    files: list[dict[str, Any]] = []
    tasks = 0
    with (
        atomic_file(out) as raw,
        tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar,
    ):
        _add(tar, DIGEST, io.BytesIO(digest), len(digest), files)
        _refuse_links(store, project_dir)
        for entry in store.layout.tree.entries(project_dir):
            if not is_id(entry.name) or not entry.is_dir:
                continue
            snapshot = _snapshot_task(store, scope, entry.name)
            tasks += 1 if snapshot else 0
            try:
                for name, fh in snapshot:
                    _add(tar, name, fh, os.fstat(fh.fileno()).st_size, files)
            finally:
                for _, fh in snapshot:
                    fh.close()
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "tenant": scope.tenant,
            "project": scope.project,
            "exported_at": iso(store.clock()),
            "files": files,
        }
        data = json.dumps(manifest, indent=1).encode() + b"\n"
        _add(tar, MANIFEST, io.BytesIO(data), len(data), None)
    return ArchiveSummary(
        scope.tenant, scope.project, tasks, len(files), sum(f["size"] for f in files)
    )


def _add(
    tar: tarfile.TarFile, name: str, fh: IO[bytes], size: int, files: list[dict[str, Any]] | None
) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0  # the records carry the times; the archive need not
    hashing = _Hashing(fh)
    tar.addfile(info, hashing)
    if hashing.size != size:
        raise ArchiveError(f"{name} changed size while it was exported")
    if files is not None:
        files.append({"path": name, "size": size, "sha256": hashing.digest.hexdigest()})


# -- import ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _reading(path: Path) -> Iterator[tarfile.TarFile]:
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            yield tar
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise ArchiveError(f"{path}: no such file") from None
        raise ArchiveError(f"{path}: archive is corrupt or truncated ({exc})") from None


def _members(tar: tarfile.TarFile) -> Iterator[tuple[tarfile.TarInfo, IO[bytes]]]:
    seen: set[str] = set()
    for member in tar:
        name = member.name
        if not member.isreg():
            raise ArchiveError(f"{name}: not a regular file (links and devices are refused)")
        if name in seen:
            raise ArchiveError(f"{name}: appears twice")
        seen.add(name)
        if name not in (MANIFEST, DIGEST) and not _MEMBER_RE.fullmatch(name):
            raise ArchiveError(f"{name}: not a path this format allows")
        fh = tar.extractfile(member)
        if fh is None:
            raise ArchiveError(f"{name}: unreadable")
        yield member, fh


def _hash_stream(fh: IO[bytes], sink: IO[bytes] | None = None) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    while chunk := fh.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if sink is not None:
            sink.write(chunk)
    return size, digest.hexdigest()


def verify_archive(path: Path) -> dict[str, Any]:
    """Read the whole archive and return its manifest, or raise ArchiveError."""
    actual: dict[str, tuple[int, str]] = {}
    listed: dict[str, tuple[int, str]] = {}
    manifest: Any = None
    with _reading(path) as tar:
        for member, fh in _members(tar):
            if member.name == MANIFEST:
                if member.size > MAX_MANIFEST_BYTES:
                    raise ArchiveError("manifest.json is implausibly large")
                try:
                    manifest = json.loads(fh.read())
                except ValueError as exc:
                    raise ArchiveError(f"manifest.json is not JSON ({exc})") from None
                continue
            if member.name.endswith(f"/{TURN_META}") or member.name.endswith(f"/{TASK_RECORD}"):
                data = fh.read()
                listed.update(_check_record(member.name, data))
                actual[member.name] = (len(data), hashlib.sha256(data).hexdigest())
            else:
                actual[member.name] = _hash_stream(fh)
        # tarfile stops at the first header it cannot parse as if the archive ended there;
        # reading the gzip stream to its end checks its CRC, so a flipped bit anywhere is
        # reported as corruption rather than as a missing manifest or missing files.
        while tar.fileobj is not None and tar.fileobj.read(CHUNK):
            pass
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArchiveError("not a project-memory export: manifest.json missing or foreign")
    if manifest.get("version") != FORMAT_VERSION:
        raise ArchiveError(f"unsupported export version {manifest.get('version')!r}")
    try:
        expected = {f["path"]: (int(f["size"]), str(f["sha256"])) for f in manifest["files"]}
        Scope(manifest["tenant"], manifest["project"])
    except (KeyError, TypeError, ValueError, StorageError) as exc:
        raise ArchiveError(f"manifest.json is malformed ({exc!r})") from None
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    if missing or extra:
        raise ArchiveError(f"archive and manifest disagree: missing {missing}, unlisted {extra}")
    for name, (size, sha) in sorted(expected.items()):
        if actual[name] != (size, sha):
            raise ArchiveError(f"{name}: size/sha256 differ from the manifest (corrupted)")
    for name, want in sorted(listed.items()):
        if actual.get(name) != want:
            raise ArchiveError(f"{name}: listed in its meta.json but missing or different")
    return manifest


def _check_record(name: str, data: bytes) -> dict[str, tuple[int, str]]:
    """Parse a record; return the artifacts a turn record lists (path -> size, sha256)."""
    try:
        obj = json.loads(data)
    except ValueError:
        raise ArchiveError(f"{name}: not valid JSON") from None
    match = _MEMBER_RE.fullmatch(name)
    assert match is not None  # _members checked every name
    if name.endswith(TASK_RECORD):
        if not isinstance(obj, dict):
            raise ArchiveError(f"{name}: not a task record")
        return {}
    try:
        record = turn_from_json(obj, Path(name))
    except Corrupt as exc:
        raise ArchiveError(str(exc)) from None
    if record.task_id != match["task"] or record.turn != int(match["turn"]):
        raise ArchiveError(f"{name}: names task {record.task_id} turn {record.turn}")
    prefix = name.rsplit("/", 1)[0]
    return {f"{prefix}/artifacts/{a.name}": (a.size, a.sha256) for a in record.artifacts}


def import_project(
    store: TaskStore,
    archive: Path,
    *,
    tenant: str | None = None,
    project: str | None = None,
    overwrite: bool = False,
) -> ArchiveSummary:
    """Verify ``archive`` and load its tasks into tenant/project (default: the source's)."""
    manifest = verify_archive(archive)
    scope = Scope(tenant or manifest["tenant"], project or manifest["project"])
    expected = {f["path"]: (int(f["size"]), str(f["sha256"])) for f in manifest["files"]}
    task_ids = sorted({m["task"] for n in expected if (m := _MEMBER_RE.fullmatch(n))})
    project_dir = store.layout.project_dir(scope)
    store.layout.check_inside(project_dir)
    tree = store.layout.tree
    for entry in tree.entries(project_dir):
        if entry.is_link and entry.name in task_ids:
            raise ArchiveError(
                f"{entry.path.relative_to(store.layout.root)} is a symlink; the import never"
                " replaces or follows one (remove it and import again). Nothing was imported."
            )
    existing = [t for t in task_ids if tree.lstat(store.layout.task_dir(scope, t)) is not None]
    if existing and not overwrite:
        raise ArchiveError(
            f"{len(existing)} task(s) already exist in {scope.tenant}/{scope.project}: "
            f"{', '.join(existing[:10])}; pass --overwrite to replace them. Nothing was imported."
        )
    make_dirs(project_dir, store.layout.root)
    staging = project_dir / f"{TMP_PREFIX}import-{secrets.token_hex(8)}"
    os.mkdir(staging)
    trashed: list[Path] = []
    try:
        _stage(archive, staging, expected)
        for task_id in task_ids:
            trashed += _publish(store, scope, task_id, staging / task_id, overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for path in trashed:
            shutil.rmtree(path, ignore_errors=True)
    store.refresh_digest(scope, force=True)
    return ArchiveSummary(
        scope.tenant,
        scope.project,
        len(task_ids),
        len(expected),
        sum(size for size, _ in expected.values()),
    )


def _stage(archive: Path, staging: Path, expected: dict[str, tuple[int, str]]) -> None:
    """Write every task file under ``staging``, checking each against the manifest again."""
    with _reading(archive) as tar:
        for member, fh in _members(tar):
            if member.name in (MANIFEST, DIGEST):
                continue  # the digest is rendered again for the target project
            target = staging / member.name.removeprefix("tasks/")
            make_dirs(target.parent, staging)
            counted = _Hashing(fh)
            write_atomic(target, iter(partial(counted.read, CHUNK), b""))
            if (counted.size, counted.digest.hexdigest()) != expected.get(member.name):
                # The file changed since verification: refuse, nothing is in place yet.
                raise ArchiveError(f"{member.name}: changed since it was verified")


def _publish(
    store: TaskStore, scope: Scope, task_id: str, staged: Path, overwrite: bool
) -> list[Path]:
    """Move one staged task into place under its lock; return what went to the trash."""
    task_dir = store.layout.task_dir(scope, task_id)
    trashed: list[Path] = []
    with store._task_txn(scope, task_id) as txn:
        if task_dir.exists():
            if not overwrite:
                raise ArchiveError(f"task {task_id} appeared during the import; not replaced")
            txn.begin()
            trashed.append(store._trash(task_dir))
        txn.begin()
        os.rename(staged, task_dir)
        fsync_dir(task_dir.parent)
        store.repair_task(scope, task_id)
    return trashed
