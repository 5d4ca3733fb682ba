"""The OpenAI-compatible embedder against a real HTTP server (the stub) that answers, fails,
hangs and goes away."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from app.embeddings.base import EmbedderUnavailable, ModelId
from app.embeddings.breaker import CircuitBreaker
from app.embeddings.remote import BadAnswer, OpenAICompatibleEmbedder, embeddings_url
from tests.embeddings.stub import DIMS, StubEmbeddingsServer, embeddings_server, stub_vector

__all__ = ["embeddings_server"]  # the fixture, imported to be used here

KEY = "sk-test-Zq81SecretValue"


def make(server: StubEmbeddingsServer, **kw: object) -> OpenAICompatibleEmbedder:
    args: dict[str, object] = {"timeout": 2.0, "backoff": 0.01, **kw}
    return OpenAICompatibleEmbedder(server.base_url, "stub-model", **args)  # type: ignore[arg-type]


def test_the_url_may_be_the_base_or_the_full_address() -> None:
    assert embeddings_url("http://127.0.0.1:11434/v1") == "http://127.0.0.1:11434/v1/embeddings"
    assert embeddings_url("http://h/v1/") == "http://h/v1/embeddings"
    assert embeddings_url("https://h/v1/embeddings") == "https://h/v1/embeddings"
    for bad in ("file:///etc/passwd", "ftp://h/v1", "http:///v1", "http://u:p@h/v1"):
        with pytest.raises(ValueError):
            embeddings_url(bad)


def test_rows_are_the_servers_vectors_made_unit_length_in_order(
    embeddings_server: StubEmbeddingsServer,
) -> None:
    emb = make(embeddings_server)
    assert emb.model == ModelId("openai:stub-model", 0)
    texts = ["the session TTL expired", "login cookie", "a migration of the database"]
    rows = emb.embed(texts, kind="document")
    assert rows.dtype == np.float32 and rows.shape == (3, DIMS)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-6)
    for row, text in zip(rows, texts, strict=True):
        want = np.array(stub_vector(text))
        np.testing.assert_allclose(row, want / np.linalg.norm(want), rtol=1e-5)
    assert emb.model == ModelId("openai:stub-model", DIMS)  # learned from the answer
    assert embeddings_server.requests[0] == {"model": "stub-model", "input": texts}


def test_texts_go_in_batches_and_come_back_in_one_array(
    embeddings_server: StubEmbeddingsServer,
) -> None:
    texts = [f"text number {i}" for i in range(10)]
    rows = make(embeddings_server, batch=4).embed(texts, kind="document")
    assert [len(r["input"]) for r in embeddings_server.requests] == [4, 4, 2]
    single = make(embeddings_server).embed(texts, kind="document")
    np.testing.assert_array_equal(rows, single)


def test_a_failed_request_is_retried_with_back_off(
    embeddings_server: StubEmbeddingsServer,
) -> None:
    embeddings_server.fail_next = 2
    emb = make(embeddings_server, retries=2, backoff=0.05)
    t0 = time.monotonic()
    rows = emb.embed(["hello"], kind="query")
    assert rows.shape == (1, DIMS)
    assert len(embeddings_server.requests) == 3
    assert time.monotonic() - t0 >= 0.05 + 0.1  # two pauses, the second twice the first
    assert emb.breaker.state == "closed"


def test_retries_stop_when_they_are_used_up(embeddings_server: StubEmbeddingsServer) -> None:
    embeddings_server.mode = "fail"
    with pytest.raises(EmbedderUnavailable, match="HTTP 500"):
        make(embeddings_server, retries=1).embed(["hello"], kind="query")
    assert len(embeddings_server.requests) == 2


def test_a_hung_server_costs_the_timeout_and_no_more_than_the_deadline(
    embeddings_server: StubEmbeddingsServer,
) -> None:
    embeddings_server.mode = "hang"
    emb = make(embeddings_server, timeout=0.3, retries=5, deadline=1.0)
    t0 = time.monotonic()
    with pytest.raises(EmbedderUnavailable):
        emb.embed(["hello"], kind="query")
    assert 0.3 <= time.monotonic() - t0 < 1.5


def test_a_server_trickling_its_answer_is_stopped_at_the_deadline(
    embeddings_server: StubEmbeddingsServer,
) -> None:
    embeddings_server.mode = "trickle"  # each byte well within the socket timeout
    emb = make(embeddings_server, timeout=0.5, retries=0, deadline=1.0)
    t0 = time.monotonic()
    with pytest.raises(EmbedderUnavailable, match="deadline"):
        emb.embed(["hello"], kind="query")
    assert time.monotonic() - t0 < 1.6


def test_a_slow_server_times_out(embeddings_server: StubEmbeddingsServer) -> None:
    embeddings_server.mode, embeddings_server.delay = "slow", 2.0
    emb = make(embeddings_server, timeout=0.2, retries=0)
    t0 = time.monotonic()
    with pytest.raises(EmbedderUnavailable, match="Timeout|timed out"):
        emb.embed(["hello"], kind="query")
    assert time.monotonic() - t0 < 1.0


def test_a_server_that_is_down_is_unavailable_at_once(
    embeddings_server: StubEmbeddingsServer,
) -> None:
    embeddings_server.down()
    t0 = time.monotonic()
    with pytest.raises(EmbedderUnavailable, match="Connection|refused"):
        make(embeddings_server, retries=1).embed(["hello"], kind="query")
    assert time.monotonic() - t0 < 1.0


def test_garbage_is_refused_and_not_retried(embeddings_server: StubEmbeddingsServer) -> None:
    embeddings_server.mode = "garbage"
    emb = make(embeddings_server)
    with pytest.raises(BadAnswer, match="garbage"):
        emb.embed(["hello"], kind="query")
    assert len(embeddings_server.requests) == 1
    assert emb.model.dims == 0  # nothing learned from it


@pytest.mark.parametrize(
    "answer",
    [
        b"not json",
        b'{"data": []}',
        b'{"data": [{"index": 0, "embedding": [1.0, "x"]}]}',
        b'{"data": [{"index": 0, "embedding": [0.0, 0.0]}]}',
        b'{"data": [{"index": 3, "embedding": [1.0, 0.0]}]}',
        b'{"data": [{"index": 0, "embedding": [1e400, 0.0]}]}',
        b'{"data": [{"index": 0, "embedding": []}]}',
        b'["data"]',
    ],
)
def test_every_malformed_answer_is_a_bad_answer(answer: bytes) -> None:
    emb = OpenAICompatibleEmbedder("http://127.0.0.1:9/v1", "m")
    with pytest.raises(BadAnswer):
        emb._parse(answer, 1)


def test_an_answer_of_other_dimensions_is_an_error(
    embeddings_server: StubEmbeddingsServer,
) -> None:
    emb = make(embeddings_server)
    emb.embed(["first"], kind="document")
    embeddings_server.dims = DIMS * 2  # the server's model was swapped under us
    with pytest.raises(BadAnswer, match="dimensions"):
        emb.embed(["second"], kind="document")
    assert emb.model.dims == DIMS
    given = make(embeddings_server, dims=DIMS)
    with pytest.raises(BadAnswer, match="dimensions"):
        given.embed(["third"], kind="document")


def test_the_breaker_opens_refuses_at_once_half_opens_and_closes(
    embeddings_server: StubEmbeddingsServer,
) -> None:
    breaker = CircuitBreaker(failures=2, cool_down=0.5)
    emb = make(embeddings_server, retries=0, breaker=breaker)
    embeddings_server.mode = "fail"
    for _ in range(2):
        with pytest.raises(EmbedderUnavailable, match="HTTP 500"):
            emb.embed(["x"], kind="query")
    assert breaker.state == "open"
    asked = len(embeddings_server.requests)
    t0 = time.monotonic()
    with pytest.raises(EmbedderUnavailable, match="next try"):
        emb.embed(["x"], kind="query")
    assert time.monotonic() - t0 < 0.05
    assert len(embeddings_server.requests) == asked  # refused without asking

    time.sleep(0.55)
    assert breaker.state == "half-open"
    with pytest.raises(EmbedderUnavailable, match="HTTP 500"):  # the probe fails: open again
        emb.embed(["x"], kind="query")
    assert breaker.state == "open"
    assert len(embeddings_server.requests) == asked + 1

    time.sleep(0.55)
    embeddings_server.mode = "ok"
    assert emb.embed(["x"], kind="query").shape == (1, DIMS)  # the probe succeeds: closed
    assert breaker.state == "closed"


def test_half_open_lets_one_probe_through() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failures=1, cool_down=10, clock=lambda: now[0])
    breaker.failure()
    assert not breaker.allow()
    now[0] = 10.0
    assert breaker.allow()
    assert not breaker.allow()  # a second caller while the probe runs
    breaker.success()
    assert breaker.allow() and breaker.allow()


def test_the_key_is_sent_and_never_shown(
    embeddings_server: StubEmbeddingsServer, caplog: pytest.LogCaptureFixture
) -> None:
    emb = make(embeddings_server, api_key=KEY, retries=0)
    emb.embed(["hello"], kind="query")
    assert embeddings_server.headers[0]["Authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(emb) and KEY not in str(vars(emb).get("url"))
    caplog.set_level(logging.DEBUG)
    shown: list[str] = [repr(emb)]
    for mode in ("fail", "garbage"):
        embeddings_server.mode = mode
        with pytest.raises(EmbedderUnavailable) as info:
            emb.embed(["hello"], kind="query")
        shown += [str(info.value), repr(info.value)]
    embeddings_server.down()
    with pytest.raises(EmbedderUnavailable) as info:
        emb.embed(["hello"], kind="query")
    shown += [str(info.value), caplog.text]
    assert caplog.text  # the failures were logged ...
    assert not [s for s in shown if KEY in s]  # ... and the key is in none of it


def test_no_texts_ask_nothing(embeddings_server: StubEmbeddingsServer) -> None:
    assert make(embeddings_server).embed([], kind="query").shape == (0, 0)
    assert embeddings_server.requests == []


def test_a_query_waits_its_own_shorter_deadline_and_a_document_the_whole_one(
    embeddings_server: StubEmbeddingsServer,
) -> None:
    embeddings_server.mode, embeddings_server.delay = "slow", 1.2
    emb = make(embeddings_server, timeout=5.0, retries=0, deadline=5.0, query_deadline=0.4)
    t0 = time.monotonic()
    with pytest.raises(EmbedderUnavailable):
        emb.embed(["hello"], kind="query")
    assert time.monotonic() - t0 < 1.0
    emb.breaker.success()  # the query's failure must not keep the document from trying
    t0 = time.monotonic()
    assert emb.embed(["hello"], kind="document").shape == (1, emb.model.dims)
    assert time.monotonic() - t0 >= 1.2
