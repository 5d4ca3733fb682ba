"""The rules of the project-memory API that hold whichever engine stores the tasks: limits,
the checks of a request, ETag preconditions and what a cursor names its project by (the
task list's cursors and orders are core/task_list.py's).

Both engines (tasks.py on the tree, pg/tasks.py on PostgreSQL) apply them from here, so a
request is refused with the same error, and a cursor is the same bytes, in both.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from app.storage.core.clock import iso_us
from app.storage.core.errors import InvalidName, PreconditionFailed
from app.storage.core.models import ArtifactInfo, ArtifactUpload, TurnRecord
from app.storage.core.names import Scope, validate_artifact_name, validate_id, validate_turn

MiB = 1 << 20
DEFAULT_MAX_ARTIFACT_BYTES = 50 * MiB
MAX_SUMMARY_BYTES = 1 * MiB
MAX_PAGE = 1000
# The refusal of a task, turn or artifact delete by a token that neither owns the task nor is
# a project_admin (NotOwner, 403).
NOT_OWNER = "only the task's owner or a project_admin may delete it"
# Artifacts written with their turn in one request: each is a file and a line of its record.
MAX_ARTIFACTS_PER_WRITE = 32
# What a part of a multipart/form-data body adds to its bytes, at most: its headers and
# boundary (app/web/multipart.py reads at most 16 KiB of headers).
FORM_PART_OVERHEAD = 16 * 1024 + 128


def max_form_bytes(max_json_bytes: int, max_artifact_bytes: int) -> int:
    """The largest body of a turn written with its artifacts: the turn, and the most
    artifacts one write takes, each at its limit, with their parts' overhead."""
    parts = MAX_ARTIFACTS_PER_WRITE + 1
    return (
        max_json_bytes + MAX_ARTIFACTS_PER_WRITE * max_artifact_bytes + parts * FORM_PART_OVERHEAD
    )


