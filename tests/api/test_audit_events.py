"""The APIs record what they changed for the audit log (core/audit.py), under the token that
asked; a refused request records nothing. On every backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.names import Scope
from tests.conftest import Tokens

pytestmark = pytest.mark.all_backends

API = "/sandbox/memory/v1"
STORES = "/v1/memory_stores"


def events(app: Flask) -> list[tuple[str, str, str | None, str]]:
    page = app.extensions["storage"].audit_log.page(Scope("acme", "web"), limit=100)
    return [(e.kind, e.action, e.actor, e.subject) for e in reversed(page.events)]


def test_writes_and_deletes_are_recorded_with_their_token(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    w, admin = tokens.headers("writer"), tokens.headers("project_admin")
    ids = tokens.ids
    assert (
        client.put(f"{API}/tasks/t/turns/0", json={"summary_md": "a"}, headers=w).status_code == 200
    )
    # A second turn, and a rewrite, create nothing.
    assert (
        client.put(f"{API}/tasks/t/turns/1", json={"summary_md": "b"}, headers=w).status_code == 200
    )
    assert (
        client.put(f"{API}/tasks/t/turns/0", json={"summary_md": "c"}, headers=w).status_code == 200
    )
    sid = client.post(STORES, json={"name": "s"}, headers=w).get_json()["id"]
    mem = client.post(f"{STORES}/{sid}/memories", json={"path": "/a", "content": "1"}, headers=w)
    mid, v1 = mem.get_json()["id"], mem.get_json()["memory_version_id"]
    r = client.post(f"{STORES}/{sid}/memories/{mid}", json={"content": "2"}, headers=w)
    assert r.status_code == 200
    r = client.post(f"{STORES}/{sid}/memory_versions/{v1}/redact", headers=admin)
    assert r.status_code == 200
    assert client.delete(f"{STORES}/{sid}/memories/{mid}", headers=w).status_code == 200
    assert client.post(f"{STORES}/{sid}/archive", headers=w).status_code == 200
    assert client.delete(f"{STORES}/{sid}", headers=admin).status_code == 200
    # Refused: another's task, a missing one; they leave nothing.
    assert client.delete(f"{API}/tasks/t", headers=tokens.headers("writer2")).status_code == 403
    assert client.delete(f"{API}/tasks/nope", headers=w).status_code == 404
    assert client.delete(f"{API}/tasks/t", headers=admin).status_code == 204
    assert events(app) == [
        ("task", "created", ids["writer"], "t"),
        ("store", "created", ids["writer"], sid),
        ("memory", "created", ids["writer"], mid),
        ("memory", "modified", ids["writer"], mid),
        ("memory", "redacted", ids["project_admin"], mid),
        ("memory", "deleted", ids["writer"], mid),
        ("store", "archived", ids["writer"], sid),
        ("store", "deleted", ids["project_admin"], sid),
        ("task", "deleted", ids["project_admin"], "t"),
    ]
    redacted = (
        app.extensions["storage"].audit_log.page(Scope("acme", "web"), kind="memory").events[1]
    )
    assert redacted.detail == {"version_id": v1} and redacted.store_id == sid


@pytest.mark.tree_only("plants a directory where the tree keeps its audit log")
def test_an_unwritable_log_does_not_fail_the_change(
    app: Flask, client: FlaskClient, tokens: Tokens, tmp_path: Path
) -> None:
    (tmp_path / "root").mkdir(exist_ok=True)
    (tmp_path / "root" / ".audit.sqlite3").mkdir()  # SQLite cannot open a directory
    w = tokens.headers("writer")
    r = client.put(f"{API}/tasks/t/turns/0", json={"summary_md": "a"}, headers=w)
    assert r.status_code == 200
    assert client.get(f"{API}/tasks/t", headers=w).status_code == 200


def test_the_memory_tool_records_its_writes_not_its_reads_or_failures(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    w = tokens.headers("writer")
    sid = client.post(STORES, json={"name": "s"}, headers=w).get_json()["id"]
    tool = f"/v1/memory_stores/{sid}/memory_tool"
    for body in (
        {"command": "create", "path": "/memories/a.md", "file_text": "one"},
        {"command": "view", "path": "/memories"},
        {"command": "str_replace", "path": "/memories/a.md", "old_str": "one", "new_str": "two"},
        {"command": "str_replace", "path": "/memories/a.md", "old_str": "absent", "new_str": "x"},
        {"command": "delete", "path": "/memories/a.md"},
    ):
        assert client.post(tool, json=body, headers=w).status_code == 200
    got = [(k, a, s) for k, a, _, s in events(app) if k == "memory"]
    assert got == [
        ("memory", "written", sid),
        ("memory", "modified", sid),
        ("memory", "deleted", sid),
    ]
