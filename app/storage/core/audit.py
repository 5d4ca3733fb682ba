"""The audit log: who created, changed, redacted or deleted what, and when, per project.

An event is written by the service that acted, after the change it records succeeded
(app/services/audit.py): the console's actions, the APIs' writes and deletes, console
sign-ins and token and limit changes. Each names its actor (a token id), a ``kind`` of
:data:`KINDS`, an ``action`` (``created``, ``deleted``, ``signed_in``...), its subject (a
task id, a memory id, a token id...) and a small JSON ``detail``. Both engines keep the
events of a tenant's projects in one ordered table (the tree: ``<root>/.audit.sqlite3``;
PostgreSQL: ``audit_events``), newest first by (``at_us``, ``id``), and keep them for
:data:`KEEP_DAYS` days. An event of a tenant's own (a token for every project of it) has no
project.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ulid import ULID

from app.storage.core.clock import iso_us
from app.storage.core.cursor import CursorCodec
from app.storage.core.errors import InvalidName
from app.storage.core.names import Scope, validate_id
from app.storage.core.task_rules import scope_tag

KINDS = (
    "task",
    "turn",
    "artifact",
    "memory",
    "store",
    "token",
    "session",
    "limits",
    "oauth",
    "secrets",
    "user",
)
KEEP_DAYS = 400  # a year of history, and the month before it
MAX_DETAIL_BYTES = 4096
MAX_SUBJECT_CHARS = 256
MAX_PAGE = 500
_ACTION_RE = re.compile(r"[a-z][a-z_]{0,31}")
CURSOR_VERSION = 1


@dataclass(frozen=True, slots=True)
class AuditEvent:
    id: str
    at_us: int
    tenant: str
    project: str | None
    actor: str | None
    kind: str
    action: str
    subject: str
    store_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def at(self) -> str:
        return iso_us(self.at_us)

    def detail_json(self) -> str:
        return json.dumps(self.detail, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True, slots=True)
class AuditPage:
    events: tuple[AuditEvent, ...]
    next_cursor: str | None  # older events
    prev_cursor: str | None  # newer events


#: The columns of a stored event, in the order both engines keep them.
COLUMNS = (
    "id",
    "at_us",
    "tenant",
    "project",
    "actor",
    "kind",
    "action",
    "subject",
    "store_id",
    "detail",
)


def values(event: AuditEvent) -> tuple[Any, ...]:
    """The event as the row of COLUMNS an engine stores."""
    return (
        event.id,
        event.at_us,
        event.tenant,
        event.project,
        event.actor,
        event.kind,
        event.action,
        event.subject,
        event.store_id,
        event.detail_json(),
    )


def from_row(row: Sequence[Any]) -> AuditEvent:
    r = dict(zip(COLUMNS, row, strict=True))
    try:
        detail = json.loads(r["detail"]) if r["detail"] else {}
    except ValueError:
        detail = {}
    return AuditEvent(
        r["id"],
        int(r["at_us"]),
        r["tenant"],
        r["project"],
        r["actor"],
        r["kind"],
        r["action"],
        r["subject"],
        r["store_id"],
        detail if isinstance(detail, dict) else {},
    )


def check_page(limit: int, kind: str | None) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidName("limit", limit, f"must be between 1 and {MAX_PAGE}")
    if kind is not None and kind not in KINDS:
        raise InvalidName("kind", kind, f"must be one of {', '.join(KINDS)}")


def encode_cursor(codec: CursorCodec, scope: Scope, event: AuditEvent) -> str:
    return codec.encode({"v": CURSOR_VERSION, "s": scope_tag(scope), "k": [event.at_us, event.id]})


def decode_cursor(codec: CursorCodec, scope: Scope, cursor: str) -> tuple[int, str]:
    """The (at_us, id) a page of events resumes from; InvalidName for another list's."""
    body = codec.decode(cursor, "cursor")
    try:
        if body["v"] != CURSOR_VERSION or body["s"] != scope_tag(scope):
            raise ValueError("issued for another list")
        at_us, event_id = body["k"]
        if not isinstance(at_us, int) or not isinstance(event_id, str):
            raise ValueError("wrong key")
        return at_us, event_id
    except (ValueError, KeyError, TypeError):
        raise InvalidName(
            "cursor", cursor, "is not a cursor this server issued for this list"
        ) from None


