"""Console requests are charged to the same budgets as the API's: the signed-in token's and
its project's. A page whose budget is spent answers 429 with the API's headers (Retry-After,
RateLimit, RateLimit-Policy) on the console's own error page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.conftest import Tokens

from .conftest import API, Browser

WEB = "/console/p/acme/web"
BURST = 4
LIMITS = {"RATE_LIMIT_RPS": 0.001, "RATE_LIMIT_BURST": BURST}  # no refill within a test


@pytest.fixture
def app_overrides() -> dict[str, Any]:
    """Every project held to BURST requests."""
    return LIMITS


def api_status(client: FlaskClient, tokens: Tokens, who: str) -> int:
    return client.get(f"{API}/tasks", headers=tokens.headers(who)).status_code


def test_console_pages_spend_the_token_and_project_budgets(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    # Signing in shows the project menu, a page in no project: it costs the token alone.
    browser = console("writer")
    statuses = [browser.get(f"{WEB}/tasks").status_code for _ in range(BURST + 1)]
    assert statuses == [200] * (BURST - 1) + [429, 429], statuses
    assert api_status(client, tokens, "writer") == 429  # the token's budget, spent
    # The project's budget: BURST - 1 pages spent it but for one request, whoever asks.
    other = console("writer2")  # its own token budget is untouched
    assert [other.get(f"{WEB}/tasks").status_code for _ in range(2)] == [200, 429]
    assert api_status(client, tokens, "writer2") == 429
    assert api_status(client, tokens, "other_project") == 200  # another project's, untouched


def test_the_api_spends_what_the_console_then_lacks(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    browser = console("writer")
    while api_status(client, tokens, "writer2") == 200:
        pass  # the project's budget, spent by another token through the API
    page = browser.get(f"{WEB}/search?q=anything")
    assert page.status_code == 429
    api = client.get(f"{API}/tasks", headers=tokens.headers("writer2"))
    assert api.status_code == 429
    # The API's answer, as a page: the same headers, the console's HTML and safety headers.
    for header in ("Retry-After", "RateLimit", "RateLimit-Policy"):
        assert page.headers.get(header), header
    assert page.headers["RateLimit-Policy"] == api.headers["RateLimit-Policy"]
    assert page.mimetype == "text/html"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["Cache-Control"] == "no-store"
    assert "rate limit" in page.get_data(as_text=True).lower()


def test_many_console_searches_are_held_to_the_burst(
    tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    browser = console("writer")
    statuses = [browser.get(f"{WEB}/search?q=x{i}").status_code for i in range(30)]
    assert statuses.count(200) <= BURST
    assert statuses.count(429) >= 30 - BURST
