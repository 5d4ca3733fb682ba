"""The console as a workplace, in a real headless Chromium against a real gunicorn: editing
a memory with a conflict in between, tokens made and revoked, a quota set and met, a turn and
an artifact deleted, usage drawn from real traffic; and the screenshots of docs/console.md.

The server, the browser and its watch (no request leaves our origin, nothing is logged to the
browser's console) are those of test_console_browser.py, each module with its own.
MEMORY_CONSOLE_SCREENSHOTS=docs/screenshots writes the screenshots where docs/console.md
shows them.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.conftest import Server, serving
from tests.e2e.test_console_browser import (
    API,
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

STORES = "/v1/memory_stores"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    _browser_or_fail()
    yield from serving(tmp_path_factory, "workplace", workers=2, threads=4)


@pytest.fixture(scope="module")
def site(server: Server) -> Site:
    site = Site(server)
    site.token("Ada (project admin)", "project_admin")
    site.token("ci-writer", "writer")
    site.token("Tess (tenant admin)", "tenant_admin", project=None)
    with site.api("ci-writer") as s:
        base = f"{site.url}{API}"
        for i, (model, turns) in enumerate(
            [("claude-sonnet-4-5", 3), ("claude-opus-4", 1), ("gpt-5", 2), ("claude-haiku", 5)]
        ):
            for turn in range(turns):
                r = s.put(
                    f"{base}/tasks/task-{i}/turns/{turn}",
                    json={
                        "meta": {"model": model, "agent_id": "ci"},
                        "summary_md": "x" * 200 * (i + 1),
                    },
                )
                assert r.status_code == 200
        store = s.post(f"{site.url}{STORES}", json={"name": "Team prefs"}).json()
        mem = s.post(
            f"{site.url}{STORES}/{store['id']}/memories",
            json={"path": "/style/format.md", "content": "Use black.\n"},
        ).json()
        site.ids["store"], site.ids["memory"] = store["id"], mem["id"]
    return site


def memory(site: Site) -> dict[str, Any]:
    with site.api("ci-writer") as s:
        r = s.get(f"{site.url}{STORES}/{site.ids['store']}/memories/{site.ids['memory']}")
        assert r.status_code == 200
        return r.json()  # type: ignore[no-any-return]


def test_tasks_sort_and_match_substrings(
    page: tuple[Any, Watch], site: Site, tmp_path: Path
) -> None:
    tab, watch = page
    sign_in(tab, site, "Ada (project admin)")
    at(tab, "Tasks · web")
    tab.fill("input[name=model]", "CLAUDE")
    tab.select_option("select[name=sort]", "size")
    go(tab, "button:has-text('Filter')")
    shown = tab.locator("table.tasks tbody tr td:first-child > a").all_inner_texts()
    # Largest first (every turn of task-i holds 200 * (i + 1) characters); gpt-5 left out.
    assert shown == ["task-3", "task-0", "task-1"]
    assert "3 of 4 live tasks match" in tab.locator("p.count").inner_text()
    screenshot(tab, "console-tasks-sorted.png", tmp_path)
    watch.assert_clean()


def test_edit_a_memory_with_a_conflict_in_between(
    page: tuple[Any, Watch], site: Site, tmp_path: Path
) -> None:
    tab, watch = page
    sign_in(tab, site, "Ada (project admin)")
    tab.goto(f"{site.url}{WEB}/stores/{site.ids['store']}/memories/{site.ids['memory']}")
    go(tab, "a:has-text('Edit')")
    editor = tab.locator("textarea[name=content]")
    assert editor.input_value() == "Use black.\n"
    editor.fill("Use ruff format.\nLine length 100.\n")
    # Someone saves first, while the form is open.
    with site.api("ci-writer") as s:
        r = s.post(
            f"{site.url}{STORES}/{site.ids['store']}/memories/{site.ids['memory']}",
            json={"content": "Use black, line length 88.\n"},
        )
        assert r.status_code == 200
    go(tab, "button:has-text('Save')")
    assert "changed by someone else" in tab.locator("p.error").inner_text()
    assert tab.locator("pre.theirs").inner_text() == "Use black, line length 88.\n"
    assert tab.locator("textarea[name=content]").input_value() == (
        "Use ruff format.\nLine length 100.\n"
    )
    assert memory(site)["content"] == "Use black, line length 88.\n"  # theirs, untouched
    screenshot(tab, "console-memory-conflict.png", tmp_path)
    # The conflict page answers 409, which the browser logs as a failed load: expected here.
    watch.messages = [m for m in watch.messages if "status of 409" not in m]
    go(tab, "button:has-text('Save anyway')")
    at(tab, "/style/format.md · Team prefs")
    assert memory(site)["content"] == "Use ruff format.\nLine length 100.\n"
    with site.api("ci-writer") as s:
        versions = s.get(
            f"{site.url}{STORES}/{site.ids['store']}/memory_versions",
            params={"memory_id": site.ids["memory"], "view": "full"},
        ).json()["data"]
    contents = [v.get("content") for v in versions]
    assert "Use black, line length 88.\n" in contents and "Use black.\n" in contents
    watch.assert_clean()


def test_create_and_revoke_a_token(page: tuple[Any, Watch], site: Site, tmp_path: Path) -> None:
    tab, watch = page
    sign_in(tab, site, "Ada (project admin)")
    go(tab, "header nav a:has-text('Tokens')")
    at(tab, "Tokens · acme / web")
    screenshot(tab, "console-tokens.png", tmp_path)
    go(tab, "a:has-text('New token')")
    tab.select_option("select[name=role]", "reader")
    tab.fill("input[name=name]", "dashboard")
    tab.fill("input[name=expires_in_days]", "7")
    with tab.expect_navigation():
        tab.click("button:has-text('Create token')")
    at(tab, "Token created")
    secret = tab.locator("label.secret input").input_value()
    assert secret.startswith("pm_")
    screenshot(tab, "console-token-made.png", tmp_path)
    bearer = {"Authorization": f"Bearer {secret}"}
    assert requests.get(f"{site.url}{API}/tasks", headers=bearer, timeout=10).status_code == 200
    # Back, the secret is not shown again; revoke it.
    go(tab, "a:has-text('Back to the tokens')")
    assert secret not in tab.content()
    go(tab, "tr:has-text('dashboard') a:has-text('Revoke')")
    go(tab, "button:has-text('Revoke token')")
    assert tab.locator("tr:has-text('dashboard')").inner_text().find("revoked") >= 0
    assert requests.get(f"{site.url}{API}/tasks", headers=bearer, timeout=10).status_code == 401
    watch.assert_clean()


def test_set_a_quota_and_see_a_write_refused(
    page: tuple[Any, Watch], site: Site, tmp_path: Path
) -> None:
    tab, watch = page
    sign_in(tab, site, "Tess (tenant admin)")
    tab.goto(f"{site.url}{WEB}/limits")
    tab.fill("form:has(button:has-text('Set quota')) input[name=bytes]", "1KiB")
    go(tab, "button:has-text('Set quota')")
    assert "1 KiB" in tab.locator("dd.quota").first.inner_text().replace("1.0 KiB", "1 KiB")
    screenshot(tab, "console-limits.png", tmp_path)
    body = {"summary_md": "y" * 4000}
    deadline = time.monotonic() + 5  # every worker applies it within a second
    status = 0
    with site.api("ci-writer") as s:
        while time.monotonic() < deadline:
            status = s.put(f"{site.url}{API}/tasks/too-big/turns/0", json=body).status_code
            if status == 507:
                break
            time.sleep(0.2)
    assert status == 507
    go(tab, "button:has-text('Clear the quota')")
    assert "no quota" in tab.locator("dd.quota").first.inner_text()
    watch.assert_clean()


def test_usage_charts_draw_real_traffic(
    page: tuple[Any, Watch], site: Site, tmp_path: Path
) -> None:
    tab, watch = page
    with site.api("ci-writer") as s:
        for _ in range(25):
            assert s.get(f"{site.url}{API}/tasks").status_code == 200
    sign_in(tab, site, "Ada (project admin)")
    # Each worker writes its counts every 10 s: wait for them to reach the chart.
    deadline = time.monotonic() + 25
    drawn = 0
    while time.monotonic() < deadline:
        tab.goto(f"{site.url}{WEB}/usage")
        bars = tab.locator("svg.chart rect[data-requests]")
        drawn = sum(int(b) for b in bars.evaluate_all("rs => rs.map(r => r.dataset.requests)"))
        if drawn >= 25:
            break
        time.sleep(1)
    assert drawn >= 25
    box = tab.locator("svg.chart").first.bounding_box()
    assert box and box["width"] > 300 and box["height"] > 100  # drawn, not collapsed
    assert tab.locator("table a:has-text('task-3')").count() == 1  # the largest task
    screenshot(tab, "console-usage.png", tmp_path)
    tab.context.clear_cookies()
    sign_in(tab, site, "Tess (tenant admin)")
    tab.goto(f"{site.url}/console/projects")
    spark = tab.locator("tr[data-project='acme/web'] svg.spark rect")
    assert spark.count() == 14
    screenshot(tab, "console-projects.png", tmp_path)
    watch.assert_clean()


def test_the_audit_view_shows_who_did_what(
    page: tuple[Any, Watch], site: Site, tmp_path: Path
) -> None:
    tab, watch = page
    sign_in(tab, site, "Ada (project admin)")
    go(tab, "header nav a:has-text('Audit')")
    at(tab, "Audit · web")
    kinds = tab.locator("table.audit tbody tr").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert "session" in kinds and "task" in kinds
    screenshot(tab, "console-audit.png", tmp_path)
    tab.select_option("select[name=kind]", "task")
    go(tab, "button:has-text('Filter')")
    kinds = tab.locator("table.audit tbody tr").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert kinds and set(kinds) == {"task"}
    watch.assert_clean()


def test_delete_one_artifact_and_one_turn_then_grep_the_root(
    page: tuple[Any, Watch], site: Site, tmp_path: Path
) -> None:
    tab, watch = page
    leaked_turn, leaked_file = "SECRET-TURN-2f9c1", "SECRET-FILE-77ab0"
    with site.api("ci-writer") as s:
        base = f"{site.url}{API}/tasks/leaky"
        assert s.put(f"{base}/turns/0", json={"summary_md": "keep this turn"}).status_code == 200
        r = s.put(f"{base}/turns/1", json={"summary_md": f"pasted {leaked_turn} by mistake"})
        assert r.status_code == 200
        r = s.put(
            f"{base}/turns/0/artifacts/env.txt",
            data=f"TOKEN={leaked_file}\n".encode(),
            headers={"Content-Type": "text/plain"},
        )
        assert r.status_code == 200
        # Found by search before: the index holds it.
        hits = s.get(f"{site.url}{API}/search", params={"q": leaked_turn}).json()
        assert hits.get("data") or hits.get("hits")
    sign_in(tab, site, "Ada (project admin)")
    tab.goto(f"{site.url}{WEB}/tasks/leaky/turns/0/artifacts/env.txt")
    go(tab, "a:has-text('Delete this artifact')")
    screenshot(tab, "console-delete-artifact.png", tmp_path)
    go(tab, "button:has-text('Delete artifact')")
    tab.goto(f"{site.url}{WEB}/tasks/leaky/turns/1")
    go(tab, "a:has-text('Delete this turn')")
    go(tab, "button:has-text('Delete turn')")
    at(tab, "leaky · Tasks")
    with site.api("ci-writer") as s:
        assert s.get(f"{site.url}{API}/tasks/leaky/turns/1").status_code == 404
        assert s.get(f"{site.url}{API}/tasks/leaky/turns/0").status_code == 200
    found = subprocess.run(
        ["grep", "-rl", "-e", leaked_turn, "-e", leaked_file, str(site.server.root)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.stdout == "", f"removed text still on disk in: {found.stdout}"
    assert not re.search(leaked_turn, tab.content())
    watch.assert_clean()
