"""Two turns or two tasks side by side: what each recorded, summed for a task as the ledger
sums it, and a diff of the summaries with what the agents wrote escaped; a bad side is a 400
page, a missing one a 404; any role of the project reads it. On every backend."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from flask.testing import FlaskClient

from app.console import compare as compare_page
from tests.conftest import Tokens

from .conftest import Browser, put_turn, text

pytestmark = pytest.mark.all_backends

COMPARE = "/console/p/acme/web/compare"


def cells(page: str, row: str) -> list[str]:
    found = re.search(rf'<th scope="row">{row}</th>(.*?)</tr>', page, re.S)
    assert found is not None, row
    return [
        re.sub(r"<[^>]+>", "", c).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", found.group(1), re.S)
    ]


def seed(client: FlaskClient, tokens: Tokens) -> None:
    put_turn(client, tokens, "a", 0, meta={"model": "opus", "tokens": {"input": 100, "output": 10},
             "cost": 0.5, "exit_code": 0}, summary="one\ntwo\nthree")  # fmt: skip
    put_turn(client, tokens, "a", 1, meta={"model": "opus", "branch": "main", "commit": "abcdef0123456789",
             "tokens": {"input": 200, "output": 20}, "cost": 0.25, "exit_code": 1},
             summary="one\n<script>alert(1)</script>\nthree")  # fmt: skip
    put_turn(client, tokens, "b", 0, meta={"model": "gpt-5", "tokens": {"input": 7}},
             summary="other")  # fmt: skip


def test_two_turns_side_by_side_with_a_diff_of_their_summaries(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    seed(client, tokens)
    r = console("reader").get(f"{COMPARE}?a=a&a_turn=0&b=a&b_turn=1")
    assert r.status_code == 200
    page = text(r)
    assert cells(page, "Tokens in") == ["100", "200"]
    assert cells(page, "Cost \\(reported\\)") == ["$0.5000", "$0.2500"]
    assert cells(page, "Exit code") == ["0", "1"]
    assert 'title="abcdef0123456789">abcdef0123456789</code>' in page
    diff = re.search(r'<pre class="diff">(.*?)</pre>', page, re.S)
    assert diff is not None
    assert '<span class="del">-two</span>' in diff.group(1)
    assert '<span class="add">+&lt;script&gt;alert(1)&lt;/script&gt;</span>' in diff.group(1)
    assert "<script>alert" not in page
    # The turn page links to this comparison.
    turn = text(console("reader").get("/console/p/acme/web/tasks/a/turns/1"))
    assert 'href="/console/p/acme/web/compare?a=a&amp;a_turn=0&amp;b=a&amp;b_turn=1"' in turn


def test_two_tasks_sum_their_turns_and_diff_their_latest_summaries(
    client: FlaskClient,
    tokens: Tokens,
    console: Callable[[str], Browser],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed(client, tokens)
    page = text(console("reader").get(f"{COMPARE}?a=a&b=b"))
    assert cells(page, "Turns") == ["2", "1"]
    assert cells(page, "Tokens in") == ["300", "7"]
    assert cells(page, "Cost \\(reported\\)") == ["$0.7500", "—"]
    assert cells(page, "Model") == ["opus", "gpt-5"]
    assert "+other" in page and "-&lt;script&gt;" in page
    # A long task is summed over its latest turns, and says so.
    monkeypatch.setattr(compare_page, "TASK_TURNS", 1)
    page = text(console("reader").get(f"{COMPARE}?a=a&b=b"))
    assert cells(page, "Turns")[0] == "1 of 2" and cells(page, "Tokens in")[0] == "200"


@pytest.mark.parametrize(
    ("query", "status"),
    [("a=../x&b=b", 400), ("a=a&a_turn=x&b=b", 400), ("a=a&a_turn=9&b=b", 404), ("a=zz&b=b", 404)],
)
def test_a_bad_or_missing_side(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], query: str, status: int
) -> None:
    seed(client, tokens)
    assert console("reader").get(f"{COMPARE}?{query}").status_code == status


def test_with_no_sides_it_is_the_form_and_another_project_is_refused(
    console: Callable[[str], Browser],
) -> None:
    page = text(console("reader").get(COMPARE))
    assert 'name="a"' in page and '<table class="compare">' not in page
    assert console("other_project").get(f"{COMPARE}?a=a&b=b").status_code == 403
