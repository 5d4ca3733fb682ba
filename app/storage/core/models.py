"""Frozen values the storage engine returns; the HTTP layer serializes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import IO, Any, BinaryIO, Generic, TypeVar

H = TypeVar("H")


def artifact_etag(sha256: str) -> str:
    """An artifact's entity tag: the SHA-256 of its bytes, quoted."""
    return f'"{sha256}"'


def turn_etag(updated_us: int) -> str:
    """A turn's entity tag: its ``updated_us``, strictly increasing per task (the task's
    writes are serialized), so it names one version of the turn."""
    return f'"t{updated_us}"'


@dataclass(frozen=True, slots=True)
class ArtifactInfo:
    name: str
    content_type: str
    size: int
    sha256: str
    updated_at: str

    @property
    def etag(self) -> str:
        return artifact_etag(self.sha256)


@dataclass(frozen=True, slots=True)
class TurnRecord:
    task_id: str
    turn: int
    meta: dict[str, Any]
    summary_md: str
    artifacts: tuple[ArtifactInfo, ...]
    created_at: str
    updated_at: str
    retain_until: str
    # Strictly increasing per task (the task lock serializes writers), so it names a version.
    updated_us: int
    # Set by the write that created the task (for its audit event); never stored or compared.
    task_created: bool = field(default=False, compare=False)

    @property
    def etag(self) -> str:
        return turn_etag(self.updated_us)


@dataclass(frozen=True, slots=True)
class TurnEntry:
    """One turn as the task index lists it: no summary, artifact names only."""

    turn: int
    meta: dict[str, Any]
    artifacts: tuple[str, ...]
    created_at: str
    updated_at: str
    retain_until: str


@dataclass(frozen=True, slots=True)
class TaskIndex:
    task_id: str
    owner: str | None
    created_at: str
    updated_at: str
    retain_until: str
    turns: tuple[TurnEntry, ...]

    @property
    def latest_turn(self) -> int | None:
        return self.turns[-1].turn if self.turns else None

    @property
    def turn_count(self) -> int:
        return len(self.turns)


@dataclass(frozen=True, slots=True)
class TaskSummary:
    task_id: str
    latest_turn: int | None
    turn_count: int
    updated_at: str
    retain_until: str
    # From the listing index: the task's owner (token id) and its latest turn's meta.
    owner: str | None = None
    model: str | None = None
    agent_id: str | None = None
    exit_code: int | None = None
    # What the task stores: its turns' meta and summaries and its artifacts (usage bytes).
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class TaskPage:
    tasks: tuple[TaskSummary, ...]
    total: int  # the project's live tasks
    next_cursor: str | None
    prev_cursor: str | None = None
    matched: int = 0  # the live tasks the filters let through (total without filters)


@dataclass(slots=True)
class ArtifactStream:
    """An open artifact: the caller streams ``file`` and must close it."""

    info: ArtifactInfo
    file: BinaryIO
    size: int


@dataclass(frozen=True, slots=True)
class ArtifactUpload:
    """An artifact written with its turn: its name, Content-Type, and a stream of its bytes,
    read once, to its end, before the next artifact of the same write is asked for."""

    name: str
    content_type: str
    stream: IO[bytes]


@dataclass(frozen=True, slots=True)
class StagedUpload(Generic[H]):
    """An artifact of a turn's write whose bytes are stored (``handle``: where, as its
    backend keeps them) and not yet named by the record that will commit them."""

    name: str
    content_type: str
    size: int
    sha256: str
    handle: H

    def info(self, updated_at: str) -> ArtifactInfo:
        return ArtifactInfo(self.name, self.content_type, self.size, self.sha256, updated_at)


@dataclass(slots=True)
class FsckReport:
    problems: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    unrepairable: list[str] = field(default_factory=list)
    # Things worth knowing that are not faults (e.g. a temp file of a write still in flight).
    notes: list[str] = field(default_factory=list)
    # Problems that are files which could not be read now (I/O or permission errors): also
    # in ``problems``, never repaired.
    unreadable: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One search result: a turn (``task_id``, ``turn``) or a memory (``memory_store_id``,
    ``memory_id``, ``path``). ``snippet`` is plain text in which each matched word sits
    between app.storage.query.MARK_START and MARK_END; ``score``: higher is better."""

    kind: str  # "turn" | "memory"
    score: float
    snippet: str
    task_id: str | None = None
    turn: int | None = None
    memory_store_id: str | None = None
    store_name: str | None = None
    memory_id: str | None = None
    path: str | None = None


@dataclass(frozen=True, slots=True)
class SearchPage:
    """A page of hits, best first. ``stores_skipped``: stores of the project left out of this
    search (beyond the per-request bound, newest searched first). ``score``: bm25 for a
    keyword search, the RRF sum for a hybrid one, the cosine for a semantic one."""

    hits: tuple[SearchHit, ...]
    next_cursor: str | None
    stores_searched: int = 0
    stores_skipped: int = 0
    # Which rankings ran ("keyword", "semantic"), and why vectors were asked for and not
    # used (the embedder unavailable: keyword results only).
    modes: tuple[str, ...] = ("keyword",)
    fallback: str | None = None


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Narrow a page to tasks whose id starts with ``prefix`` and whose latest live turn has
    this ``model`` / ``agent_id`` / a non-zero exit code (``failed``)."""

    prefix: str | None = None
    model: str | None = None
    agent_id: str | None = None
    failed: bool = False

    def prefix_range(self) -> tuple[str, str]:
        """The ids ``[low, high)`` that start with ``prefix`` (ids are ASCII, compared as
        bytes: ``high`` is the prefix with its last character one higher)."""
        assert self.prefix
        return self.prefix, self.prefix[:-1] + chr(ord(self.prefix[-1]) + 1)


DEFAULT_GRACE = timedelta(minutes=10)
