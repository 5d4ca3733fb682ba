"""What each memory-store request means apart from where it is stored: the records a write
makes, the checks that refuse it, and the ids and times it hands out.

Both engines (the tree's, tree/stores/; PostgreSQL's, pg/stores.py) call these, so ids,
times, records and errors are the same whichever one runs; an engine only reads and writes.
A memory's create, update and delete are decided here whole (:func:`created_version`,
:func:`updated_version`, :func:`deleted_version`) over the store's :class:`MemoryLookup`,
inside the engine's transaction on the store; the engine then charges and commits the
version they return.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ulid import ULID

from app.storage.core import store_rules as rules
from app.storage.core.clock import iso_us
from app.storage.core.errors import InvalidName, NotFound, NotOwner
from app.storage.core.names import MEMORY_ID_RE, Scope
from app.storage.core.store_models import (
    ArchivedStoreUpdate,
    ContentPreconditionFailed,
    HeadVersion,
    PathConflict,
    StoreArchived,
    StoreFull,
)
from app.storage.core.store_records import (
    MemoryLookup,
    MemoryRow,
    StoreRecord,
    VersionRecord,
    sha256_hex,
)

VERSION_PREFIX = "memver_"


# -- stores --------------------------------------------------------------------------------
def new_store(
    scope: Scope,
    now_us: int,
    *,
    name: object,
    description: object,
    metadata: object,
    creator: str | None,
) -> StoreRecord:
    """The record of a new, empty store (InvalidName for a bad name, description or bag)."""
    return StoreRecord(
        id=f"memstore_{ULID()}",
        name=rules.validate_name(name),
        description=rules.validate_description("" if description is None else description),
        metadata=rules.validate_metadata({} if metadata is None else metadata),
        created_at=iso_us(now_us),
        created_us=now_us,
        updated_at=iso_us(now_us),
        archived_at=None,
        tenant=scope.tenant,
        project=scope.project,
        created_by=creator,
    )


def check_creator(record: StoreRecord, only_creator: str | None) -> None:
    """Refuse a change by anyone but the store's creator when ``only_creator`` is given."""
    if only_creator is not None and record.created_by != only_creator:
        raise NotOwner(
            f"only the creator of memory store {record.id} or a project_admin may change it"
        )


def check_writable(record: StoreRecord) -> None:
    """Refuse a memory create or update in an archived store (archiving is one-way). A delete
    is no such write: an archived store's memories may still be deleted, as the reference
    API allows, so that what must go can go without deleting the whole store."""
    if record.archived_at:
        raise StoreArchived(f"memory store {record.id} is archived and read-only")


def store_update_request(name: object, description: object) -> tuple[str | None, str | None]:
    """The checked (name, description) of a store update; None: not given."""
    return (
        None if name is None else rules.validate_name(name),
        None if description is None else rules.validate_description(description),
    )


def check_updatable(record: StoreRecord, store_id: str, only_creator: str | None) -> None:
    """Refuse an update by anyone but the creator (with ``only_creator``), or of an archived
    store."""
    check_creator(record, only_creator)
    if record.archived_at:
        raise ArchivedStoreUpdate(
            f"memory store {store_id} is archived: its name, description and metadata can no"
            " longer change"
        )


def changed_store(
    record: StoreRecord,
    now_us: int,
    *,
    name: str | None,
    description: str | None,
    metadata: object,
) -> StoreRecord | None:
    """``record`` with a new name, description and/or metadata patch (each None: as it is);
    None when nothing changes, so that a no-op writes nothing."""
    new = record
    if name is not None:
        new = replace(new, name=name)
    if description is not None:
        new = replace(new, description=description)
    if metadata is not None:
        new = replace(new, metadata=rules.patch_metadata(record.metadata, metadata))
    if new == record:
        return None
    # The clock may stand behind the store's creation (a step back): never before it.
    return replace(new, updated_at=iso_us(max(now_us, record.created_us)))


def archived_store(record: StoreRecord, now_us: int) -> StoreRecord:
    """``record`` archived now (never before its creation). Archiving changes the store, so
    its ``updated_at`` is the archive time too."""
    at = iso_us(max(now_us, record.created_us))
    return replace(record, archived_at=at, updated_at=at)


# -- memories ------------------------------------------------------------------------------
def live_memory(reader: MemoryLookup, memory_id: str) -> MemoryRow:
    """The live memory ``memory_id``, or NotFound (also for a malformed id)."""
    row = reader.memory(memory_id) if MEMORY_ID_RE.fullmatch(str(memory_id)) else None
    if row is None:
        raise NotFound(f"memory {memory_id} not found")
    return row


def check_free(reader: MemoryLookup, path: str, exclude: str | None) -> None:
    """Refuse a path held by another memory, or an ancestor/descendant of one."""
    found = reader.occupant(path, exclude)
    if found is not None:
        raise PathConflict(path, found[0], found[1])


def next_version_id(last: tuple[str, int], now_us: int) -> tuple[str, int]:
    """A version id and time, both strictly after the store's ``last`` (the clock may stall
    or step back, and version ids must still grow with time within a store)."""
    last_id, last_us = last
    us = max(now_us, last_us)
    candidate = ULID.from_timestamp(us / 1_000_000)
    if last_id and str(candidate) <= last_id.removeprefix(VERSION_PREFIX):
        candidate = ULID.from_int(int(ULID.from_str(last_id.removeprefix(VERSION_PREFIX))) + 1)
    return f"{VERSION_PREFIX}{candidate}", us


