"""Backups of the PostgreSQL + object store backend, in the format every backend shares
(core/archive.py): a backup of the tree imports here, and one written here
imports into the tree, member for member the same bytes.

Export: each task and each store is read in a snapshot transaction of its own (REPEATABLE
READ), so each is as of one moment while writers run; its records stream from a server-side
cursor and its artifacts from the object store, by the keys its rows name, one at a time. The
export holds the backup lock (db.backup_lock) from start to end: while it does, objects
that lose their rows (a task deleted, a turn expired, an artifact replaced) stay in the store
for the sweeper's orphan pass, so a snapshot never names an object that is gone.

A restore (restore.py) reads the same format back.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

from app.storage.core.archive import (
    CURSOR_KEY_MEMBER,
    ArchiveError,
    BackupWriter,
    ExportSummary,
    store_member,
    task_member,
)
from app.storage.core.clock import Clock, iso
from app.storage.core.encoding import dumps
from app.storage.core.files import atomic_file
from app.storage.core.models import ArtifactInfo
from app.storage.core.names import (
    ARTIFACTS_DIR,
    CURSOR_KEY,
    STORE_RECORD,
    TASK_RECORD,
    TURN_META,
    Scope,
    turn_dirname,
)
from app.storage.core.records import turn_to_json
from app.storage.core.store_records import StoreRecord
from app.storage.pg.blobs import BlobStore
from app.storage.pg.db import Database, backup_lock, translated
from app.storage.pg.listing import (
    ARTIFACT_COLUMNS,
    KEY,
    TURN_COLUMNS,
    artifact_row,
    task_key,
    turn_row,
)
from app.storage.pg.store_index import (
    RECORD_COLUMNS,
    version_record,
)
from app.storage.pg.tasks import PgTaskStore


class PgBackups(Protocol):
    """What a backup is taken from and restored into (PgStorage): its database and bucket,
    its task engine, its keys, its projects."""

    db: Database
    blobs: BlobStore
    tasks: PgTaskStore

    @property
    def clock(self) -> Clock: ...

    @property
    def lock_timeout(self) -> float: ...

    def key(self, name: str) -> bytes: ...

    def projects(self, tenants: Iterable[str] | None = None) -> list[Scope]: ...


_BATCH = 500  # ids per listing query, rows per server-side cursor fetch


# -- export ----------------------------------------------------------------------------------
def export_pg(
    storage: PgBackups, out: Path, *, tenant: str | None = None, project: str | None = None
) -> ExportSummary:
    """Write a backup of one project, one tenant or the whole deployment (None: all)."""
    if project is not None and tenant is None:
        raise ArchiveError("--project needs --tenant")
    out = Path(os.path.abspath(out))
    with (
        translated("backup"),
        storage.db.connect(autocommit=True) as lock,
        backup_lock(lock),
        atomic_file(out) as raw,
    ):
        writer = BackupWriter(raw, tenant=tenant, project=project)
        try:
            for scope in _scopes(storage, tenant, project):
                for task_id in _ids(storage, "task_id", "tasks", scope):
                    _export_task(storage, writer, scope, task_id)
                for store_id in _ids(storage, "id", "stores", scope):
                    _export_store(storage, writer, scope, store_id)
            if tenant is None:
                writer.add(CURSOR_KEY_MEMBER, storage.key(CURSOR_KEY))
            manifest = writer.finish(iso(storage.clock()))
        except BaseException:
            writer.abandon()
            raise
    return ExportSummary(out, manifest["counts"], manifest["members"])


def _scopes(storage: PgBackups, tenant: str | None, project: str | None) -> list[Scope]:
    if tenant is not None and project is not None:
        found = storage.projects([tenant])
        if Scope(tenant, project) not in found:
            raise ArchiveError(f"project {tenant}/{project} does not exist")
        return [Scope(tenant, project)]
    return storage.projects(None if tenant is None else [tenant])


def _ids(storage: PgBackups, column: str, table: str, scope: Scope) -> Iterator[str]:
    """The ids of a project's tasks or stores in byte order, a batch per query (a project of
    any size is listed in constant memory)."""
    last = ""
    while True:
        with storage.db.snapshot("backup") as conn:
            rows = conn.execute(
                f"SELECT {column} FROM {table} WHERE tenant = %s AND project = %s"
                f" AND {column} > %s ORDER BY {column} LIMIT %s",
                (scope.tenant, scope.project, last, _BATCH),
            ).fetchall()
        if not rows:
            return
        for row in rows:
            yield str(row[0])
        last = str(rows[-1][0])


def _export_task(storage: PgBackups, writer: BackupWriter, scope: Scope, task_id: str) -> None:
    """Write one task's records and artifacts, all as of one snapshot."""
    with storage.db.snapshot("backup") as conn:
        task = conn.execute(
            f"SELECT owner, created_at FROM tasks WHERE {KEY}", task_key(scope, task_id)
        ).fetchone()
        if task is None:
            return  # deleted since the listing
        record = {"version": 1, "task_id": task_id, "owner": task[0], "created_at": task[1]}
        with conn.cursor(name="backup_turns") as turns:
            turns.itersize = 8  # a turn's record may be megabytes: a few at a time
            turns.execute(
                f"SELECT {TURN_COLUMNS} FROM turns WHERE {KEY} ORDER BY turn",
                task_key(scope, task_id),
            )
            member = f"{scope.tenant}/{scope.project}/{task_id}"
            first = True
            for row in turns:
                if first:
                    writer.add(task_member(*_parts(scope, task_id), TASK_RECORD), dumps(record))
                    first = False
                turn = turn_row(row)
                artifacts = [
                    artifact_row(r)
                    for r in conn.execute(
                        f"SELECT {ARTIFACT_COLUMNS} FROM artifacts WHERE {KEY}"
                        " AND turn = %(turn)s ORDER BY updated_us, name",
                        task_key(scope, task_id, turn=turn.turn),
                    )
                ]
                full = turn.record(task_id, tuple(info for _, info, _ in artifacts))
                prefix = turn_dirname(turn.turn)
                writer.add(
                    task_member(*_parts(scope, task_id), f"{prefix}/{TURN_META}"),
                    dumps(turn_to_json(full)),
                )
                for _, info, blob in artifacts:
                    name = task_member(
                        *_parts(scope, task_id), f"{prefix}/{ARTIFACTS_DIR}/{info.name}"
                    )
                    _export_artifact(storage, writer, name, info, blob, member)


