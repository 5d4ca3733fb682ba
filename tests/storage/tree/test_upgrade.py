"""A root written in the older layout (tests/fixtures/legacy-root) is upgraded in place, and
then answers every recorded GET exactly as the version that wrote it did; an upgrade killed
midway finishes when it runs again."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app import create_app
from app.storage import Scope
from app.storage.core.errors import SearchRebuilding
from app.storage.core.models import FsckReport
from app.storage.tree.stores.fsck import fsck_stores
from tests.conftest import BufferedClient
from tests.storage._helpers import upkeep_done

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "legacy-root"


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(FIXTURE / "root", root)
    return root


def _app(root: Path, tmp_path: Path) -> Flask:
    app = create_app(
        {"TESTING": True, "STORAGE_ROOT": str(root), "TOKENS_FILE": str(tmp_path / "tokens.json")}
    )
    app.test_client_class = BufferedClient
    return app


def _assert_same_answers(app: Flask) -> None:
    _, secret = app.extensions["token_registry"].create(role="writer", tenant="acme", project="web")
    client = app.test_client()
    answers: dict[str, Any] = json.loads((FIXTURE / "answers.json").read_text())
    for url, want in answers.items():
        r = client.get(url, headers={"Authorization": f"Bearer {secret}"})
        got = {"status": r.status_code, "etag": r.headers.get("ETag"), "body": r.get_data(True)}
        assert got == want, url


def _store_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "acme" / "web" / "_stores").iterdir())


def test_an_older_root_is_upgraded_and_answers_as_before(tmp_path: Path) -> None:
    root = _root(tmp_path)
    app = _app(root, tmp_path)
    storage = app.extensions["storage"]
    before = FsckReport()
    fsck_stores(storage.stores, before)
    assert any("older layout" in p for p in before.problems)
    done = storage.upgrade()
    assert sum(" -> memstore_" in line for line in done) == 2, done
    assert sum("listing rows of 2 task(s)" in line for line in done) == 1, done
    assert sum("search index of" in line for line in done) == 2, done
    # The root predates usage counters: its tasks are counted with their listing rows, its
    # stores once.
    assert done[-1] == "acme/web: usage of 2 memory store(s) counted", done
    assert len(done) == 6 and all(name.startswith("memstore_") for name in _store_dirs(root))
    assert storage.upgrade() == []  # idempotent
    _assert_same_answers(app)
    assert storage.fsck().clean


def test_an_older_root_is_searchable_once_upgraded(tmp_path: Path) -> None:
    """Turns and memories written before search are found once the start-up upgrade has
    built their search rows; until then a search answers that the index is being built
    (503), not an empty page, and fsck says so."""
    app = _app(_root(tmp_path), tmp_path)
    storage = app.extensions["storage"]
    scope = Scope("acme", "web")
    report = storage.fsck()
    assert any("search index not built yet" in p for p in report.problems), report.problems
    with pytest.raises(SearchRebuilding):
        storage.search(scope, "ttl")
    storage.upgrade()
    upkeep_done(storage.tasks)
    found = {(h.kind, h.task_id or h.path) for h in storage.search(scope, "ttl").hits}
    assert found == {("turn", "fix-login"), ("memory", "/notes.md")}
    assert storage.fsck().clean


def test_fsck_repair_upgrades_too(tmp_path: Path) -> None:
    root = _root(tmp_path)
    app = _app(root, tmp_path)
    report = app.extensions["storage"].fsck(repair=True)
    assert report.unrepairable == [] and len(report.repaired) >= 2
    _assert_same_answers(app)


def _upgrade_and_die_after_one_rename(root: str, tokens: str) -> None:
    from app.storage.tree.fs.walk import Tree

    real = Tree.rename

    def rename_then_die(self: Tree, src: Any, dst: Any) -> None:
        real(self, src, dst)
        os.kill(os.getpid(), signal.SIGKILL)

    Tree.rename = rename_then_die  # type: ignore[method-assign]
    app = create_app({"STORAGE_ROOT": root, "TOKENS_FILE": tokens})
    app.extensions["storage"].upgrade()


def test_an_upgrade_killed_midway_finishes_when_run_again(tmp_path: Path) -> None:
    root = _root(tmp_path)
    proc = multiprocessing.get_context("spawn").Process(
        target=_upgrade_and_die_after_one_rename, args=(str(root), str(tmp_path / "tokens.json"))
    )
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    names = _store_dirs(root)
    assert sum(n.startswith("memstore_") for n in names) == 1, names
    app = _app(root, tmp_path)
    assert sum(" -> memstore_" in line for line in app.extensions["storage"].upgrade()) == 1
    _assert_same_answers(app)


def test_a_store_under_both_names_is_left_for_a_person(tmp_path: Path) -> None:
    root = _root(tmp_path)
    stores = root / "acme" / "web" / "_stores"
    legacy = next(p for p in stores.iterdir() if p.name.startswith("team-prefs-"))
    shutil.copytree(legacy, stores / legacy.name.split("-", 2)[-1])
    app = _app(root, tmp_path)
    assert all(legacy.name not in line for line in app.extensions["storage"].upgrade())
    assert legacy.exists()
    report = app.extensions["storage"].fsck(repair=True)
    assert any("exists too" in p for p in report.unrepairable), report.unrepairable
