"""Restoring a backup (core/archive.py) into the PostgreSQL + object store backend: all of it,
or nothing.

all of it, or nothing. Records go to temporary tables of one session of their own
(the staging area, dropped by PostgreSQL with the session, so a killed import leaves no
rows), artifacts to new objects, each before the row that names it. Nothing of it is visible
until the whole backup has passed every check; then one transaction checks for tasks and
stores that exist, moves every staged row into place, recomputes the listing columns and the
project counters, and commits. A refusal deletes the objects the import uploaded; what a
killed import uploaded no row names, and the sweeper's orphan pass removes it (the import
holds the backup lock too, so that pass leaves its objects alone however long it takes).
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, BinaryIO

import psycopg
from psycopg import errors as pg_errors

from app.storage.core.archive import ArchiveError, BackupReader, ImportSummary, Member, MemberName
from app.storage.core.clock import parse_iso_us
from app.storage.core.encoding import dumps_compact
from app.storage.core.errors import StorageError
from app.storage.core.ledger import TURN_COLUMNS, entry_of
from app.storage.core.models import ArtifactInfo, TurnRecord
from app.storage.core.names import (
    CURSOR_KEY,
    Scope,
)
from app.storage.core.restore import Group, Record, Restore
from app.storage.core.store_records import StoreRecord, VersionRecord
from app.storage.core.task_rules import meta_facts
from app.storage.pg import digest as pgd, usage as pgu
from app.storage.pg.backup import PgBackups
from app.storage.pg.blobs import BlobError
from app.storage.pg.db import backup_lock, translated
from app.storage.pg.store_index import (
    VERSION_COLUMNS,
    as_json,
    marks,
    version_values,
)

_DELETE_BATCH = 1000


# -- import ----------------------------------------------------------------------------------
# The staging area: temporary tables of the import's own session, shaped like the tables
# they go to (LIKE copies the columns' types and collations, and with INDEXES their keys).
_STAGING = """
CREATE TEMP TABLE staged_tasks (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    owner text,
    created_at text NOT NULL,
    PRIMARY KEY (tenant, project, task_id)
);
CREATE TEMP TABLE staged_turns (LIKE turns INCLUDING DEFAULTS INCLUDING INDEXES);
CREATE TEMP TABLE staged_ledger_turns (LIKE ledger_turns INCLUDING DEFAULTS);
CREATE TEMP TABLE staged_artifacts (LIKE artifacts INCLUDING DEFAULTS INCLUDING INDEXES);
CREATE TEMP TABLE staged_stores (LIKE stores INCLUDING DEFAULTS INCLUDING INDEXES);
CREATE TEMP TABLE staged_versions (LIKE versions INCLUDING DEFAULTS INCLUDING INDEXES);
CREATE TEMP TABLE staged_projects (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    PRIMARY KEY (tenant, project)
);
"""
_TURN_INSERT = (
    "tenant, project, task_id, turn, meta, summary, created_at, updated_at, retain_until,"
    " updated_us, retain_until_us, model, agent_id, exit_code"
)
# Each turn's ledger entry (core/ledger.py): its trigger moves the rollups as it lands.
_LEDGER_INSERT = ", ".join(("tenant", "project", "task_id", "turn", *TURN_COLUMNS))
_ARTIFACT_INSERT = (
    "tenant, project, task_id, turn, name, content_type, size, sha256, updated_at, updated_us, blob"
)
_STORE_INSERT = "id, tenant, project, record, created_us, archived"
_SAME_TASK = "t.tenant = s.tenant AND t.project = s.project AND t.task_id = s.task_id"
_OF_TASKS = (
    f"JOIN staged_tasks s ON {_SAME_TASK} WHERE s.tenant = p.tenant AND s.project = p.project"
)
_OF_STORES = "JOIN staged_stores s ON s.id = {} WHERE s.tenant = p.tenant AND s.project = p.project"
# What the backup's tasks and stores hold in each of its projects, as the usage counters
# (pg/usage.py) count it; the task counter is moved by added_tasks.
_HELD_KINDS = (
    "turns",
    "artifacts",
    "artifact_bytes",
    "turn_bytes",
    "stores",
    "memories",
    "memory_bytes",
    "versions",
    "version_bytes",
)
_HELD = f"""
SELECT p.tenant, p.project,
    (SELECT count(*) FROM turns t {_OF_TASKS}),
    (SELECT count(*) FROM artifacts t {_OF_TASKS}),
    (SELECT coalesce(sum(t.size), 0) FROM artifacts t {_OF_TASKS}),
    (SELECT coalesce(sum(octet_length(t.meta) + octet_length(t.summary)), 0)
     FROM turns t {_OF_TASKS}),
    (SELECT count(*) FROM stores t {_OF_STORES.format("t.id")}),
    (SELECT count(*) FROM memories t {_OF_STORES.format("t.store_id")}),
    (SELECT coalesce(sum(t.size), 0) FROM memories t {_OF_STORES.format("t.store_id")}),
    (SELECT count(*) FROM versions t {_OF_STORES.format("t.store_id")}),
    (SELECT coalesce(sum(t.size), 0) FROM versions t {_OF_STORES.format("t.store_id")})
