"""The ledger and timeline pages: the REST ledger's figures drawn and ranked, the filters in
the address, the timeline paged with the API's cursor; any role of the project reads them,
another project's token does not; a bad filter or cursor is a 400 page; what agents wrote
(models, branches) shows as text. On every backend."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.console import ledger as ledger_page
from tests.conftest import Tokens

from .conftest import API, Browser, put_turn, text

pytestmark = pytest.mark.all_backends

WEB = "/console/p/acme/web"
TOKENS = {"input": 1000, "output": 100, "cache_read": 10, "cache_creation": 1}


def seed(client: FlaskClient, tokens: Tokens) -> None:
    """Three turns in two tasks, two models, two branches; one failed (the clock: 2026-01-01)."""
    turns: list[tuple[str, int, dict[str, Any]]] = [
        ("fix-login", 0, {"agent_id": "claude-code", "model": "opus", "branch": "main",
                          "claude_session_id": "s1", "started_at": "2025-12-31T09:00:00Z",
                          "exit_code": 0, "cost": 0.5}),
        ("fix-login", 1, {"agent_id": "claude-code", "model": "opus", "branch": "main",
                          "claude_session_id": "s1", "started_at": "2025-12-31T10:00:00Z",
                          "exit_code": 2, "cost": 0.25, "commit": "0123456789abcdef0123"}),
        ("ci", 0, {"agent_id": "codex", "model": "gpt-5", "branch": "feature/x",
                   "codex_session_id": "s2", "started_at": "2025-12-30T23:00:00Z",
                   "cost": 2.0}),
    ]  # fmt: skip
    for task, turn, meta in turns:
        put_turn(client, tokens, task, turn, meta={**meta, "tokens": TOKENS})


def api_totals(client: FlaskClient, tokens: Tokens, **query: str) -> dict[str, Any]:
    r = client.get(f"{API}/ledger", headers=tokens.headers("reader"), query_string=query)
    assert r.status_code == 200, r.get_json()
    totals: dict[str, Any] = r.get_json()["totals"]
    return totals


def test_the_ledger_page_shows_what_the_rest_ledger_answers(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    seed(client, tokens)
    r = console("reader").get(f"{WEB}/ledger")
    assert r.status_code == 200
    page = text(r)
    totals = api_totals(client, tokens, since="30d")
    assert totals["turns"] == 3 and totals["cost_usd"] == 2.75
    assert '<dd data-total="turns">3</dd>' in page
    assert '<dd data-total="cost_usd">$2.75</dd>' in page
    assert 'data-total="nonzero_exits" class="bad">1<' in page
    # The cost chart: one bar per day and model, its values the rows' (micro-dollars).
    cost_chart = re.search(r'<svg[^>]*aria-label="Cost per day.*?</svg>', page, re.S)
    assert cost_chart is not None
    drawn = sorted(int(v) for v in re.findall(r'data-cost-musd="(\d+)"', cost_chart.group(0)))
    assert drawn == [750_000, 2_000_000]
    assert "2025-12-30: gpt-5: $2.00" in cost_chart.group(0)
    # The costliest first; the failing task with its count.
    tasks = re.search(r'<table class="ledger-top" data-of="task">.*?</table>', page, re.S)
    assert tasks is not None
    assert re.findall(r'data-key="([^"]*)"', tasks.group(0)) == ["ci", "fix-login"]
    failing = page.split("<h2>Failures</h2>", 1)[1]
    assert re.findall(r'data-key="([^"]*)"', failing) == ["fix-login"]
    # A branch links to the same view narrowed to it.
    assert f'href="{WEB}/ledger?branch=feature/x"' in page


def test_filters_are_the_address_and_narrow_every_figure(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    seed(client, tokens)
    page = text(console("reader").get(f"{WEB}/ledger?model=opus&since=2025-12-01"))
    assert (
        '<dd data-total="turns">2</dd>' in page and '<dd data-total="cost_usd">$0.75</dd>' in page
    )
    assert 'name="model" value="opus"' in page  # the form shows what the address says
    assert f'href="{WEB}/timeline?since=2025-12-01&amp;model=opus"' in page
    timeline = text(console("reader").get(f"{WEB}/timeline?model=opus&since=2025-12-01"))
    assert re.findall(r'data-task="([^"]+)" data-turn="(\d+)"', timeline) == [
        ("fix-login", "1"),
        ("fix-login", "0"),
    ]
    # Nothing in range: a panel that says so and how turns get here, no empty charts.
    empty = text(console("reader").get(f"{WEB}/ledger?until=2025-01-01"))
    assert "No turns in this range" in empty and "<svg" not in empty.split("<main", 1)[1]


def test_the_timeline_is_newest_first_and_pages_with_the_apis_cursor(
    client: FlaskClient,
    tokens: Tokens,
    console: Callable[[str], Browser],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed(client, tokens)
    monkeypatch.setattr(ledger_page, "TIMELINE_PAGE", 2)
    browser = console("reader")
    first = text(browser.get(f"{WEB}/timeline"))
    assert re.findall(r'data-task="([^"]+)" data-turn="(\d+)"', first) == [
        ("fix-login", "1"),
        ("fix-login", "0"),
    ]
    assert f'href="{WEB}/tasks/fix-login/turns/1"' in first
    assert 'title="0123456789abcdef0123">01234567</code>' in first
    nxt = re.search(r'href="([^"]+)" rel="next"', first)
    assert nxt is not None
    # The API's cursor for the same question: one may go from the page to the API and back.
    api = client.get(f"{API}/timeline?limit=2", headers=tokens.headers("reader")).get_json()
    assert f"cursor={api['next_cursor']}" in html.unescape(nxt.group(1))
    second = text(browser.get(html.unescape(nxt.group(1))))
    assert re.findall(r'data-task="([^"]+)" data-turn="(\d+)"', second) == [("ci", "0")]
    assert 'rel="next"' not in second


@pytest.mark.parametrize(
    "query",
    [
        "ledger?since=last-tuesday",
        "ledger?until=2026-13-45",
        "ledger?model=a%01b",
        "timeline?since=soon",
        "timeline?cursor=not-a-cursor",
        "timeline?branch=" + "b" * 300,
    ],
)
def test_a_bad_filter_or_cursor_is_a_400_page(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], query: str
) -> None:
    seed(client, tokens)
    r = console("reader").get(f"{WEB}/{query}")
    assert r.status_code == 400
    assert "Bad request" in text(r)


@pytest.mark.parametrize("who", ["reader", "writer", "project_admin", "tenant_admin", "admin"])
def test_every_role_of_the_project_reads_both(console: Callable[[str], Browser], who: str) -> None:
    for path in ("ledger", "timeline"):
        r = console(who).get(f"{WEB}/{path}")
        assert r.status_code == 200, (who, path)
        assert f'href="{WEB}/ledger">Ledger</a>' in text(r)


def test_another_projects_token_is_refused(console: Callable[[str], Browser]) -> None:
    for path in ("ledger", "timeline"):
        assert console("other_project").get(f"{WEB}/{path}").status_code == 403


def test_markup_in_a_model_or_branch_is_text(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    evil = '<img src=x onerror="alert(1)">'
    put_turn(client, tokens, "t", meta={"model": evil, "branch": f"<script>x</script>{evil}",
                                        "cost": 1.0, "started_at": "2025-12-31T00:00:00Z"})  # fmt: skip
    for path in ("ledger", "timeline"):
        page = text(console("reader").get(f"{WEB}/{path}"))
        assert "<img src=x" not in page and "<script>x" not in page
        assert "&lt;img src=x onerror=" in page


@pytest.mark.parametrize(
    "query",
    [
        "ledger?since=999999w",
        "ledger?until=0001-01-01",
        "ledger?since=9999-12-31T23:59:59Z",
        "ledger?since=2026-01-02&until=2025-01-01",
        "timeline?since=999999w",
        "timeline?until=0001-01-01",
    ],
)
def test_far_or_empty_ranges_are_pages_not_errors(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], query: str
) -> None:
    seed(client, tokens)
    r = console("reader").get(f"{WEB}/{query}")
    assert r.status_code == 200
    # A chart never spans more than a year of days (the clock is 2026-01-01), whatever the range.
    days = re.findall(r'class="tick" x="[\d.]+" y="\d+">(\d{4}-\d\d-\d\d)<', text(r))
    assert all("2025-01-01" <= d <= "2026-01-01" for d in days), days[:3]
    if query == "ledger?since=999999w":
        assert days and min(days) == "2025-01-01"  # the last MOST_DAYS days, today's included


def test_an_until_in_the_future_draws_up_to_today(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    seed(client, tokens)
    page = text(console("reader").get(f"{WEB}/ledger?since=2025-12-25&until=2030-01-01"))
    chart = re.search(r'<svg[^>]*aria-label="Cost per day.*?</svg>', page, re.S)
    assert chart is not None
    days = re.findall(r"<title>(\d{4}-\d\d-\d\d):", chart.group(0))
    assert days and max(days) <= "2026-01-01"
    # 2025-12-25 to 2026-01-01: eight slots, so each is an eighth of the width.
    widths = {float(w) for w in re.findall(r'<rect[^>]* width="([\d.]+)"', chart.group(0))}
    assert widths == {90 - 1}
