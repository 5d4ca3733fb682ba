"""The backup format: a gzip-compressed tar stream of records, checked member by member.

A backup holds the records of the tasks and memory stores it covers, under names a person
can read, and nothing derived (indexes, summaries, listings, digests, live memory files are
rebuilt on import)::

    tasks/<tenant>/<project>/<task>/task.json
    tasks/<tenant>/<project>/<task>/0000-turn/meta.json
    tasks/<tenant>/<project>/<task>/0000-turn/artifacts/<name>
    stores/<tenant>/<project>/<store_id>/store.json
    stores/<tenant>/<project>/<store_id>/versions/<version_id>.json
    keys/cursor-key                       (a whole-root backup only: cursors stay valid)
    manifest.json                         last: format, what it covers, counts by kind

Every member carries its SHA-256 in a PAX header, so a reader checks each one as it streams
past, in constant memory, and the manifest carries the count of members and a digest of
their (name, size, sha256) in order, so a reader knows at the end that nothing was left
out, added or reordered. Neither side ever holds a list of members: a backup of any size
is written and read in constant memory.

A backend writes a backup through :class:`BackupWriter` and reads one through
:class:`BackupReader`. Its records' JSON is the same for every backend, so a backup moves
between them; core/restore.py holds what every backend's import checks of what the members
say, and leaves where the members go to the backend.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol

from app.storage.core.errors import InvalidName, StorageError
from app.storage.core.names import (
    ARTIFACT_NAME_PATTERN,
    ID_PATTERN,
    STORE_ID_PATTERN,
    VERSION_ID_PATTERN,
    validate_artifact_name,
    validate_id,
)

FORMAT = "project-memory-backup"
VERSION = 2
MANIFEST = "manifest.json"
CURSOR_KEY_MEMBER = "keys/cursor-key"
PAX_SHA256 = "PROJECTMEMORY.sha256"
CHUNK = 1 << 20
MAX_MANIFEST_BYTES = 1 << 20
# A record is JSON the API accepted: a turn's meta and summary (at most 4 MiB of request
# body), a memory version (100 KB of content), a store record. Anything larger is not one.
MAX_RECORD_BYTES = 8 << 20

_ID = ID_PATTERN
_NAMES = re.compile(
    rf"(?P<kind>tasks)/(?P<tenant>{_ID})/(?P<project>{_ID})/(?P<task>{_ID})/"
    rf"(?:(?P<task_record>task\.json)|(?P<turn>[0-9]{{4}})-turn/"
    rf"(?:(?P<meta>meta\.json)|artifacts/(?P<artifact>{ARTIFACT_NAME_PATTERN})))"
    rf"|(?P<skind>stores)/(?P<stenant>{_ID})/(?P<sproject>{_ID})/(?P<store>{STORE_ID_PATTERN})/"
    rf"(?:(?P<store_record>store\.json)|versions/(?P<version>{VERSION_ID_PATTERN})\.json)"
    rf"|(?P<key>keys/cursor-key)",
    re.ASCII,
)


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def _forget_members(tar: tarfile.TarFile) -> None:
    """Drop the TarInfo objects tarfile keeps of every member it saw (constant memory)."""
    tar.members.clear()  # type: ignore[attr-defined]


class ArchiveError(StorageError):
    """The backup is corrupt, incomplete or foreign, or would overwrite data without leave."""


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What an export wrote."""

    path: Path
    counts: dict[str, int]
    members: int


@dataclass(frozen=True, slots=True)
class ImportSummary:
    """What an import restored; ``kept``: tasks created while it ran (after its check for
    existing ones, without ``--overwrite``), kept as they were instead of the backup's."""

    tasks: int
    stores: int
    counts: dict[str, int]
    kept: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MemberName:
    """What a member name says, checked by the same rules as a write through the API."""

    name: str
    kind: str  # "task", "turn", "artifact", "store", "version", "key"
    tenant: str = ""
    project: str = ""
    owner: str = ""  # the task id or the store id
    turn: int = -1
    leaf: str = ""  # the artifact name or the version id

    @property
    def record(self) -> bool:
        return self.kind not in ("artifact", "key")