FROM staged_projects p
"""


def _read_all(member: Member) -> bytes:
    """A record's bytes (at most MAX_RECORD_BYTES: the reader refuses a larger one)."""
    data = bytearray()
    while chunk := member.stream.read(member.size - len(data)):
        data += chunk
    return bytes(data)


class _Importer(Restore):
    """Stage a backup's members in one session's temporary tables and new objects."""

    def __init__(
        self,
        storage: PgBackups,
        conn: psycopg.Connection[Any],
        *,
        tenant: str | None,
        project: str | None,
    ) -> None:
        super().__init__(
            tenant=tenant, project=project, max_artifact_bytes=storage.tasks.max_artifact_bytes
        )
        self.storage = storage
        self.conn = conn
        self.tasks = 0
        self.stores = 0
        # Of the task in progress: its objects not yet in a committed staged row (deleted if
        # the import is refused), each turn's artifact list, the earliest turn creation.
        self.uploads: dict[tuple[int, str], str] = {}
        self.listed: dict[int, tuple[ArtifactInfo, ...]] = {}
        self.task_record: dict[str, Any] = {}
        self.first_created = ""
        self.scopes: list[Scope] = []  # the projects the published import wrote to

    def begin(self, group: Group) -> None:
        self.uploads, self.listed, self.task_record, self.first_created = {}, {}, {}, ""
        self.conn.execute(
            "INSERT INTO staged_projects VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (group.scope.tenant, group.scope.project),
        )

    def stage(self, group: Group, member: Member) -> bytes | None:
        name = member.name
        if name.kind != "artifact":
            return _read_all(member)
        listed = {a.name: a for a in self.listed.get(name.turn, ())}
        info = listed.get(name.leaf)
        key = self.storage.tasks.blob_key(group.scope, group.owner, name.turn, name.leaf)
        self.uploads[(name.turn, name.leaf)] = key
        self.storage.blobs.put_new(
            key,
            member.stream,  # type: ignore[arg-type]
            limit=self.storage.tasks.max_artifact_bytes,
            content_type=info.content_type if info else "application/octet-stream",
        )
        return None

    def record(self, group: Group, name: MemberName, record: Record) -> None:
        scope = group.scope
        if isinstance(record, dict):
            self.task_record = record
        elif isinstance(record, TurnRecord):
            self._stage_turn(scope, record)
        elif isinstance(record, StoreRecord):
            self.conn.execute(
                f"INSERT INTO staged_stores ({_STORE_INSERT}) VALUES ({marks(_STORE_INSERT)})",
                (
                    record.id,
                    scope.tenant,
                    scope.project,
                    as_json(record.to_json()),
                    record.created_us,
                    record.archived_at is not None,
                ),
            )
        elif isinstance(record, VersionRecord):
            self._stage_version(group.owner, name, record)

    def _stage_turn(self, scope: Scope, record: TurnRecord) -> None:
        try:
            retain_us = parse_iso_us(record.retain_until)
            for info in record.artifacts:
                parse_iso_us(info.updated_at)
        except ValueError as exc:
            raise ArchiveError(f"turn {record.turn} of task {record.task_id}: {exc}") from None
        self.listed[record.turn] = record.artifacts
        if not self.first_created or record.created_at < self.first_created:
            self.first_created = record.created_at
        model, agent_id, exit_code = meta_facts(record.meta)
        self.conn.execute(
            f"INSERT INTO staged_turns ({_TURN_INSERT}) VALUES ({marks(_TURN_INSERT)})",
            (
                scope.tenant,
                scope.project,
                record.task_id,
                record.turn,
                dumps_compact(record.meta).decode("utf-8"),
                record.summary_md.encode("utf-8"),
                record.created_at,
                record.updated_at,
                record.retain_until,
                record.updated_us,
                retain_us,
                model,
                agent_id,
                exit_code,
            ),
        )

        entry = entry_of(record)
        self.conn.execute(
            f"INSERT INTO staged_ledger_turns ({_LEDGER_INSERT}) VALUES ({marks(_LEDGER_INSERT)})",
            (scope.tenant, scope.project, entry.task_id, entry.turn, *entry.values()),
        )

    def _stage_version(self, store_id: str, name: MemberName, record: VersionRecord) -> None:
        try:
            self.conn.execute(
                f"INSERT INTO staged_versions ({VERSION_COLUMNS})"
                f" VALUES ({marks(VERSION_COLUMNS)})",
                version_values(store_id, record),
            )
        except pg_errors.UniqueViolation:
            raise ArchiveError(f"{name.name}: appears twice") from None

    def task_done(self, group: Group) -> None:
        scope = group.scope
        created = self.task_record.get("created_at") or self.first_created
        owner = self.task_record.get("owner")
        self.conn.execute(
            "INSERT INTO staged_tasks VALUES (%s, %s, %s, %s, %s)",
            (
                scope.tenant,
                scope.project,
                group.owner,
                owner if isinstance(owner, str) else None,
                str(created),
            ),
        )
        rows = []
        for turn, artifacts in self.listed.items():
            for info in artifacts:
                rows.append(
                    (
                        scope.tenant,
                        scope.project,
                        group.owner,
                        turn,
                        info.name,
                        info.content_type,
                        info.size,
                        info.sha256,
                        info.updated_at,
                        parse_iso_us(info.updated_at),
                        self.uploads[(turn, info.name)],
                    )
                )
        if rows:
            with self.conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO staged_artifacts ({_ARTIFACT_INSERT})"
                    f" VALUES ({marks(_ARTIFACT_INSERT)})",
                    rows,
                )
        self.conn.commit()
        self.uploads = {}  # named by committed staged rows from here on
        self.tasks += 1

    def store_done(self, group: Group) -> None:
        self.conn.commit()
        self.stores += 1

    # -- the last transaction --------------------------------------------------------------
    def publish(self, *, overwrite: bool) -> None:
        """Move every staged row into place in one transaction (and a whole backup's cursor
        key, into a deployment that held nothing: processes that start after it use it)."""
        conn = self.conn
        conn.rollback()
        ms = max(1, int(self.storage.lock_timeout * 1000))
        conn.execute(f"SET LOCAL lock_timeout = {ms}")
        self._check_conflicts(overwrite)
        empty = not conn.execute("SELECT 1 FROM projects LIMIT 1").fetchone()
        # What each project's task counter gains: the tasks it did not hold before.
        conn.execute(
            "CREATE TEMP TABLE added_tasks AS SELECT s.tenant, s.project,"
            " count(*) FILTER (WHERE t.task_id IS NULL) AS n FROM staged_tasks s"
            f" LEFT JOIN tasks t ON {_SAME_TASK} GROUP BY s.tenant, s.project"
        )
        # What the tasks and stores it replaces held (nothing, unless ``overwrite``).
        before = self._held()
        if overwrite:
            conn.execute(
                "CREATE TEMP TABLE replaced_blobs AS SELECT a.blob FROM artifacts a"
                " JOIN staged_tasks s ON a.tenant = s.tenant AND a.project = s.project"
                " AND a.task_id = s.task_id"
            )
            conn.execute(f"DELETE FROM tasks t USING staged_tasks s WHERE {_SAME_TASK}")
            conn.execute(
                "DELETE FROM stores t USING staged_stores s WHERE t.id = s.id"
                " AND t.tenant = s.tenant AND t.project = s.project"
            )
        self._move_rows()
        # Added to the usage counters, like the task counter, by what the backup's tasks
        # and stores hold less what they replaced.
        for (tenant, project), now in self._held().items():
            was = before.get((tenant, project), (0,) * len(_HELD_KINDS))
            pgu.add(
                conn,
                Scope(tenant, project),
                **{k: n - w for k, n, w in zip(_HELD_KINDS, now, was, strict=True)},
            )
        if self.key is not None and self.target is None and empty:
            conn.execute(
                "INSERT INTO keys (name, value) VALUES (%s, %s)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (CURSOR_KEY, self.key),
            )
        self.scopes = [
            Scope(*r) for r in conn.execute("SELECT tenant, project FROM staged_projects")
        ]
        conn.commit()

    def _held(self) -> dict[tuple[str, str], tuple[int, ...]]:
        return {
            (str(r[0]), str(r[1])): tuple(int(v) for v in r[2:]) for r in self.conn.execute(_HELD)
        }

    def _check_conflicts(self, overwrite: bool) -> None:
        conn = self.conn
        elsewhere = conn.execute(
            "SELECT s.id, t.tenant, t.project FROM staged_stores s JOIN stores t ON t.id = s.id"
            " WHERE (t.tenant, t.project) <> (s.tenant, s.project) ORDER BY s.id LIMIT 1"
        ).fetchone()
        if elsewhere is not None:
            raise ArchiveError(
                f"memory store {elsewhere[0]} exists in {elsewhere[1]}/{elsewhere[2]}: a store"
                " id names one store in a deployment of this backend, so a project's stores"
                " cannot be restored beside the project they came from (restore it into another"
                " deployment, or delete the stores there first). Nothing was imported."
            )
        if overwrite:
            return
        taken = [
            f"{r[0]}/{r[1]}/{r[2]}"
            for r in conn.execute(
                "SELECT s.tenant, s.project, s.task_id FROM staged_tasks s JOIN tasks t"
                f" ON {_SAME_TASK} UNION ALL SELECT s.tenant, s.project, s.id FROM staged_stores s"
                " JOIN stores t ON t.id = s.id AND t.tenant = s.tenant AND t.project = s.project"
                " ORDER BY 1, 2, 3 LIMIT 10"
            )
        ]
        if taken:
            count = conn.execute(
                f"SELECT (SELECT count(*) FROM staged_tasks s JOIN tasks t ON {_SAME_TASK})"
                " + (SELECT count(*) FROM staged_stores s JOIN stores t ON t.id = s.id)"
            ).fetchone()
            raise ArchiveError(
                f"{count[0] if count else len(taken)} task(s) or store(s) already exist:"
                f" {', '.join(taken)}; pass --overwrite to replace them. Nothing was imported."
            )

    def _move_rows(self) -> None:
        conn = self.conn
        conn.execute(
            "INSERT INTO projects (tenant, project) SELECT tenant, project FROM staged_projects"
            " ON CONFLICT DO NOTHING"
        )
        # The listing columns, as the tasks engine's recompute sets them after a write.
        conn.execute(
            "INSERT INTO tasks (tenant, project, task_id, owner, created_at, updated_us,"
            " retain_until_us, turn_count, latest_turn, min_retain_us, model, agent_id,"
            " exit_code, bytes) SELECT s.tenant, s.project, s.task_id, s.owner, s.created_at,"
            " a.updated_us, a.retain_until_us, a.n, a.latest, a.min_retain, l.model,"
            " l.agent_id, l.exit_code, a.turn_bytes + b.size FROM staged_tasks s"
            " CROSS JOIN LATERAL (SELECT max(updated_us) AS updated_us,"
            " max(retain_until_us) AS retain_until_us, count(*) AS n, max(turn) AS latest,"
            " min(retain_until_us) AS min_retain,"
            " coalesce(sum(octet_length(meta) + octet_length(summary)), 0) AS turn_bytes"
            f" FROM staged_turns t WHERE {_SAME_TASK}) a"
            " CROSS JOIN LATERAL (SELECT coalesce(sum(size), 0) AS size FROM staged_artifacts t"
            f" WHERE {_SAME_TASK}) b CROSS JOIN LATERAL (SELECT model, agent_id, exit_code"
            f" FROM staged_turns t WHERE {_SAME_TASK} ORDER BY turn DESC LIMIT 1) l"
        )
        conn.execute(f"INSERT INTO turns ({_TURN_INSERT}) SELECT {_TURN_INSERT} FROM staged_turns")
        conn.execute(
            f"INSERT INTO ledger_turns ({_LEDGER_INSERT})"
            f" SELECT {_LEDGER_INSERT} FROM staged_ledger_turns"
        )
        conn.execute(
            f"INSERT INTO artifacts ({_ARTIFACT_INSERT})"
            f" SELECT {_ARTIFACT_INSERT} FROM staged_artifacts"
        )
        conn.execute(
            f"INSERT INTO stores ({_STORE_INSERT}, last_version_id, last_version_us)"
            f" SELECT {', '.join('s.' + c.strip() for c in _STORE_INSERT.split(','))},"
            " coalesce(v.last_id, ''), coalesce(v.last_us, 0) FROM staged_stores s"
            " LEFT JOIN (SELECT store_id, max(id) AS last_id, max(created_us) AS last_us"
            " FROM staged_versions GROUP BY store_id) v ON v.store_id = s.id"
        )
        conn.execute(
            f"INSERT INTO versions ({VERSION_COLUMNS}) SELECT {VERSION_COLUMNS}"
            " FROM staged_versions"
        )
        # Each memory is its newest version, unless that deleted it.
        conn.execute(
            "INSERT INTO memories (store_id, id, path, head, sha, size, created_at,"
            " updated_at, path_since) SELECT store_id, memory_id, path, id, sha, size,"
            " memory_created_at, created_at, path_since FROM (SELECT DISTINCT ON (store_id,"
            " memory_id) * FROM staged_versions ORDER BY store_id, memory_id, id DESC) head"
            " WHERE operation <> 'deleted'"
        )
        # Added to the counters, not recounted: writers of these projects may be adding to
        # them in transactions this one does not see.
        conn.execute(
            "UPDATE projects p SET tasks = p.tasks + coalesce(n.n, 0) FROM staged_projects s"
            " LEFT JOIN added_tasks n ON n.tenant = s.tenant AND n.project = s.project"
            " WHERE p.tenant = s.tenant AND p.project = s.project"
        )

    # -- clean-up ----------------------------------------------------------------------------
    def staged_blobs(self) -> Iterator[str]:
        """Every object this import uploaded (while its session lasts)."""
        yield from self.uploads.values()
        with self.conn.cursor(name="staged_blobs") as cur:
            cur.itersize = _DELETE_BATCH
            cur.execute("SELECT blob FROM staged_artifacts")
            for row in cur:
                yield str(row[0])

    def replaced_blobs(self) -> list[str]:
        return [str(r[0]) for r in self.conn.execute("SELECT blob FROM replaced_blobs")]


