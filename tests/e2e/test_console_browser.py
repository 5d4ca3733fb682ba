"""The web console in a real headless Chromium against a real gunicorn.

One server and one browser for the module. Data goes in through the APIs, as agents write
it; the browser only clicks, types and reads. Every page the tests open is watched: each
request it makes must go to our origin, and nothing may be logged to its console (a CSP
violation, a script error, a failed load).

Chromium is Debian's (`apt-get install chromium`; .ci/run installs it), driven by the
playwright package. Without it the module fails, unless MEMORY_ALLOW_NO_BROWSER=1 asks for a
skip (for a machine that cannot have a browser; CI never sets it).

MEMORY_CONSOLE_SCREENSHOTS=DIR writes the README's screenshots into DIR (docs/screenshots).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from app.storage.tree.tokens import TokenRegistry
from tests.e2e.conftest import Server, flask_cli, serving

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
API = "/sandbox/memory/v1"
WEB = "/console/p/acme/web"


def _browser_or_fail() -> Any:
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "the playwright package is not installed (pip install -e '.[dev]')"
    if reason is None and not os.access(CHROMIUM, os.X_OK):
        reason = f"{CHROMIUM} is missing (apt-get install -y chromium)"
    if reason is not None:
        if os.environ.get("MEMORY_ALLOW_NO_BROWSER") == "1":
            pytest.skip(reason)
        pytest.fail(f"no browser for the console tests: {reason}", pytrace=False)
    return sync_playwright


# -- the server, its data and its tokens ----------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    _browser_or_fail()  # before starting anything
    yield from serving(
        tmp_path_factory,
        "console",
        workers=2,
        threads=4,
        env_extra={"MEMORY_EMBEDDER": "bundled"},  # the default: search by meaning too
    )


@dataclass
class Site:
    server: Server
    secrets: dict[str, str] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    def token(self, name: str, role: str, project: str | None = "web") -> str:
        # The registry file the server reads (it picks up changes at the next request).
        registry = TokenRegistry(Path(self.server.env["MEMORY_TOKENS_FILE"]))
        token, secret = registry.create(role=role, tenant="acme", project=project, name=name)
        self.secrets[name], self.ids[name] = secret, token.id
        return secret

    def api(self, who: str) -> requests.Session:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.secrets[who]}"
        return session


def png(width: int = 3, height: int = 2) -> bytes:
    """A valid PNG (red pixels), so the preview really decodes an image."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.fixture(scope="module")