def page(
    rows: Sequence[Sequence[Any]],
    *,
    limit: int,
    backward: bool,
    from_cursor: bool,
    codec: CursorCodec,
    scope: Scope,
) -> AuditPage:
    """The page of ``rows`` (``limit`` + 1 read newest first, or oldest first when read
    backward from a cursor), with the cursors of the older and the newer pages."""
    events = [from_row(r) for r in rows]
    more = len(events) > limit
    events = events[:limit]
    if backward:
        events.reverse()
        older, newer = True, more
    else:
        older, newer = more, from_cursor
    return AuditPage(
        tuple(events),
        encode_cursor(codec, scope, events[-1]) if events and older else None,
        encode_cursor(codec, scope, events[0]) if events and newer else None,
    )


def where(
    actor: str | None,
    kind: str | None,
    key: tuple[int, str] | None,
    *,
    backward: bool,
    mark: Callable[[str], str],
    params: dict[str, object],
) -> tuple[str, str]:
    """The WHERE terms (after tenant and project) and the ORDER BY of a page of events."""
    terms = ""
    if actor is not None:
        terms += f" AND actor = {mark('actor')}"
        params["actor"] = actor
    if kind is not None:
        terms += f" AND kind = {mark('kind')}"
        params["kind"] = kind
    if key is not None:
        params["k_at"], params["k_id"] = key
        terms += f" AND (at_us, id) {'>' if backward else '<'} ({mark('k_at')}, {mark('k_id')})"
    order = "at_us ASC, id ASC" if backward else "at_us DESC, id DESC"
    return terms, order


class EventRows(Protocol):
    """Where an engine keeps the events (tree/audit.py, pg/audit.py)."""

    def add(self, event: AuditEvent) -> None: ...

    def rows(
        self,
        tenant: str,
        project: str,
        *,
        actor: str | None,
        kind: str | None,
        key: tuple[int, str] | None,
        backward: bool,
        limit: int,
    ) -> list[tuple[Any, ...]]: ...

    def prune(self, before_us: int) -> int: ...


class AuditLog:
    """The audit log of an engine: its rows, its clock and its cursor codec."""

    def __init__(self, rows: EventRows, codec: CursorCodec, now_us: Callable[[], int]) -> None:
        self.rows = rows
        self.codec = codec
        self.now_us = now_us

    def record(
        self,
        tenant: str,
        project: str | None,
        *,
        actor: str | None,
        kind: str,
        action: str,
        subject: str,
        store_id: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> AuditEvent:
        """Add an event: ``actor`` (a token id) did ``action`` to ``subject`` (of ``kind``) in
        ``tenant`` / ``project`` (None: the tenant's own, e.g. a token for all its projects).
        InvalidName for a kind, action, subject or detail outside the rules above."""
        validate_id("tenant", tenant)
        if project is not None:
            validate_id("project", project)
        if kind not in KINDS:
            raise InvalidName("kind", kind, f"must be one of {', '.join(KINDS)}")
        if not _ACTION_RE.fullmatch(action):
            raise InvalidName("action", action, "must be a lowercase word")
        if not subject or len(subject) > MAX_SUBJECT_CHARS:
            raise InvalidName("subject", subject, f"must be 1 to {MAX_SUBJECT_CHARS} characters")
        event = AuditEvent(
            f"evt_{ULID()}",
            self.now_us(),
            tenant,
            project,
            actor,
            kind,
            action,
            subject,
            store_id,
            dict(detail or {}),
        )
        if len(event.detail_json().encode("utf-8")) > MAX_DETAIL_BYTES:
            raise InvalidName("detail", None, f"must be at most {MAX_DETAIL_BYTES} bytes of JSON")
        self.rows.add(event)
        return event

    def page(
        self,
        scope: Scope,
        *,
        actor: str | None = None,
        kind: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        backward: bool = False,
    ) -> AuditPage:
        """The project's events, newest first, of one ``actor`` and ``kind`` if given;
        ``cursor``: a ``next_cursor`` (older events) or, with ``backward``, a
        ``prev_cursor`` (newer ones). InvalidName for a cursor of another list."""
        check_page(limit, kind)
        key = decode_cursor(self.codec, scope, cursor) if cursor else None
        backward = backward and key is not None
        rows = self.rows.rows(
            scope.tenant,
            scope.project,
            actor=actor,
            kind=kind,
            key=key,
            backward=backward,
            limit=limit + 1,
        )
        return page(
            rows,
            limit=limit,
            backward=backward,
            from_cursor=key is not None,
            codec=self.codec,
            scope=scope,
        )

    def prune(self, before_us: int) -> int:
        """Forget the events older than ``before_us``; return how many went."""
        return self.rows.prune(before_us)
