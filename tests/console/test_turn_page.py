"""A turn's page: a one-line header of what the hook recorded (the commit and session short,
whole in their title and text), its artifacts each with type, size and, for text, the start
of it as escaped text, a bounded read whatever the artifacts weigh. On every backend."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from flask.testing import FlaskClient

from app.console import tasks as task_pages
from tests.conftest import Tokens

from .conftest import API, Browser, put_turn, text

pytestmark = pytest.mark.all_backends

TURN = "/console/p/acme/web/tasks/t/turns/0"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def put_artifact(client: FlaskClient, tokens: Tokens, name: str, data: bytes, kind: str) -> None:
    r = client.put(
        f"{API}/tasks/t/turns/0/artifacts/{name}",
        data=data,
        headers={**tokens.headers("writer"), "Content-Type": kind},
    )
    assert r.status_code == 200, r.get_json()


def test_the_header_says_what_the_hook_recorded(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    meta = {"model": "opus", "agent_id": "claude-code", "branch": "main", "commit": COMMIT,
            "session_id": "sess-0123456789", "tokens": {"input": 1234, "output": 56},
            "cost": 0.125, "exit_code": 2}  # fmt: skip
    put_turn(client, tokens, "t", meta=meta)
    page = text(console("reader").get(TURN))
    head = re.search(r'<p class="turn-head">.*?</p>', page, re.S)
    assert head is not None
    assert f'<code class="clip commit" title="{COMMIT}">{COMMIT}</code>' in head.group(0)
    assert 'title="sess-0123456789">sess-0123456789</code>' in head.group(0)
    assert "1,234 in / 56 out" in head.group(0) and "$0.1250" in head.group(0)
    assert 'data-exit="2">exit 2<' in head.group(0)


def test_text_artifacts_are_previewed_escaped_and_bounded(
    client: FlaskClient,
    tokens: Tokens,
    console: Callable[[str], Browser],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    put_turn(client, tokens, "t")
    put_artifact(
        client, tokens, "log.txt", b"<script>alert(1)</script>\n" + b"x" * 9000, "text/plain"
    )
    put_artifact(client, tokens, "pic.png", b"\x89PNG not really", "image/png")
    put_artifact(client, tokens, "bin.txt", b"a\x00b", "text/plain")
    monkeypatch.setattr(task_pages, "TURN_PREVIEW_BYTES", 100)
    page = text(console("reader").get(TURN))
    cards = dict(re.findall(r'<li data-artifact="([^"]+)">(.*?)</li>', page, re.S))
    assert set(cards) == {"log.txt", "pic.png", "bin.txt"}
    log = cards["log.txt"]
    assert "text/plain" in log and 'data-bytes="9026"' in log
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in log and "<script>alert" not in page
    shown = re.search(r'<pre class="preview small">(.*?)</pre>', log, re.S)
    assert (
        shown is not None and len(shown.group(1).replace("&lt;", "<").replace("&gt;", ">")) == 100
    )
    assert "The first 100 bytes" in log
    assert "<pre" not in cards["pic.png"] and "<pre" not in cards["bin.txt"]  # no text to show


def test_no_more_than_a_few_artifacts_are_read(
    client: FlaskClient,
    tokens: Tokens,
    console: Callable[[str], Browser],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    put_turn(client, tokens, "t")
    for i in range(4):
        put_artifact(client, tokens, f"log{i}.txt", f"log {i}".encode(), "text/plain")
    monkeypatch.setattr(task_pages, "TURN_PREVIEWS", 2)
    page = text(console("reader").get(TURN))
    assert page.count('<pre class="preview small">') == 2
    assert page.count("<li data-artifact=") == 4
