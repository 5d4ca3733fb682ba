"""The console's task list: substring filters, four sort orders, a count of what matches and
pages in both directions; the task page's owner, size and retention date. On every backend."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from flask.testing import FlaskClient

from tests.conftest import FixedClock, Tokens

from .conftest import API, Browser, link, put_turn, text

pytestmark = pytest.mark.all_backends

WEB = "/console/p/acme/web"
_ROW = re.compile(r'<a href="/console/p/acme/web/tasks/([^"/]+)">')


def listed(page: str) -> list[str]:
    return _ROW.findall(page)


def walk(browser: Browser, url: str) -> tuple[list[list[str]], list[str]]:
    """Every page from ``url`` following rel=next, and the pages (their html) on the way."""
    pages, htmls = [], []
    while url:
        html = text(browser.get(url))
        pages.append(listed(html))
        htmls.append(html)
        url = link(html, "next") or ""
    return pages, htmls


@pytest.fixture
def models(client: FlaskClient, tokens: Tokens, clock: FixedClock) -> None:
    for task, model, agent in (
        ("a-sonnet", "claude-sonnet-4-5", "ci-runner"),
        ("b-opus", "Claude-Opus-4", "CI-nightly"),
        ("c-gpt", "gpt-5", "laptop"),
        ("d-none", None, None),
    ):
        meta = {k: v for k, v in (("model", model), ("agent_id", agent)) if v}
        put_turn(client, tokens, task, meta=meta)
        clock.advance(seconds=1)


@pytest.mark.parametrize(
    "query, found",
    [
        ("model=claude", ["b-opus", "a-sonnet"]),
        ("model=SONNET", ["a-sonnet"]),
        ("model=-4", ["b-opus", "a-sonnet"]),
        ("model=gpt-5", ["c-gpt"]),
        ("model=%25", []),  # a LIKE wildcard is a character like any other
        ("model=_", []),
        ("agent=ci", ["b-opus", "a-sonnet"]),
        ("agent=NIGHT", ["b-opus"]),
        ("model=claude&agent=runner", ["a-sonnet"]),
    ],
)
def test_model_and_agent_match_substrings_without_case(
    models: None, console: Callable[[str], Browser], query: str, found: list[str]
) -> None:
    page = text(console("reader").get(f"{WEB}/tasks?{query}"))
    assert listed(page) == found
    assert f"{len(found)} of 4 live tasks match" in page if found else "No tasks match" in page


@pytest.fixture
def sized(client: FlaskClient, tokens: Tokens, clock: FixedClock) -> dict[str, int]:
    """Seven tasks of distinct sizes, turn counts and update times (none in id order)."""
    plan = {  # task: (turns, summary length)
        "t3": (1, 900),
        "t1": (4, 10),
        "t6": (2, 5000),
        "t2": (3, 300),
        "t7": (5, 50),
        "t5": (6, 2000),
        "t4": (7, 100),
    }
    for task, (turns, length) in plan.items():
        for n in range(turns):
            put_turn(client, tokens, task, n, summary="x" * (length if n == 0 else 1))
        clock.advance(seconds=1)
    return {task: turns for task, (turns, _) in plan.items()}


SORTS = {
    "": ["t4", "t5", "t7", "t2", "t6", "t1", "t3"],  # last update, newest first
    "sort=updated&dir=asc": ["t3", "t1", "t6", "t2", "t7", "t5", "t4"],
    "sort=task_id": ["t1", "t2", "t3", "t4", "t5", "t6", "t7"],
    "sort=task_id&dir=desc": ["t7", "t6", "t5", "t4", "t3", "t2", "t1"],
    "sort=size": ["t6", "t5", "t3", "t2", "t4", "t7", "t1"],  # largest first
    "sort=size&dir=asc": ["t1", "t7", "t4", "t2", "t3", "t5", "t6"],
    "sort=turns": ["t4", "t5", "t7", "t1", "t2", "t6", "t3"],  # most first
    "sort=turns&dir=asc": ["t3", "t6", "t2", "t1", "t7", "t5", "t4"],
}


@pytest.mark.parametrize("order", list(SORTS))
def test_every_sort_pages_forward_and_back(
    sized: dict[str, int], console: Callable[[str], Browser], order: str
) -> None:
    browser = console("reader")
    pages, htmls = walk(browser, f"{WEB}/tasks?{order}&per_page=3")
    assert pages == [SORTS[order][:3], SORTS[order][3:6], SORTS[order][6:]]
    assert all("7 live tasks" in html for html in htmls)
    assert link(htmls[0], "prev") is None and link(htmls[-1], "next") is None
    # Back from the last page, through rel=prev, to the first.
    back, url = [], link(htmls[-1], "prev")
    while url:
        html = text(browser.get(url))
        back.append(listed(html))
        url = link(html, "prev")
    assert back == [SORTS[order][3:6], SORTS[order][:3]]


def test_paging_back_holds_across_a_write_in_between(
    sized: dict[str, int], client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    browser = console("reader")
    first = text(browser.get(f"{WEB}/tasks?sort=task_id&per_page=3"))
    second = text(browser.get(link(first, "next") or ""))
    put_turn(client, tokens, "t0")  # sorts before every other task
    back = text(browser.get(link(second, "prev") or ""))
    assert listed(back) == ["t1", "t2", "t3"]  # the page before t4, as it is now
    assert link(back, "prev") is not None  # and t0 is there, before it


def test_filters_sorts_and_count_combine(
    sized: dict[str, int], console: Callable[[str], Browser]
) -> None:
    page = text(console("reader").get(f"{WEB}/tasks?q=t&sort=turns&dir=asc&failed=1"))
    assert listed(page) == [] and "No tasks match" in page
    page = text(console("reader").get(f"{WEB}/tasks?sort=size&per_page=2"))
    assert listed(page) == ["t6", "t5"] and "7 live tasks" in page


@pytest.mark.parametrize("junk", ["sort=bytes", "dir=up", "per_page=0", "per_page=100000"])
def test_unknown_sort_options_fall_back_to_the_default(
    sized: dict[str, int], console: Callable[[str], Browser], junk: str
) -> None:
    r = console("reader").get(f"{WEB}/tasks?{junk}")
    assert r.status_code == 200
    assert listed(text(r))[:1] == ["t4"]


def test_a_task_page_shows_owner_size_and_retention(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    put_turn(client, tokens, "big", summary="y" * 3000, meta={"model": "m"})
    r = client.put(
        f"{API}/tasks/big/turns/0/artifacts/a.bin",
        data=b"z" * 5000,
        headers=tokens.headers("writer"),
    )
    assert r.status_code == 200
    usage = client.get(f"{API}/usage", headers=tokens.headers("reader")).get_json()["usage"]
    page = text(console("reader").get(f"{WEB}/tasks/big"))
    facts = dict(re.findall(r"<dt>([^<]+)</dt><dd>(.*?)</dd>", page))
    assert tokens.ids["writer"] in facts["Owner"]
    assert "2026-01-31" in facts["Retained until"]  # 30 days after the fixed clock's start
    # The task's bytes are the project's (it is the only task): turn plus artifact.
    assert f'data-bytes="{usage["bytes"]}"' in facts["Size"]
    assert "1 artifact" in facts["Size"]