def parse_name(name: str) -> MemberName:
    """Parse a member name; ArchiveError for anything the layout would refuse."""
    match = _NAMES.fullmatch(name) if name.isascii() else None
    if match is None:
        raise ArchiveError(f"{name!r}: not a member name this format allows")
    try:
        if match["key"]:
            return MemberName(name, "key")
        if match["kind"]:
            tenant = validate_id("tenant", match["tenant"])
            project = validate_id("project", match["project"])
            task = validate_id("task_id", match["task"])
            if match["task_record"]:
                return MemberName(name, "task", tenant, project, task)
            turn = int(match["turn"])
            if match["meta"]:
                return MemberName(name, "turn", tenant, project, task, turn)
            leaf = validate_artifact_name(match["artifact"])
            return MemberName(name, "artifact", tenant, project, task, turn, leaf)
        tenant = validate_id("tenant", match["stenant"])
        project = validate_id("project", match["sproject"])
        if match["store_record"]:
            return MemberName(name, "store", tenant, project, match["store"])
        return MemberName(name, "version", tenant, project, match["store"], leaf=match["version"])
    except InvalidName as exc:
        raise ArchiveError(f"{name!r}: {exc}") from None


def task_member(tenant: str, project: str, task: str, tail: str) -> str:
    return f"tasks/{tenant}/{project}/{task}/{tail}"


def store_member(tenant: str, project: str, store: str, tail: str) -> str:
    return f"stores/{tenant}/{project}/{store}/{tail}"


@dataclass
class Counts:
    tasks: int = 0
    turns: int = 0
    artifacts: int = 0
    artifact_bytes: int = 0
    stores: int = 0
    versions: int = 0

    def add(self, kind: str, size: int) -> None:
        if kind == "task":
            self.tasks += 1
        elif kind == "turn":
            self.turns += 1
        elif kind == "artifact":
            self.artifacts += 1
            self.artifact_bytes += size
        elif kind == "store":
            self.stores += 1
        elif kind == "version":
            self.versions += 1

    def as_dict(self) -> dict[str, int]:
        return {
            "tasks": self.tasks,
            "turns": self.turns,
            "artifacts": self.artifacts,
            "artifact_bytes": self.artifact_bytes,
            "stores": self.stores,
            "versions": self.versions,
        }


@dataclass
class _Chain:
    """The running digest of the members' (name, size, sha256), in order."""

    digest: Any = field(default_factory=hashlib.sha256)
    members: int = 0

    def add(self, name: str, size: int, sha256: str) -> None:
        self.digest.update(f"{name}\0{size}\0{sha256}\n".encode())
        self.members += 1


