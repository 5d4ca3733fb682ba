"""The ledger, the timeline and a turn's page in a real headless Chromium against a real
gunicorn: two weeks of turns by three models on three branches, some failed, written through
the API as hooks write them; what a person sees on a desktop and on a phone (the screenshots
of docs/console.md), and that a model, branch or agent holding markup shows as text and runs
nothing.

The server, the browser and its watch are test_console_browser.py's, this module with its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.conftest import Server, serving
from tests.e2e.test_console_browser import (
    API,
    PROBE,
    SCRIPTS,
    WEB,
    Site,
    Watch,
    _browser_or_fail,
    at,
    chromium,
    go,
    page,
    screenshot,
    sign_in,
)

pytestmark = pytest.mark.e2e
__all__ = ["chromium", "page"]  # fixtures, used by name

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1200, "height": 900}
MODELS = [("claude-sonnet-4-5", 0.04), ("claude-opus-4", 0.3), ("gpt-5", 0.08)]
BRANCHES = ["main", "feature/ledger", "fix/login"]
EVIL_MODEL, EVIL_BRANCH, EVIL_AGENT = SCRIPTS[1], SCRIPTS[0], SCRIPTS[3]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    _browser_or_fail()
    yield from serving(tmp_path_factory, "ledger", workers=2, threads=4)


@pytest.fixture(scope="module")
def site(server: Server) -> Site:
    site = Site(server)
    site.token("Ada (project admin)", "project_admin")
    site.token("ci-writer", "writer")
    now = datetime.now(UTC).replace(microsecond=0)
    with site.api("ci-writer") as s:
        base = f"{site.url}{API}"
        for day in range(14):
            for i, (model, price) in enumerate(MODELS):
                if (day + i) % 3 == 2:
                    continue
                start = now - timedelta(days=day, hours=i + 1)
                task = f"task-{day:02d}-{i}"
                for turn in range(1 + (day * 7 + i) % 3):
                    meta = {
                        "model": model,
                        "agent_id": "claude-code" if i != 2 else "codex",
                        "branch": BRANCHES[(day + i) % 3],
                        "session_id": f"sess-{day:02d}-{i}",
                        "commit": f"{day:02d}{i}{turn}" + "c0ffee" * 6,
                        "started_at": (start + timedelta(minutes=turn)).isoformat(),
                        "ended_at": (start + timedelta(minutes=turn, seconds=40)).isoformat(),
                        "tokens": {"input": 20_000 + 900 * day, "output": 1500 + 100 * i},
                        "cost": round(price * (1 + day % 4) * (turn + 1), 4),
                        "exit_code": 1 if (day + turn) % 5 == 4 else 0,
                    }
                    r = s.put(
                        f"{base}/tasks/{task}/turns/{turn}",
                        json={"meta": meta, "summary_md": f"Worked on {task}, turn {turn}."},
                    )
                    assert r.status_code == 200, r.text
        # A turn whose model, branch and agent hold markup, with a text artifact that does too.
        hostile = {
            "model": EVIL_MODEL,
            "branch": EVIL_BRANCH,
            "agent_id": EVIL_AGENT,
            "session_id": SCRIPTS[2],
            "commit": "deadbeef" * 5,
            "started_at": now.isoformat(),
            "tokens": {"input": 1000, "output": 10},
            "cost": 0.5,
            "exit_code": 3,
        }
        r = s.put(
            f"{base}/tasks/xss/turns/0",
            json={"meta": hostile, "summary_md": "Markup in every field."},
        )
        assert r.status_code == 200, r.text
        r = s.put(
            f"{base}/tasks/task-00-0/turns/0/artifacts/test-output.txt",
            data=("All 212 tests passed.\n" + SCRIPTS[0] + "\n").encode(),
            headers={"Content-Type": "text/plain"},
        )
        assert r.status_code == 200, r.text
        store = s.post(f"{site.url}/v1/memory_stores", json={"name": "Team notes"}).json()
        r = s.post(
            f"{site.url}/v1/memory_stores/{store['id']}/memories",
            json={"path": "/style/format.md", "content": "Use black."},
        )
        assert r.status_code == 200, r.text
        site.ids["store"] = store["id"]
    return site


def header_height(tab: Any) -> float:
    box = tab.locator("header.top").bounding_box()
    assert box is not None
    return float(box["height"])


def test_the_ledger_and_timeline_on_a_desktop_and_a_phone(
    page: tuple[Any, Watch], site: Site, tmp_path: Path
) -> None:
    tab, watch = page
    sign_in(tab, site, "Ada (project admin)")
    tab.goto(f"{site.url}{WEB}/tasks")
    go(tab, "header nav a:has-text('Ledger')")
    at(tab, "Ledger · web")
    with site.api("ci-writer") as s:
        totals = s.get(f"{site.url}{API}/ledger", params={"since": "30d"}).json()["totals"]
    assert tab.locator("[data-total=turns]").inner_text() == f"{totals['turns']:,}"
    assert tab.locator("[data-total=nonzero_exits]").inner_text() == str(totals["nonzero_exits"])
    bars = tab.locator("svg.chart rect[data-cost-musd]")
    assert bars.count() >= 14
    drawn = sum(int(v) for v in bars.evaluate_all("rs => rs.map(r => r.dataset.costMusd)"))
    assert abs(drawn - totals["cost_usd"] * 1_000_000) < 100  # one rounding per bar
    screenshot(tab, "console-ledger.png", tmp_path)

    # A branch's link narrows the view; the address holds the filter, to share.
    go(tab, "table[data-of=branch] a:has-text('feature/ledger')")
    assert "branch=feature%2Fledger" in tab.url or "branch=feature/ledger" in tab.url
    assert tab.locator("input[name=branch]").input_value() == "feature/ledger"
    narrowed = int(tab.locator("[data-total=turns]").inner_text().replace(",", ""))
    assert 0 < narrowed < totals["turns"]

    # The same turns one by one, newest first; the next page by the API's cursor.
    go(tab, "a:has-text('These turns one by one')")
    at(tab, "Timeline · web")
    rows = tab.locator("table.timeline tbody tr")
    assert rows.count() == min(50, narrowed)
    times = rows.locator("time").evaluate_all("ts => ts.map(t => t.dateTime)")
    assert times == sorted(times, reverse=True)
    screenshot(tab, "console-timeline.png", tmp_path)
    go(tab, "table.timeline tbody tr:first-child td:nth-child(2) a")
    at(tab, tab.title().removesuffix(" · Project Memory"))
    assert "/turns/" in tab.url

    # A phone: the header takes at most 15% of the screen; nothing wider than it.
    tab.set_viewport_size(PHONE)
    for path, shot in (
        ("ledger", "console-ledger-phone.png"),
        ("timeline", "console-timeline-phone.png"),
    ):
        tab.goto(f"{site.url}{WEB}/{path}")
        assert header_height(tab) <= PHONE["height"] * 0.15, (path, header_height(tab))
        assert tab.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], path
        screenshot(tab, shot, tmp_path)
    tab.set_viewport_size(DESKTOP)
    watch.assert_clean()


def test_a_bad_filter_is_a_page_that_says_which(page: tuple[Any, Watch], site: Site) -> None:
    tab, watch = page
    sign_in(tab, site, "Ada (project admin)")
    response = tab.goto(f"{site.url}{WEB}/ledger?since=last-tuesday")
    assert response is not None and response.status == 400
    assert "since:" in tab.locator("main").inner_text()
    response = tab.goto(f"{site.url}{WEB}/timeline?cursor=forged")
    assert response is not None and response.status == 400
    # The browser logs each 400 it loaded, and nothing else.
    assert len(watch.messages) == 2 and all("status of 400" in m for m in watch.messages)
    watch.messages.clear()
    watch.assert_clean()


def test_markup_in_a_model_branch_or_agent_is_text_and_runs_nothing(
    page: tuple[Any, Watch], site: Site
) -> None:
    tab, watch = page
    dialogs: list[str] = []
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    sign_in(tab, site, "Ada (project admin)")
    q = requests.utils.quote
    for url in (
        f"{WEB}/ledger",
        f"{WEB}/ledger?model={q(EVIL_MODEL)}",
        f"{WEB}/ledger?branch={q(EVIL_BRANCH)}&agent={q(EVIL_AGENT)}",
        f"{WEB}/timeline",
        f"{WEB}/timeline?model={q(EVIL_MODEL)}",
        f"{WEB}/tasks/xss/turns/0",
        f"{WEB}/compare?a=xss&a_turn=0&b=task-00-0&b_turn=0",
    ):
        response = tab.goto(site.url + url)
        assert response is not None and response.status == 200, url
        tab.wait_for_load_state("load")
        for link in tab.locator("main a").all()[:10]:
            link.hover()
        assert tab.evaluate(PROBE) is None, url
        assert tab.locator("main script, main img, main iframe").count() == 0, url
        assert set(tab.locator("main svg *").evaluate_all("els => els.map(e => e.localName)")) <= {
            "title",
            "rect",
            "line",
            "text",
            "path",
            "use",
            "polyline",
        }, url
    # Shown as the text it is, where it belongs.
    tab.goto(f"{site.url}{WEB}/timeline?model={q(EVIL_MODEL)}")
    row = tab.locator("table.timeline tbody tr")
    assert row.count() == 1
    assert EVIL_MODEL in row.inner_text() and EVIL_BRANCH in row.inner_text()
    tab.goto(f"{site.url}{WEB}/ledger?model={q(EVIL_MODEL)}")
    assert tab.locator("input[name=model]").input_value() == EVIL_MODEL
    assert EVIL_BRANCH in tab.locator("table[data-of=branch]").inner_text()
    assert EVIL_MODEL in tab.locator("p.legend").inner_text()
    assert dialogs == []
    watch.assert_clean()


def test_folders_and_files_are_drawn_with_our_svg_icons(
    page: tuple[Any, Watch], site: Site
) -> None:
    tab, watch = page
    sign_in(tab, site, "Ada (project admin)")
    loaded: list[tuple[str, int]] = []
    tab.on("response", lambda r: loaded.append((r.url, r.status)))
    tab.goto(f"{site.url}{WEB}/stores/{site.ids['store']}")
    before = "(el) => { const s = getComputedStyle(el, '::before');"
    before += " return [s.content, s.backgroundImage, s.width]; }"
    folder = tab.locator("li.folder a").first.evaluate(before)
    assert folder[0] == '""' and "icon-folder.svg" in folder[1] and folder[2] == "16px"
    go(tab, "li.folder a")
    file = tab.locator("li.file a").first.evaluate(before)
    assert file[0] == '""' and "icon-file.svg" in file[1]
    icons = {u.rsplit("/", 1)[-1]: status for u, status in loaded if "/icon-" in u}
    assert icons == {"icon-folder.svg": 200, "icon-file.svg": 200}
    watch.assert_clean()


def test_a_turn_and_a_comparison_on_a_desktop_and_a_phone(
    page: tuple[Any, Watch], site: Site, tmp_path: Path
) -> None:
    tab, watch = page
    sign_in(tab, site, "Ada (project admin)")
    tab.goto(f"{site.url}{WEB}/tasks/task-00-0/turns/0")
    commit = tab.locator("p.turn-head code.commit")
    full = commit.get_attribute("title")
    assert full == "0000" + "c0ffee" * 6  # task-00-0, turn 0
    assert commit.inner_text() == full  # all of it is there to select and copy
    box = commit.bounding_box()
    assert box is not None and box["width"] < 100  # shown short
    card = tab.locator("li[data-artifact='test-output.txt']")
    assert "text/plain" in card.inner_text() and "All 212 tests passed." in card.inner_text()
    assert SCRIPTS[0] in card.locator("pre").inner_text()  # escaped, shown as text
    assert tab.evaluate(PROBE) is None
    screenshot(tab, "console-turn.png", tmp_path)
    tab.set_viewport_size(PHONE)
    assert header_height(tab) <= PHONE["height"] * 0.15
    assert tab.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    screenshot(tab, "console-turn-phone.png", tmp_path)
    tab.set_viewport_size(DESKTOP)

    # Compare it with the task's next turn, from the next turn's page.
    tab.goto(f"{site.url}{WEB}/tasks/task-07-0/turns/1")
    go(tab, "a:has-text('Compare with turn 0')")
    at(tab, "Compare · web")
    assert tab.locator("table.compare tbody tr").count() >= 10
    assert tab.locator("pre.diff .add").inner_text().startswith("+Worked on task-07-0, turn 1")
    screenshot(tab, "console-compare.png", tmp_path)
    tab.set_viewport_size(PHONE)
    assert header_height(tab) <= PHONE["height"] * 0.15
    assert tab.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    screenshot(tab, "console-compare-phone.png", tmp_path)
    tab.set_viewport_size(DESKTOP)
    # Two tasks, one of them with markup in every field.
    tab.goto(f"{site.url}{WEB}/compare?a=xss&b=task-00-0")
    assert EVIL_MODEL in tab.locator("table.compare").inner_text()
    assert tab.evaluate(PROBE) is None
    watch.assert_clean()
