"""Artifacts: streamed in, the size limit to the byte, nothing visible on failure, streamed
back (also from an offset, as a ranged download reads them)."""

from __future__ import annotations

import hashlib
import io
import tracemalloc

import pytest

from app.storage.core.clock import iso
from app.storage.core.errors import NotFound, PayloadTooLarge, PreconditionFailed
from app.storage.core.names import Scope
from app.storage.interface import TaskBackend
from tests.conformance.conftest import Factory, assert_views_agree
from tests.conftest import FixedClock
from tests.storage._helpers import MiB, PatternStream, iter_chunks

LIMIT = 50 * MiB


def test_put_and_open_artifact(tasks: TaskBackend, scope: Scope, clock: FixedClock) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    clock.advance(seconds=3)
    body = b"\x00binary\xffdata" * 1000
    info = tasks.put_artifact(
        scope, "t1", 0, "out.bin", io.BytesIO(body), content_type="application/x-thing"
    )
    assert info.name == "out.bin"
    assert info.size == len(body)
    assert info.sha256 == hashlib.sha256(body).hexdigest()
    assert info.etag == f'"{info.sha256}"'
    assert info.content_type == "application/x-thing"
    assert info.updated_at == iso(clock.now)
    art = tasks.open_artifact(scope, "t1", 0, "out.bin")
    with art.file:
        assert art.file.read() == body
    assert art.info == info and art.size == len(body)
    rec = tasks.get_turn(scope, "t1", 0)
    assert rec.artifacts == (info,)
    assert rec.updated_at == iso(clock.now)  # an artifact write refreshes the turn
    assert tasks.get_task(scope, "t1").turns[0].artifacts == ("out.bin",)
    assert_views_agree(tasks, scope)


def test_an_opened_artifact_reads_from_any_offset(tasks: TaskBackend, scope: Scope) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    body = bytes(range(256)) * 100
    tasks.put_artifact(scope, "t1", 0, "a", io.BytesIO(body), content_type="x/y")
    art = tasks.open_artifact(scope, "t1", 0, "a")
    with art.file:
        assert art.file.seekable()
        art.file.seek(1000)
        assert art.file.read(10) == body[1000:1010]
        art.file.seek(25590)
        assert art.file.read() == body[25590:]


def test_replacing_an_artifact(tasks: TaskBackend, scope: Scope) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    first = tasks.put_artifact(scope, "t1", 0, "a", io.BytesIO(b"one"), content_type="text/a")
    tasks.put_artifact(scope, "t1", 0, "b", io.BytesIO(b"bee"), content_type="text/b")
    with pytest.raises(PreconditionFailed):
        tasks.put_artifact(
            scope, "t1", 0, "a", io.BytesIO(b"two"), content_type="x", if_none_match=True
        )
    with pytest.raises(PreconditionFailed):
        tasks.put_artifact(
            scope, "t1", 0, "a", io.BytesIO(b"two"), content_type="x", if_match='"0"'
        )
    second = tasks.put_artifact(
        scope, "t1", 0, "a", io.BytesIO(b"two!"), content_type="text/c", if_match=first.etag
    )
    rec = tasks.get_turn(scope, "t1", 0)
    assert [a.name for a in rec.artifacts] == ["b", "a"]  # a replaced artifact moves last
    assert next(a for a in rec.artifacts if a.name == "a") == second
    art = tasks.open_artifact(scope, "t1", 0, "a")
    with art.file:
        assert art.file.read() == b"two!"
    assert art.info.content_type == "text/c" and art.info.size == 4
    assert_views_agree(tasks, scope)


def test_a_reader_of_the_old_bytes_keeps_them_across_a_replacement(
    tasks: TaskBackend, scope: Scope
) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    old = b"old " * 100_000
    tasks.put_artifact(scope, "t1", 0, "a", io.BytesIO(old), content_type="x/y")
    art = tasks.open_artifact(scope, "t1", 0, "a")
    with art.file:
        head = art.file.read(10)
        tasks.put_artifact(scope, "t1", 0, "a", io.BytesIO(b"new"), content_type="x/y")
        assert head + art.file.read() == old
        assert hashlib.sha256(old).hexdigest() == art.info.sha256