# The start of a task id (ID_PATTERN's first character, then any of the rest).
_ID_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_turn(task_id: str, turn: int, meta: dict[str, Any], summary_md: str) -> bytes:
    """The summary's UTF-8 bytes, once the turn's address and ``meta`` and ``summary_md``
    are known to be storable.

    What cannot be stored as UTF-8 JSON (lone surrogates, NaN, sets, ...) is refused before
    the first write: failing inside the transaction would leave a task skeleton behind.
    """
    validate_id("task_id", task_id)
    validate_turn(turn)
    try:
        summary = summary_md.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidName("summary_md", None, "is not valid Unicode text") from None
    try:
        json.dumps(meta, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidName("meta", None, f"cannot be stored as JSON ({exc})") from None
    if len(summary) > MAX_SUMMARY_BYTES:
        raise InvalidName("summary_md", None, f"longer than {MAX_SUMMARY_BYTES} bytes")
    return summary


# A media type as a Content-Type header gives it (RFC 9110's token/token, then parameters
# of printable ASCII): no CR, LF or NUL can reach a header the service sends back.
_CONTENT_TYPE_RE = re.compile(
    r"[A-Za-z0-9!#$&^_.+-]{1,127}/[A-Za-z0-9!#$&^_.+-]{1,127}(\s*;[ -~]*)?", re.ASCII
)
MAX_CONTENT_TYPE_CHARS = 255


def check_content_type(value: object) -> str:
    """An artifact's content type, as an upload may give it (InvalidName otherwise)."""
    if not isinstance(value, str):
        raise InvalidName("content_type", value, "not a valid media type")
    if len(value) > MAX_CONTENT_TYPE_CHARS or not _CONTENT_TYPE_RE.fullmatch(value):
        raise InvalidName("content_type", value[:200], "not a valid media type")
    return value


def checked_uploads(uploads: Iterable[ArtifactUpload]) -> Iterator[ArtifactUpload]:
    """``uploads`` as they come, each checked before it is read: a valid artifact name, not
    one named twice in the same write, and at most MAX_ARTIFACTS_PER_WRITE of them."""
    seen: set[str] = set()
    for upload in uploads:
        validate_artifact_name(upload.name)
        if upload.name in seen:
            raise InvalidName("artifacts", upload.name, "names one artifact twice")
        if len(seen) == MAX_ARTIFACTS_PER_WRITE:
            raise InvalidName("artifacts", None, f"at most {MAX_ARTIFACTS_PER_WRITE} in one write")
        seen.add(upload.name)
        yield upload


def next_updated_us(last_us: int, now_us: int) -> int:
    """The ``updated_us`` of a task's next write, after its latest ``last_us`` (0: a new
    task): strictly increasing per task, even when the clock stalls or steps back, for the
    listing's keyset cursor and the turn ETag rely on it."""
    return max(now_us, last_us + 1)


def written_turn(
    task_id: str,
    turn: int,
    *,
    meta: dict[str, Any],
    summary_md: str,
    artifacts: tuple[ArtifactInfo, ...],
    created_at: str | None,
    updated_us: int,
    retention_us: int,
    task_created: bool = False,
) -> TurnRecord:
    """The record a put_turn writes: the new meta and summary, the artifacts and creation
    time the live turn it replaces had (``created_at`` None: a new turn, created now), and
    its retention counted from this write. ``task_created``: this write made the task."""
    return TurnRecord(
        task_id=task_id,
        turn=turn,
        meta=meta,
        summary_md=summary_md,
        artifacts=artifacts,
        created_at=created_at if created_at is not None else iso_us(updated_us),
        updated_at=iso_us(updated_us),
        retain_until=iso_us(updated_us + retention_us),
        updated_us=updated_us,
        task_created=task_created,
    )


def check_list(limit: int, prefix: str | None) -> None:
    """Refuse a page size out of range, or a prefix no task id can start with."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidName("limit", limit, f"must be between 1 and {MAX_PAGE}")
    if prefix is not None and (not prefix or not _ID_PREFIX_RE.fullmatch(prefix)):
        raise InvalidName("prefix", prefix, "must be the start of a task id")


# A member of an If-Match / If-None-Match list: characters other than a comma, and quoted
# strings (an entity tag may hold a comma); and what an entity tag (or ``*``) looks like.
_LIST_MEMBER = re.compile(r'(?:[^,"]|"[^"]*"?)+')
_ENTITY_TAG = re.compile(r'\*|(?:W/)?"[\x21\x23-\x7e\x80-\xff]*"')


def entity_tags(value: str) -> list[str]:
    """The entity tags (and ``*``) an If-Match / If-None-Match value lists (RFC 9110 13.1).

    A member that is not an entity tag (``abc``, ``junk"x"``) is no tag: it matches nothing.
    """
    tags = []
    for member in _LIST_MEMBER.findall(value):
        tag = member.strip(" \t")
        if _ENTITY_TAG.fullmatch(tag):
            tags.append(tag)
    return tags


def if_match_fails(current_etag: str | None, if_match: str) -> bool:
    """Whether ``If-Match: if_match`` fails for a resource whose ETag is ``current_etag``
    (None: it does not exist). ``*`` needs the resource; otherwise some listed tag must be
    its ETag, compared strongly (a weak tag never matches)."""
    tags = entity_tags(if_match)
    if "*" in tags:
        return current_etag is None
    return current_etag is None or current_etag not in tags


def check_preconditions(
    current_etag: str | None, if_match: str | None, if_none_match: bool
) -> None:
    """Refuse a conditional write whose If-Match / If-None-Match the current ETag fails."""
    if if_none_match and current_etag is not None:
        raise PreconditionFailed("the resource already exists (If-None-Match: *)")
    if if_match is not None and if_match_fails(current_etag, if_match):
        if current_etag is None and "*" in entity_tags(if_match):
            raise PreconditionFailed("the resource does not exist (If-Match: *)")
        raise PreconditionFailed("the resource changed since the given ETag (If-Match)")


def scope_tag(scope: Scope) -> str:
    """What a cursor names its project by: another project refuses it."""
    return hashlib.sha256(f"{scope.tenant}/{scope.project}".encode()).hexdigest()[:16]


_INT64 = (1 << 63) - 1
# What the task listing holds for a NUL of a meta value (and a filter looks for): U+FFFD, the
# replacement character. A turn keeps its meta as sent, NUL and all (JSON escapes it); the
# listing keeps two of its values as text columns to filter and sort by, which PostgreSQL's
# text cannot hold a NUL in. Both engines keep the same text, so a filter finds the same tasks.
LISTED_NUL = "\ufffd"


def listed_text(value: str) -> str:
    """``value`` as the task listing keeps it: each NUL as U+FFFD."""
    return value.replace("\x00", LISTED_NUL) if "\x00" in value else value


def meta_facts(meta: dict[str, Any]) -> tuple[str | None, str | None, int | None]:
    """The model, agent_id and exit_code a listing row keeps of a turn's meta.

    Only strings and integers are kept (meta is free-form JSON), the strings as
    :func:`listed_text` gives them; an exit code beyond 64 bits is clamped, which keeps
    "non-zero" true.
    """
    model, agent, code = meta.get("model"), meta.get("agent_id"), meta.get("exit_code")
    return (
        listed_text(model) if isinstance(model, str) else None,
        listed_text(agent) if isinstance(agent, str) else None,
        max(-_INT64, min(_INT64, code))
        if isinstance(code, int) and not isinstance(code, bool)
        else None,
    )
