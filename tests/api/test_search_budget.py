"""A search answers within its budget or with a JSON 503 (Retry-After), on every backend: one
that runs out of MEMORY_SEARCH_TIMEOUT; one beyond the searches a worker runs at once waits
for a slot, and is refused only past its wait or beyond the queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.storage.core.errors import SearchTimeout
from app.storage.core.query import SearchSlots
from tests.conftest import BufferedClient, FixedClock, Tokens

pytestmark = pytest.mark.all_backends
PM = "/sandbox/memory/v1"


@pytest.fixture
def app(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    clock: FixedClock,
    backend_config: dict[str, Any],
) -> Iterator[Flask]:
    # Spent before the first snippet is cut: every search with a hit runs out (unless a test
    # asks for another budget).
    budget = getattr(request, "param", 1e-6)
    application = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "CLOCK": clock,
            "LOCK_TIMEOUT": 5.0,
            "THREADS": 8,
            "SEARCH_TIMEOUT": budget,
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
    # The slot it held is free again: both slots are taken at once, by two projects.
    slots = app.extensions["storage"].searcher.slots
    slots.wait_seconds = 0.0
    with slots.taken("a"), slots.taken("b"):
        pass


# A budget no search here spends: on PostgreSQL even a search of empty tables can take more
# than the smallest statement_timeout (1 ms) on a busy machine.
@pytest.mark.parametrize("app", [30.0], indirect=True)
def test_a_search_beyond_the_slots_waits_for_one_and_is_answered(
    app: Flask, tokens: Tokens
) -> None:
    slots = app.extensions["storage"].searcher.slots
    assert slots.slots == 2 and slots.waiting == 6  # a quarter of 8 threads; the rest wait
    answers: list[tuple[int, float]] = []

    def search() -> None:
        started = time.monotonic()
        r = app.test_client().get(
            f"{PM}/search", headers=tokens.headers("reader"), query_string={"q": "x"}
        )
        answers.append((r.status_code, time.monotonic() - started))

    with slots.taken("other"), slots.taken("another"):
        waiter = threading.Thread(target=search)
        waiter.start()
        time.sleep(0.3)
        assert not answers  # still waiting for a slot
    waiter.join(10)
    ((status, took),) = answers
    assert status == 200 and took >= 0.3


@pytest.mark.parametrize("app", [30.0], indirect=True)
def test_a_search_refused_past_its_wait_or_a_full_queue_says_so_with_retry_after(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    slots = app.extensions["storage"].searcher.slots
    slots.wait_seconds = 0.2
    with slots.taken("other"), slots.taken("another"):
        r = client.get(f"{PM}/search", headers=tokens.headers("reader"), query_string={"q": "x"})
        assert r.status_code == 503 and "within 0.2 s" in r.json["detail"]
        assert r.headers["Retry-After"] == "1"
        slots.waiting = 0
        started = time.monotonic()
        r = client.get(f"{PM}/search", headers=tokens.headers("reader"), query_string={"q": "x"})
        assert r.status_code == 503 and "waiting already" in r.json["detail"]
        assert time.monotonic() - started < 0.2  # refused at once
    r = client.get(f"{PM}/search", headers=tokens.headers("reader"), query_string={"q": "x"})
    assert r.status_code == 200


def test_one_project_never_takes_every_slot() -> None:
    slots = SearchSlots(3, waiting=4, wait_seconds=0.2)
    with slots.taken("busy"), slots.taken("busy"):
        # Its third waits, then gives up.
        with pytest.raises(SearchTimeout, match="within"), slots.taken("busy"):
            pass
        with slots.taken("quiet"):  # another project's runs at once
            pass
    single = SearchSlots(1, waiting=1, wait_seconds=0.0)
    with single.taken("only"):  # one slot: a project alone may use it
        pass
