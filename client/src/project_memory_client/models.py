"""Typed results, named and shaped as the API's schemas name them (the seed's TurnRecord,
TaskSummary, TaskList, ArtifactRecord, MemoryArtifact; the server's TaskIndex, SearchHit,
UsageReport, WhoAmI).

Each is a frozen dataclass built by ``from_json`` from a response body, and ``to_dict()``
gives the body back (the CLI's ``--json`` prints it). Keys a newer server adds are ignored.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import IO, Any

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes] | Iterable[bytes]
"""An artifact body: a file path, bytes, a binary file object, or an iterable of chunks."""


@dataclass(frozen=True)
class Upload:
    """An artifact written with its turn (:meth:`Client.put_turn`): its name, its body (any
    :data:`Source`) and its Content-Type (None: the one the name suggests, else
    ``application/octet-stream``)."""

    name: str
    source: Source
    content_type: str | None = None


__all__ = [
    "ArtifactInfo",
    "ArtifactRecord",
    "MemoryArtifact",
    "SearchHit",
    "SearchResults",
    "TaskIndex",
    "TaskList",
    "TaskSummary",
    "TaskTurn",
    "TurnRecord",
    "UsageReport",
    "WhoAmI",
]


class _Model:
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)  # type: ignore[call-overload]
        return out


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class MemoryArtifact(_Model):
    """An artifact as a turn lists it."""

    name: str
    content_type: str
    size: int
    updated_at: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryArtifact:
        return cls(
            name=str(data["name"]),
            content_type=str(data["content_type"]),
            size=int(data["size"]),
            updated_at=_opt_str(data.get("updated_at")),
        )


@dataclass(frozen=True)
class ArtifactRecord(_Model):
    """What storing an artifact answers; ``etag`` is the response's ETag header."""

    name: str
    content_type: str
    size: int
    task_id: str
    turn: int
    updated_at: str | None = None
    etag: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any], etag: str | None = None) -> ArtifactRecord:
        return cls(
            name=str(data["name"]),
            content_type=str(data["content_type"]),
            size=int(data["size"]),
            task_id=str(data["task_id"]),
            turn=int(data["turn"]),
            updated_at=_opt_str(data.get("updated_at")),
            etag=etag,
        )


@dataclass(frozen=True)
class ArtifactInfo(_Model):
    """A downloaded artifact, from the response headers: what was written and its ETag."""

    task_id: str
    turn: int
    name: str
    content_type: str
    size: int
    etag: str | None
    path: str | None = None  # the file written, when the download went to a path


@dataclass(frozen=True)
class TurnRecord(_Model):
    """One turn; ``etag`` (from the response header) is what ``If-Match`` takes."""

    task_id: str
    turn: int
    meta: dict[str, Any]
    summary_md: str
    artifacts: tuple[MemoryArtifact, ...]
    created_at: str | None = None
    updated_at: str | None = None
    retain_until: str | None = None
    etag: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any], etag: str | None = None) -> TurnRecord:
        return cls(
            task_id=str(data["task_id"]),
            turn=int(data["turn"]),
            meta=dict(data.get("meta") or {}),
            summary_md=str(data.get("summary_md") or ""),
            artifacts=tuple(MemoryArtifact.from_json(a) for a in data.get("artifacts") or []),
            created_at=_opt_str(data.get("created_at")),
            updated_at=_opt_str(data.get("updated_at")),
            retain_until=_opt_str(data.get("retain_until")),
            etag=etag,
        )


@dataclass(frozen=True)
class TaskSummary(_Model):
    task_id: str
    latest_turn: int | None = None
    turn_count: int | None = None
    updated_at: str | None = None
    retain_until: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskSummary:
        return cls(
            task_id=str(data["task_id"]),
            latest_turn=_opt_int(data.get("latest_turn")),
            turn_count=_opt_int(data.get("turn_count")),
            updated_at=_opt_str(data.get("updated_at")),
            retain_until=_opt_str(data.get("retain_until")),
        )


@dataclass(frozen=True)
class TaskList(_Model):
    """One page of tasks; pass ``next_cursor`` back for the next (None at the end)."""

    tasks: tuple[TaskSummary, ...]
    total: int
    next_cursor: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskList:
        return cls(
            tasks=tuple(TaskSummary.from_json(t) for t in data.get("tasks") or []),
            total=int(data.get("total") or 0),
            next_cursor=_opt_str(data.get("next_cursor")),
        )


@dataclass(frozen=True)
class TaskTurn(_Model):
    """A turn as the task index lists it: meta and artifact names, no summary."""

    turn: int
    meta: dict[str, Any]
    artifacts: tuple[str, ...]
    created_at: str | None = None
    updated_at: str | None = None
    retain_until: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskTurn:
        return cls(
            turn=int(data["turn"]),
            meta=dict(data.get("meta") or {}),
            artifacts=tuple(str(a) for a in data.get("artifacts") or []),
            created_at=_opt_str(data.get("created_at")),
            updated_at=_opt_str(data.get("updated_at")),
            retain_until=_opt_str(data.get("retain_until")),
        )


@dataclass(frozen=True)
class TaskIndex(_Model):
    task_id: str
    turns: tuple[TaskTurn, ...]
    turn_count: int
    latest_turn: int | None = None
    owner: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    retain_until: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskIndex:
        turns = tuple(TaskTurn.from_json(t) for t in data.get("turns") or [])
        return cls(
            task_id=str(data["task_id"]),
            turns=turns,
            turn_count=int(data.get("turn_count", len(turns))),
            latest_turn=_opt_int(data.get("latest_turn")),
            owner=_opt_str(data.get("owner")),
            created_at=_opt_str(data.get("created_at")),
            updated_at=_opt_str(data.get("updated_at")),
            retain_until=_opt_str(data.get("retain_until")),
        )


