"""Turns on the tree: the files hold what the API returns (behaviour: tests/conformance/)."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest

from app.storage.core.errors import InvalidName
from app.storage.core.names import Scope
from app.storage.tree.tasks import TaskStore
from tests.conftest import T0, FixedClock
from tests.storage._helpers import assert_consistent


def test_the_tree_holds_exactly_what_the_api_returns(store: TaskStore, scope: Scope) -> None:
    text = "# done\n\nok — ✓\r\n"
    store.put_turn(scope, "t1", 3, meta={"agent": "a", "n": [1, 2]}, summary_md=text)
    turn_dir = store.layout.turn_dir(scope, "t1", 3)
    assert turn_dir.name == "0003-turn"
    assert (turn_dir / "summary.md").read_bytes() == text.encode("utf-8")
    meta = json.loads((turn_dir / "meta.json").read_text())
    assert meta["meta"] == {"agent": "a", "n": [1, 2]} and meta["summary_md"] == text
    assert_consistent(store, scope)


def test_expired_turns_stay_on_disk_until_the_sweeper(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="old turn")
    clock.set(T0 + timedelta(days=30))
    assert (store.layout.turn_dir(scope, "t1", 0) / "meta.json").exists()
    assert store.list_tasks(scope).total == 0


def test_rewriting_an_expired_turn_removes_its_old_artifact_files(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    store.put_turn(scope, "t1", 0, meta={"v": 1}, summary_md="old")
    store.put_artifact(scope, "t1", 0, "old.bin", io.BytesIO(b"old"), content_type="x/y")
    clock.advance(days=31)
    store.put_turn(scope, "t1", 0, meta={"v": 2}, summary_md="new")
    assert not (store.layout.turn_dir(scope, "t1", 0) / "artifacts" / "old.bin").exists()
    assert_consistent(store, scope)


def test_content_that_cannot_be_stored_creates_no_file(store: TaskStore, scope: Scope) -> None:
    store.put_turn(scope, "other", 0, meta={}, summary_md="x")
    before = sorted(p for p in store.layout.root.rglob("*") if ".locks" not in p.parts)
    for task_id in ("new-task", "other"):
        with pytest.raises(InvalidName):
            store.put_turn(scope, task_id, 1, meta={}, summary_md="lone surrogate \ud800")
    after = sorted(p for p in store.layout.root.rglob("*") if ".locks" not in p.parts)
    assert after == before


def test_records_are_utf8_json_with_big_integers_exact(store: TaskStore, scope: Scope) -> None:
    # Records are encoded by orjson, which refuses integers beyond 64 bits; the fallback to
    # the standard library must store them exactly, as UTF-8 rather than \\u escapes.
    meta = {"big": 2**70, "unicode": "naïve — 日本"}
    store.put_turn(scope, "t1", 0, meta=meta, summary_md="s")
    raw = (store.layout.turn_dir(scope, "t1", 0) / "meta.json").read_bytes()
    assert b"1180591620717411303424" in raw and "日本".encode() in raw
    assert_consistent(store, scope)
