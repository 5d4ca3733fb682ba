"""The operations commands: sweep, fsck, export, import (Flask's CLI runner and a real
`flask --app wsgi` process)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskCliRunner

from app.storage.core.names import TMP_PREFIX, Scope
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock
from tests.e2e.conftest import REPO, VENV_BIN
from tests.storage._helpers import snapshot


@pytest.fixture
def runner(app: Flask) -> FlaskCliRunner:
    return app.test_cli_runner()


@pytest.fixture
def store(app: Flask) -> TaskStore:  # the app's own store, on the test clock
    store: TaskStore = app.extensions["storage"].tasks
    return store


def fill(store: TaskStore, scope: Scope, clock: FixedClock) -> None:
    store.put_turn(scope, "old", 0, meta={}, summary_md="old turn")
    store.put_artifact(scope, "old", 0, "a.txt", io.BytesIO(b"abc"), content_type="text/plain")
    clock.advance(days=20)
    store.put_turn(scope, "young", 0, meta={}, summary_md="young turn")


def test_sweep_dry_run_changes_nothing_then_sweep_removes(
    runner: FlaskCliRunner, store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    fill(store, scope, clock)
    fh, _ = store.open_digest(scope)
    fh.close()
    now = (clock.now + timedelta(days=15)).isoformat()
    before = snapshot(store.layout.root)
    result = runner.invoke(args=["sweep", "--dry-run", "--now", now])
    assert result.exit_code == 0, result.output
    assert "dry run: nothing changed" in result.output
    assert "acme/web: would remove 1 turn(s), 1 task(s)" in result.output
    assert snapshot(store.layout.root) == before

    result = runner.invoke(args=["sweep", "--now", now, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["turns"], report["tasks"], report["dry_run"]) == (1, 1, False)
    assert report["bytes"] >= 3
    assert report["projects"][0]["tenant"] == "acme"
    assert "memory_store_versions" in report
    assert not store.layout.task_dir(scope, "old").exists()
    assert store.layout.task_dir(scope, "young").exists()


def test_sweep_refuses_a_bad_time(runner: FlaskCliRunner) -> None:
    result = runner.invoke(args=["sweep", "--now", "yesterday"])
    assert result.exit_code == 2
    assert "not an ISO 8601 time" in result.output


def test_fsck_exit_status_problem_repair_and_symlink(
    runner: FlaskCliRunner, store: TaskStore, scope: Scope, clock: FixedClock, tmp_path: Path
) -> None:
    fill(store, scope, clock)
    result = runner.invoke(args=["fsck"])
    assert result.exit_code == 0, result.output
    assert "fsck: clean" in result.output

    (store.layout.task_index(scope, "young")).write_text("{}")
    stray = store.layout.project_dir(scope) / f"{TMP_PREFIX}dead"
    stray.write_bytes(b"x")
    os.utime(stray, (time.time() - 3600, time.time() - 3600))
    result = runner.invoke(args=["fsck"])
    assert result.exit_code == 1
    assert "problem: acme/web/young/index.json: stale" in result.output
    assert "stale temp file" in result.output
    assert "fsck --repair" in result.output

    result = runner.invoke(args=["fsck", "--repair"])
    assert result.exit_code == 0, result.output
    assert "repaired: acme/web/young/index.json" in result.output
    assert "fsck: clean" in result.output
    assert not stray.exists()

    (store.layout.task_dir(scope, "young") / "link").symlink_to(tmp_path)
    result = runner.invoke(args=["fsck", "--repair"])
    assert result.exit_code == 1
    assert "UNREPAIRED" in result.output and "symlink" in result.output


def test_export_import_commands(
    runner: FlaskCliRunner, store: TaskStore, scope: Scope, clock: FixedClock, tmp_path: Path
) -> None:
    fill(store, scope, clock)
    archive = tmp_path / "out.tar.gz"
    result = runner.invoke(args=["export", "--tenant", "acme", "--project", "web", str(archive)])
    assert result.exit_code == 0, result.output
    assert "exported acme/web: 2 task(s)" in result.output and "memory store(s)" in result.output

    result = runner.invoke(args=["import", str(archive)])
    assert result.exit_code == 1
    assert "import refused" in result.output and "--overwrite" in result.output

    result = runner.invoke(args=["import", "--tenant", "acme", "--project", "copy", str(archive)])
    assert result.exit_code == 0, result.output
    copy = Scope("acme", "copy")
    assert store.get_turn(copy, "old", 0).summary_md == "old turn"

    broken = tmp_path / "broken.tar.gz"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x55
    broken.write_bytes(bytes(data))
    result = runner.invoke(args=["import", "--tenant", "acme", "--project", "third", str(broken)])
    assert result.exit_code == 1
    assert "import refused" in result.output
    assert not store.layout.project_dir(Scope("acme", "third")).exists()


def test_real_flask_process_dry_run_changes_nothing(tmp_path: Path) -> None:
    """`flask --app wsgi sweep --dry-run` against a tree written by the engine."""
    root = tmp_path / "root"
    scope = Scope("acme", "web")
    store = TaskStore(root, retention=timedelta(days=1))
    store.put_turn(scope, "t", 0, meta={}, summary_md="expires")
    store.put_artifact(scope, "t", 0, "a.bin", io.BytesIO(b"12345"), content_type="x/y")
    fh, _ = store.open_digest(scope)
    fh.close()
    from app.storage.tree.sqlite.listing import Listing

    Listing.forget(store.layout.listing(scope))
    env = {
        **os.environ,
        "MEMORY_STORAGE_ROOT": str(root),
        "MEMORY_TOKENS_FILE": str(tmp_path / "tokens.json"),
    }
    later = (datetime.now(UTC) + timedelta(days=2)).isoformat()

    def flask(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(VENV_BIN / "flask"), "--app", "wsgi", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    before = snapshot(root)
    dry = flask("sweep", "--dry-run", "--now", later)
    assert dry.returncode == 0, dry.stderr
    assert "would remove 1 turn(s), 1 task(s)" in dry.stdout
    assert snapshot(root) == before

    real = flask("sweep", "--now", later)
    assert real.returncode == 0, real.stderr
    assert "removed 1 turn(s), 1 task(s)" in real.stdout
    assert not (root / "acme" / "web" / "t").exists()
    check = flask("fsck")
    assert check.returncode == 0, check.stdout + check.stderr


def test_startup_recovery_repairs_after_an_unclean_shutdown(
    app: Flask, store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    from app.ops.sweeper import clean_shutdown, startup_recovery
    from app.storage.core.names import SENTINEL as RUNNING_SENTINEL
    from app.storage.tree.fs.txn import Key

    fill(store, scope, clock)
    sentinel = store.layout.root / RUNNING_SENTINEL
    assert startup_recovery(app) == []  # first start: nothing to recover
    assert sentinel.exists()
    clean_shutdown(app)
    assert not sentinel.exists()

    assert startup_recovery(app) == []
    # The server is killed (kill -9) while a write of "young" is in flight: its journal slot
    # is set and its index lags its records.
    store.layout.task_index(scope, "young").write_text("{}")
    store.txns.mark(Key(scope, "young"))
    lines = startup_recovery(app)
    assert "did not shut down cleanly" in lines[0] and "the server was killed" in lines[0]
    assert "repaired 1 write(s)" in lines[1] and "acme/web/young" in lines[2]
    assert store.get_task(scope, "young").turns[0].turn == 0
    assert sentinel.exists() and app.extensions["storage"].ready()[0]


def test_the_first_start_keeps_the_newest_write_as_the_last_sweeps_clock(
    app: Flask, store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    """Until a sweep runs, the clock guard compares with what the first start kept: a start
    under a clock stepped forward, and a write after it, leave it as it was."""
    from app.ops.sweeper import startup_recovery
    from app.storage.core.clock import to_us

    fill(store, scope, clock)
    storage = app.extensions["storage"]
    startup_recovery(app)
    newest = store.get_task(scope, "young").turns[0].updated_at
    assert storage.sweep_clock.last_us() == to_us(datetime.fromisoformat(newest))
    clock.advance(days=31)
    startup_recovery(app)  # a restart under the stepped clock
    store.put_turn(scope, "next", 0, meta={}, summary_md="")
    assert storage.sweep_clock.last_us() == to_us(datetime.fromisoformat(newest))
    refused = storage.sweep(now=clock())
    assert "ahead of the last sweep" in refused.refused and refused.tasks.turns == 0


def test_startup_recovery_after_lost_unsynced_writes_runs_a_full_check(
    app: Flask, store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    """A canary that lost its last unsynced write means the page cache was lost too."""
    from app.ops.sweeper import startup_recovery

    fill(store, scope, clock)
    storage = app.extensions["storage"]
    startup_recovery(app)
    # A power loss: derived files and the canary lose what the kernel had not flushed.
    store.layout.task_index(scope, "young").write_text("{}")
    storage.layout.canary().write_bytes(b"")
    lines = startup_recovery(app)
    assert "writes the kernel had not flushed were lost" in lines[0]
    assert any("full check" in line for line in lines)
    ok, detail = storage.ready()
    assert not ok and detail.startswith("recovering")
    report = storage.full_check()
    assert report is not None and any("young" in p for p in report.repaired), report.problems
    assert storage.ready()[0] and storage.full_check() is None
    assert store.get_task(scope, "young").turns[0].turn == 0


def test_tasks_written_while_the_full_check_runs_are_correct_afterwards(
    app: Flask, store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    """The server serves while the full check of a lost page cache runs: what is written
    meanwhile (a stale task rewritten, new tasks) survives the check and reads back whole."""
    from app.ops.sweeper import startup_recovery

    for i in range(40):
        store.put_turn(scope, f"t{i:02d}", 0, meta={}, summary_md=f"before {i}")
    storage = app.extensions["storage"]
    startup_recovery(app)
    for i in range(0, 40, 3):  # derived files the power loss took back
        store.layout.task_index(scope, f"t{i:02d}").write_text("{}")
    storage.layout.canary().write_bytes(b"")
    startup_recovery(app)
    assert not storage.ready()[0]
    check = threading.Thread(target=storage.full_check)
    check.start()
    written = []
    for i in range(60):
        task = f"t{i % 50:02d}"
        store.put_turn(scope, task, 1, meta={"i": i}, summary_md=f"during {i}")
        written.append((task, i))
    check.join(60)
    assert not check.is_alive() and storage.ready()[0]
    latest = dict(written)
    for task, i in latest.items():
        index = store.get_task(scope, task)
        assert [t.turn for t in index.turns][-1] == 1
        assert store.get_turn(scope, task, 1).summary_md == f"during {i}"
    page = store.list_tasks(scope, limit=100)
    assert page.total == 50 and len(page.tasks) == 50
    assert all(f"during {i}" in read_all_digest(store, scope) for i in latest.values())
    assert storage.fsck().clean


def read_all_digest(store: TaskStore, scope: Scope) -> str:
    fh, _ = store.open_digest(scope)
    with fh:
        return fh.read().decode()


def test_a_clean_shutdown_syncs_the_derived_files_before_it_drops_the_sentinel(
    app: Flask, store: TaskStore, scope: Scope, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Derived files are written without fsync; without the sentinel the next start skips the
    # recovery, so they must be on disk before it goes.
    from app.ops.sweeper import clean_shutdown, startup_recovery
    from app.storage.core.names import SENTINEL as RUNNING_SENTINEL

    fill(store, scope, clock)
    startup_recovery(app)
    sentinel = store.layout.root / RUNNING_SENTINEL
    seen: list[bool] = []
    real_sync = os.sync

    def sync() -> None:
        seen.append(sentinel.exists())
        real_sync()

    monkeypatch.setattr(os, "sync", sync)
    clean_shutdown(app)
    assert seen == [True] and not sentinel.exists()


def test_a_clean_stop_where_sync_makes_nothing_durable_keeps_the_sentinel_as_stopped(
    app: Flask, store: TaskStore, scope: Scope, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On FUSE a sync reaches no disk (tests/powerloss/test_clean_stop.py cuts the power
    there): the sentinel of a clean stop stays, and the next start runs the full check only
    if the canary lost its nonce."""
    from app.ops.sweeper import clean_shutdown, startup_recovery
    from app.storage.core.names import SENTINEL as RUNNING_SENTINEL
    from app.storage.tree.fs import sync

    monkeypatch.setattr(sync, "_filesystem_type", lambda dev: "fuse.sshfs")
    monkeypatch.setattr(sync, "_flushers", {})
    fill(store, scope, clock)
    storage = app.extensions["storage"]
    sentinel = store.layout.root / RUNNING_SENTINEL
    startup_recovery(app)
    clean_shutdown(app)
    assert json.loads(sentinel.read_text())["stopped"] is True
    assert startup_recovery(app) == []  # nothing lost since: a clean start
    assert "stopped" not in json.loads(sentinel.read_text())  # running again
    assert storage.ready()[0]

    clean_shutdown(app)
    storage.layout.canary().write_bytes(b"")  # a power cut took the unsynced nonce
    lines = startup_recovery(app)
    assert "the last stop was clean, but a cut since lost writes" in lines[0], lines
    assert not storage.ready()[0] and storage.full_check() is not None
    assert storage.ready()[0]


def test_startup_recovery_also_repairs_memory_stores(app: Flask) -> None:
    from app.ops.sweeper import startup_recovery
    from app.storage.core.names import SENTINEL as RUNNING_SENTINEL
    from app.storage.tree.fs.txn import Key

    engine = app.extensions["storage"].stores
    root = Path(app.config["STORAGE_ROOT"])
    startup_recovery(app)
    scope = Scope("acme", "web")
    created = engine.create_store(scope, name="Prefs", description="")
    store_dir = next((root / "acme" / "web" / "_stores").iterdir())
    # A writer killed mid-write leaves a temp file in the store's version history.
    stray = store_dir / "versions" / ".~tmp-deadbeef00000000"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"half")
    old = stray.stat().st_mtime - 3600
    os.utime(stray, (old, old))
    assert (root / RUNNING_SENTINEL).exists()  # the server never shut down cleanly
    app.extensions["storage"].stores.txns.mark(Key(scope, created.id))  # killed in flight
    startup_recovery(app)
    assert not stray.exists(), created