def site(server: Server) -> Site:
    site = Site(server)
    site.token("Ada (project admin)", "project_admin")
    site.token("ci-writer", "writer")
    with site.api("ci-writer") as s:
        base = f"{site.url}{API}"
        for i in range(120):
            meta = {
                "model": "opus" if i % 3 == 0 else "haiku",
                "agent_id": "ci",
                "exit_code": i % 4,
            }
            r = s.put(
                f"{base}/tasks/bulk-{i:03d}/turns/0", json={"meta": meta, "summary_md": f"Bulk {i}"}
            )
            assert r.status_code == 200
        for turn, summary in enumerate(
            [
                "## Reproduced\n\nThe login fails after **30 minutes**.",
                "## Fixed\n\n- session TTL raised\n- test added\n\n```\npytest -q\n```",
            ]
        ):
            meta = {
                "model": "claude-opus",
                "agent_id": "fixer",
                "commit": f"c0ffee{turn}",
                "exit_code": 0,
                "started_at": "2026-11-29T10:00:00Z",
                "ended_at": "2026-11-29T10:04:30Z",
                "tokens": {"input": 1200, "output": 340},
                "cost": 0.042,
                "ticket": "WEB-17",
            }
            r = s.put(
                f"{base}/tasks/fix-login/turns/{turn}", json={"meta": meta, "summary_md": summary}
            )
            assert r.status_code == 200
        for name, data, kind in [
            ("test.log", b"214 passed in 3.02s\n" * 20, "text/plain"),
            ("screen.png", png(), "image/png"),
        ]:
            r = s.put(
                f"{base}/tasks/fix-login/turns/1/artifacts/{name}",
                data=data,
                headers={"Content-Type": kind},
            )
            assert r.status_code == 200
        store = s.post(
            f"{site.url}/v1/memory_stores",
            json={"name": "Team prefs", "description": "How this team likes its code"},
        ).json()
        mem = s.post(
            f"{site.url}/v1/memory_stores/{store['id']}/memories",
            json={"path": "/style/format.md", "content": "Use black.\nLine length 88.\n"},
        ).json()
        site.ids["v1"] = mem["memory_version_id"]
        site.ids["v2"] = s.post(
            f"{site.url}/v1/memory_stores/{store['id']}/memories/{mem['id']}",
            json={"content": "Use ruff format.\nLine length 100.\n"},
        ).json()["memory_version_id"]
        s.post(
            f"{site.url}/v1/memory_stores/{store['id']}/memories",
            json={"path": "/README.md", "content": "Read me."},
        )
        r = s.post(
            f"{site.url}/v1/memory_stores/{store['id']}/memories",
            json={"path": "/login-notes.md", "content": "Login sessions last 30 minutes."},
        )
        assert r.status_code == 200
        site.ids["store"], site.ids["memory"] = store["id"], mem["id"]
    # Another project of the same tenant writes about the login too: never found from web.
    site.token("mobile-writer", "writer", project="mobile")
    with site.api("mobile-writer") as s:
        r = s.put(
            f"{site.url}{API}/tasks/mobile-login/turns/0",
            json={"summary_md": "The login of the mobile app."},
        )
        assert r.status_code == 200
        store = s.post(f"{site.url}/v1/memory_stores", json={"name": "Mobile notes"}).json()
        r = s.post(
            f"{site.url}/v1/memory_stores/{store['id']}/memories",
            json={"path": "/mobile-login.md", "content": "Login on phones."},
        )
        assert r.status_code == 200
    return site


# -- the browser ------------------------------------------------------------------------------
@dataclass
class Watch:
    """What the pages of one browser context did: every request, every console message."""

    origin: str
    requests: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        foreign = [u for u in self.requests if not u.startswith(self.origin + "/")]
        assert not foreign, f"requests left our origin: {foreign}"
        assert not self.messages, f"the browser console logged: {self.messages}"


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    sync_playwright = _browser_or_fail()
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            timezone_id="America/New_York",
            locale="en-US",
            viewport={"width": 1200, "height": 900},
            accept_downloads=True,
        )
        context.set_default_timeout(15_000)
        try:
            yield context
        finally:
            context.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(chromium: Any, site: Site) -> Iterator[tuple[Any, Watch]]:
    """A fresh tab with no session, watched."""
    chromium.clear_cookies()
    watch = Watch(site.url)
    tab = chromium.new_page()
    tab.on("request", lambda request: watch.requests.append(request.url))
    tab.on("console", lambda message: watch.messages.append(f"{message.type}: {message.text}"))
    tab.on("pageerror", lambda error: watch.messages.append(f"pageerror: {error}"))
    try:
        yield tab, watch
    finally:
        tab.close()


def at(tab: Any, title: str) -> None:
    """Wait for the page titled ``title`` (a click's navigation may still be loading)."""
    from playwright.sync_api import expect

    expect(tab).to_have_title(f"{title} · Project Memory")


def go(tab: Any, selector: str) -> None:
    """Click what ``selector`` finds and wait for the page it leads to."""
    with tab.expect_navigation():
        tab.click(selector)
    tab.wait_for_load_state()


def sign_in(tab: Any, site: Site, who: str) -> None:
    tab.goto(f"{site.url}/console/")
    at(tab, "Sign in")
    # Keyboard only: the token field has the focus, Enter submits.
    tab.keyboard.type(site.secrets[who])
    with tab.expect_navigation():
        tab.keyboard.press("Enter")
    tab.wait_for_load_state()


