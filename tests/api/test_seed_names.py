"""Task ids, artifact names and the scoping headers' ids follow the seed's patterns whole:
``[A-Za-z0-9][A-Za-z0-9._-]{0,127}`` and ``[A-Za-z0-9._-]{1,128}``, a name that ends in ``.``
included. ``.`` and ``..`` alone are still refused as artifact names (they name a directory)."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.names import Scope
from tests.conftest import Tokens

pytestmark = pytest.mark.all_backends

BASE = "/sandbox/memory/v1"
TASKS = ["t", "t.", "t..", "v1.2."]
ARTIFACTS = ["x", "x.", "x..", "...", ".x.", "-."]


def test_task_ids_ending_in_a_dot_are_tasks_of_their_own(
    client: FlaskClient, tokens: Tokens
) -> None:
    h = tokens.headers("writer")
    for task in TASKS:
        r = client.put(f"{BASE}/tasks/{task}/turns/0", json={"summary_md": f"of {task}"}, headers=h)
        assert r.status_code == 200, (task, r.get_json())
        assert r.get_json()["task_id"] == task
    for task in TASKS:
        assert client.get(f"{BASE}/tasks/{task}/turns/0", headers=h).get_json()["summary_md"] == (
            f"of {task}"
        )
        assert client.get(f"{BASE}/tasks/{task}", headers=h).get_json()["task_id"] == task
    listed = client.get(f"{BASE}/tasks", headers=h).get_json()["tasks"]
    assert sorted(t["task_id"] for t in listed) == sorted(TASKS)
    digest = client.get(f"{BASE}/project.md", headers=h).get_data(as_text=True)
    for task in TASKS:
        assert f"## {task}\n" in digest
    assert client.delete(f"{BASE}/tasks/t.", headers=h).status_code == 204
    assert client.get(f"{BASE}/tasks/t.", headers=h).status_code == 404
    for task in ("t", "t.."):
        assert client.get(f"{BASE}/tasks/{task}/turns/0", headers=h).status_code == 200


def test_artifact_names_ending_in_a_dot_are_files_of_their_own(
    client: FlaskClient, tokens: Tokens
) -> None:
    h = tokens.headers("writer")
    assert client.put(f"{BASE}/tasks/t./turns/0", json={}, headers=h).status_code == 200
    for name in ARTIFACTS:
        url = f"{BASE}/tasks/t./turns/0/artifacts/{name}"
        r = client.put(url, data=name.encode(), headers=h)
        assert r.status_code == 200, (name, r.get_json())
        assert r.get_json()["name"] == name
    # A replacement (which keeps the old bytes aside until its commit) and a delete.
    assert client.put(
        f"{BASE}/tasks/t./turns/0/artifacts/x.", data=b"again", headers=h
    ).status_code == (200)
    assert client.delete(f"{BASE}/tasks/t./turns/0/artifacts/x..", headers=h).status_code == 204
    expected = {name: name.encode() for name in ARTIFACTS if name != "x.."}
    expected["x."] = b"again"
    turn = client.get(f"{BASE}/tasks/t./turns/0", headers=h).get_json()
    assert sorted(a["name"] for a in turn["artifacts"]) == sorted(expected)
    for name, data in expected.items():
        got = client.get(f"{BASE}/tasks/t./turns/0/artifacts/{name}", headers=h)
        assert got.status_code == 200 and got.data == data, name


@pytest.mark.parametrize("name", [".", "..", "%2e", "%2E%2e"])
def test_dot_and_dot_dot_alone_are_still_refused(
    client: FlaskClient, tokens: Tokens, name: str
) -> None:
    h = tokens.headers("writer")
    assert client.put(f"{BASE}/tasks/t/turns/0", json={}, headers=h).status_code == 200
    r = client.put(f"{BASE}/tasks/t/turns/0/artifacts/{name}", data=b"x", headers=h)
    assert r.status_code in (404, 422), r.data
    assert client.get(f"{BASE}/tasks/t/turns/0", headers=h).get_json()["artifacts"] == []


def test_header_ids_ending_in_a_dot_name_a_project_of_their_own(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    admin = tokens.headers("tenant_admin", **{"X-Sandbox-Project-Id": "web."})
    who = client.get(f"{BASE}/whoami", headers=admin).get_json()
    assert (who["tenant"], who["project"]) == ("acme", "web.")
    assert client.put(f"{BASE}/tasks/a/turns/0", json={}, headers=admin).status_code == 200
    assert client.get(f"{BASE}/tasks", headers=tokens.headers("writer")).get_json()["tasks"] == []
    root = tokens.headers("admin", **{"X-Sandbox-Tenant-Id": "acme.", "X-Sandbox-Project-Id": "p."})
    assert client.put(f"{BASE}/tasks/a./turns/0", json={}, headers=root).status_code == 200
    tasks = app.extensions["storage"].tasks
    assert [t.task_id for t in tasks.list_tasks(Scope("acme", "web.")).tasks] == ["a"]
    assert [t.task_id for t in tasks.list_tasks(Scope("acme.", "p.")).tasks] == ["a."]
    assert tasks.list_tasks(Scope("acme", "web")).tasks == ()


@pytest.mark.tree_only("reads the tree's directories")
def test_on_the_tree_each_is_its_own_directory_and_file(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    """Beside ``t.``, ``t`` and ``t..`` are other directories; beside ``x.``, the temp and
    kept-aside names of a write (``.~tmp-...``) hold a ``~``, which no name may: nothing
    collides, and fsck finds the tree whole."""
    h = tokens.headers("writer")
    for task in TASKS:
        assert client.put(f"{BASE}/tasks/{task}/turns/0", json={}, headers=h).status_code == 200
        for name in ARTIFACTS:
            url = f"{BASE}/tasks/{task}/turns/0/artifacts/{name}"
            assert client.put(url, data=b"1", headers=h).status_code == 200
            assert client.put(url, data=b"2", headers=h).status_code == 200
    project = Path(app.config["STORAGE_ROOT"]) / "acme" / "web"
    assert {p.name for p in project.iterdir() if p.name[0].isalnum()} == set(TASKS)
    for task in TASKS:
        files = project / task / "0000-turn" / "artifacts"
        assert sorted(p.name for p in files.iterdir()) == sorted(ARTIFACTS)
        assert all((files / name).read_bytes() == b"2" for name in ARTIFACTS)
    report = app.extensions["storage"].fsck()
    assert report.clean, report