def test_artifact_needs_a_live_turn(tasks: TaskBackend, scope: Scope, clock: FixedClock) -> None:
    with pytest.raises(NotFound):
        tasks.put_artifact(scope, "t1", 0, "a", io.BytesIO(b"x"), content_type="x")
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    with pytest.raises(NotFound):
        tasks.put_artifact(scope, "t1", 1, "a", io.BytesIO(b"x"), content_type="x")
    with pytest.raises(NotFound):
        tasks.open_artifact(scope, "t1", 0, "missing")
    tasks.put_artifact(scope, "t1", 0, "a", io.BytesIO(b"x"), content_type="x")
    clock.advance(days=31)
    with pytest.raises(NotFound):
        tasks.open_artifact(scope, "t1", 0, "a")
    with pytest.raises(NotFound):
        tasks.put_artifact(scope, "t1", 0, "b", io.BytesIO(b"x"), content_type="x")


def test_empty_artifact(tasks: TaskBackend, scope: Scope) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    info = tasks.put_artifact(scope, "t1", 0, "empty", io.BytesIO(b""), content_type="x/y")
    assert info.size == 0 and info.sha256 == hashlib.sha256(b"").hexdigest()
    art = tasks.open_artifact(scope, "t1", 0, "empty")
    with art.file:
        assert art.file.read() == b""


def test_exactly_50_mib_is_accepted_and_streamed(tasks: TaskBackend, scope: Scope) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    # A first, small upload: a client's one-time set-up (an object store client loads its
    # service description) is not what an upload costs.
    tasks.put_artifact(scope, "t1", 0, "warm.txt", io.BytesIO(b"w"), content_type="text/plain")
    body = PatternStream(LIMIT, seed=1)
    tracemalloc.start()
    try:
        info = tasks.put_artifact(scope, "t1", 0, "big.bin", body, content_type="x/y")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert body.pos == LIMIT
    assert info.size == LIMIT
    assert info.sha256 == PatternStream(LIMIT, seed=1).sha256()
    # Streamed: the backend never held more than a few parts of the body.
    assert peak < 16 * MiB, f"upload peaked at {peak / MiB:.1f} MiB of Python memory"
    art = tasks.open_artifact(scope, "t1", 0, "big.bin")
    digest = hashlib.sha256()
    with art.file:
        for chunk in iter_chunks(art.file):
            digest.update(chunk)
    assert art.size == LIMIT and digest.hexdigest() == info.sha256


def test_50_mib_plus_one_byte_is_refused_and_keeps_what_was_there(
    tasks: TaskBackend, scope: Scope
) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    kept = tasks.put_artifact(scope, "t1", 0, "keep.txt", io.BytesIO(b"keep"), content_type="t/p")
    before = tasks.get_turn(scope, "t1", 0)
    with pytest.raises(PayloadTooLarge) as err:
        tasks.put_artifact(scope, "t1", 0, "big.bin", PatternStream(LIMIT + 1), content_type="x")
    assert err.value.limit == LIMIT
    with pytest.raises(NotFound):
        tasks.open_artifact(scope, "t1", 0, "big.bin")
    with pytest.raises(PayloadTooLarge):
        tasks.put_artifact(scope, "t1", 0, "keep.txt", PatternStream(LIMIT + 1), content_type="x")
    assert tasks.get_turn(scope, "t1", 0) == before
    art = tasks.open_artifact(scope, "t1", 0, "keep.txt")
    with art.file:
        assert art.file.read() == b"keep"
    assert art.info == kept
    assert_views_agree(tasks, scope)


def test_a_stream_that_breaks_mid_upload_leaves_nothing(tasks: TaskBackend, scope: Scope) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x")

    class Broken:
        def __init__(self) -> None:
            self.calls = 0

        def read(self, n: int = -1) -> bytes:
            self.calls += 1
            if self.calls > 12:
                raise ConnectionResetError("client went away")
            return b"z" * min(n, 1 << 20)

    with pytest.raises(ConnectionResetError):
        tasks.put_artifact(scope, "t1", 0, "a.bin", Broken(), content_type="x")  # type: ignore[arg-type]
    assert tasks.get_turn(scope, "t1", 0).artifacts == ()
    with pytest.raises(NotFound):
        tasks.open_artifact(scope, "t1", 0, "a.bin")


def test_a_smaller_configured_limit_is_exact(make_backend: Factory) -> None:
    small = make_backend(MAX_ARTIFACT_BYTES=1000).tasks
    scope = Scope("a", "b")
    small.put_turn(scope, "t", 0, meta={}, summary_md="x")
    assert small.max_artifact_bytes == 1000
    assert (
        small.put_artifact(scope, "t", 0, "ok", PatternStream(1000), content_type="x").size == 1000
    )
    with pytest.raises(PayloadTooLarge):
        small.put_artifact(scope, "t", 0, "no", PatternStream(1001), content_type="x")