def _parts(scope: Scope, task_id: str) -> tuple[str, str, str]:
    return scope.tenant, scope.project, task_id


def _export_artifact(
    storage: PgBackups,
    writer: BackupWriter,
    name: str,
    info: ArtifactInfo,
    blob: str,
    where: str,
) -> None:
    try:
        body = storage.blobs.open(blob, info.size)
    except FileNotFoundError:
        raise ArchiveError(
            f"{where}: artifact {info.name} is listed but its bytes are missing from the"
            f" object store ({blob}); `flask --app wsgi fsck` lists every such artifact"
        ) from None
    with body:
        writer.add_stream(name, body, info.size, info.sha256)  # type: ignore[arg-type]


def _export_store(storage: PgBackups, writer: BackupWriter, scope: Scope, store_id: str) -> None:
    """Write one store's record and versions, all as of one snapshot."""
    with storage.db.snapshot("backup") as conn:
        row = conn.execute(
            "SELECT record FROM stores WHERE id = %s AND tenant = %s AND project = %s",
            (store_id, scope.tenant, scope.project),
        ).fetchone()
        if row is None:
            return  # deleted since the listing
        record = StoreRecord.from_json(json.loads(row[0]), Path(store_id))
        writer.add(
            store_member(scope.tenant, scope.project, store_id, STORE_RECORD),
            dumps(record.to_json()),
        )
        with conn.cursor(name="backup_versions") as versions:
            versions.itersize = _BATCH
            versions.execute(
                f"SELECT {RECORD_COLUMNS} FROM versions WHERE store_id = %s ORDER BY id",
                (store_id,),
            )
            for version in versions:
                found = version_record(store_id, version)
                writer.add(
                    store_member(
                        scope.tenant, scope.project, store_id, f"versions/{found.id}.json"
                    ),
                    dumps(found.to_json()),
                )
