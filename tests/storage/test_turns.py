"""Turns: upsert keeps created_at, refreshes updated_at and retain_until; reads; expiry."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from app.storage import InvalidName, NotFound, PreconditionFailed, Scope, TaskStore
from app.storage.clock import iso
from tests.conftest import T0, FixedClock
from tests.storage._helpers import assert_consistent, read_digest


def test_put_then_get_turn(store: TaskStore, scope: Scope) -> None:
    rec = store.put_turn(
        scope, "t1", 3, meta={"agent": "a", "n": [1, 2]}, summary_md="# done\n\nok", actor="tok1"
    )
    assert rec.task_id == "t1" and rec.turn == 3
    assert rec.meta == {"agent": "a", "n": [1, 2]}
    assert rec.summary_md == "# done\n\nok"
    assert rec.created_at == rec.updated_at == iso(T0)
    assert rec.retain_until == iso(T0 + timedelta(days=30))
    assert rec.artifacts == ()
    assert store.get_turn(scope, "t1", 3) == rec
    # The tree holds exactly what the API returns.
    turn_dir = store.layout.turn_dir(scope, "t1", 3)
    assert turn_dir.name == "0003-turn"
    assert (turn_dir / "summary.md").read_text() == "# done\n\nok"
    meta = json.loads((turn_dir / "meta.json").read_text())
    assert meta["meta"] == {"agent": "a", "n": [1, 2]} and meta["summary_md"] == "# done\n\nok"
    assert_consistent(store, scope)


def test_upsert_keeps_created_at_and_refreshes_updated_at_and_retention(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    first = store.put_turn(scope, "t1", 0, meta={"v": 1}, summary_md="one")
    clock.advance(days=2, seconds=5)
    second = store.put_turn(scope, "t1", 0, meta={"v": 2}, summary_md="two")
    assert second.created_at == first.created_at == iso(T0)
    assert second.updated_at == iso(clock.now)
    assert second.retain_until == iso(clock.now + timedelta(days=30))
    assert second.updated_us > first.updated_us
    got = store.get_turn(scope, "t1", 0)
    assert got.meta == {"v": 2} and got.summary_md == "two"
    assert got.created_at == iso(T0)
    index = store.get_task(scope, "t1")
    assert [t.meta for t in index.turns] == [{"v": 2}]
    assert index.turns[0].created_at == iso(T0)
    assert index.updated_at == iso(clock.now)
    assert index.retain_until == iso(clock.now + timedelta(days=30))
    assert_consistent(store, scope)


def test_upsert_keeps_the_turns_artifacts(store: TaskStore, scope: Scope) -> None:
    import io

    store.put_turn(scope, "t1", 0, meta={}, summary_md="one")
    store.put_artifact(scope, "t1", 0, "a.txt", io.BytesIO(b"abc"), content_type="text/plain")
    rec = store.put_turn(scope, "t1", 0, meta={"v": 2}, summary_md="two")
    assert [a.name for a in rec.artifacts] == ["a.txt"]
    art = store.open_artifact(scope, "t1", 0, "a.txt")
    with art.file:
        assert art.file.read() == b"abc"


def test_updated_at_strictly_increases_when_the_clock_stalls_or_steps_back(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    a = store.put_turn(scope, "t1", 0, meta={}, summary_md="a")
    b = store.put_turn(scope, "t1", 0, meta={}, summary_md="b")
    clock.advance(seconds=-10)
    c = store.put_turn(scope, "t1", 1, meta={}, summary_md="c")
    assert a.updated_us < b.updated_us < c.updated_us
    assert a.etag != b.etag != c.etag


def test_get_turn_of_missing_task_or_turn_is_not_found(store: TaskStore, scope: Scope) -> None:
    with pytest.raises(NotFound):
        store.get_turn(scope, "nope", 0)
    store.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    with pytest.raises(NotFound):
        store.get_turn(scope, "t1", 1)
    with pytest.raises(NotFound):
        store.get_turn(Scope("acme", "other"), "t1", 0)
    with pytest.raises(NotFound):
        store.get_turn(Scope("other", "web"), "t1", 0)


def test_preconditions(store: TaskStore, scope: Scope) -> None:
    with pytest.raises(PreconditionFailed):
        store.put_turn(scope, "t1", 0, meta={}, summary_md="x", if_match="*")
    rec = store.put_turn(scope, "t1", 0, meta={}, summary_md="x", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put_turn(scope, "t1", 0, meta={}, summary_md="y", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put_turn(scope, "t1", 0, meta={}, summary_md="y", if_match='"t1"')
    store.put_turn(scope, "t1", 0, meta={}, summary_md="y", if_match=rec.etag)
    assert store.get_turn(scope, "t1", 0).summary_md == "y"
    assert_consistent(store, scope)


def test_summary_is_kept_verbatim(store: TaskStore, scope: Scope) -> None:
    text = "line one\r\n\n  indented — ünïcødé ✓\n\n```\ncode\n```\n\n\n"
    store.put_turn(scope, "t1", 0, meta={}, summary_md=text)
    assert store.get_turn(scope, "t1", 0).summary_md == text
    path = store.layout.turn_dir(scope, "t1", 0) / "summary.md"
    assert path.read_bytes() == text.encode("utf-8")


# -- expiry ------------------------------------------------------------------------------------
def test_expired_turns_are_invisible_before_anything_deletes_them(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    store.put_turn(scope, "t1", 0, meta={"n": 0}, summary_md="old turn")
    clock.advance(days=10)
    store.put_turn(scope, "t1", 1, meta={"n": 1}, summary_md="newer turn")
    store.put_turn(scope, "t2", 0, meta={}, summary_md="other task")
    clock.set(T0 + timedelta(days=30))  # turn 0 of t1 expires exactly now
    with pytest.raises(NotFound):
        store.get_turn(scope, "t1", 0)
    assert store.get_turn(scope, "t1", 1).summary_md == "newer turn"
    index = store.get_task(scope, "t1")
    assert [t.turn for t in index.turns] == [1]
    page = store.list_tasks(scope)
    summaries = {t.task_id: t for t in page.tasks}
    assert summaries["t1"].turn_count == 1 and summaries["t1"].latest_turn == 1
    assert page.total == 2
    digest = read_digest(store, scope)
    assert "old turn" not in digest and "newer turn" in digest
    # The files are still there: invisibility does not wait for the sweeper.
    assert (store.layout.turn_dir(scope, "t1", 0) / "meta.json").exists()


def test_a_turn_one_microsecond_before_its_deadline_is_visible(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    clock.set(T0 + timedelta(days=30) - timedelta(microseconds=1))
    assert store.get_turn(scope, "t1", 0).summary_md == "x"
    assert store.list_tasks(scope).total == 1


def test_a_task_whose_turns_all_expired_is_gone_everywhere(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    store.put_turn(scope, "gone", 0, meta={}, summary_md="gone summary")
    store.put_turn(scope, "gone", 1, meta={}, summary_md="gone summary 1")
    clock.advance(days=1)
    store.put_turn(scope, "kept", 0, meta={}, summary_md="kept summary")
    before = read_digest(store, scope)
    assert "gone summary 1" in before
    clock.set(T0 + timedelta(days=30, seconds=1))
    for turn in (0, 1):
        with pytest.raises(NotFound):
            store.get_turn(scope, "gone", turn)
    with pytest.raises(NotFound):
        store.get_task(scope, "gone")
    page = store.list_tasks(scope)
    assert [t.task_id for t in page.tasks] == ["kept"]
    assert page.total == 1
    digest = read_digest(store, scope)
    assert "gone" not in digest and "kept summary" in digest
    with pytest.raises(NotFound):
        store.delete_task(scope, "gone")
    clock.advance(days=2)
    assert store.list_tasks(scope).total == 0
    assert store.list_tasks(scope).tasks == ()
    assert "## " not in read_digest(store, scope)


def test_rewriting_an_expired_turn_starts_fresh(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    import io

    store.put_turn(scope, "t1", 0, meta={"v": 1}, summary_md="old")
    store.put_artifact(scope, "t1", 0, "old.bin", io.BytesIO(b"old"), content_type="x/y")
    clock.advance(days=31)
    rec = store.put_turn(scope, "t1", 0, meta={"v": 2}, summary_md="new")
    assert rec.created_at == iso(clock.now)
    assert rec.artifacts == ()
    with pytest.raises(NotFound):
        store.open_artifact(scope, "t1", 0, "old.bin")
    assert not (store.layout.turn_dir(scope, "t1", 0) / "artifacts" / "old.bin").exists()
    assert_consistent(store, scope)


def test_short_retention(tmp_path: Path) -> None:
    clock = FixedClock()
    s = TaskStore(tmp_path / "r", clock=clock, retention=timedelta(hours=1), lock_timeout=5)
    scope = Scope("a", "b")
    rec = s.put_turn(scope, "t", 0, meta={}, summary_md="x")
    assert rec.retain_until == iso(T0 + timedelta(hours=1))
    clock.advance(hours=1)
    with pytest.raises(NotFound):
        s.get_turn(scope, "t", 0)


# -- content round trip -------------------------------------------------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=40, deadline=None)
@given(meta=st.dictionaries(st.text(max_size=10), _json, max_size=5), summary=st.text(max_size=300))
def test_meta_and_summary_round_trip_verbatim(
    issued_store: TaskStore, meta: dict[str, object], summary: str
) -> None:
    scope = Scope("acme", "roundtrip")
    rec = issued_store.put_turn(scope, "t", 0, meta=meta, summary_md=summary)
    got = issued_store.get_turn(scope, "t", 0)
    assert got.meta == meta == rec.meta and got.summary_md == summary
    turn_dir = issued_store.layout.turn_dir(scope, "t", 0)
    assert (turn_dir / "summary.md").read_bytes() == summary.encode("utf-8")
    assert issued_store.get_task(scope, "t").turns[0].meta == meta


@pytest.fixture(scope="module")
def issued_store(tmp_path_factory: pytest.TempPathFactory) -> TaskStore:
    return TaskStore(tmp_path_factory.mktemp("rt") / "root", lock_timeout=5.0)


@pytest.mark.parametrize(
    ("meta", "summary"),
    [
        ({}, "lone surrogate \ud800"),
        ({"k": "\udfff"}, "ok"),
        ({"\ud800": 1}, "ok"),
        ({"k": {1, 2}}, "ok"),  # not JSON
        ({"k": float("nan")}, "ok"),  # not JSON either
    ],
    ids=["summary-surrogate", "meta-value-surrogate", "meta-key-surrogate", "set", "nan"],
)
def test_content_that_cannot_be_stored_is_refused_before_any_write(
    store: TaskStore, scope: Scope, meta: dict[str, object], summary: str
) -> None:
    store.put_turn(scope, "other", 0, meta={}, summary_md="x")
    before = sorted(p for p in store.layout.root.rglob("*") if ".locks" not in p.parts)
    for task_id in ("new-task", "other"):
        with pytest.raises(InvalidName):
            store.put_turn(scope, task_id, 1, meta=meta, summary_md=summary)
    after = sorted(p for p in store.layout.root.rglob("*") if ".locks" not in p.parts)
    assert after == before
    assert_consistent(store, scope)


def test_values_orjson_cannot_encode_round_trip_exactly(store: TaskStore, scope: Scope) -> None:
    # Records are encoded by orjson, which refuses integers beyond 64 bits; the fallback to
    # the standard library must store them exactly (and json.loads must read them back as
    # ints: orjson.loads would turn them into floats).
    meta = {"big": 2**70, "neg": -(2**64), "unicode": "naïve — 日本", "float": 0.1}
    store.put_turn(scope, "t1", 0, meta=meta, summary_md="s")
    assert store.get_turn(scope, "t1", 0).meta == meta
    raw = (store.layout.turn_dir(scope, "t1", 0) / "meta.json").read_bytes()
    assert b"1180591620717411303424" in raw and "日本".encode() in raw  # UTF-8, not \u escapes
    assert store.get_task(scope, "t1").turns[0].meta == meta
    assert_consistent(store, scope)