def screenshot(tab: Any, name: str, tmp: Path) -> None:
    target = os.environ.get("MEMORY_CONSOLE_SCREENSHOTS")
    directory = Path(target) if target else tmp
    directory.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(directory / name), full_page=False)
    assert (directory / name).stat().st_size > 1000


# -- the flow ---------------------------------------------------------------------------------
def test_browse_page_diff_delete_redact_and_sign_out(
    page: tuple[Any, Watch], site: Site, tmp_path: Path
) -> None:
    tab, watch = page
    sign_in(tab, site, "Ada (project admin)")
    assert tab.url == f"{site.url}{WEB}/tasks"
    at(tab, "Tasks · web")

    # Dates show in the viewer's zone; the UTC value stays on hover.
    first_time = tab.locator("main time").first
    utc_title = first_time.get_attribute("title")
    assert utc_title and utc_title.endswith(" UTC")
    assert "UTC" not in first_time.inner_text()  # localized by console.js

    # 121 tasks, 50 a page, with the listing's cursor.
    seen: list[str] = []
    for expected in (50, 50, 21):
        rows = tab.locator("table.tasks tbody tr td:first-child > a").all_inner_texts()
        assert len(rows) == expected
        seen += rows
        more = tab.locator("a[rel=next]")
        if expected == 21:
            assert more.count() == 0
        else:
            with tab.expect_navigation():
                more.click()
    assert len(set(seen)) == 121 and seen[0] == "fix-login"
    go(tab, "a:has-text('« First page')")

    tab.fill("input[name=model]", "opus")
    tab.check("input[name=failed]")
    go(tab, "button:has-text('Filter')")
    filtered = tab.locator("table.tasks tbody tr td:first-child > a").all_inner_texts()
    assert filtered and all(re.fullmatch(r"bulk-\d{3}", t) for t in filtered)
    assert all(int(t[-3:]) % 3 == 0 and int(t[-3:]) % 4 for t in filtered)
    go(tab, "a:has-text('Clear')")
    screenshot(tab, "console-tasks.png", tmp_path)

    # Search from the header: a turn and a memory, never another project's text.
    tab.fill("header input[name=q]", "login")
    with tab.expect_navigation():
        tab.keyboard.press("Enter")
    at(tab, "Search · web")
    hits = tab.locator("li.hit > a:first-child").all_inner_texts()
    assert {"fix-login · turn 0", "fix-login · turn 1", "/login-notes.md"} <= set(hits), hits
    assert not any("mobile" in h for h in hits), hits
    assert "login" in [m.lower() for m in tab.locator("li.hit mark").all_inner_texts()]
    assert tab.locator("header input[name=q]").input_value() == "login"
    screenshot(tab, "console-search.png", tmp_path)
    go(tab, "li.hit a:has-text('/login-notes.md')")
    at(tab, "/login-notes.md · Team prefs")
    tab.go_back()
    at(tab, "Search · web")
    go(tab, "li.hit a:has-text('fix-login · turn 0')")
    at(tab, "Turn 0 · fix-login")
    # By meaning (the server's default), the project's nearest texts: never the other's.
    tab.goto(f"{site.url}{WEB}/search?q=mobile")
    assert tab.locator("input[name=mode][value=hybrid]").is_checked()
    hits = tab.locator("li.hit > a:first-child").all_inner_texts()
    assert not any("mobile" in h for h in hits), hits
    tab.goto(f"{site.url}{WEB}/search?q=mobile&mode=keyword")
    assert "Nothing matches" in tab.locator("main").inner_text()
    tab.goto(f"{site.url}{WEB}/tasks")

    # Task -> turn -> artifact preview -> back.
    go(tab, "a:has-text('fix-login')")
    at(tab, "fix-login · Tasks")
    assert tab.locator(".turn h3").all_inner_texts()[0].startswith("Turn 1")
    assert tab.locator(".summary h2").first.inner_text() == "Fixed"
    screenshot(tab, "console-task.png", tmp_path)
    go(tab, ".turn h3 a:has-text('Turn 1')")
    at(tab, "Turn 1 · fix-login")
    meta = tab.locator("dl.meta").inner_text()
    for shown in (
        "claude-opus",
        "fixer",
        "c0ffee1",
        "4 min 30 s",
        "input: 1200, output: 340",
        "ticket",
        "WEB-17",
    ):
        assert shown in meta, shown
    go(tab, "a:has-text('test.log')")
    at(tab, "test.log · turn 1 · fix-login")
    assert "214 passed in 3.02s" in tab.locator("pre.preview").inner_text()
    assert "All 400 bytes." in tab.locator("main").inner_text()
    tab.go_back()
    at(tab, "Turn 1 · fix-login")
    go(tab, "a:has-text('screen.png')")
    image = tab.locator("figure.preview img")
    image.wait_for()
    assert tab.evaluate("document.querySelector('figure.preview img').naturalWidth") == 3
    with tab.expect_download() as download:
        tab.click("a:has-text('Download')")
    assert download.value.suggested_filename == "screen.png"

    # project.md, rendered.
    go(tab, "header nav a:has-text('project.md')")
    at(tab, "project.md · web")
    assert tab.locator("article.digest h2").count() >= 100

    # A store as folders, a memory's versions, a diff of two of them.
    go(tab, "header nav a:has-text('Memory stores')")
    go(tab, "a:has-text('Team prefs')")
    assert tab.locator("ul.tree li.folder").all_inner_texts() == ["style/"]
    go(tab, "ul.tree a:has-text('style/')")
    go(tab, "ul.tree a:has-text('format.md')")
    at(tab, "/style/format.md · Team prefs")
    assert tab.locator("pre.content").inner_text() == "Use ruff format.\nLine length 100.\n"
    go(tab, "button:has-text('Compare')")  # the newest two are chosen already
    at(tab, "Diff · Team prefs")
    assert tab.locator("pre.diff .del").all_inner_texts() == ["-Use black.", "-Line length 88."]
    assert tab.locator("pre.diff .add").all_inner_texts() == [
        "+Use ruff format.",
        "+Line length 100.",
    ]
    screenshot(tab, "console-diff.png", tmp_path)

    # Redact the older version (the newer one is the memory's head).
    go(tab, f"a:has-text('{site.ids['v1']}')")
    go(tab, "a:has-text('Redact this version')")
    at(tab, f"Redact {site.ids['v1']}")
    go(tab, "button:has-text('Redact version')")
    assert "Redacted" in tab.locator("p.notice").inner_text()
    with site.api("ci-writer") as s:
        version = s.get(
            f"{site.url}/v1/memory_stores/{site.ids['store']}/memory_versions/{site.ids['v1']}"
        ).json()
    assert version["redacted_by"]["api_key_id"] == site.ids["Ada (project admin)"]

    # Delete a task, after the confirmation page.
    tab.goto(f"{site.url}{WEB}/tasks/bulk-007")
    go(tab, "a:has-text('Delete this task')")
    at(tab, "Delete bulk-007")
    go(tab, "button:has-text('Delete task')")
    assert tab.locator("p.notice").inner_text() == "Deleted task bulk-007."
    with site.api("ci-writer") as s:
        assert s.get(f"{site.url}{API}/tasks/bulk-007").status_code == 404

    # Readable on a phone: nothing wider than the screen but the tables' own scrollers.
    tab.set_viewport_size({"width": 390, "height": 800})
    for url in (
        f"{WEB}/tasks",
        f"{WEB}/tasks/fix-login",
        f"{WEB}/tasks/fix-login/turns/1",
        f"{WEB}/search?q=login",
    ):
        tab.goto(site.url + url)
        assert tab.evaluate("document.documentElement.scrollWidth") <= 390, url
        # The header leaves the screen to the page: at most 15% of its height.
        header = tab.locator("header.top").bounding_box()
        assert header is not None and header["height"] <= 800 * 0.15, (url, header)
    tab.set_viewport_size({"width": 1200, "height": 900})

    go(tab, "button:has-text('Sign out')")
    at(tab, "Sign in")
    assert tab.locator("p.notice").inner_text() == "Signed out."
    tab.goto(f"{site.url}{WEB}/tasks")
    at(tab, "Sign in")
    watch.assert_clean()


