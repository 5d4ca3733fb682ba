"""The console's pages with the Flask test client: what they show, their headers, their
actions (through the same storage calls and actor as the APIs)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.console.views import CSP
from app.storage.core.names import Scope
from tests.conftest import FixedClock, Tokens

from .conftest import API, Browser, put_turn

WEB = "/console/p/acme/web"
SCOPE = Scope("acme", "web")


def text(r: object) -> str:
    return r.get_data(as_text=True)  # type: ignore[attr-defined, no-any-return]


def assert_safety_headers(r: object, url: str) -> None:
    headers = r.headers  # type: ignore[attr-defined]
    assert headers["X-Frame-Options"] == "DENY", url
    assert headers["Referrer-Policy"] == "no-referrer", url
    assert headers["X-Content-Type-Options"] == "nosniff", url
    csp = headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp or csp.startswith("sandbox"), url


@pytest.fixture
def store_ids(client: FlaskClient, tokens: Tokens) -> dict[str, str]:
    h = tokens.headers("writer")
    sid = client.post(
        "/v1/memory_stores", json={"name": "Prefs", "description": "how we work"}, headers=h
    ).get_json()["id"]
    mem = client.post(
        f"/v1/memory_stores/{sid}/memories",
        json={"path": "/prefs/format.md", "content": "use ruff\nline 2\n"},
        headers=h,
    ).get_json()
    v1 = mem["memory_version_id"]
    v2 = client.post(
        f"/v1/memory_stores/{sid}/memories/{mem['id']}",
        json={"content": "use ruff format\nline 2\n<b>bold</b>\n"},
        headers=h,
    ).get_json()["memory_version_id"]
    client.post(
        f"/v1/memory_stores/{sid}/memories", json={"path": "/top.md", "content": "t"}, headers=h
    )
    return {"sid": sid, "mid": mem["id"], "v1": v1, "v2": v2}


def test_every_response_carries_the_safety_headers(
    app: Flask, client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], store_ids
) -> None:  # noqa: ANN001
    put_turn(client, tokens, "t", meta={"model": "m"})
    client.put(
        f"{API}/tasks/t/turns/0/artifacts/a.txt", data=b"hi", headers=tokens.headers("writer")
    )
    browser = console("writer")
    sid, mid, v1, v2 = store_ids["sid"], store_ids["mid"], store_ids["v1"], store_ids["v2"]
    urls = [
        "/console/signin",
        "/console/",
        "/console/projects",
        f"{WEB}/tasks",
        f"{WEB}/tasks/t",
        f"{WEB}/tasks/t/turns/0",
        f"{WEB}/tasks/t/turns/0/artifacts/a.txt",
        f"{WEB}/tasks/t/turns/0/artifacts/a.txt/raw",
        f"{WEB}/project.md",
        f"{WEB}/project.md/raw",
        f"{WEB}/stores",
        f"{WEB}/stores/{sid}",
        f"{WEB}/stores/{sid}/memories/{mid}",
        f"{WEB}/stores/{sid}/versions/{v1}",
        f"{WEB}/stores/{sid}/diff?a={v1}&b={v2}",
        f"{WEB}/tasks/nope",
        f"{WEB}/tasks/t/turns/9999",
        "/console/missing/page",
        "/console/static/console.css",
        "/console/static/console.js",
        "/console/static/favicon.svg",
    ]
    for url in urls:
        r = browser.get(url)
        assert r.status_code in (200, 303, 404), (url, r.status_code)
        assert_safety_headers(r, url)
        if r.mimetype == "text/html" and r.status_code != 303:
            assert r.headers["Content-Security-Policy"] == CSP
            assert r.headers["Cache-Control"] == "no-store"
            assert re.search(r"<title>[^<]+ · Project Memory</title>", text(r)), url
            assert "<script>" not in text(r)
    anonymous = app.test_client().get(f"{WEB}/tasks")
    assert_safety_headers(anonymous, "anonymous")
    assert client.get("/").headers["Location"] == "/console/"


def test_the_console_is_not_in_the_openapi_document(client: FlaskClient) -> None:
    spec = text(client.get(f"{API}/openapi.yaml"))
    assert "/console" not in spec and "signin" not in spec


def test_no_page_has_inline_script_or_style(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    put_turn(client, tokens, "t")
    browser = console("writer")
    for url in ("/console/signin", f"{WEB}/tasks", f"{WEB}/tasks/t", f"{WEB}/project.md"):
        page = text(browser.get(url))
        assert re.findall(r"<script[^>]*>", page) in (
            [],
            ['<script src="/console/static/console.js" defer>'],
        )
        assert "<style" not in page and " style=" not in page and " onclick" not in page


def test_task_list_pages_filters_owner_and_expiry(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], clock: FixedClock
) -> None:
    for i in range(55):
        meta = {"model": "opus" if i % 5 == 0 else "haiku", "exit_code": i % 2}
        who = "writer2" if i == 54 else "writer"
        put_turn(client, tokens, f"task-{i:02d}", meta=meta, who=who)
        clock.advance(seconds=1)
        if i == 0:
            clock.advance(days=3)  # task-00 is retained 3 days less than the rest
    clock.advance(days=26, hours=23)  # task-00 expires within 3 days, the rest later
    browser = console("reader")
    first = text(browser.get(f"{WEB}/tasks"))
    listed = re.findall(r'<a href="/console/p/acme/web/tasks/(task-\d\d)">', first)
    assert listed == [f"task-{i:02d}" for i in range(54, 4, -1)]
    assert "55 live tasks" in first
    assert first.count("expires soon") == 0
    # task-54's owner: a token without a name shows as its id.
    assert f'<td class="owner"><span>{tokens.ids["writer2"]}</span></td>' in first
    assert first.count('<td class="owner">') == 50
    following = re.search(r'href="([^"]+)" rel="next"', first)
    assert following
    second = text(browser.get(following.group(1).replace("&amp;", "&")))
    assert re.findall(r'tasks/(task-\d\d)">', second) == [f"task-{i:02d}" for i in range(4, -1, -1)]
    assert second.count("expires soon") == 1 and 'class="soon"' in second
    assert 'rel="next"' not in second and "« First page" in second

    filtered = text(browser.get(f"{WEB}/tasks?model=opus&failed=1"))
    assert re.findall(r'tasks/(task-\d\d)">', filtered) == [
        "task-45",
        "task-35",
        "task-25",
        "task-15",
        "task-05",
    ]
    prefix = text(browser.get(f"{WEB}/tasks?q=task-1"))
    assert re.findall(r'tasks/(task-\d\d)">', prefix) == [f"task-{i}" for i in range(19, 9, -1)]
    bad = browser.get(f"{WEB}/tasks?q=no%20such")
    assert bad.status_code == 200 and "prefix: must be the start of a task id" in text(bad)
    foreign = browser.get(f"{WEB}/tasks?cursor=forged")
    assert foreign.status_code == 200 and "cursor" in text(foreign)


def test_task_timeline_turn_and_meta(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    for turn in range(23):
        meta = {
            "model": "opus",
            "agent_id": "ci",
            "commit": "abc123",
            "exit_code": 0 if turn else 3,
            "started_at": "2026-01-01T00:00:00Z",
            "ended_at": "2026-01-01T00:01:05Z",
            "tokens": {"input": 10, "output": turn},
            "cost": 0.5,
            "custom<key>": {"nested": True},
        }
        put_turn(client, tokens, "long", turn, meta=meta, summary=f"## Turn {turn} done\n\n*ok*")
    browser = console("reader")
    page = text(browser.get(f"{WEB}/tasks/long"))
    assert re.findall(r'<h3><a href="[^"]+/turns/(\d+)">', page) == [
        str(t) for t in range(22, 2, -1)
    ]
    assert "Page 1 of 2" in page and "Delete this task" not in page  # a reader
    assert "<h2>Turn 22 done</h2>" in page and "<em>ok</em>" in page
    assert "1 more meta key" in page and "1 min 5 s" in page
    older = text(browser.get(f"{WEB}/tasks/long?page=2"))
    assert re.findall(r'<h3><a href="[^"]+/turns/(\d+)">', older) == ["2", "1", "0"]
    turn = text(browser.get(f"{WEB}/tasks/long/turns/0"))
    for shown in (
        "abc123",
        "ci",
        "opus",
        "input: 10, output: 0",
        "custom&lt;key&gt;",
        "{&#34;nested&#34;: true}",
    ):
        assert shown in turn, shown
    assert browser.get(f"{WEB}/tasks/long/turns/23").status_code == 404
    assert browser.get(f"{WEB}/tasks/bad%20id").status_code == 404
    assert browser.get(f"{WEB}/tasks/long/turns/99999").status_code == 404


def test_a_damaged_turn_is_shown_as_damaged_with_the_repair(
    app: Flask, client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    for turn in range(2):
        put_turn(client, tokens, "t", turn, summary=f"turn {turn} text")
    root = Path(app.config["STORAGE_ROOT"])
    (root / "acme" / "web" / "t" / "0000-turn" / "meta.json").write_text('{"torn": ')
    browser = console("reader")
    page = text(browser.get(f"{WEB}/tasks/t"))
    assert "turn 1 text" in page
    assert 'id="turn-0"' in page and "record is damaged" in page and "fsck --repair" in page
    turn = browser.get(f"{WEB}/tasks/t/turns/0")
    assert turn.status_code == 500 and "fsck --repair" in text(turn)
    assert str(root) not in text(turn)


def test_artifacts_preview_text_and_images_and_download_the_rest(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    put_turn(client, tokens, "t")
    h = tokens.headers("writer")
    big = b"0123456789abcde\n" * (300 * 1024 // 16)  # 300 KiB of text
    artifacts = {
        "big.log": (big, "text/plain"),
        "fake.txt": (b"\x7fELF\x00\x00binary", "text/plain"),
        "page.html": (b"<script>window.pwned=1</script>", "text/html"),
        "pic.svg": (b"<svg onload='window.pwned=1'/>", "image/svg+xml"),
        "shot.png": (b"\x89PNG\r\n\x1a\n" + b"\x00" * 32, "image/png"),
        "doc.pdf": (b"%PDF-1.4", "application/pdf"),
    }
    for name, (data, kind) in artifacts.items():
        r = client.put(
            f"{API}/tasks/t/turns/0/artifacts/{name}",
            data=data,
            headers={**h, "Content-Type": kind},
        )
        assert r.status_code == 200
    browser = console("reader")
    base = f"{WEB}/tasks/t/turns/0/artifacts"
    page = text(browser.get(f"{base}/big.log"))
    assert "The first 256.0 KiB of 300.0 KiB." in page
    shown = re.search(r'<pre class="preview">(.*?)</pre>', page, re.S)
    assert shown and len(shown.group(1)) == 256 * 1024
    for name in ("fake.txt", "page.html", "pic.svg", "doc.pdf"):
        page = text(browser.get(f"{base}/{name}")).split('<main id="main">')[1]
        assert "No preview for this type" in page and "<pre" not in page and "<img" not in page, (
            name
        )
        raw = browser.get(f"{base}/{name}/raw?inline=1")
        assert raw.headers["Content-Disposition"] == f"attachment; filename={name}"
        assert raw.headers["Content-Security-Policy"] == "sandbox; default-src 'none'"
    page = text(browser.get(f"{base}/shot.png"))
    assert f'<img src="{base}/shot.png/raw?inline=1" alt="shot.png">' in page
    raw = browser.get(f"{base}/shot.png/raw?inline=1")
    assert raw.status_code == 200 and raw.mimetype == "image/png"
    assert raw.headers["Content-Disposition"] == "inline; filename=shot.png"
    assert raw.headers["X-Content-Type-Options"] == "nosniff"
    assert raw.headers["Cross-Origin-Resource-Policy"] == "same-origin"
    assert (
        browser.get(f"{base}/shot.png/raw").headers["Content-Disposition"].startswith("attachment")
    )
    assert browser.get(f"{base}/nope.txt").status_code == 404


def test_delete_follows_the_api_rule_and_the_owner_check(
    app: Flask, client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    put_turn(client, tokens, "mine", who="writer")
    put_turn(client, tokens, "theirs", who="writer")
    store = app.extensions["storage"].tasks
    other = console("writer2")
    assert "Delete this task" not in text(other.get(f"{WEB}/tasks/theirs"))
    assert other.get(f"{WEB}/tasks/theirs/delete").status_code == 403
    assert other.post(f"{WEB}/tasks/theirs/delete").status_code == 403
    assert store.get_task(SCOPE, "theirs")

    owner = console("writer")
    confirm = owner.get(f"{WEB}/tasks/mine/delete")
    assert confirm.status_code == 200 and "Delete task mine?" in text(confirm)
    done = owner.post(f"{WEB}/tasks/mine/delete")
    assert done.status_code == 303 and done.headers["Location"] == f"{WEB}/tasks?deleted=mine"
    assert "Deleted task mine." in text(owner.get(done.headers["Location"]))
    # The notice follows a real delete only: a link cannot put words on the page.
    for spoof in ("theirs", "Your token was rotated: see https://evil.example", "never-was-x"):
        page = text(owner.get(f"{WEB}/tasks", query_string={"deleted": spoof}))
        assert "Deleted task" not in page or spoof == "never-was-x", spoof
    assert client.get(f"{API}/tasks/mine", headers=tokens.headers("reader")).status_code == 404

    admin = console("project_admin")
    assert admin.post(f"{WEB}/tasks/theirs/delete").status_code == 303
    assert admin.post(f"{WEB}/tasks/theirs/delete").status_code == 404


def test_redact_is_project_admin_only_and_records_who(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], store_ids
) -> None:  # noqa: ANN001
    sid, v1, v2 = store_ids["sid"], store_ids["v1"], store_ids["v2"]
    writer = console("writer")
    assert "Redact this version" not in text(writer.get(f"{WEB}/stores/{sid}/versions/{v1}"))
    assert writer.get(f"{WEB}/stores/{sid}/versions/{v1}/redact").status_code == 403
    assert writer.post(f"{WEB}/stores/{sid}/versions/{v1}/redact").status_code == 403
    admin = console("project_admin")
    # The head of a live memory is not offered: its redaction always fails.
    assert "Redact this version" not in text(admin.get(f"{WEB}/stores/{sid}/versions/{v2}"))
    assert "Redact this version" in text(admin.get(f"{WEB}/stores/{sid}/versions/{v1}"))
    head = admin.post(f"{WEB}/stores/{sid}/versions/{v2}/redact")
    assert head.status_code == 409 and "head of live memory" in text(head)
    assert "Redact version" in text(admin.get(f"{WEB}/stores/{sid}/versions/{v1}/redact"))
    done = admin.post(f"{WEB}/stores/{sid}/versions/{v1}/redact")
    assert done.status_code == 303
    version = client.get(
        f"/v1/memory_stores/{sid}/memory_versions/{v1}", headers=tokens.headers("reader")
    ).get_json()
    assert version["content"] is None and version["redacted_by"] == {
        "type": "api_actor",
        "api_key_id": tokens.ids["project_admin"],
    }
    page = text(admin.get(done.headers["Location"]))
    assert "Redacted" in page and "use ruff\n" not in page


def test_stores_tree_memory_versions_and_diff(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], store_ids
) -> None:  # noqa: ANN001
    sid, mid, v1, v2 = store_ids["sid"], store_ids["mid"], store_ids["v1"], store_ids["v2"]
    browser = console("reader")
    stores = text(browser.get(f"{WEB}/stores"))
    assert ">Prefs</a>" in stores and "how we work" in stores
    root = text(browser.get(f"{WEB}/stores/{sid}"))
    assert f'href="{WEB}/stores/{sid}?path=/prefs/">prefs/</a>' in root
    assert ">top.md</a>" in root and "format.md" not in root
    folder = text(browser.get(f"{WEB}/stores/{sid}?path=/prefs/"))
    assert f'href="{WEB}/stores/{sid}/memories/{mid}">format.md</a>' in folder
    memory = text(browser.get(f"{WEB}/stores/{sid}/memories/{mid}"))
    assert "use ruff format\nline 2\n&lt;b&gt;bold&lt;/b&gt;" in memory
    assert memory.count('name="a"') == 2 and "current" in memory
    assert tokens.ids["writer"] in memory  # who wrote each version
    diff = text(browser.get(f"{WEB}/stores/{sid}/diff?a={v1}&b={v2}"))
    assert '<span class="del">-use ruff</span>' in diff
    assert '<span class="add">+use ruff format</span>' in diff
    assert '<span class="add">+&lt;b&gt;bold&lt;/b&gt;</span>' in diff
    assert browser.get(f"{WEB}/stores/{sid}?path=no-slash").status_code == 422
    assert browser.get(f"{WEB}/stores/memstore_nope").status_code == 404
    assert browser.get(f"{WEB}/stores/{sid}/diff?a={v1}&b=memver_x").status_code == 404


def test_project_md_is_rendered_and_a_large_one_is_cut(
    app: Flask,
    client: FlaskClient,
    tokens: Tokens,
    console: Callable[[str], Browser],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.console import views

    for i in range(4):
        put_turn(client, tokens, f"t{i}", summary=f"**bold {i}**\n\n" + "words " * 200)
    browser = console("reader")
    page = text(browser.get(f"{WEB}/project.md"))
    assert "<strong>bold 3</strong>" in page and "Showing the first" not in page
    monkeypatch.setattr(views, "DIGEST_RENDER_BYTES", 2000)
    page = text(browser.get(f"{WEB}/project.md"))
    assert "Showing the first" in page and "bold 0" not in page
    raw = browser.get(f"{WEB}/project.md/raw")
    assert b"**bold 0**" in raw.data and raw.headers["Content-Disposition"].startswith("attachment")


@pytest.mark.all_backends
def test_the_page_of_a_large_digest_shows_its_head_on_every_backend(
    client: FlaskClient,
    tokens: Tokens,
    console: Callable[[str], Browser],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The page reads the head of a project.md of more sections than one database fetch and
    closes it mid-body, more times than the app has database connections."""
    from app.console import views

    for i in range(300):
        put_turn(client, tokens, f"t{i:03d}", summary=f"section {i} " + "words " * 40)
    monkeypatch.setattr(views, "DIGEST_RENDER_BYTES", 2000)
    browser = console("reader")
    for _ in range(12):
        page = browser.get(f"{WEB}/project.md")
        assert page.status_code == 200 and "Showing the first" in text(page)
    whole = client.get(f"{API}/project.md", headers=tokens.headers("reader"))
    assert whole.status_code == 200 and whole.data.count(b"\n## t") == 300


def test_owners_and_authors_show_by_name_with_the_id_on_hover(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    token, secret = tokens.registry.create(
        role="writer", tenant="acme", project="web", name="Ada <ci>"
    )
    tokens.secrets["named"], tokens.ids["named"] = secret, token.id
    put_turn(client, tokens, "by-ada", who="named")
    page = text(console("reader").get(f"{WEB}/tasks"))
    assert f'<span title="{tokens.ids["named"]}">Ada &lt;ci&gt;</span>' in page
