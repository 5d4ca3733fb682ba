"""Artifacts on the tree: bytes as files, nothing left behind, the tree's memory bound
(behaviour: tests/conformance/test_artifacts.py)."""

from __future__ import annotations

import hashlib
import io
import json
import tracemalloc

import pytest

from app.storage.core.clock import iso
from app.storage.core.errors import NotFound, PayloadTooLarge, PreconditionFailed
from app.storage.core.names import Scope
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock
from tests.storage._helpers import (
    MiB,
    PatternStream,
    assert_consistent,
    iter_chunks,
    snapshot,
    temp_files,
)

LIMIT = 50 * MiB


def test_put_and_open_artifact(store: TaskStore, scope: Scope, clock: FixedClock) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    clock.advance(seconds=3)
    body = b"\x00binary\xffdata" * 1000
    info = store.put_artifact(
        scope, "t1", 0, "out.bin", io.BytesIO(body), content_type="application/x-thing"
    )
    assert info.name == "out.bin"
    assert info.size == len(body)
    assert info.sha256 == hashlib.sha256(body).hexdigest()
    assert info.content_type == "application/x-thing"
    assert info.updated_at == iso(clock.now)
    art = store.open_artifact(scope, "t1", 0, "out.bin")
    with art.file:
        assert art.file.read() == body
    assert art.info == info and art.size == len(body)
    rec = store.get_turn(scope, "t1", 0)
    assert rec.artifacts == (info,)
    assert rec.updated_at == iso(clock.now)  # an artifact write refreshes the turn
    path = store.layout.artifact(scope, "t1", 0, "out.bin")
    assert path.read_bytes() == body  # the tree holds the bytes as they are
    assert store.get_task(scope, "t1").turns[0].artifacts == ("out.bin",)
    assert_consistent(store, scope)


def test_replacing_an_artifact(store: TaskStore, scope: Scope) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    first = store.put_artifact(scope, "t1", 0, "a", io.BytesIO(b"one"), content_type="text/a")
    store.put_artifact(scope, "t1", 0, "b", io.BytesIO(b"bee"), content_type="text/b")
    with pytest.raises(PreconditionFailed):
        store.put_artifact(
            scope, "t1", 0, "a", io.BytesIO(b"two"), content_type="x", if_none_match=True
        )
    with pytest.raises(PreconditionFailed):
        store.put_artifact(
            scope, "t1", 0, "a", io.BytesIO(b"two"), content_type="x", if_match='"0"'
        )
    second = store.put_artifact(
        scope, "t1", 0, "a", io.BytesIO(b"two!"), content_type="text/c", if_match=first.etag
    )
    rec = store.get_turn(scope, "t1", 0)
    assert sorted(a.name for a in rec.artifacts) == ["a", "b"]
    assert next(a for a in rec.artifacts if a.name == "a") == second
    art = store.open_artifact(scope, "t1", 0, "a")
    with art.file:
        assert art.file.read() == b"two!"
    assert art.info.content_type == "text/c" and art.info.size == 4
    assert temp_files(store.layout.root) == []
    assert_consistent(store, scope)


def test_exactly_50_mib_is_accepted_and_streamed(store: TaskStore, scope: Scope) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    body = PatternStream(LIMIT, seed=1)
    tracemalloc.start()
    try:
        info = store.put_artifact(scope, "t1", 0, "big.bin", body, content_type="x/y")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert body.pos == LIMIT
    assert info.size == LIMIT
    assert info.sha256 == PatternStream(LIMIT, seed=1).sha256()
    # Chunked: the engine never held more than a few chunks of the body.
    assert peak < 8 * MiB, f"upload peaked at {peak / MiB:.1f} MiB of Python memory"
    art = store.open_artifact(scope, "t1", 0, "big.bin")
    digest = hashlib.sha256()
    with art.file:
        for chunk in iter_chunks(art.file):
            digest.update(chunk)
    assert art.size == LIMIT and digest.hexdigest() == info.sha256
    assert temp_files(store.layout.root) == []


