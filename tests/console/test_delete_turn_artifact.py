"""Deleting one turn and one artifact from the console: its owner or a project_admin, on a
confirmation that carries the ETag it showed (a change in between refuses the delete), and
the removed text leaves every file of the storage root. On every backend."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.names import Scope
from tests.conftest import Tokens
from tests.storage._helpers import upkeep_done

from .conftest import API, Browser, hidden, put_turn, text

pytestmark = pytest.mark.all_backends

WEB = "/console/p/acme/web"
LEAK_TURN, LEAK_FILE = "LEAKED-TURN-5d1e", "LEAKED-FILE-9a3c"


@pytest.fixture
def leaky(client: FlaskClient, tokens: Tokens) -> None:
    put_turn(client, tokens, "leaky", 0, summary="keep this")
    put_turn(client, tokens, "leaky", 1, summary=f"pasted {LEAK_TURN} by mistake")
    r = client.put(
        f"{API}/tasks/leaky/turns/0/artifacts/env.txt",
        data=f"TOKEN={LEAK_FILE}\n".encode(),
        headers=tokens.headers("writer", **{"Content-Type": "text/plain"}),
    )
    assert r.status_code == 200


def test_owner_deletes_an_artifact_then_a_turn(
    app: Flask,
    client: FlaskClient,
    tokens: Tokens,
    console: Callable[[str], Browser],
    leaky: None,
    tmp_path: Path,
    backend_kind: str,
) -> None:
    browser = console("writer")  # the owner
    art = f"{WEB}/tasks/leaky/turns/0/artifacts/env.txt"
    assert "Delete this artifact" in text(browser.get(art))
    confirm = text(browser.get(f"{art}/delete"))
    done = browser.post(f"{art}/delete", {"if_match": hidden(confirm, "if_match")})
    assert done.status_code == 303 and done.headers["Location"].endswith("/tasks/leaky/turns/0")
    h = tokens.headers("writer")
    assert client.get(f"{API}/tasks/leaky/turns/0/artifacts/env.txt", headers=h).status_code == 404
    turn = f"{WEB}/tasks/leaky/turns/1"
    confirm = text(browser.get(f"{turn}/delete"))
    done = browser.post(f"{turn}/delete", {"if_match": hidden(confirm, "if_match")})
    assert done.status_code == 303 and done.headers["Location"].endswith("/tasks/leaky")
    assert client.get(f"{API}/tasks/leaky/turns/1", headers=h).status_code == 404
    assert client.get(f"{API}/tasks/leaky/turns/0", headers=h).status_code == 200
    found = client.get(f"{API}/search", query_string={"q": LEAK_TURN}, headers=h).get_json()
    assert not (found.get("data") or found.get("hits"))
    if backend_kind == "tree":  # every file under the root, its SQLite files and WALs too
        upkeep_done(app.extensions["storage"].tasks)  # the purge runs after the answer
        grep = subprocess.run(
            ["grep", "-rl", "-e", LEAK_TURN, "-e", LEAK_FILE, str(tmp_path / "root")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert grep.stdout == "", grep.stdout
    page = app.extensions["storage"].audit_log.page(Scope("acme", "web"))
    assert [(e.kind, e.action) for e in page.events[:2]] == [
        ("turn", "deleted"),
        ("artifact", "deleted"),
    ]


def test_a_change_in_between_refuses_the_delete(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], leaky: None
) -> None:
    browser = console("project_admin")
    turn = f"{WEB}/tasks/leaky/turns/1"
    shown = hidden(text(browser.get(f"{turn}/delete")), "if_match")
    put_turn(client, tokens, "leaky", 1, summary="rewritten meanwhile")
    refused = browser.post(f"{turn}/delete", {"if_match": shown})
    assert refused.status_code == 412
    assert (
        client.get(f"{API}/tasks/leaky/turns/1", headers=tokens.headers("writer")).status_code
        == 200
    )


def test_only_the_owner_or_a_project_admin(console: Callable[[str], Browser], leaky: None) -> None:
    for who in ("writer2", "reader"):
        browser = console(who)
        assert "Delete this turn" not in text(browser.get(f"{WEB}/tasks/leaky/turns/1"))
        assert browser.get(f"{WEB}/tasks/leaky/turns/1/delete").status_code == 403
        assert browser.post(f"{WEB}/tasks/leaky/turns/1/delete").status_code == 403
        art = f"{WEB}/tasks/leaky/turns/0/artifacts/env.txt/delete"
        assert browser.post(art).status_code == 403
    # The last turn takes the task with it.
    admin = console("project_admin")
    for turn in (1, 0):
        assert admin.post(f"{WEB}/tasks/leaky/turns/{turn}/delete").status_code == 303
    assert admin.get(f"{WEB}/tasks/leaky").status_code == 404
