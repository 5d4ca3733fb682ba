"""The changes to a project's turn history, whichever door they come by (the REST API, the
console, the MCP tools): each checks access, makes one storage call and records one audit
event. Reads need no use case: a door reads the storage directly, in its principal's scope.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import IO, Any

from app.services import access, audit, secrets
from app.services.access import Principal
from app.services.secrets import Screen
from app.storage.core.errors import Conflict, NotFound, PreconditionFailed, SecretsRefused
from app.storage.core.models import ArtifactInfo, ArtifactUpload, TurnRecord
from app.storage.core.names import MAX_TURN
from app.storage.interface import StorageBackend

# Writers racing for the next turn number of one task: each lost race costs one read and one
# refused write, and another writer's success.
NEXT_TURN_ATTEMPTS = 64


def record_turn(
    storage: StorageBackend,
    principal: Principal,
    task_id: str,
    turn: int,
    *,
    meta: dict[str, Any],
    summary_md: str,
    if_match: str | None = None,
    if_none_match: bool = False,
    artifacts: Iterable[ArtifactUpload] = (),
    size: int | None = None,
    screen: Screen | None = None,
) -> TurnRecord:
    """Create or replace turn ``turn`` (TaskBackend.put_turn); a write that creates the task
    is recorded as its creation. Its secrets are masked or refused by the project's policy
    (services/secrets.py); ``screen``, when the door passes one, tells it what was masked."""
    access.require_write(principal)
    screen = screen or Screen.of(storage, principal)
    meta, summary_md = _screened(screen, meta, summary_md, f"{task_id}/{turn}", storage, principal)
    return _put_turn(
        storage,
        principal,
        screen,
        task_id,
        turn,
        meta=meta,
        summary_md=summary_md,
        if_match=if_match,
        if_none_match=if_none_match,
        artifacts=artifacts,
        size=size,
    )


def _screened(
    screen: Screen,
    meta: dict[str, Any],
    summary_md: str,
    subject: str,
    storage: StorageBackend,
    principal: Principal,
) -> tuple[dict[str, Any], str]:
    """A turn's meta and summary as they may be stored; SecretsRefused (audited) when the
    project refuses what they hold."""
    meta = screen.json(meta, "meta")
    summary_md = screen.text(summary_md, "summary_md")
    try:
        screen.settle()
    except SecretsRefused as exc:
        secrets.refused(storage, principal, exc, subject)
        raise
    return meta, summary_md


def _put_turn(
    storage: StorageBackend,
    principal: Principal,
    screen: Screen,
    task_id: str,
    turn: int,
    *,
    meta: dict[str, Any],
    summary_md: str,
    if_match: str | None,
    if_none_match: bool,
    artifacts: Iterable[ArtifactUpload],
    size: int | None,
) -> TurnRecord:
    """The storage call of a turn whose texts are screened; its artifacts are screened as
    the storage reads them."""
    subject = f"{task_id}/{turn}"
    try:
        record = storage.tasks.put_turn(
            principal.scope,
            task_id,
            turn,
            meta=meta,
            summary_md=summary_md,
            actor=principal.actor,
            if_match=if_match,
            if_none_match=if_none_match,
            artifacts=(screen.artifact(a, f"artifacts.{a.name}") for a in artifacts),
            size=size,
        )
    except SecretsRefused as exc:
        secrets.refused(storage, principal, exc, subject)
        raise
    if record.task_created:
        audit.event(storage, principal, "task", "created", task_id)
    screen.record(storage, principal, subject)
    return record


def append_turn(
    storage: StorageBackend,
    principal: Principal,
    task_id: str,
    *,
    meta: dict[str, Any],
    summary_md: str,
    artifacts: Callable[[], Iterable[ArtifactUpload]] = tuple,
    size: int | None = None,
    screen: Screen | None = None,
) -> TurnRecord:
    """Record the task's next free turn (0 for a new task), never over another writer's.

    Each try reads the latest turn and writes the one after it with If-None-Match; a writer
    that took that number first sends it to the next. ``artifacts`` makes fresh uploads for
    each try (a lost race has read the last ones); ``size``, when known, is their bytes in
    all (TaskBackend.put_turn). Conflict when the task has used every number, or when other
    writers kept winning for NEXT_TURN_ATTEMPTS tries. Secrets as record_turn.
    """
    access.require_write(principal)
    screen = screen or Screen.of(storage, principal)
    meta, summary_md = _screened(screen, meta, summary_md, task_id, storage, principal)
    for _ in range(NEXT_TURN_ATTEMPTS):
        try:
            latest = storage.tasks.get_task(principal.scope, task_id).latest_turn
        except NotFound:
            latest = None
        number = 0 if latest is None else latest + 1
        if number > MAX_TURN:
            raise Conflict(
                f"task {task_id} has used every turn number (0-{MAX_TURN}):"
                " record under another task id"
            )
        counted = Counter(screen.masked)  # a lost try's artifacts are not stored
        try:
            return _put_turn(
                storage,
                principal,
                screen,
                task_id,
                number,
                meta=meta,
                summary_md=summary_md,
                if_match=None,
                if_none_match=True,
                artifacts=artifacts(),
                size=size,
            )
        except PreconditionFailed:
            screen.masked = counted
            continue
    raise Conflict(f"other writers kept taking task {task_id}'s next turn number; try again")


def put_artifact(
    storage: StorageBackend,
    principal: Principal,
    task_id: str,
    turn: int,
    name: str,
    stream: IO[bytes],
    *,
    content_type: str,
    if_match: str | None = None,
    if_none_match: bool = False,
    size: int | None = None,
    screen: Screen | None = None,
) -> ArtifactInfo:
    """Create or replace one artifact of an existing turn (a write of that turn); a text
    artifact's secrets as record_turn's (its size is then the masked one's)."""
    access.require_write(principal)
    screen = screen or Screen.of(storage, principal)
    subject = f"{task_id}/{turn}/{name}"
    if screen.active:
        # ``size`` still admits the body before it is read; what masking adds (a marker may be
        # longer than the secret it replaces) is counted when the write settles.
        stream = screen.artifact(ArtifactUpload(name, content_type, stream), "artifact").stream
    try:
        info = storage.tasks.put_artifact(
            principal.scope,
            task_id,
            turn,
            name,
            stream,
            content_type=content_type,
            if_match=if_match,
            if_none_match=if_none_match,
            size=size,
        )
    except SecretsRefused as exc:
        secrets.refused(storage, principal, exc, subject)
        raise
    screen.record(storage, principal, subject)
    return info


def delete_task(storage: StorageBackend, principal: Principal, task_id: str) -> None:
    """Delete a task with every turn and artifact: its owner, or a project_admin and above."""
    access.require_write(principal)
    storage.tasks.delete_task(principal.scope, task_id, only_owner=access.only_owner(principal))
    audit.event(storage, principal, "task", "deleted", task_id)


def delete_turn(
    storage: StorageBackend,
    principal: Principal,
    task_id: str,
    turn: int,
    *,
    if_match: str | None = None,
) -> None:
    """Delete one turn and its artifacts (the last turn takes its task): as delete_task."""
    access.require_write(principal)
    storage.tasks.delete_turn(
        principal.scope,
        task_id,
        turn,
        only_owner=access.only_owner(principal),
        if_match=if_match,
    )
    audit.event(storage, principal, "turn", "deleted", task_id, {"turn": turn})


def delete_artifact(
    storage: StorageBackend,
    principal: Principal,
    task_id: str,
    turn: int,
    name: str,
    *,
    if_match: str | None = None,
) -> None:
    """Delete one artifact of a turn (a write of that turn): as delete_task."""
    access.require_write(principal)
    storage.tasks.delete_artifact(
        principal.scope,
        task_id,
        turn,
        name,
        only_owner=access.only_owner(principal),
        if_match=if_match,
    )
    audit.event(storage, principal, "artifact", "deleted", task_id, {"turn": turn, "name": name})
