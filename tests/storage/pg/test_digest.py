"""project.md on PostgreSQL: one snapshot per read while writers go on, sections filled for
tasks written in bulk or before an upgrade, fsck against sections and counters changed by
hand (the format itself: tests/conformance/test_digest.py, on every backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from app.storage.backends import open_backend
from app.storage.core.errors import LockTimeout, StorageError
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend
from app.storage.pg import backup as pg_backup, digest as pg_digest, restore as pg_restore, schema
from tests.conformance.conftest import expected_digest, read_digest
from tests.conftest import FixedClock

pytestmark = pytest.mark.all_backends
WEB = Scope("acme", "web")


def sql(pg_settings: dict[str, Any], statement: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_settings["DATABASE_URL"], autocommit=True) as conn:
        cur = conn.execute(statement, params or None)
        return cur.fetchall() if cur.description else []


def write(pg_storage: StorageBackend, task_id: str, turn: int = 0, text: str = "") -> None:
    summary = text or f"# {task_id}\n\n" + f"notes of {task_id} turn {turn}. " * 20
    pg_storage.tasks.put_turn(WEB, task_id, turn, meta={"n": turn}, summary_md=summary)


def test_a_read_shows_one_moment_while_writers_go_on(
    pg_storage: StorageBackend, clock: FixedClock
) -> None:
    for i in range(700):  # more rows than one fetch of the stream
        write(pg_storage, f"t{i:04d}")
        clock.advance(seconds=1)
    want = expected_digest(pg_storage.tasks, WEB)
    file, size = pg_storage.tasks.open_digest(WEB)
    with file:
        head = file.read(2048)
        # Each of these would move or change a section the read has not reached yet.
        write(pg_storage, "t0000", 1, "the oldest task, written again")
        pg_storage.tasks.delete_task(WEB, "t0001")
        write(pg_storage, "t0002", 5, "a new turn of an old task")
        write(pg_storage, "new", 0, "a task of its own")
        rest = file.read()
    assert len(head) + len(rest) == size
    assert (head + rest).decode() == want
    after = read_digest(pg_storage.tasks, WEB)
    assert after == expected_digest(pg_storage.tasks, WEB) != want
    assert after.index("## t0002") < after.index("## t0000") < after.index("## t0699")
    assert "## t0001\n" not in after and pg_storage.fsck().clean


def test_tasks_without_sections_are_filled_by_the_first_read(
    pg_storage: StorageBackend, pg_settings: dict[str, Any], clock: FixedClock
) -> None:
    for i in range(1200):  # more than one batch of the fill
        write(pg_storage, f"t{i:04d}", i % 3)
        clock.advance(seconds=1)
    want = expected_digest(pg_storage.tasks, WEB)
    sql(pg_settings, "DELETE FROM digest_sections WHERE task_id >= 't0100'")
    assert sql(pg_settings, "SELECT count(*) FROM digest_sections") == [(100,)]
    assert read_digest(pg_storage.tasks, WEB) == want
    assert sql(pg_settings, "SELECT count(*) FROM digest_sections") == [(1200,)]
    assert pg_storage.fsck().clean


def test_a_read_renders_a_few_unwritten_sections_and_refuses_many(
    pg_storage: StorageBackend,
    pg_settings: dict[str, Any],
    clock: FixedClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a read does when sections are still missing after it filled the project (a
    concurrent import brought tasks meanwhile): it renders them, up to a bound."""
    for i in range(10):
        write(pg_storage, f"t{i}")
        clock.advance(seconds=1)
    want = expected_digest(pg_storage.tasks, WEB)
    sql(pg_settings, "DELETE FROM digest_sections WHERE task_id > 't3'")
    monkeypatch.setattr(pg_digest, "fill", lambda *args: 0)
    monkeypatch.setattr(pg_digest, "MAX_MISSING", 6)
    assert read_digest(pg_storage.tasks, WEB) == want
    monkeypatch.setattr(pg_digest, "MAX_MISSING", 5)
    with pytest.raises(LockTimeout, match="retry shortly"):
        pg_storage.tasks.open_digest(WEB)
    assert sql(pg_settings, "SELECT count(*) FROM digest_sections") == [(4,)]


def test_the_sweeper_fills_sections_no_read_has_asked_for(
    pg_storage: StorageBackend, pg_settings: dict[str, Any], clock: FixedClock
) -> None:
    for i in range(20):
        write(pg_storage, f"t{i:02d}")
    want = expected_digest(pg_storage.tasks, WEB)
    sql(pg_settings, "DELETE FROM digest_sections")
    pg_storage.sweep(now=clock())
    assert sql(pg_settings, "SELECT tasks, digest_rows, digest_shown FROM projects") == [
        (20, 20, 20)
    ]
    assert read_digest(pg_storage.tasks, WEB) == want