def _delete_in_batches(storage: PgBackups, keys: Iterator[str]) -> None:
    batch: list[str] = []
    for key in keys:
        batch.append(key)
        if len(batch) >= _DELETE_BATCH:
            storage.blobs.delete(batch)
            batch = []
    if batch:
        storage.blobs.delete(batch)


def import_pg(
    storage: PgBackups,
    archive: BinaryIO,
    *,
    tenant: str | None = None,
    project: str | None = None,
    overwrite: bool = False,
) -> ImportSummary:
    """Import a backup, all or nothing; ArchiveError (nothing imported) when it is refused."""
    reader = BackupReader(archive, max_artifact_bytes=storage.tasks.max_artifact_bytes)
    replaced: list[str] = []
    with translated("import"), storage.db.connect(autocommit=True) as conn, backup_lock(conn):
        conn.execute(_STAGING.encode())
        conn.autocommit = False
        importer = _Importer(storage, conn, tenant=tenant, project=project)
        try:
            try:
                for member in reader.members():
                    importer.member(member)
                importer.end()
                importer.publish(overwrite=overwrite)
            except (StorageError, psycopg.Error) as exc:
                raise _refused(exc) from None
        except BaseException:
            _clean_up(storage, importer)
            raise
        if overwrite:
            replaced = importer.replaced_blobs()
    storage.tasks.forget_blobs(replaced)  # once this import's lock is released
    # The imported tasks' project.md sections, now rather than on the first read (which
    # would write them if this stopped short).
    with contextlib.suppress(StorageError):
        for scope in importer.scopes:
            pgd.fill(storage.db, scope, storage.tasks.now_us)
    return ImportSummary(importer.tasks, importer.stores, reader.counts.as_dict())


def _refused(exc: Exception) -> ArchiveError:
    if isinstance(exc, ArchiveError):
        return exc
    if isinstance(exc, pg_errors.UniqueViolation):
        return ArchiveError(
            "a task or store of the backup was written meanwhile, or the backup holds two"
            f" memories at one path ({exc.diag.message_primary}). Nothing was imported."
        )
    if isinstance(exc, psycopg.Error):
        return ArchiveError(f"{exc.diag.message_primary or exc}. Nothing was imported.")
    return ArchiveError(str(exc))


def _clean_up(storage: PgBackups, importer: _Importer) -> None:
    """Delete what a refused import uploaded (best effort: no row names any of it, and the
    sweeper's orphan pass removes whatever is left)."""
    try:
        importer.conn.rollback()
        _delete_in_batches(storage, importer.staged_blobs())
    except (psycopg.Error, BlobError, StorageError):
        pass
