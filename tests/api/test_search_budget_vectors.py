"""The vector half of a search keeps the search's promises: its query is embedded within a
share of MEMORY_SEARCH_TIMEOUT (a slow embedder: keyword results in time, and the reason),
and it runs inside the worker's search slots (beyond them and their wait: 503, Retry-After).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.embeddings.base import Kind
from tests.conftest import Tokens
from tests.storage._embedders import HashEmbedder

PM = "/sandbox/memory/v1"


class SlowQueries(HashEmbedder):
    """Embeds documents at once and each query after ``delay`` seconds (a server that hangs
    on the request path; the background drain is not timed here)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def embed(self, texts: Sequence[str], *, kind: Kind) -> npt.NDArray[np.float32]:
        if kind == "query":
            time.sleep(self.delay)
        return super().embed(texts, kind=kind)


@pytest.fixture
def app_overrides() -> dict[str, Any]:
    return {"EMBEDDER": "bundled", "SEARCH_TIMEOUT": 1.0, "THREADS": 8}


def with_embedder(app: Flask, embedder: HashEmbedder) -> None:
    # Swapped before anything is embedded: the bundled model is never loaded.
    app.extensions["storage"].embedding.embedder = embedder


def write(client: FlaskClient, tokens: Tokens, who: str = "writer") -> None:
    r = client.put(
        f"{PM}/tasks/t/turns/0", json={"summary_md": "npm cache"}, headers=tokens.headers(who)
    )
    assert r.status_code == 200, r.json


def test_a_slow_embedder_answers_keyword_results_within_the_budget(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    with_embedder(app, SlowQueries(2.0))
    write(client, tokens)
    for mode in ("hybrid", "semantic"):
        started = time.monotonic()
        r = client.get(
            f"{PM}/search",
            headers=tokens.headers("reader"),
            query_string={"q": "npm", "mode": mode},
        )
        took = time.monotonic() - started
        assert r.status_code == 200, r.json
        assert r.json["modes"] == ["keyword"] and "did not answer within" in r.json["fallback"]
        assert [h["task_id"] for h in r.json["hits"]] == ["t"]
        assert took < 1.0  # the budget: the query's share of it, then keywords


def test_searches_by_meaning_hold_the_slots_and_one_beyond_is_refused_with_retry_after(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    with_embedder(app, SlowQueries(0.4))
    write(client, tokens)
    write(client, tokens, "other_project")
    slots = app.extensions["storage"].searcher.slots
    assert slots.slots == 2
    slots.wait_seconds = 0.1
    answers: list[int] = []

    def semantic(who: str) -> None:
        r = app.test_client().get(
            f"{PM}/search",
            headers=tokens.headers(who),
            query_string={"q": "npm", "mode": "semantic"},
        )
        answers.append(r.status_code)

    # Two projects (one never takes every slot), each embedding its query in a slot.
    busy = [threading.Thread(target=semantic, args=(who,)) for who in ("reader", "other_project")]
    for thread in busy:
        thread.start()
    time.sleep(0.15)
    r = client.get(
        f"{PM}/search",
        headers=tokens.headers("reader"),
        query_string={"q": "npm", "mode": "semantic"},
    )
    assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.json
    for thread in busy:
        thread.join(10)
    assert answers == [200, 200]
    r = client.get(
        f"{PM}/search",
        headers=tokens.headers("reader"),
        query_string={"q": "npm", "mode": "semantic"},
    )
    assert r.status_code == 200 and r.json["modes"] == ["semantic"]
