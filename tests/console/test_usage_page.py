"""Usage you can look at: a project's counters against its quotas, its requests and bytes per
hour drawn as SVG by the server (no script, no CDN), its largest tasks; the projects page
with tasks, bytes, last activity and a 14-day sparkline. On every backend."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.names import Scope
from tests.conftest import Tokens

from .conftest import API, Browser, put_turn, text

pytestmark = pytest.mark.all_backends

WEB = "/console/p/acme/web"


def svgs(page: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", page, re.S)


@pytest.fixture
def traffic(app: Flask, client: FlaskClient, tokens: Tokens) -> int:
    """Real requests through the API, their counts flushed to the backend; how many."""
    for i, size in enumerate((100, 4000, 300)):
        put_turn(client, tokens, f"task-{i}", summary="s" * size)
    for _ in range(6):
        assert client.get(f"{API}/tasks", headers=tokens.headers("reader")).status_code == 200
    app.extensions["traffic"].flush()
    rows = app.extensions["storage"].traffic("acme", "web")
    return sum(r.requests for r in rows)


def test_the_usage_page_draws_real_traffic_and_the_counters(
    app: Flask, traffic: int, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    r = console("reader").get(f"{WEB}/usage")
    assert r.status_code == 200
    page = text(r)
    usage = app.extensions["storage"].usage(Scope("acme", "web"))
    assert f'data-value="{usage.tasks}"' in page and f'data-value="{usage.bytes}"' in page
    charts = svgs(page)
    assert len(charts) >= 2  # requests per hour, bytes per hour
    requests_chart = next(c for c in charts if "requests" in c.lower())
    drawn = [int(n) for n in re.findall(r'data-requests="(\d+)"', requests_chart)]
    assert sum(drawn) == traffic > 0
    # Drawn by the server: no script in the charts, nothing they load from anywhere.
    drawn_svg = "".join(charts)
    assert "<script" not in drawn_svg and "href" not in drawn_svg
    assert "http" not in drawn_svg.replace("http://www.w3.org/2000/svg", "")
    assert re.findall(r"<script\b[^>]*>", page) == [
        '<script src="/console/static/console.js" defer>'
    ]
    # The largest tasks first.
    top = re.findall(r'<a href="/console/p/acme/web/tasks/(task-\d)">', page)
    assert top[:3] == ["task-1", "task-2", "task-0"]


def test_usage_shows_quotas_when_set(
    app: Flask, traffic: int, console: Callable[[str], Browser]
) -> None:
    from app.storage.core.limits import QuotaOverride

    app.extensions["storage"].limits().set_quota(
        "acme", "web", QuotaOverride(bytes=1 << 20, tasks=10)
    )
    page = text(console("reader").get(f"{WEB}/usage"))
    assert 'data-limit="1048576"' in page and 'data-limit="10"' in page


def test_the_projects_page_has_counts_activity_and_sparklines(
    app: Flask, client: FlaskClient, traffic: int, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    r = client.put(
        f"{API}/tasks/m/turns/0",
        json={"summary_md": "mobile"},
        headers=tokens.headers("tenant_admin", **{"X-Sandbox-Project-Id": "mobile"}),
    )
    assert r.status_code == 200
    app.extensions["traffic"].flush()
    page = text(console("tenant_admin").get("/console/projects"))
    rows = re.findall(r'<tr data-project="([^"]+)">(.*?)</tr>', page, re.S)
    assert [name for name, _ in rows] == ["acme/mobile", "acme/web"]
    by_name = dict(rows)
    assert 'data-tasks="3"' in by_name["acme/web"] and 'data-tasks="1"' in by_name["acme/mobile"]
    assert "<time" in by_name["acme/web"]  # last activity
    spark = svgs(by_name["acme/web"])
    assert len(spark) == 1
    days = re.findall(r'data-requests="(\d+)"', spark[0])
    assert len(days) == 14 and int(days[-1]) == traffic


def test_a_new_project_says_how_to_fill_it_instead_of_empty_charts(
    console: Callable[[str], Browser],
) -> None:
    page = text(console("reader").get(f"{WEB}/usage"))
    assert 'id="nothing-yet"' in page and "project-memory agent install" in page
    assert [c for c in svgs(page) if 'class="chart"' in c] == []


def test_the_panel_goes_once_something_is_recorded(
    traffic: int, console: Callable[[str], Browser]
) -> None:
    page = text(console("reader").get(f"{WEB}/usage"))
    assert 'id="nothing-yet"' not in page
    assert len([c for c in svgs(page) if 'class="chart"' in c]) == 2
