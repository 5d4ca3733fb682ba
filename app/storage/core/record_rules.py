"""What a stored record must hold to be one the service could have written: the rules a write
applies to what it is given (task_rules.check_turn, the content type, store_rules' checks of
a path, a content, a name), applied to every field of a whole record, with the fields a
write computes itself (its times, sizes and digests) held to how it computes them.

An import checks every record with these before anything of it is published
(core/restore.py), so a backup cannot bring in what the API would refuse; fsck applies them
to what it finds. Each raises InvalidName naming the field and the rule.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from app.storage.core.clock import parse_iso_us
from app.storage.core.errors import InvalidName
from app.storage.core.models import TurnRecord
from app.storage.core.names import (
    ID_PATTERN,
    MEMORY_ID_RE,
    VERSION_ID_RE,
    validate_artifact_name,
    validate_id,
)
from app.storage.core.store_records import OPERATIONS, StoreRecord, VersionRecord
from app.storage.core.store_rules import (
    validate_content,
    validate_description,
    validate_memory_path,
    validate_metadata,
    validate_name,
    validate_sha256,
)
from app.storage.core.task_rules import check_content_type, check_turn

# The longest retention a deployment may set (MEMORY_RETENTION_DAYS), so the latest
# retain_until a write can give a turn.
MAX_RETENTION_DAYS = 36_500
_MAX_RETENTION_US = MAX_RETENTION_DAYS * 86_400 * 1_000_000
# How every time the service writes is spelled (clock.iso_us).
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z", re.ASCII)
_OWNER = re.compile(ID_PATTERN, re.ASCII)


def timestamp(field: str, value: object) -> int:
    """A time as the service writes it, in microseconds since the epoch."""
    if not isinstance(value, str) or not _TIME.fullmatch(value):
        raise InvalidName(field, value, "is not a time as the service writes it (ISO 8601, UTC)")
    try:
        us = parse_iso_us(value)
    except (ValueError, OverflowError):
        raise InvalidName(field, value, "is not a time") from None
    if us < 0:
        raise InvalidName(field, value, "is before 1970")
    return us


def _same_us(field: str, value: object, expected: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value != expected:
        raise InvalidName(field, value, "must be the time beside it in microseconds")


def check_task_record(obj: Any, task_id: str) -> None:
    """``task.json``: its task, its owner (a token id or none), when it was created."""
    if not isinstance(obj, dict):
        raise InvalidName("task", None, "is not a JSON object")
    if obj.get("task_id", task_id) != task_id:
        raise InvalidName("task_id", obj.get("task_id"), f"must be {task_id}")
    owner = obj.get("owner")
    if owner is not None and not (isinstance(owner, str) and _OWNER.fullmatch(owner)):
        raise InvalidName("owner", owner, "must be a token id or null")
    timestamp("created_at", obj.get("created_at"))


def check_turn_record(record: TurnRecord, *, max_artifact_bytes: int) -> None:
    """A turn's ``meta.json``: what put_turn accepts, the times it writes, the artifacts an
    upload records."""
    check_turn(record.task_id, record.turn, record.meta, record.summary_md)
    created = timestamp("created_at", record.created_at)
    updated = timestamp("updated_at", record.updated_at)
    until = timestamp("retain_until", record.retain_until)
    _same_us("updated_us", record.updated_us, updated)
    if created > updated:
        raise InvalidName("created_at", record.created_at, "must not come after updated_at")
    if not updated < until <= updated + _MAX_RETENTION_US:
        raise InvalidName(
            "retain_until",
            record.retain_until,
            f"must come after updated_at, by at most {MAX_RETENTION_DAYS} days",
        )
    for artifact in record.artifacts:
        validate_artifact_name(artifact.name)
        check_content_type(artifact.content_type)
        size = artifact.size
        if isinstance(size, bool) or not 0 <= size <= max_artifact_bytes:
            raise InvalidName("size", size, f"must be 0 to {max_artifact_bytes} bytes")
        validate_sha256(artifact.sha256, "sha256")
        if timestamp("updated_at", artifact.updated_at) > updated:
            raise InvalidName("updated_at", artifact.updated_at, "is after its turn's")


def check_store_record(record: StoreRecord) -> None:
    """A store's ``store.json``: what create_store and update_store accept, and its times."""
    validate_name(record.name)
    validate_description(record.description)
    validate_metadata(record.metadata)
    validate_id("tenant", record.tenant)
    validate_id("project", record.project)
    _same_us("created_us", record.created_us, timestamp("created_at", record.created_at))
    timestamp("updated_at", record.updated_at)
    if record.archived_at is not None:
        timestamp("archived_at", record.archived_at)


def check_version_record(record: VersionRecord) -> None:
    """A memory version: what a memory write accepts (its path and content), the digest and
    size it computes of them, its times; a redacted or deleted one holds no content."""
    if not MEMORY_ID_RE.fullmatch(record.memory_id):
        raise InvalidName("memory_id", record.memory_id, "is not a memory id")
    if record.operation not in OPERATIONS:
        raise InvalidName("operation", record.operation, f"must be one of {OPERATIONS}")
    _same_us("created_us", record.created_us, timestamp("created_at", record.created_at))
    previous = record.previous_version_id
    if previous is not None and not (
        isinstance(previous, str) and VERSION_ID_RE.fullmatch(previous) and previous < record.id
    ):
        raise InvalidName("previous_version_id", previous, "must be an earlier version's id")
    if record.redacted_at is not None:
        timestamp("redacted_at", record.redacted_at)
    if not record.live:
        if record.content is not None:
            raise InvalidName("content", None, "must be null in a deleted or redacted version")
        return
    validate_memory_path(record.path)
    content = validate_content(record.content)
    data = content.encode("utf-8")
    if record.content_sha256 != hashlib.sha256(data).hexdigest():
        raise InvalidName("content_sha256", record.content_sha256, "is not the content's")
    if record.content_size_bytes != len(data) or isinstance(record.content_size_bytes, bool):
        raise InvalidName("content_size_bytes", record.content_size_bytes, "is not the content's")
    if timestamp("memory_created_at", record.memory_created_at) > record.created_us:
        raise InvalidName("memory_created_at", record.memory_created_at, "is after the version")
    since = record.path_since
    if not (isinstance(since, str) and VERSION_ID_RE.fullmatch(since) and since <= record.id):
        raise InvalidName("path_since", since, "must be this version's id or an earlier one's")


def chain_problems(versions: Iterable[tuple[str, str, str | None]]) -> list[str]:
    """What is wrong with the version chains of (version id, memory id, previous id): each
    version names the memory's version before it, the first one none; a fork, a gap filled
    twice or a loop shows here."""
    by_memory: dict[str, list[tuple[str, str | None]]] = {}
    for version_id, memory_id, previous in versions:
        by_memory.setdefault(memory_id, []).append((version_id, previous))
    problems = []
    for memory_id, chain in by_memory.items():
        chain.sort()
        present = {v for v, _ in chain}
        pointed: set[str] = set()
        first, first_previous = chain[0]
        if first_previous in present:
            problems.append(f"memory {memory_id}: version {first} follows a later one (a loop)")
        for (before, _), (after, previous) in zip(chain, chain[1:], strict=False):
            if previous in present and previous != before:
                problems.append(f"memory {memory_id}: version {after} forks the chain")
            if previous in pointed:
                problems.append(f"memory {memory_id}: two versions follow {previous}")
            if previous is not None:
                pointed.add(previous)
    return problems