def test_the_first_start_banner_names_the_console(site: Site) -> None:
    assert f"Web console: {site.url}/console/ " in site.server.log()


def test_a_token_revoked_with_the_cli_is_signed_out_at_the_next_click(
    page: tuple[Any, Watch], site: Site
) -> None:
    tab, watch = page
    secret = site.token("soon revoked", "reader")
    assert secret
    sign_in(tab, site, "soon revoked")
    at(tab, "Tasks · web")
    flask_cli(site.server.env, "tokens", "revoke", site.ids["soon revoked"])
    go(tab, "a:has-text('fix-login')")
    at(tab, "Sign in")
    assert "revoked or has expired" in tab.locator("p.notice").inner_text()
    watch.assert_clean()


def test_forms_posted_from_another_origin_or_without_the_token_change_nothing(
    page: tuple[Any, Watch], site: Site
) -> None:
    tab, _ = page
    with site.api("ci-writer") as s:
        r = s.put(f"{site.url}{API}/tasks/keep-me/turns/0", json={"summary_md": "keep"})
        assert r.status_code == 200
    sign_in(tab, site, "Ada (project admin)")
    target = f"{site.url}{WEB}/tasks/keep-me/delete"
    # Another site's page posting to us: served by the browser itself for evil.example.
    attack = (
        f'<form id=f method=post action="{target}"><input name=csrf value=guess></form>'
        "<script>document.getElementById('f').submit()</script>"
    )
    tab.route(
        "http://evil.example/**",
        lambda route: route.fulfill(status=200, content_type="text/html", body=attack),
    )
    tab.goto("http://evil.example/attack.html")
    tab.wait_for_url(re.compile(re.escape(site.url)))
    tab.wait_for_load_state()
    # SameSite=Strict kept the session cookie home; the Origin check would refuse it anyway.
    assert tab.title() in ("Sign in · Project Memory", "Not allowed · Project Memory")
    # Our own origin, but a form without the CSRF token.
    tab.goto(f"{site.url}{WEB}/tasks/keep-me")
    tab.evaluate(
        """target => { const f = document.createElement('form'); f.method = 'post';
        f.action = target; document.body.appendChild(f); f.submit(); }""",
        target,
    )
    tab.wait_for_load_state()
    at(tab, "Not allowed")
    assert "did not come from this console" in tab.locator("main").inner_text()
    with site.api("ci-writer") as s:
        assert s.get(f"{site.url}{API}/tasks/keep-me").status_code == 200