def new_version(
    last: tuple[str, int],
    now_us: int,
    store_id: str,
    *,
    memory_id: str,
    operation: str,
    path: str,
    content: str | None,
    actor: dict[str, Any] | None,
    row: MemoryRow | None,
) -> VersionRecord:
    """The next version of a store (``last``: its last version's id and time) for the
    memory ``row`` (None: a new memory)."""
    version_id, us = next_version_id(last, now_us)
    moved = row is None or row.path != path
    return VersionRecord.new(
        id=version_id,
        store_id=store_id,
        memory_id=memory_id,
        operation=operation,
        path=path,
        content=content,
        actor=actor,
        created_us=us,
        created_at=iso_us(us),
        memory_created_at=row.created_at if row else iso_us(us),
        path_since=version_id if moved or row is None else row.path_since,
        previous=row.head if row else None,
    )


def update_request(
    content: object, path: object, precondition_sha256: object
) -> tuple[str | None, str | None, str | None]:
    """The checked (path, content, precondition hash) of an update; None: not given."""
    if content is None and path is None:
        raise InvalidName("content", None, "at least one of content or path is required")
    new_path = None if path is None else rules.validate_memory_path(path)
    new_content = None if content is None else rules.validate_content(content)
    expected = (
        None
        if precondition_sha256 is None
        else rules.validate_sha256(precondition_sha256, "precondition.content_sha256")
    )
    return new_path, new_content, expected


def update_target(
    row: MemoryRow,
    memory_id: str,
    new_path: str | None,
    new_content: str | None,
    expected: str | None,
) -> tuple[str, bool]:
    """The path an update leaves ``row`` at, and whether it changes nothing at all."""
    target = row.path if new_path is None else new_path
    sha = row.sha if new_content is None else sha256_hex(new_content.encode("utf-8"))
    unchanged = target == row.path and sha == row.sha
    if expected is not None and expected != row.sha and not unchanged:
        # A failed precondition whose requested state already holds is a success.
        raise ContentPreconditionFailed(
            f"memory {memory_id} has content_sha256 {row.sha}, not {expected}; re-read it and retry"
        )
    return target, unchanged


def delete_request(expected_sha256: object) -> str | None:
    """The checked precondition hash of a delete; None: not given."""
    if expected_sha256 is None:
        return None
    return rules.validate_sha256(expected_sha256, "expected_content_sha256")


def check_delete(row: MemoryRow, memory_id: str, expected: str | None) -> None:
    """Refuse to delete ``row`` when its content is not the one the client expects."""
    if expected is not None and expected != row.sha:
        raise ContentPreconditionFailed(
            f"memory {memory_id} has content_sha256 {row.sha}, not {expected}; nothing was deleted"
        )


# -- versions ------------------------------------------------------------------------------
def check_redactable(version_id: str, live: MemoryRow | None) -> None:
    """Refuse to redact the head of a live memory (``live``: the version's memory, if live):
    it would leave a live memory without content."""
    if live is not None and live.head == version_id:
        raise HeadVersion(
            f"version {version_id} is the head of live memory {live.id}: write a new"
            " version (or delete the memory) first, then redact this one"
        )


# -- a memory's writes, decided over the store's rows ------------------------------------------
def created_version(
    reader: MemoryLookup,
    now_us: Callable[[], int],
    store_id: str,
    *,
    path: str,
    content: str,
    actor: dict[str, Any] | None,
    max_memories: int,
) -> VersionRecord:
    """The version that creates a memory at ``path``: refused when the path is taken or the
    store holds ``max_memories`` already."""
    check_free(reader, path, None)
    if reader.count() >= max_memories:
        raise StoreFull(max_memories)
    return new_version(
        reader.state(),
        now_us(),
        store_id,
        memory_id=f"mem_{ULID()}",
        operation="created",
        path=path,
        content=content,
        actor=actor,
        row=None,
    )


def updated_version(
    reader: MemoryLookup,
    now_us: Callable[[], int],
    store_id: str,
    memory_id: str,
    request: tuple[str | None, str | None, str | None],
    *,
    actor: dict[str, Any] | None,
    head_content: Callable[[MemoryRow], str],
) -> tuple[MemoryRow, VersionRecord | None]:
    """The live memory and the version that changes it as ``request`` (update_request's)
    asks; None for a change that changes nothing (no version is written). ``head_content``
    reads the memory's current content, which a move keeps."""
    new_path, new_content, expected = request
    row = live_memory(reader, memory_id)
    target, unchanged = update_target(row, memory_id, new_path, new_content, expected)
    if unchanged:
        return row, None
    if target != row.path:
        check_free(reader, target, row.id)
    if new_content is None:
        new_content = head_content(row)
    return row, new_version(
        reader.state(),
        now_us(),
        store_id,
        memory_id=row.id,
        operation="modified",
        path=target,
        content=new_content,
        actor=actor,
        row=row,
    )


def deleted_version(
    reader: MemoryLookup,
    now_us: Callable[[], int],
    store_id: str,
    memory_id: str,
    expected: str | None,
    *,
    actor: dict[str, Any] | None,
) -> tuple[MemoryRow, VersionRecord]:
    """The live memory and the ``deleted`` version that ends it (its history stays)."""
    row = live_memory(reader, memory_id)
    check_delete(row, memory_id, expected)
    return row, new_version(
        reader.state(),
        now_us(),
        store_id,
        memory_id=row.id,
        operation="deleted",
        path=row.path,
        content=None,
        actor=actor,
        row=row,
    )
