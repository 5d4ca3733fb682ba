"""Artifacts on the tree: the bytes streamed to a synced temp file before any lock is taken,
then published under the task's lock, before the ``meta.json`` that names them (the commit).

A replacement keeps the acknowledged bytes as a hard link (``PREV_PREFIX``) until its commit:
if it fails or dies in between, the task's repair (:func:`reconcile_artifacts`, run on failure
or by the next writer through the journal) puts them back, so a record and its bytes never
disagree. Readers take no lock: they pair the bytes with the record read before and after
opening them, and serve the kept copy while a replacement is between publish and commit.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol, cast

from app.storage.core.clock import iso_us
from app.storage.core.errors import Conflict, Corrupt, LockTimeout, NotFound
from app.storage.core.files import DIR_MODE, os_errors
from app.storage.core.models import (
    ArtifactInfo,
    ArtifactStream,
    ArtifactUpload,
    StagedUpload,
    TurnRecord,
)
from app.storage.core.names import (
    ARTIFACTS_DIR,
    PREV_PREFIX,
    TMP_PREFIX,
    TURN_META,
    Scope,
    validate_artifact_name,
    validate_turn,
)
from app.storage.core.records import turn_to_json
from app.storage.core.task_rules import (
    MiB,
    check_preconditions,
    checked_uploads,
)
from app.storage.core.usage import ReservingStream, Ticket, TurnUsage
from app.storage.tree.fs.atomic import StagedFile, make_dirs, remove_quietly, stage_stream
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.noatime import open_noatime, sha256_file
from app.storage.tree.fs.sync import (
    commit_point,
    flush_now,
    fsync_dir,
    group_commit,
)
from app.storage.tree.fs.txn import Transactions, Txn
from app.storage.tree.fs.walk import Tree
from app.storage.tree.records import (
    load_index,
    read_turn,
    write_json,
)
from app.storage.tree.usage import TreeUsage


class TaskWrites(Protocol):
    """What the artifacts need of the task engine (TaskStore): its paths, counters and lock,
    and the steps of a write its turns share."""

    layout: Layout
    usage: TreeUsage
    txns: Transactions
    max_artifact_bytes: int
    retention_us: int

    def now_us(self) -> int: ...

    def transaction(self, scope: Scope, task_id: str) -> AbstractContextManager[Txn]: ...

    def alive(self, record: TurnRecord | None, now_us: int) -> TurnRecord | None: ...

    def next_updated_us(self, index: dict[str, Any] | None, now_us: int) -> int: ...

    def write_derived(
        self,
        scope: Scope,
        task_id: str,
        task_dir: Path,
        record: TurnRecord,
        index: dict[str, Any] | None,
        *,
        summary: bool,
        ticket: Ticket = ...,
        usage: TurnUsage | None = None,
    ) -> None: ...


class TaskArtifacts:
    """The artifacts of every task of one tree (TaskStore's)."""

    def __init__(self, tasks: TaskWrites) -> None:
        self.tasks = tasks

    def put_artifact(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        name: str,
        stream: IO[bytes],
        *,
        content_type: str,
        if_match: str | None = None,
        if_none_match: bool = False,
        size: int | None = None,
    ) -> ArtifactInfo:
        """Stream an artifact to disk (fsynced before any lock), then publish it under the lock.

        ``size``: the body's declared length. It is admitted (floor, quotas) before a byte is
        read; a body of unknown length is admitted slice by slice as it streams in.
        """
        validate_turn(turn)
        validate_artifact_name(name)
        path = self.tasks.layout.artifact(scope, task_id, turn, name)
        self.tasks.layout.check_inside(path)
        turn_dir = path.parent.parent
        self.tasks.layout.check_inside(turn_dir / TURN_META, below=turn_dir)
        found = self.tasks.alive(read_turn(turn_dir), self.tasks.now_us())
        if found is None:
            raise NotFound(f"turn {turn} of task {task_id} not found; PUT the turn first")
        # What it replaces, as read now; checked again under the lock (ticket.cover).
        before = next((a.size for a in found.artifacts if a.name == name), 0)
        ticket = self.tasks.usage.admit(
            scope, gross=size or 0, add_bytes=0 if size is None else size - before
        )
        try:
            body = ReservingStream(
                stream, ticket, self.tasks.usage.floor, known=size is not None, credit=before
            )
            # The staged bytes join the transaction's group flush (if any).
            with group_commit(self.tasks.layout.root, enabled=self.tasks.txns.group_commit):
                return self._put_artifact(
                    scope,
                    task_id,
                    turn,
                    name,
                    cast("IO[bytes]", body),
                    content_type,
                    if_match,
                    if_none_match,
                    ticket,
                )
        finally:
            ticket.release()  # nothing to release once the write settled it

    def _put_artifact(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        name: str,
        stream: IO[bytes],
        content_type: str,
        if_match: str | None,
        if_none_match: bool,
        ticket: Ticket,
    ) -> ArtifactInfo:
        path = self.tasks.layout.artifact(scope, task_id, turn, name)
        turn_dir = path.parent.parent
        # Staged in the turn's directory, not in artifacts/: that one is created under the
        # lock, so a failed upload can remove it again without touching a concurrent one's
        # bytes (an unnamed temp file does not keep a directory from being removed).
        with (
            self._stage(turn_dir, stream, task_id, turn) as staged,
            self.tasks.transaction(scope, task_id) as txn,
            os_errors(),
        ):
            now_us = self.tasks.now_us()
            record = self.tasks.alive(read_turn(turn_dir), now_us)
            if record is None:
                raise NotFound(f"turn {turn} of task {task_id} not found")
            if not staged.still_staged():
                # The turn had expired and was re-created while this body streamed in: the
                # staged bytes went to the trash with the old turn directory.
                raise Conflict(
                    f"turn {turn} of task {task_id} was replaced during the upload; retry"
                )
            current = next((a for a in record.artifacts if a.name == name), None)
            check_preconditions(current.etag if current else None, if_match, if_none_match)
            # What it adds, now known exactly: reserve any more it needs before writing.
            ticket.cover(staged.size - (current.size if current else 0), 0)
            task_dir = turn_dir.parent
            index = load_index(self.tasks.layout.tree, task_dir, task_id)
            updated_us = self.tasks.next_updated_us(index, now_us)
            info = ArtifactInfo(
                name=name,
                content_type=content_type,
                size=staged.size,
                sha256=staged.sha256,
                updated_at=iso_us(updated_us),
            )
            txn.begin()
            # The bytes are published before meta.json (the commit) names them. Keep the
            # previous bytes as a hard link until the commit: if the write fails or dies in
            # between, repair_task (run on failure, or by the next writer through the dirty
            # marker) puts them back so the record and the bytes never disagree.
            created = self._artifacts_dir(turn_dir)
            try:
                backup = self._keep_previous(path)
                staged.publish(path)
            except BaseException:
                if created:
                    self.tasks.layout.tree.rmdir(path.parent)  # only if still empty
                raise
            flush_now()  # the bytes and their name are durable before a record names them
            record = replace(
                record,
                artifacts=tuple(a for a in record.artifacts if a.name != name) + (info,),
                updated_at=info.updated_at,
                retain_until=iso_us(updated_us + self.tasks.retention_us),
                updated_us=updated_us,
            )
            write_json(turn_dir / TURN_META, turn_to_json(record))
            commit_point()
            self.tasks.write_derived(
                scope, task_id, task_dir, record, index, summary=False, ticket=ticket
            )
            if backup is not None:
                remove_quietly(backup)
        return info

    def stage_uploads(
        self,
        scope: Scope,
        uploads: Iterable[ArtifactUpload],
        credits: dict[str, int],
        ticket: Ticket,
        stack: ExitStack,
    ) -> list[StagedUpload[StagedFile]]:
        """Stream each upload to a synced temp file in the project's directory, before any
        lock, each admitted (floor, quotas: ``ticket``) as it streams in past ``credits``
        (the size of the live artifact of its name, which it replaces). Each staged file is
        removed when ``stack`` closes unless it was published by then.

        The project's directory, not the turn's: the turn and its task may not exist yet,
        and creating them outside the lock would show a half-made task to the next writer.
        """
        project_dir = self.tasks.layout.check_inside(self.tasks.layout.project_dir(scope))
        if not os.path.isdir(project_dir):  # checked: no link on the way
            make_dirs(project_dir, self.tasks.layout.root)
        staged = []
        for upload in checked_uploads(uploads):
            body = ReservingStream(
                upload.stream,
                ticket,
                self.tasks.usage.floor,
                known=False,
                credit=credits.get(upload.name, 0),
            )
            file = stack.enter_context(
                stage_stream(
                    project_dir, cast("IO[bytes]", body), limit=self.tasks.max_artifact_bytes
                )
            )
            staged.append(
                StagedUpload(upload.name, upload.content_type, file.size, file.sha256, file)
            )
        return staged

    def publish_uploads(self, turn_dir: Path, staged: list[StagedUpload[StagedFile]]) -> list[Path]:
        """Publish staged uploads into ``turn_dir``'s artifacts/ (the caller holds the task's
        lock and will commit ``meta.json`` next); return the kept previous copies, which the
        caller removes once the record that names the new bytes is committed."""
        if not staged:
            return []
        directory = turn_dir / ARTIFACTS_DIR
        self._artifacts_dir(turn_dir)
        with os_errors():
            backups = []
            for upload in staged:
                path = directory / upload.name
                if not upload.handle.still_staged():
                    raise Conflict(f"artifact {upload.name} was removed during the upload; retry")
                backups.append(self._keep_previous(path))
                upload.handle.publish(path)
        flush_now()  # the bytes and their names are durable before a record names them
        return [b for b in backups if b is not None]

    def _keep_previous(self, path: Path) -> Path | None:
        """Hard-link the bytes at ``path`` (an artifact about to be replaced) to its kept copy,
        which repair puts back if the replacement's record never commits."""
        backup = path.parent / f"{PREV_PREFIX}{path.name}"
        remove_quietly(backup)
        if not os.path.lexists(path):
            return None
        if not os.path.isfile(path):  # lexists: not a link (checked above)
            raise Corrupt(f"{path}: not a regular file where an artifact belongs")
        os.link(path, backup)
        return backup

    def _stage(self, turn_dir: Path, stream: IO[bytes], task_id: str, turn: int) -> StagedFile:
        try:
            return stage_stream(turn_dir, stream, limit=self.tasks.max_artifact_bytes)
        except FileNotFoundError:  # the turn was deleted since it was read
            raise NotFound(f"turn {turn} of task {task_id} not found") from None

    def _artifacts_dir(self, turn_dir: Path) -> bool:
        """Make sure the turn's artifacts/ exists (the caller holds the task's lock and has
        read the turn alive); return whether this call created it."""
        directory = turn_dir / ARTIFACTS_DIR
        with os_errors():
            try:
                os.mkdir(directory, DIR_MODE)
            except FileExistsError:
                self.tasks.layout.check_inside(directory, below=turn_dir)
                return False
            fsync_dir(turn_dir)
            return True

    def open_artifact(self, scope: Scope, task_id: str, turn: int, name: str) -> ArtifactStream:
        """Open a live artifact for streaming; the caller closes ``file``."""
        validate_turn(turn)
        validate_artifact_name(name)
        path = self.tasks.layout.artifact(scope, task_id, turn, name)
        self.tasks.layout.check_inside(path)
        turn_dir = path.parent.parent
        self.tasks.layout.check_inside(turn_dir / TURN_META)
        backup = path.parent / f"{PREV_PREFIX}{name}"
        missing = f"artifact {name} of turn {turn} of task {task_id} not found"
        for _ in range(8):
            info = self._live_artifact(turn_dir, name)
            if info is None:
                raise NotFound(missing)
            try:
                fd = open_noatime(path)
            except FileNotFoundError:
                raise NotFound(missing) from None
            file: BinaryIO = os.fdopen(fd, "rb")
            if os.path.lexists(backup):
                # A replacement is between publishing its bytes and committing its record, or
                # died (or failed) there; until its commit or the next writer's repair, the
                # committed bytes may be the kept previous copy. Serve the record's copy.
                file = committed_copy(file, backup, info.sha256)
            # Readers take no lock: a replacement committed between reading the record and
            # opening the bytes would pair new bytes with the old record. If the record moved
            # on meanwhile, start over.
            if self._live_artifact(turn_dir, name) == info:
                return ArtifactStream(info=info, file=file, size=os.fstat(file.fileno()).st_size)
            file.close()
        raise LockTimeout(f"artifact {name} is being replaced; retry shortly")

    def _live_artifact(self, turn_dir: Path, name: str) -> ArtifactInfo | None:
        record = self.tasks.alive(read_turn(turn_dir), self.tasks.now_us())
        return (
            None if record is None else next((a for a in record.artifacts if a.name == name), None)
        )


def _file_sha256(path: Path) -> str | None:
    try:
        return sha256_file(path)[1]
    except FileNotFoundError:
        return None


def _fh_sha256(fh: BinaryIO) -> str:
    digest = hashlib.sha256()
    fh.seek(0)
    while chunk := fh.read(MiB):
        digest.update(chunk)
    fh.seek(0)
    return digest.hexdigest()


def committed_copy(file: BinaryIO, backup: Path, sha256: str) -> BinaryIO:
    """``file``, or the kept previous copy ``backup`` when only that one has ``sha256``."""
    if _fh_sha256(file) == sha256:
        return file
    try:
        fd = open_noatime(backup)
    except FileNotFoundError:
        return file
    other = os.fdopen(fd, "rb")
    if _fh_sha256(other) == sha256:
        file.close()
        return other
    other.close()
    return file


def reconcile_artifacts(tree: Tree, directory: Path, record: TurnRecord) -> None:
    """Make the artifact files of a turn match its committed record (caller holds the lock).

    Artifacts are published only under the task lock and committed before it is released,
    so a file the record does not name, or bytes that differ from the record next to a kept
    previous copy, are what a failed or killed put_artifact left behind. A linked
    ``artifacts/`` is refused (UnsafePath), never listed.
    """
    names = [e.name for e in tree.entries(directory) if e.is_file]
    expected = {a.name: a for a in record.artifacts}
    for name in names:
        if name.startswith(PREV_PREFIX):
            info = expected.get(name[len(PREV_PREFIX) :])
            if (
                info is not None
                and _file_sha256(directory / info.name) != info.sha256
                and _file_sha256(directory / name) == info.sha256
            ):
                os.replace(directory / name, directory / info.name)
                fsync_dir(directory)
            else:
                remove_quietly(directory / name)
        elif not name.startswith(TMP_PREFIX) and name not in expected:
            remove_quietly(directory / name)