# -- the XSS corpus ---------------------------------------------------------------------------
PROBE = "window.__pwned"
SCRIPTS = [
    "<script>window.__pwned=1</script>",
    "<img src=x onerror=window.__pwned=1>",
    "<svg onload=window.__pwned=1>",
    '"><script>window.__pwned=1</script>',
    "'><img src=x onerror=window.__pwned=1>",
    "javascript:window.__pwned=1",
    "<iframe src=javascript:window.__pwned=1>",
    "<img src=https://evil.example/leak.png>",
    "<link rel=stylesheet href=https://evil.example/x.css>",
    "<meta http-equiv=refresh content='0;url=https://evil.example/'>",
    "<style>@import 'https://evil.example/x.css';</style>",
    "{{7*7}}<b>{% raw %}",
]
MARKDOWN = "\n\n".join(
    [
        "# Title <script>window.__pwned=1</script>",
        "[click](javascript:window.__pwned=1) [data](data:text/html,<script>window.__pwned=1</script>)",
        "![tracker](https://evil.example/pixel.png) ![local](/console/signout)",
        '<a href="javascript:window.__pwned=1" onmouseover="window.__pwned=1">raw</a>',
        "[ref]: javascript:window.__pwned=1\n\n[ref]",
        "<details open ontoggle=window.__pwned=1>x</details>",
        "```html\n<script>window.__pwned=1</script>\n```",
        "| a |\n|---|\n| <img src=x onerror=window.__pwned=1> |",
        "[proto](//evil.example/x)",
    ]
    + SCRIPTS
)