def test_the_upgrade_to_sections_keeps_every_project_readable(
    pg_settings: dict[str, Any], clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database of the first schema, with tasks and a rendered digest: the migrations
    drop the rendered digest, and the first read of each project writes its sections."""
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
    with psycopg.connect(pg_settings["DATABASE_URL"], autocommit=True) as conn:
        schema.migrate(conn)
        conn.execute(
            "INSERT INTO projects (tenant, project, tasks, digest) VALUES ('acme', 'web', 2, 'old')"
        )
        for task_id, up in (("a", 10), ("b", 20)):
            conn.execute(
                "INSERT INTO tasks (tenant, project, task_id, created_at, updated_us,"
                " retain_until_us, turn_count, latest_turn, min_retain_us) VALUES"
                " ('acme', 'web', %s, 'c', %s, 2e15, 1, 0, 2e15)",
                (task_id, up),
            )
            conn.execute(
                "INSERT INTO turns (tenant, project, task_id, turn, meta, summary, created_at,"
                " updated_at, retain_until, updated_us, retain_until_us) VALUES"
                " ('acme', 'web', %s, 0, '{}', %s, 'c', %s, 'r', %s, 2e15)",
                (task_id, f"## {task_id} heading\nbody".encode(), f"u{up}", up),
            )
    monkeypatch.undo()
    pg_storage = open_backend(pg_settings)
    try:
        assert read_digest(pg_storage.tasks, WEB) == (
            "# Project memory: acme/web\n"
            "\n## b\n\nLatest turn: 0, updated u20\n\n#### b heading\nbody\n"
            "\n## a\n\nLatest turn: 0, updated u10\n\n#### a heading\nbody\n"
        )
        assert pg_storage.fsck().clean
        write(pg_storage, "c")
        assert read_digest(pg_storage.tasks, WEB) == expected_digest(pg_storage.tasks, WEB)
    finally:
        pg_storage.close()


def test_fsck_repairs_sections_and_counters_changed_by_hand(
    pg_storage: StorageBackend, pg_settings: dict[str, Any], clock: FixedClock
) -> None:
    for task_id in ("a", "b", "c"):
        write(pg_storage, task_id)
        clock.advance(seconds=1)
    want = expected_digest(pg_storage.tasks, WEB)
    sql(pg_settings, "UPDATE digest_sections SET section = 'edited' WHERE task_id = 'a'")
    sql(pg_settings, "UPDATE digest_sections SET section = NULL WHERE task_id = 'b'")
    sql(pg_settings, "UPDATE projects SET digest_bytes = 7, digest_rows = 9")
    problems = pg_storage.fsck().problems
    assert any("acme/web/a: project.md section" in p for p in problems), problems
    assert any("acme/web/b: project.md section" in p for p in problems), problems
    assert any("acme/web: project.md counters" in p for p in problems), problems
    pg_storage.fsck(repair=True)
    assert pg_storage.fsck().clean
    assert read_digest(pg_storage.tasks, WEB) == want


def test_a_read_fails_rather_than_break_its_length_when_counters_were_changed(
    pg_storage: StorageBackend, pg_settings: dict[str, Any]
) -> None:
    write(pg_storage, "a")
    sql(pg_settings, "UPDATE projects SET digest_bytes = digest_bytes + 5")
    file, size = pg_storage.tasks.open_digest(WEB)
    with file, pytest.raises(StorageError, match="fsck --repair"):
        file.read()
    pg_storage.fsck(repair=True)
    assert read_digest(pg_storage.tasks, WEB) == expected_digest(pg_storage.tasks, WEB)


def test_a_section_follows_its_expired_turn_and_the_sweep(
    pg_storage: StorageBackend, pg_settings: dict[str, Any], clock: FixedClock
) -> None:
    write(pg_storage, "a", 1, "turn one of a")
    write(pg_storage, "b", 0)
    clock.advance(days=20)
    write(pg_storage, "a", 0, "turn zero of a, written again")
    clock.advance(days=15)  # turn 1 of a has expired, turn 0 has not; b has expired
    write(pg_storage, "c", 0, "c")
    text = read_digest(pg_storage.tasks, WEB)
    assert text == expected_digest(pg_storage.tasks, WEB)
    assert "## b" not in text and "\n## a\n\nLatest turn: 0," in text
    assert pg_storage.fsck().clean
    pg_storage.sweep(now=clock())
    assert sql(pg_settings, "SELECT task_id, turn FROM digest_sections ORDER BY 1") == [
        ("a", 0),
        ("c", 0),
    ]
    assert read_digest(pg_storage.tasks, WEB) == text
    assert pg_storage.fsck().clean


def test_an_import_writes_the_sections_of_the_tasks_it_brings(
    pg_storage: StorageBackend,
    pg_settings: dict[str, Any],
    services: Any,
    tmp_path: Path,
    clock: FixedClock,
) -> None:
    for i in range(30):
        write(pg_storage, f"t{i:02d}", i % 2)
        clock.advance(seconds=1)
    want = expected_digest(pg_storage.tasks, WEB)
    archive = tmp_path / "backup.pmbak"
    pg_backup.export_pg(pg_storage, archive)  # type: ignore[arg-type]
    target = open_backend({**pg_settings, **services.settings()})
    try:
        with archive.open("rb") as raw:
            pg_restore.import_pg(target, raw)  # type: ignore[arg-type]
        url = target.db.url  # type: ignore[attr-defined]
        with psycopg.connect(url, autocommit=True) as conn:
            counted = conn.execute(
                "SELECT tasks, digest_rows, digest_shown FROM projects"
            ).fetchall()
        assert counted == [(30, 30, 30)]  # before any read
        assert read_digest(target.tasks, WEB) == want
        assert target.fsck().clean
    finally:
        target.close()