@dataclass(frozen=True)
class SearchHit(_Model):
    """A turn (``task_id``, ``turn``) or a memory (``memory_store_id``, ``memory_id``,
    ``path``); in ``snippet`` each matched word stands between U+0002 and U+0003."""

    kind: str
    score: float
    snippet: str
    task_id: str | None = None
    turn: int | None = None
    memory_store_id: str | None = None
    store_name: str | None = None
    memory_id: str | None = None
    path: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchHit:
        return cls(
            kind=str(data["kind"]),
            score=float(data["score"]),
            snippet=str(data.get("snippet") or ""),
            task_id=_opt_str(data.get("task_id")),
            turn=_opt_int(data.get("turn")),
            memory_store_id=_opt_str(data.get("memory_store_id")),
            store_name=_opt_str(data.get("store_name")),
            memory_id=_opt_str(data.get("memory_id")),
            path=_opt_str(data.get("path")),
        )


@dataclass(frozen=True)
class SearchResults(_Model):
    hits: tuple[SearchHit, ...]
    stores_searched: int
    stores_skipped: int
    next_cursor: str | None = None
    # The rankings that ran, and why meaning was not used (a server before modes: keyword).
    modes: tuple[str, ...] = ("keyword",)
    fallback: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchResults:
        return cls(
            hits=tuple(SearchHit.from_json(h) for h in data.get("hits") or []),
            stores_searched=int(data.get("stores_searched") or 0),
            stores_skipped=int(data.get("stores_skipped") or 0),
            next_cursor=_opt_str(data.get("next_cursor")),
            modes=tuple(str(m) for m in data.get("modes") or ("keyword",)),
            fallback=_opt_str(data.get("fallback")),
        )


@dataclass(frozen=True)
class UsageCounts(_Model):
    tasks: int = 0
    turns: int = 0
    artifacts: int = 0
    artifact_bytes: int = 0
    turn_bytes: int = 0
    stores: int = 0
    memories: int = 0
    memory_bytes: int = 0
    versions: int = 0
    version_bytes: int = 0
    bytes: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> UsageCounts:
        data = data or {}
        return cls(**{k: int(data.get(k) or 0) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Quota(_Model):
    """None: no limit."""

    bytes: int | None = None
    tasks: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Quota:
        data = data or {}
        return cls(bytes=_opt_int(data.get("bytes")), tasks=_opt_int(data.get("tasks")))


@dataclass(frozen=True)
class ProjectUsage(_Model):
    tenant: str
    project: str
    usage: UsageCounts
    quota: Quota

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProjectUsage:
        return cls(
            tenant=str(data["tenant"]),
            project=str(data["project"]),
            usage=UsageCounts.from_json(data.get("usage")),
            quota=Quota.from_json(data.get("quota")),
        )


@dataclass(frozen=True)
class DiskSpace(_Model):
    free_bytes: int
    floor_bytes: int


@dataclass(frozen=True)
class TrafficHour(_Model):
    hour: str
    project: str
    token_id: str
    requests: int
    bytes_in: int
    bytes_out: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrafficHour:
        return cls(
            hour=str(data["hour"]),
            project=str(data["project"]),
            token_id=str(data["token_id"]),
            requests=int(data["requests"]),
            bytes_in=int(data["bytes_in"]),
            bytes_out=int(data["bytes_out"]),
        )


@dataclass(frozen=True)
class UsageReport(_Model):
    """``GET /usage``: the project's counts and quota, its tenant's, and the traffic."""

    tenant: str
    project: str
    usage: UsageCounts
    quota: Quota
    tenant_usage: UsageCounts
    tenant_quota: Quota
    projects: tuple[ProjectUsage, ...]
    traffic: tuple[TrafficHour, ...]
    disk: DiskSpace | None = None  # admin tokens, the tree backend only

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UsageReport:
        disk = data.get("disk")
        return cls(
            tenant=str(data["tenant"]),
            project=str(data["project"]),
            usage=UsageCounts.from_json(data.get("usage")),
            quota=Quota.from_json(data.get("quota")),
            tenant_usage=UsageCounts.from_json(data.get("tenant_usage")),
            tenant_quota=Quota.from_json(data.get("tenant_quota")),
            projects=tuple(ProjectUsage.from_json(p) for p in data.get("projects") or []),
            traffic=tuple(TrafficHour.from_json(t) for t in data.get("traffic") or []),
            disk=DiskSpace(int(disk["free_bytes"]), int(disk["floor_bytes"])) if disk else None,
        )


@dataclass(frozen=True)
class WhoAmI(_Model):
    """The token a request was made with (never its secret) and the scope it acts in."""

    token_id: str
    name: str
    role: str
    tenant: str
    project: str
    token_tenant: str | None = None
    token_project: str | None = None
    created_at: str | None = None
    expires_at: str | None = None
    # The space of the project ("project", or "private": the user's own), and the user the
    # token belongs to (None: a token of no user, or a server older than them).
    visibility: str = "project"
    user: str | None = None
    user_name: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WhoAmI:
        return cls(
            token_id=str(data["token_id"]),
            name=str(data.get("name") or ""),
            role=str(data["role"]),
            tenant=str(data["tenant"]),
            project=str(data["project"]),
            token_tenant=_opt_str(data.get("token_tenant")),
            token_project=_opt_str(data.get("token_project")),
            created_at=_opt_str(data.get("created_at")),
            expires_at=_opt_str(data.get("expires_at")),
            visibility=str(data.get("visibility") or "project"),
            user=_opt_str(data.get("user")),
            user_name=_opt_str(data.get("user_name")),
        )