@pytest.fixture(scope="module")
def hostile(site: Site) -> dict[str, str]:
    """The corpus, stored through the APIs in every field an agent controls (and a token
    named by it, which the tokens and audit pages show)."""
    ids: dict[str, str] = {}
    site.token(SCRIPTS[0], "reader")
    with site.api("ci-writer") as s:
        meta = {f"key{i} {p}": p for i, p in enumerate(SCRIPTS)}
        meta.update(model=SCRIPTS[0], agent_id=SCRIPTS[1], commit=SCRIPTS[2], exit_code=7)
        r = s.put(f"{site.url}{API}/tasks/xss/turns/0", json={"meta": meta, "summary_md": MARKDOWN})
        assert r.status_code == 200, r.text
        artifacts = [
            ("page.html", b"<script>window.__pwned=1</script>", "text/html"),
            (
                "pic.svg",
                b'<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned=1"/>',
                "image/svg+xml",
            ),
            (
                "note.txt",
                "\n".join(SCRIPTS).encode(),
                'text/plain; x="<script>window.__pwned=1</script>"',
            ),
            ("fake.png", b"<script>window.__pwned=1</script>", "image/png"),
            ("doc.pdf", b"%PDF-1.4 /JS (app.alert(1))", "application/pdf"),
            ("x.json", b'{"a": "</pre><script>window.__pwned=1</script>"}', "application/json"),
        ]
        for name, data, kind in artifacts:
            r = s.put(
                f"{site.url}{API}/tasks/xss/turns/0/artifacts/{name}",
                data=data,
                headers={"Content-Type": kind},
            )
            assert r.status_code == 200, r.text
        store = s.post(
            f"{site.url}/v1/memory_stores",
            json={
                "name": SCRIPTS[0],
                "description": SCRIPTS[1],
                "metadata": {"k": SCRIPTS[2], SCRIPTS[3][:60]: "v"},
            },
        ).json()
        ids["store"] = store["id"]
        paths = [
            "/<img src=x onerror=window.__pwned=1>/<svg onload=window.__pwned=1>.md",
            "/\"'><b>x.md",
        ]
        for path in paths:
            mem = s.post(
                f"{site.url}/v1/memory_stores/{store['id']}/memories",
                json={"path": path, "content": MARKDOWN},
            )
            assert mem.status_code == 200, mem.text
        mem_id = mem.json()["id"]
        ids["memory"], ids["v1"] = mem_id, mem.json()["memory_version_id"]
        ids["v2"] = s.post(
            f"{site.url}/v1/memory_stores/{store['id']}/memories/{mem_id}",
            json={"content": "\n".join(reversed(SCRIPTS))},
        ).json()["memory_version_id"]
    return ids