class BackupWriter:
    """Write a backup to ``fileobj``: members first, :meth:`finish` last."""

    def __init__(self, fileobj: IO[bytes], *, tenant: str | None, project: str | None) -> None:
        self._sink = _Sink(fileobj)
        # Closed by finish() or abandon().
        self._tar = tarfile.open(  # noqa: SIM115
            fileobj=self._sink,  # type: ignore[call-overload]
            mode="w|gz",
            format=tarfile.PAX_FORMAT,
        )
        self.scope = {"tenant": tenant, "project": project}
        self.counts = Counts()
        self._chain = _Chain()

    def add(self, name: str, data: bytes) -> None:
        """Add a small member (a record) held in memory."""
        self._add(name, len(data), hashlib.sha256(data).hexdigest(), _BytesReader(data))

    def add_stream(self, name: str, fh: IO[bytes], size: int, sha256: str) -> None:
        """Add a member streamed from ``fh``, whose size and SHA-256 its record names; the
        bytes are checked on the way (ArchiveError: the file no longer matches its record)."""
        checked = _Checked(fh, size)
        self._add(name, size, sha256, checked)
        if checked.size != size or checked.digest.hexdigest() != sha256:
            raise ArchiveError(f"{name}: its bytes no longer match its record; run fsck")

    def _add(self, name: str, size: int, sha256: str, fh: Readable) -> None:
        kind = parse_name(name).kind  # the writer writes nothing a reader would refuse
        info = tarfile.TarInfo(name)
        info.size = size
        info.mode = 0o600
        info.mtime = 0  # the records carry the times
        info.pax_headers = {PAX_SHA256: sha256}
        self._tar.addfile(info, fh)
        _forget_members(self._tar)
        self._chain.add(name, size, sha256)
        self.counts.add(kind, size)

    def abandon(self) -> None:
        """Stop writing (the export failed): nothing more reaches the output file."""
        self._sink.open = False
        self._tar.close()

    def finish(self, exported_at: str) -> dict[str, Any]:
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "scope": self.scope,
            "exported_at": exported_at,
            "counts": self.counts.as_dict(),
            "members": self._chain.members,
            "digest": self._chain.digest.hexdigest(),
        }
        data = json.dumps(manifest, indent=1).encode() + b"\n"
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        info.mode = 0o600
        self._tar.addfile(info, _BytesReader(data))
        self._tar.close()
        return manifest


@dataclass(frozen=True, slots=True)
class Member:
    """One member as it streams past: its parsed name, size, declared SHA-256 and bytes.

    Read ``stream`` to the end before asking for the next member; :meth:`BackupReader.
    members` checks the bytes against the declared SHA-256 once they are read.
    """

    name: MemberName
    size: int
    sha256: str
    stream: Readable