def test_50_mib_plus_one_byte_is_refused_and_leaves_nothing(store: TaskStore, scope: Scope) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    store.put_artifact(scope, "t1", 0, "keep.txt", io.BytesIO(b"keep"), content_type="t/p")
    meta_path = store.layout.turn_dir(scope, "t1", 0) / "meta.json"
    before = snapshot(store.layout.root)
    meta_before = json.loads(meta_path.read_text())
    body = PatternStream(LIMIT + 1, seed=2)
    with pytest.raises(PayloadTooLarge) as err:
        store.put_artifact(scope, "t1", 0, "big.bin", body, content_type="x/y")
    assert err.value.limit == LIMIT
    assert temp_files(store.layout.root) == []
    assert not store.layout.artifact(scope, "t1", 0, "big.bin").exists()
    assert json.loads(meta_path.read_text()) == meta_before
    after = snapshot(store.layout.root)
    # Lock side files may appear (they are never deleted); nothing else may change.
    assert {k: v for k, v in after.items() if not k.startswith(".locks")} == {
        k: v for k, v in before.items() if not k.startswith(".locks")
    }
    with pytest.raises(NotFound):
        store.open_artifact(scope, "t1", 0, "big.bin")
    # Replacing an existing artifact with an oversize body keeps the old one.
    with pytest.raises(PayloadTooLarge):
        store.put_artifact(scope, "t1", 0, "keep.txt", PatternStream(LIMIT + 1), content_type="x")
    art = store.open_artifact(scope, "t1", 0, "keep.txt")
    with art.file:
        assert art.file.read() == b"keep"
    assert_consistent(store, scope)


def test_a_stream_that_breaks_mid_upload_leaves_nothing(store: TaskStore, scope: Scope) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="x")

    class Broken:
        def __init__(self) -> None:
            self.calls = 0

        def read(self, n: int = -1) -> bytes:
            self.calls += 1
            if self.calls > 3:
                raise ConnectionResetError("client went away")
            return b"z" * n

    before = snapshot(store.layout.root)
    with pytest.raises(ConnectionResetError):
        store.put_artifact(scope, "t1", 0, "a.bin", Broken(), content_type="x")  # type: ignore[arg-type]
    assert temp_files(store.layout.root) == []
    assert {k: v for k, v in snapshot(store.layout.root).items() if not k.startswith(".locks")} == {
        k: v for k, v in before.items() if not k.startswith(".locks")
    }
    assert store.get_turn(scope, "t1", 0).artifacts == ()


def test_upload_racing_a_rewrite_of_its_expired_turn_is_a_conflict(store, scope, clock) -> None:
    from app.storage.core.errors import Conflict

    store.put_turn(scope, "t", 0, meta={}, summary_md="old")

    class Stream:
        def __init__(self) -> None:
            self.calls = 0

        def read(self, n: int = -1) -> bytes:
            self.calls += 1
            if self.calls == 1:
                # While the body streams in, the turn expires and someone writes it anew:
                # its old directory (with the staged bytes) goes to the trash.
                clock.advance(days=31)
                store.put_turn(scope, "t", 0, meta={}, summary_md="new")
                return b"abc"
            return b""

    with pytest.raises(Conflict):
        store.put_artifact(
            scope, "t", 0, "a.bin", Stream(), content_type="application/octet-stream"
        )
    record = store.get_turn(scope, "t", 0)
    assert record.summary_md == "new" and record.artifacts == ()


def test_a_failed_upload_does_not_undo_a_concurrent_one(store: TaskStore, scope: Scope) -> None:
    """Two uploads to a turn without artifacts yet: the first to start fails after the second
    began streaming. The second still lands (its bytes were not in a directory the failed
    one removed on its way out)."""
    import threading

    store.put_turn(scope, "t", 0, meta={}, summary_md="x")
    first_streaming = threading.Event()
    second_streaming = threading.Event()
    first_failed = threading.Event()
    errors: list[BaseException] = []

    class First:
        def __init__(self) -> None:
            self.calls = 0

        def read(self, n: int = -1) -> bytes:
            self.calls += 1
            if self.calls == 1:
                first_streaming.set()
                return b"a" * 10
            assert second_streaming.wait(10)
            raise ConnectionResetError("client went away")

    class Second:
        def __init__(self) -> None:
            self.calls = 0

        def read(self, n: int = -1) -> bytes:
            self.calls += 1
            if self.calls == 1:
                second_streaming.set()
                return b"b" * 10
            if self.calls == 2:
                assert first_failed.wait(10)
                return b"b"
            return b""

    def first() -> None:
        try:
            store.put_artifact(scope, "t", 0, "one.bin", First(), content_type="x/y")  # type: ignore[arg-type]
        except BaseException as exc:
            errors.append(exc)
        first_failed.set()

    thread = threading.Thread(target=first)
    thread.start()
    assert first_streaming.wait(10)
    info = store.put_artifact(scope, "t", 0, "two.bin", Second(), content_type="x/y")  # type: ignore[arg-type]
    thread.join(10)
    assert [type(e) for e in errors] == [ConnectionResetError]
    assert info.size == 11
    assert [a.name for a in store.get_turn(scope, "t", 0).artifacts] == ["two.bin"]
    assert temp_files(store.layout.root) == []
    assert_consistent(store, scope)