def test_nothing_an_agent_wrote_runs_or_loads_anything(
    page: tuple[Any, Watch], site: Site, hostile: dict[str, str]
) -> None:
    tab, watch = page
    sign_in(tab, site, "Ada (project admin)")
    store, memory, v1, v2 = hostile["store"], hostile["memory"], hostile["v1"], hostile["v2"]
    turn = f"{WEB}/tasks/xss/turns/0"
    pages = [
        f"{WEB}/tasks",
        f"{WEB}/tasks?model={requests.utils.quote(SCRIPTS[0])}",
        f"{WEB}/tasks/xss",
        turn,
        *(
            f"{turn}/artifacts/{n}"
            for n in ("page.html", "pic.svg", "note.txt", "fake.png", "doc.pdf", "x.json")
        ),
        f"{WEB}/project.md",
        f"{WEB}/stores",
        f"{WEB}/stores/{store}",
        f"{WEB}/stores/{store}?path={requests.utils.quote('/<img src=x onerror=window.__pwned=1>/')}",
        f"{WEB}/stores/{store}/memories/{memory}",
        f"{WEB}/stores/{store}/versions/{v1}",
        f"{WEB}/stores/{store}/diff?a={v1}&b={v2}",
        f"{WEB}/stores/{store}/versions/{v1}/redact",
        f"{WEB}/tasks/xss/delete",
        # The workplace: forms and confirmations over the same data, tokens, limits, audit.
        f"{WEB}/stores/{store}/memories/{memory}/edit",
        f"{WEB}/stores/{store}/memories/{memory}/rename",
        f"{WEB}/stores/{store}/memories/{memory}/delete",
        f"{WEB}/stores/{store}/versions/{v1}/restore",
        f"{WEB}/stores/{store}/memories/new?path={requests.utils.quote(SCRIPTS[1])}",
        f"{WEB}/stores/{store}/archive",
        f"{WEB}/stores/{store}/delete",
        f"{WEB}/stores/new",
        f"{WEB}/tasks/xss/turns/0/delete",
        f"{turn}/artifacts/note.txt/delete",
        f"{WEB}/tokens",
        f"{WEB}/tokens/new",
        f"{WEB}/limits",
        f"{WEB}/audit",
        f"{WEB}/audit?kind=memory&actor={requests.utils.quote(SCRIPTS[0])}",
        f"{WEB}/tasks?sort=size&agent={requests.utils.quote(SCRIPTS[1])}",
        # Charts of our own drawing: the only SVG a page may hold.
        f"{WEB}/usage",
        "/console/projects",
        # The ledger's pages: models, agents and commits as labels, filters, keys of charts.
        f"{WEB}/ledger",
        f"{WEB}/ledger?model={requests.utils.quote(SCRIPTS[0])}",
        f"{WEB}/timeline",
        f"{WEB}/timeline?agent={requests.utils.quote(SCRIPTS[1])}",
        f"{WEB}/compare?a=xss&b=xss&b_turn=0",
        # Snippets of everything above, with the matches highlighted; a hostile query too.
        f"{WEB}/search?q=pwned",
        f"{WEB}/search?q=script",
        f"{WEB}/search?q={requests.utils.quote(SCRIPTS[0])}",
        f"{WEB}/search?q={requests.utils.quote(SCRIPTS[3])}",
    ]
    for url in pages:
        response = tab.goto(site.url + url)
        assert response is not None and response.status == 200, (url, response and response.status)
        tab.wait_for_load_state("load")
        # Hover and focus everything: handlers that wait for a person must not fire either.
        for link in tab.locator("main a").all()[:10]:
            link.hover()
        assert tab.evaluate(PROBE) is None, url
        assert (
            tab.locator(
                "main script, main iframe, main img:not(figure.preview img), main style,"
                " main svg:not(svg.chart):not(svg.spark):not(svg.meter)"
            ).count()
            == 0
        ), url
        # Ours hold rectangles, lines and text only: nothing that runs or loads.
        drawn = tab.locator("main svg *").evaluate_all("els => els.map(e => e.localName)")
        assert set(drawn) <= {"title", "rect", "line", "text"}, (url, set(drawn))
        hrefs = tab.eval_on_selector_all("main a[href]", "links => links.map(a => a.href)")
        assert not [
            h for h in hrefs if h.lower().startswith(("javascript:", "data:", "vbscript:"))
        ], url
    # Search found the corpus and shows it as text, with marks only where it matched.
    tab.goto(site.url + f"{WEB}/search?q=pwned")
    assert tab.locator("li.hit").count() >= 3
    assert "<script>window.__pwned=1</script>" in tab.locator("main").inner_text()
    assert tab.locator("li.hit mark").count() >= 3
    # What the corpus looks like, as text, on the turn page.
    tab.goto(site.url + turn)
    body = tab.locator("main").inner_text()
    assert "<script>window.__pwned=1</script>" in body and "[image: tracker]" in body
    watch.assert_clean()
