"""Writing a turn on the tree: its record, the artifacts it brings, then its derived files
(TaskStore.put_turn; the transaction it runs in: tasks.py).

Artifacts are staged (written and fsynced) before the task's lock, under the project's
reservation when a quota applies, and published under the lock before ``meta.json``, the
commit point, names them. A write that fails before its commit takes back what it made, so
its error means what it says: nothing was stored.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from app.storage.core import task_rules
from app.storage.core.clock import iso_us
from app.storage.core.files import os_errors
from app.storage.core.models import ArtifactInfo, ArtifactUpload, StagedUpload, TurnRecord
from app.storage.core.names import TASK_RECORD, TURN_META, Scope, turn_dirname
from app.storage.core.records import turn_to_json, turn_usage, usage_of_turn
from app.storage.core.task_rules import check_preconditions, written_turn
from app.storage.core.usage import Ticket, TurnUsage
from app.storage.tree.artifacts import TaskArtifacts, TaskWrites
from app.storage.tree.fs.atomic import StagedFile, make_dirs, remove_quietly
from app.storage.tree.fs.sync import commit_point, group_commit
from app.storage.tree.records import load_index, read_task_record, read_turn, write_json
from app.storage.tree.usage import settling


class TurnWrites(TaskWrites, Protocol):
    """What a turn's write needs of the task engine (TaskStore) besides an artifact's: the
    artifacts it stages and publishes, the checked task directory, the trash."""

    artifacts: TaskArtifacts

    def task_dir_checked(self, scope: Scope, task_id: str) -> Path: ...

    def trash(self, directory: Path) -> Path: ...


def put_turn(
    store: TurnWrites,
    scope: Scope,
    task_id: str,
    turn: int,
    *,
    meta: dict[str, Any],
    summary_md: str,
    actor: str | None = None,
    if_match: str | None = None,
    if_none_match: bool = False,
    artifacts: Iterable[ArtifactUpload] = (),
    size: int | None = None,
) -> TurnRecord:
    """Create or replace one turn's meta and summary; keep created_at and artifacts.

    ``artifacts`` (app/storage/interface.py) are staged before the lock, published under
    it before ``meta.json`` (the commit) names them, as put_artifact does one."""
    task_rules.check_turn(task_id, turn, meta, summary_md)
    task_dir = store.task_dir_checked(scope, task_id)
    turn_dir = task_dir / turn_dirname(turn)
    expired_dir: Path | None = None
    with contextlib.ExitStack() as staging:
        uploads, ticket = _stage_uploads(
            store, scope, task_id, turn, artifacts, size, if_match, if_none_match, staging
        )
        with (
            store.transaction(scope, task_id) as txn,
            os_errors(),
            contextlib.ExitStack() as stack,
        ):
            now_us = store.now_us()
            store.layout.check_inside(turn_dir / TURN_META, below=task_dir)
            previous = read_turn(turn_dir) if turn_dir.exists() else None
            alive = store.alive(previous, now_us)
            check_preconditions(alive.etag if alive else None, if_match, if_none_match)
            index = load_index(store.layout.tree, task_dir, task_id) if task_dir.exists() else None
            updated_us = store.next_updated_us(index, now_us)
            # Written at one instant: in name order, as a listing of artifacts by time
            # and then name gives them.
            added = tuple(sorted((u.info(iso_us(updated_us)) for u in uploads), key=_name))
            names = {a.name for a in added}
            kept = alive.artifacts if alive else ()
            kept = tuple(a for a in kept if a.name not in names) + added
            stored = usage_of_turn(turn, meta, summary_md, kept)
            was = turn_usage(previous) if previous is not None else TurnUsage(turn, 0, 0, 0)
            ticket = store.usage.admit_write(
                scope,
                ticket,
                # meta.json holds the summary and meta, summary.md the summary again, and
                # index.json the meta of every turn: about three times the turn's bytes.
                gross=3 * stored.turn_bytes + 8192,
                add_bytes=stored.artifact_bytes
                + stored.turn_bytes
                - was.artifact_bytes
                - was.turn_bytes,
                add_tasks=int(index is None),
            )
            stack.enter_context(settling(ticket))
            txn.begin()
            new_task = not task_dir.exists()
            new_turn = previous is None and not turn_dir.exists()
            try:
                if new_task or read_task_record(task_dir) is None:
                    make_dirs(task_dir, store.layout.root)
                    write_json(
                        task_dir / TASK_RECORD,
                        {
                            "version": 1,
                            "task_id": task_id,
                            "owner": actor,
                            "created_at": iso_us(now_us),
                        },
                    )
                if previous is not None and alive is None:
                    # The old turn expired: it is gone for every reader, so its
                    # artifacts must not come back with the new write.
                    expired_dir = store.trash(turn_dir)
                # artifacts/ comes with the first artifact: a turn without one costs no inode.
                make_dirs(turn_dir, store.layout.root)
                backups = store.artifacts.publish_uploads(turn_dir, uploads)
                record = written_turn(
                    task_id,
                    turn,
                    meta=meta,
                    summary_md=summary_md,
                    artifacts=kept,
                    created_at=alive.created_at if alive else None,
                    updated_us=updated_us,
                    retention_us=store.retention_us,
                    task_created=index is None,
                )
                write_json(turn_dir / TURN_META, turn_to_json(record))
                commit_point()
                store.write_derived(
                    scope,
                    task_id,
                    task_dir,
                    record,
                    index,
                    summary=True,
                    ticket=ticket,
                    usage=stored,
                )
                for backup in backups:
                    remove_quietly(backup)
            except Exception:
                # A new turn that failed (a full disk, a failing one) takes itself back, so
                # that its error means what it says: nothing was stored. The listing is
                # written last, in one transaction: it holds nothing of it either. A task
                # this write made goes with it, and then nothing is left to repair.
                if (
                    new_turn
                    and _take_back(store, turn_dir)
                    and new_task
                    and _take_back(store, task_dir)
                ):
                    txn.abandon()
                raise
    if expired_dir is not None:
        store.layout.tree.remove(expired_dir)
    return record


def _take_back(store: TurnWrites, path: Path) -> bool:
    """Remove what a failed write made at ``path`` (the caller holds its task's lock);
    whether it is gone."""
    try:
        store.layout.tree.remove(path)
    except OSError:
        return False
    return store.layout.tree.lstat(path) is None


def _stage_uploads(
    store: TurnWrites,
    scope: Scope,
    task_id: str,
    turn: int,
    artifacts: Iterable[ArtifactUpload],
    size: int | None,
    if_match: str | None,
    if_none_match: bool,
    stack: contextlib.ExitStack,
) -> tuple[list[StagedUpload[StagedFile]], Ticket | None]:
    """Stage the artifacts of a put_turn before its lock (none: the seed's write, which
    reads nothing here); their reservation, which the write under the lock settles."""
    uploads = iter(artifacts)
    first = next(uploads, None)
    if first is None:
        return [], None
    # The staged bytes and the write join one group flush (if any).
    stack.enter_context(group_commit(store.layout.root, enabled=store.txns.group_commit))
    credits: dict[str, int] = {}
    if if_match is not None or if_none_match or store.usage.applies(scope):
        turn_dir = store.layout.check_inside(store.layout.turn_dir(scope, task_id, turn))
        found = store.alive(read_turn(turn_dir), store.now_us())
        # Checked again under the lock; a write that cannot succeed reads no body.
        check_preconditions(found.etag if found else None, if_match, if_none_match)
        # What each upload replaces, as read now: a quota counts only what it adds.
        credits = {a.name: a.size for a in found.artifacts} if found else {}
    ticket = stack.enter_context(settling(store.usage.admit(scope, gross=size or 0)))
    staged = store.artifacts.stage_uploads(
        scope, itertools.chain((first,), uploads), credits, ticket, stack
    )
    return staged, ticket


def _name(info: ArtifactInfo) -> str:
    return info.name
