"""A search answers within its budget or with a JSON 503 (Retry-After), on every backend: one
that runs out of MEMORY_SEARCH_TIMEOUT, and one beyond the searches a worker runs at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from tests.conftest import BufferedClient, FixedClock, Tokens

pytestmark = pytest.mark.all_backends
PM = "/sandbox/memory/v1"


@pytest.fixture
def app(tmp_path: Path, clock: FixedClock, backend_config: dict[str, Any]) -> Iterator[Flask]:
    application = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "CLOCK": clock,
            "LOCK_TIMEOUT": 5.0,
            "THREADS": 8,
            # Spent before the first snippet is cut: every search with a hit runs out.
            "SEARCH_TIMEOUT": 1e-6,
            **backend_config,
        }
    )
    application.test_client_class = BufferedClient
    yield application
    application.extensions["traffic"].close()
    application.extensions["storage"].close()


def test_a_search_past_its_budget_is_a_503_and_nothing_else_is_held(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    r = client.put(
        f"{PM}/tasks/t/turns/0",
        json={"summary_md": "passed test " * 20_000},
        headers=tokens.headers("writer"),
    )
    assert r.status_code == 200
    r = client.get(f"{PM}/search", headers=tokens.headers("reader"), query_string={"q": "passed"})
    assert r.status_code == 503, r.json
    assert "budget" in r.json["detail"] and r.headers["Retry-After"] == "1"
    # The slot it held is free again.
    slots = app.extensions["storage"].searcher.slots
    with slots.taken(), slots.taken():
        pass


def test_searches_beyond_the_workers_share_are_refused_at_once(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    slots = app.extensions["storage"].searcher.slots
    assert slots.slots == 2  # a quarter of 8 threads
    with slots.taken(), slots.taken():
        r = client.get(f"{PM}/search", headers=tokens.headers("reader"), query_string={"q": "x"})
    assert r.status_code == 503 and "running on this worker" in r.json["detail"]
    assert r.headers["Retry-After"] == "1"
    r = client.get(f"{PM}/search", headers=tokens.headers("reader"), query_string={"q": "x"})
    assert r.status_code == 200
