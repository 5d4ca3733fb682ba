"""Turns: upsert keeps created_at, refreshes updated_at and retain_until; reads; expiry."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from app.storage.core.clock import iso
from app.storage.core.errors import InvalidName, NotFound, PreconditionFailed
from app.storage.core.names import Scope
from app.storage.interface import TaskBackend
from tests.conformance.conftest import Factory, assert_views_agree, read_digest
from tests.conftest import T0, FixedClock


def test_put_then_get_turn(tasks: TaskBackend, scope: Scope) -> None:
    rec = tasks.put_turn(
        scope, "t1", 3, meta={"agent": "a", "n": [1, 2]}, summary_md="# done\n\nok", actor="tok1"
    )
    assert rec.task_id == "t1" and rec.turn == 3
    assert rec.meta == {"agent": "a", "n": [1, 2]}
    assert rec.summary_md == "# done\n\nok"
    assert rec.created_at == rec.updated_at == iso(T0)
    assert rec.retain_until == iso(T0 + timedelta(days=30))
    assert rec.artifacts == ()
    assert rec.etag == f'"t{rec.updated_us}"'
    assert tasks.get_turn(scope, "t1", 3) == rec
    assert_views_agree(tasks, scope)


def test_upsert_keeps_created_at_and_refreshes_updated_at_and_retention(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    first = tasks.put_turn(scope, "t1", 0, meta={"v": 1}, summary_md="one")
    clock.advance(days=2, seconds=5)
    second = tasks.put_turn(scope, "t1", 0, meta={"v": 2}, summary_md="two")
    assert second.created_at == first.created_at == iso(T0)
    assert second.updated_at == iso(clock.now)
    assert second.retain_until == iso(clock.now + timedelta(days=30))
    assert second.updated_us > first.updated_us
    got = tasks.get_turn(scope, "t1", 0)
    assert got.meta == {"v": 2} and got.summary_md == "two"
    index = tasks.get_task(scope, "t1")
    assert [t.meta for t in index.turns] == [{"v": 2}]
    assert index.turns[0].created_at == iso(T0)
    assert index.updated_at == iso(clock.now)
    assert index.retain_until == iso(clock.now + timedelta(days=30))
    assert_views_agree(tasks, scope)


def test_upsert_keeps_the_turns_artifacts(tasks: TaskBackend, scope: Scope) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="one")
    tasks.put_artifact(scope, "t1", 0, "a.txt", io.BytesIO(b"abc"), content_type="text/plain")
    rec = tasks.put_turn(scope, "t1", 0, meta={"v": 2}, summary_md="two")
    assert [a.name for a in rec.artifacts] == ["a.txt"]
    art = tasks.open_artifact(scope, "t1", 0, "a.txt")
    with art.file:
        assert art.file.read() == b"abc"


def test_updated_at_strictly_increases_when_the_clock_stalls_or_steps_back(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    a = tasks.put_turn(scope, "t1", 0, meta={}, summary_md="a")
    b = tasks.put_turn(scope, "t1", 0, meta={}, summary_md="b")
    clock.advance(seconds=-10)
    c = tasks.put_turn(scope, "t1", 1, meta={}, summary_md="c")
    assert a.updated_us < b.updated_us < c.updated_us
    assert a.etag != b.etag != c.etag


def test_get_turn_of_missing_task_or_turn_is_not_found(tasks: TaskBackend, scope: Scope) -> None:
    with pytest.raises(NotFound):
        tasks.get_turn(scope, "nope", 0)
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    with pytest.raises(NotFound):
        tasks.get_turn(scope, "t1", 1)
    with pytest.raises(NotFound):
        tasks.get_turn(Scope("acme", "other"), "t1", 0)
    with pytest.raises(NotFound):
        tasks.get_turn(Scope("other", "web"), "t1", 0)


def test_preconditions(tasks: TaskBackend, scope: Scope) -> None:
    with pytest.raises(PreconditionFailed):
        tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x", if_match="*")
    rec = tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        tasks.put_turn(scope, "t1", 0, meta={}, summary_md="y", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        tasks.put_turn(scope, "t1", 0, meta={}, summary_md="y", if_match='"t1"')
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="y", if_match=rec.etag)
    assert tasks.get_turn(scope, "t1", 0).summary_md == "y"
    with pytest.raises(PreconditionFailed):
        tasks.put_turn(scope, "t1", 0, meta={}, summary_md="z", if_match=rec.etag)
    assert_views_agree(tasks, scope)


def test_summary_is_kept_verbatim(tasks: TaskBackend, scope: Scope) -> None:
    text = "line one\r\n\n  indented — ünïcødé ✓\n\n```\ncode\n```\n\n\n\x00 nul too"
    tasks.put_turn(scope, "t1", 0, meta={"k": "\x00"}, summary_md=text)
    got = tasks.get_turn(scope, "t1", 0)
    assert got.summary_md == text and got.meta == {"k": "\x00"}
    assert text in read_digest(tasks, scope)


# -- expiry ------------------------------------------------------------------------------------
def test_expired_turns_are_invisible_before_anything_deletes_them(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks.put_turn(scope, "t1", 0, meta={"n": 0}, summary_md="old turn")
    clock.advance(days=10)
    tasks.put_turn(scope, "t1", 1, meta={"n": 1}, summary_md="newer turn")
    tasks.put_turn(scope, "t2", 0, meta={}, summary_md="other task")
    clock.set(T0 + timedelta(days=30))  # turn 0 of t1 expires exactly now
    with pytest.raises(NotFound):
        tasks.get_turn(scope, "t1", 0)
    assert tasks.get_turn(scope, "t1", 1).summary_md == "newer turn"
    index = tasks.get_task(scope, "t1")
    assert [t.turn for t in index.turns] == [1]
    page = tasks.list_tasks(scope)
    summaries = {t.task_id: t for t in page.tasks}
    assert summaries["t1"].turn_count == 1 and summaries["t1"].latest_turn == 1
    assert page.total == 2
    digest = read_digest(tasks, scope)
    assert "old turn" not in digest and "newer turn" in digest
    assert_views_agree(tasks, scope)


def test_a_turn_one_microsecond_before_its_deadline_is_visible(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    clock.set(T0 + timedelta(days=30) - timedelta(microseconds=1))
    assert tasks.get_turn(scope, "t1", 0).summary_md == "x"
    assert tasks.list_tasks(scope).total == 1


def test_a_task_whose_turns_all_expired_is_gone_everywhere(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks.put_turn(scope, "gone", 0, meta={}, summary_md="gone summary")
    tasks.put_turn(scope, "gone", 1, meta={}, summary_md="gone summary 1")
    clock.advance(days=1)
    tasks.put_turn(scope, "kept", 0, meta={}, summary_md="kept summary")
    assert "gone summary 1" in read_digest(tasks, scope)
    clock.set(T0 + timedelta(days=30, seconds=1))
    for turn in (0, 1):
        with pytest.raises(NotFound):
            tasks.get_turn(scope, "gone", turn)
    with pytest.raises(NotFound):
        tasks.get_task(scope, "gone")
    page = tasks.list_tasks(scope)
    assert [t.task_id for t in page.tasks] == ["kept"]
    assert page.total == 1
    digest = read_digest(tasks, scope)
    assert "gone" not in digest and "kept summary" in digest
    with pytest.raises(NotFound):
        tasks.delete_task(scope, "gone")
    clock.advance(days=2)
    assert tasks.list_tasks(scope).total == 0
    assert tasks.list_tasks(scope).tasks == ()
    assert "## " not in read_digest(tasks, scope)


def test_rewriting_an_expired_turn_starts_fresh(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks.put_turn(scope, "t1", 0, meta={"v": 1}, summary_md="old")
    tasks.put_artifact(scope, "t1", 0, "old.bin", io.BytesIO(b"old"), content_type="x/y")
    clock.advance(days=31)
    rec = tasks.put_turn(scope, "t1", 0, meta={"v": 2}, summary_md="new")
    assert rec.created_at == iso(clock.now)
    assert rec.artifacts == ()
    with pytest.raises(NotFound):
        tasks.open_artifact(scope, "t1", 0, "old.bin")
    assert_views_agree(tasks, scope)


def test_short_retention(make_backend: Factory, clock: FixedClock) -> None:
    short = make_backend(RETENTION_DAYS=1 / 24).tasks
    scope = Scope("a", "b")
    rec = short.put_turn(scope, "t", 0, meta={}, summary_md="x")
    assert rec.retain_until == iso(T0 + timedelta(hours=1))
    clock.advance(hours=1)
    with pytest.raises(NotFound):
        short.get_turn(scope, "t", 0)


# -- content round trip -------------------------------------------------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(meta=st.dictionaries(st.text(max_size=10), _json, max_size=5), summary=st.text(max_size=300))
def test_meta_and_summary_round_trip_verbatim(
    tasks: TaskBackend, meta: dict[str, object], summary: str
) -> None:
    scope = Scope("acme", "roundtrip")
    rec = tasks.put_turn(scope, "t", 0, meta=meta, summary_md=summary)
    got = tasks.get_turn(scope, "t", 0)
    assert got.meta == meta == rec.meta and got.summary_md == summary
    assert list(got.meta) == list(meta)  # key order too: the API returns meta as stored
    assert tasks.get_task(scope, "t").turns[0].meta == meta


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
    tasks: TaskBackend, scope: Scope, meta: dict[str, object], summary: str
) -> None:
    tasks.put_turn(scope, "other", 0, meta={}, summary_md="x")
    for task_id in ("new-task", "other"):
        with pytest.raises(InvalidName):
            tasks.put_turn(scope, task_id, 1, meta=meta, summary_md=summary)
    with pytest.raises(NotFound):
        tasks.get_task(scope, "new-task")
    assert [t.turn for t in tasks.get_task(scope, "other").turns] == [0]
    assert_views_agree(tasks, scope)


def test_values_orjson_cannot_encode_round_trip_exactly(tasks: TaskBackend, scope: Scope) -> None:
    meta = {"big": 2**70, "neg": -(2**64), "unicode": "naïve — 日本", "float": 0.1}
    tasks.put_turn(scope, "t1", 0, meta=meta, summary_md="s")
    assert tasks.get_turn(scope, "t1", 0).meta == meta
    assert tasks.get_task(scope, "t1").turns[0].meta == meta
    assert_views_agree(tasks, scope)