class BackupReader:
    """Read and check a backup from ``fileobj`` in one pass, in constant memory.

    ``max_artifact_bytes`` is the artifact limit of the importing server: a backup cannot
    bring in what the API would refuse.
    """

    def __init__(self, fileobj: BinaryIO, *, max_artifact_bytes: int) -> None:
        self.fileobj = fileobj
        self.max_artifact_bytes = max_artifact_bytes
        self.counts = Counts()
        self.manifest: dict[str, Any] | None = None
        self._chain = _Chain()
        self._scopes: set[tuple[str, str]] = set()  # every (tenant, project) a member names

    def members(self) -> Iterator[Member]:
        """Every member but the manifest, each checked; the manifest is checked at the end."""
        try:
            with tarfile.open(fileobj=self.fileobj, mode="r|gz") as tar:
                for info in tar:
                    _forget_members(tar)
                    if self.manifest is not None:
                        raise ArchiveError(f"{info.name!r} follows the manifest")
                    if info.name == MANIFEST:
                        self.manifest = self._read_manifest(tar, info)
                        continue
                    yield from self._member(tar, info)
                # A flipped bit late in the gzip stream shows as a CRC error only once the
                # stream is read to its end.
                while tar.fileobj is not None and tar.fileobj.read(CHUNK):
                    pass
        except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
            raise ArchiveError(f"the backup is corrupt or truncated ({exc})") from None
        self._check_manifest()

    def _member(self, tar: tarfile.TarFile, info: tarfile.TarInfo) -> Iterator[Member]:
        if not info.isreg():
            raise ArchiveError(f"{info.name!r}: not a regular file (links and devices are refused)")
        name = parse_name(info.name)
        limit = self.max_artifact_bytes if name.kind == "artifact" else MAX_RECORD_BYTES
        if info.size > limit:
            raise ArchiveError(f"{info.name}: {info.size} bytes, over the limit of {limit}")
        sha256 = info.pax_headers.get(PAX_SHA256, "")
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ArchiveError(f"{info.name}: no SHA-256 in its header")
        fh = tar.extractfile(info)
        if fh is None:
            raise ArchiveError(f"{info.name}: unreadable")
        checked = _Checked(_Damage(fh), info.size)
        yield Member(name, info.size, sha256, checked)
        while checked.read(CHUNK):  # whatever the consumer left unread
            pass
        if checked.digest.hexdigest() != sha256:
            raise ArchiveError(f"{info.name}: its bytes do not match its SHA-256 (corrupted)")
        self._chain.add(info.name, info.size, sha256)
        self.counts.add(name.kind, info.size)
        if name.kind != "key":
            self._scopes.add((name.tenant, name.project))

    def _read_manifest(self, tar: tarfile.TarFile, info: tarfile.TarInfo) -> dict[str, Any]:
        if not info.isreg() or info.size > MAX_MANIFEST_BYTES:
            raise ArchiveError("manifest.json is not a small regular file")
        fh = tar.extractfile(info)
        try:
            manifest = json.loads(fh.read() if fh else b"")
        except ValueError as exc:
            raise ArchiveError(f"manifest.json is not JSON ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ArchiveError("not a project-memory backup: its manifest is missing or foreign")
        if manifest.get("version") != VERSION:
            raise ArchiveError(f"unsupported backup version {manifest.get('version')!r}")
        return manifest

    def _check_manifest(self) -> None:
        manifest = self.manifest
        if manifest is None:
            raise ArchiveError("the backup has no manifest: it is truncated")
        if (
            manifest.get("members") != self._chain.members
            or manifest.get("digest") != self._chain.digest.hexdigest()
        ):
            raise ArchiveError(
                "the members do not match the manifest (missing, added or reordered)"
            )
        if manifest.get("counts") != self.counts.as_dict():
            raise ArchiveError("the counts do not match the manifest")
        # The scope the backup says it is of (export's --tenant/--project) holds every member:
        # a relabelled backup would otherwise restore into projects its label does not name.
        scope = manifest.get("scope")
        if not isinstance(scope, dict):
            raise ArchiveError("the manifest names no scope")
        for part, index in (("tenant", 0), ("project", 1)):
            said = scope.get(part)
            if said is None:
                continue
            outside = sorted({f"{t}/{p}" for t, p in self._scopes if (t, p)[index] != said})
            if outside:
                raise ArchiveError(
                    f"the manifest says a backup of {part} {said!r}, but it holds"
                    f" {', '.join(outside[:3])}"
                )


class _Sink:
    """The output file, until the writer is abandoned: then writes go nowhere (tarfile
    flushes its compressor when it is closed or collected)."""

    def __init__(self, fileobj: IO[bytes]) -> None:
        self.fileobj = fileobj
        self.open = True

    def write(self, data: bytes) -> int:
        if self.open:
            self.fileobj.write(data)
        return len(data)

    def flush(self) -> None:
        pass


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)

    def read(self, n: int = -1) -> bytes:
        n = len(self._view) if n is None or n < 0 else n
        chunk, self._view = bytes(self._view[:n]), self._view[n:]
        return chunk


class _Damage:
    """A member's bytes as tarfile reads them. Its consumer reads them outside
    :meth:`BackupReader.members`, so a damaged stream is ArchiveError here as well."""

    def __init__(self, fh: Readable) -> None:
        self.fh = fh

    def read(self, n: int = -1) -> bytes:
        try:
            return self.fh.read(n)
        except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
            raise ArchiveError(f"the backup is corrupt or truncated ({exc})") from None


class _Checked:
    """A read-through wrapper that hashes and counts, and never reads past ``limit``.

    A read returns all ``n`` bytes asked for unless the source ends first: tarfile takes a
    short read for the end of the data, and a network body (an object store's) may return
    less than asked at any read.
    """

    def __init__(self, fh: Readable, limit: int) -> None:
        self.fh = fh
        self.left = limit
        self.size = 0
        self.digest = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.fh.read(n) if n else b""
        while data and len(data) < n:
            more = self.fh.read(n - len(data))
            if not more:
                break
            data += more
        self.left -= len(data)
        self.size += len(data)
        self.digest.update(data)
        return data
