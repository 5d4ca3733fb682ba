"""Traversal and hostile names on every id, name and path parameter; planted symlinks.

Every hostile value, in every slot of every route and with every method, is answered
400/404/405/422: never 200, never 500. Nothing appears outside the storage root. Symlinks
planted inside the root (a ``meta.json`` pointing at a file outside, a task directory
pointing at a directory outside that looks like a task) are never followed by reads, writes,
the retention sweeper or fsck. The decoys stand in for ``/etc/hosts`` and ``/`` so that a
bug can only ever damage the test's own files.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.names import Scope
from app.storage.tree.fsck import fsck
from app.storage.tree.retention import sweep
from tests.conftest import Tokens
from tests.robust.helpers import BASE, tree_outside

# Runs against every backend MEMORY_TEST_BACKENDS names (tests/conftest.py).
pytestmark = pytest.mark.all_backends

HOSTILE = [
    "..",
    ".",
    "%2e%2e%2f",
    "..%2f",
    "..%2fetc%2fpasswd",
    "/etc/passwd",
    "a/../../b",
    "\\..\\",
    "..\\..\\etc",
    "a\x00b",
    "%00",
    "\u2025",  # ‥
    "\uff0e\uff0e",  # ．．
    "\uff0f",  # ／
    "\u2024\u2024",
    "a" * 256,
    "a" * 129,
    "task ",
    " task",
    "",
    "a,b",
    "~",
    ".~tmp-x",
]
ROUTES = [
    ("GET", "/tasks/{task_id}"),
    ("DELETE", "/tasks/{task_id}"),
    ("GET", "/tasks/{task_id}/turns/{turn}"),
    ("PUT", "/tasks/{task_id}/turns/{turn}"),
    ("GET", "/tasks/{task_id}/turns/{turn}/artifacts/{name}"),
    ("PUT", "/tasks/{task_id}/turns/{turn}/artifacts/{name}"),
]
REFUSED = {400, 404, 405, 422}


def _urls(template: str, value: str) -> list[str]:
    """``value`` in each slot of ``template`` (the others valid), percent-encoded and raw."""
    valid = {"task_id": "t", "turn": "0", "name": "a.bin"}
    out = []
    for slot in ("task_id", "turn", "name"):
        if "{" + slot + "}" not in template:
            continue
        for encoded in (quote(value, safe=""), quote(value, safe="/%")):
            out.append(template.format(**{**valid, slot: encoded}))
    return out


@pytest.fixture
def seeded(app: Flask, client: FlaskClient, tokens: Tokens) -> dict[str, str]:
    h = tokens.headers("project_admin")
    assert (
        client.put(f"{BASE}/tasks/t/turns/0", json={"summary_md": "mine"}, headers=h).status_code
        == 200
    )
    assert (
        client.put(f"{BASE}/tasks/t/turns/0/artifacts/a.bin", data=b"A", headers=h).status_code
        == 200
    )
    return h


def test_hostile_values_in_every_slot(
    app: Flask, client: FlaskClient, seeded: dict[str, str], tmp_path: Path, backend_kind: str
) -> None:
    root = Path(app.config["STORAGE_ROOT"])
    outside_before = tree_outside(tmp_path) - {
        p for p in tree_outside(tmp_path) if p.startswith("root")
    }
    seen = 0
    for method, template in ROUTES:
        for value in HOSTILE:
            for url in _urls(template, value):
                resp = client.open(
                    f"{BASE}{url}", method=method, data=b'{"summary_md": "x"}', headers=seeded
                )
                seen += 1
                assert resp.status_code in REFUSED, (method, url, resp.status_code, resp.data[:200])
                assert b"mine" not in resp.data
    assert seen > 300
    outside_after = {p for p in tree_outside(tmp_path) if not p.startswith("root")}
    assert outside_after == outside_before
    assert [
        t.task_id for t in app.extensions["storage"].tasks.list_tasks(Scope("acme", "web")).tasks
    ] == ["t"]
    if backend_kind != "tree":
        return
    # The only task is the one we made; no stray names inside the root either.
    assert sorted(
        p.name for p in (root / "acme" / "web").iterdir() if not p.name.startswith(("_", "."))
    ) == ["t"]


def test_hostile_scope_headers(client: FlaskClient, tokens: Tokens) -> None:
    for value in HOSTILE:
        if "\x00" in value or value != value.strip() or not value:
            continue  # not a header value a client can send
        for header in ("X-Sandbox-Project-Id", "X-Sandbox-Tenant-Id"):
            h = tokens.headers("admin", **{header: value.encode("utf-8").decode("latin-1")})
            resp = client.get(f"{BASE}/tasks", headers=h)
            assert resp.status_code in {400, 403, 422}, (header, value, resp.status_code)


def test_hostile_cursor_and_limit(client: FlaskClient, seeded: dict[str, str]) -> None:
    for value in [*HOSTILE, "A" * 5000, "eyJ2IjoxfQ", "-1"]:
        for q in ("cursor", "limit"):
            resp = client.get(f"{BASE}/tasks?{q}={quote(value, safe='')}", headers=seeded)
            if q == "cursor" and value == "":
                assert resp.status_code == 200  # an empty cursor is the first page
                continue
            assert resp.status_code in {400, 422}, (q, value, resp.status_code)


def _raw(url: str, request: bytes) -> int:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


@pytest.mark.e2e
def test_raw_paths_and_duplicate_headers_on_a_real_server(
    live_factory: Any, tmp_path: Path
) -> None:
    """What the test client normalises away: raw ``..`` segments, encoded slashes, header joins."""
    server = live_factory(workers=1, threads=2)
    secret = server.token("writer")
    outside_before = {p for p in tree_outside(tmp_path) if not p.startswith("storage")}
    paths = [
        f"{BASE}/tasks/../../../../etc/passwd",
        f"{BASE}/tasks/%2e%2e/turns/0",
        f"{BASE}/tasks/..%2f..%2fetc/turns/0",
        f"{BASE}/tasks/t%00x/turns/0",
        f"{BASE}/tasks/t/turns/0/artifacts/..%2f..%2f..%2fx",
        f"{BASE}/tasks/t/turns/0/artifacts/%2e%2e",
        f"{BASE}/tasks/%E2%80%A5/turns/0",
        f"{BASE}/tasks/t/turns/%2e%2e",
        f"{BASE}/tasks/t\\..\\x/turns/0",
    ]
    for path in paths:
        for method in ("GET", "PUT"):
            req = (
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
                f"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            ).encode("latin-1")
            status = _raw(server.url, req)
            assert status in REFUSED, (method, path, status)
    for header in ("X-Sandbox-Project-Id", "X-Sandbox-Tenant-Id"):
        req = (
            f"GET {BASE}/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
            f"{header}: web\r\n{header}: other\r\nConnection: close\r\n\r\n"
        ).encode()
        assert _raw(server.url, req) in {400, 403, 422}, header
    # Underscore spellings are dropped by gunicorn, never read as the scoping header.
    req = (
        f"GET {BASE}/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
        "X_Sandbox_Project_Id: other\r\nConnection: close\r\n\r\n"
    ).encode()
    assert _raw(server.url, req) == 200
    assert {p for p in tree_outside(tmp_path) if not p.startswith("storage")} - outside_before <= {
        p for p in tree_outside(tmp_path) if p.startswith("gunicorn-")
    }


@pytest.mark.tree_only("plants symlinks in the tree")
def test_planted_symlinks_are_never_followed(
    app: Flask, client: FlaskClient, seeded: dict[str, str], tmp_path: Path
) -> None:
    store = app.extensions["storage"].tasks
    project = Path(app.config["STORAGE_ROOT"]) / "acme" / "web"
    # Decoys outside the root: a file standing in for /etc/hosts, a directory for /.
    hosts = tmp_path / "decoy-hosts"
    hosts.write_text('{"task_id": "OUTSIDE", "secret": "HOSTS"}')
    slash = tmp_path / "decoy-slash"
    (slash / "0000-turn" / "artifacts").mkdir(parents=True)
    (slash / "0000-turn" / "meta.json").write_text('{"secret": "SLASH"}')
    (slash / "0000-turn" / "artifacts" / "a.bin").write_text("SLASH-BYTES")
    (slash / "index.json").write_text('{"secret": "SLASH"}')
    (slash / ".~tmp-old").write_text("stale temp file in the decoy")
    os.utime(slash / ".~tmp-old", (0, 0))
    before = {p: p.read_bytes() for p in [hosts, *slash.rglob("*")] if p.is_file()}

    # A task whose turn meta.json is a link to the decoy hosts file.
    h = seeded
    assert (
        client.put(f"{BASE}/tasks/linked/turns/0", json={"summary_md": "x"}, headers=h).status_code
        == 200
    )
    meta = project / "linked" / "0000-turn" / "meta.json"
    meta.unlink()
    os.symlink(hosts, meta)
    # A task directory that is a link to the decoy "/".
    os.symlink(slash, project / "rooted")

    for method, url in [
        ("GET", "/tasks/linked"),
        ("GET", "/tasks/linked/turns/0"),
        ("PUT", "/tasks/linked/turns/0"),
        ("PUT", "/tasks/linked/turns/0/artifacts/a.bin"),
        ("GET", "/tasks/linked/turns/0/artifacts/a.bin"),
        ("GET", "/tasks/rooted"),
        ("GET", "/tasks/rooted/turns/0"),
        ("GET", "/tasks/rooted/turns/0/artifacts/a.bin"),
        ("PUT", "/tasks/rooted/turns/0"),
        ("PUT", "/tasks/rooted/turns/1"),
        ("PUT", "/tasks/rooted/turns/0/artifacts/a.bin"),
        ("DELETE", "/tasks/rooted"),
        ("DELETE", "/tasks/linked"),
    ]:
        resp = client.open(f"{BASE}{url}", method=method, data=b'{"summary_md": "x"}', headers=h)
        # The index of "linked" is a real file of the task: reading it is fine. Everything
        # that would have to pass through a link is refused.
        # Deleting it moves the task directory, link and all, into the trash unfollowed.
        allowed = {
            ("GET", "/tasks/linked"): {200, 404},
            ("DELETE", "/tasks/linked"): {204, 404},
        }.get((method, url), {404})
        assert resp.status_code in allowed, (method, url, resp.status_code)
        assert b"HOSTS" not in resp.data and b"SLASH" not in resp.data, (method, url)
    listing = client.get(f"{BASE}/tasks", headers=h)
    assert b"HOSTS" not in listing.data and b"SLASH" not in listing.data
    digest = client.get(f"{BASE}/project.md", headers=h)
    assert b"HOSTS" not in digest.data and b"SLASH" not in digest.data

    # The sweeper, far in the future (everything expired, every temp file stale), and fsck
    # with repair, touch neither decoy.
    sweep(store, now=datetime.now(UTC) + timedelta(days=400), grace=timedelta(0))
    report = fsck(store, repair=True, grace=timedelta(0))
    assert any("symlink" in p for p in report.problems), report.problems
    after = {p: p.read_bytes() for p in [hosts, *slash.rglob("*")] if p.is_file()}
    assert after == before
    assert os.path.islink(project / "rooted") and os.readlink(project / "rooted") == str(slash)
    assert Scope("acme", "web")


STORE_ROUTES = [
    ("GET", "/v1/memory_stores/{memory_store_id}"),
    ("POST", "/v1/memory_stores/{memory_store_id}"),
    ("DELETE", "/v1/memory_stores/{memory_store_id}"),
    ("POST", "/v1/memory_stores/{memory_store_id}/archive"),
    ("GET", "/v1/memory_stores/{memory_store_id}/memories"),
    ("POST", "/v1/memory_stores/{memory_store_id}/memories"),
    ("GET", "/v1/memory_stores/{memory_store_id}/memories/{memory_id}"),
    ("POST", "/v1/memory_stores/{memory_store_id}/memories/{memory_id}"),
    ("PATCH", "/v1/memory_stores/{memory_store_id}/memories/{memory_id}"),
    ("DELETE", "/v1/memory_stores/{memory_store_id}/memories/{memory_id}"),
    ("GET", "/v1/memory_stores/{memory_store_id}/memory_versions"),
    ("GET", "/v1/memory_stores/{memory_store_id}/memory_versions/{memory_version_id}"),
    ("POST", "/v1/memory_stores/{memory_store_id}/memory_versions/{memory_version_id}/redact"),
]


def test_memory_stores_hostile_ids_and_paths(
    app: Flask, client: FlaskClient, tokens: Tokens, tmp_path: Path
) -> None:
    h = tokens.headers("writer")
    created = client.post("/v1/memory_stores", json={"name": "s"}, headers=h)
    if created.status_code != 200:
        pytest.skip("the memory-stores API is not there")
    sid = created.get_json()["id"]
    mem = client.post(
        f"/v1/memory_stores/{sid}/memories", json={"path": "/ok.md", "content": "mine"}, headers=h
    )
    assert mem.status_code == 200, mem.data
    valid = {
        "memory_store_id": sid,
        "memory_id": mem.get_json()["id"],
        "memory_version_id": "memver_x",
    }
    outside_before = {p for p in tree_outside(tmp_path) if not p.startswith("root")}
    for method, template in STORE_ROUTES:
        for slot in ("memory_store_id", "memory_id", "memory_version_id"):
            if "{" + slot + "}" not in template:
                continue
            for value in HOSTILE:
                for encoded in (quote(value, safe=""), quote(value, safe="/%")):
                    url = template.format(**{**valid, slot: encoded})
                    resp = client.open(
                        url, method=method, json={"content": "x", "path": "/p.md"}, headers=h
                    )
                    assert resp.status_code in REFUSED, (
                        method,
                        url,
                        resp.status_code,
                        resp.data[:200],
                    )
                    assert b"mine" not in resp.data
    for path in [
        "/../../etc/passwd",
        "/a/../../b",
        "../x",
        "/a/./b",
        "//etc/passwd",
        "/a\\..\\b",
        "/a\x00b",
        "/\u2025/x",
        "/\uff0e\uff0e/x",
        "/a\uff0fb",
        "/" + "a" * 300,
        "/a/" * 200,
        "/.~tmp-x",
        "/x.",
        "/x ",
    ]:
        resp = client.post(
            f"/v1/memory_stores/{sid}/memories", json={"path": path, "content": "x"}, headers=h
        )
        assert resp.status_code != 500, (path, resp.data[:200])
        if resp.status_code == 200:
            # Accepted names are stored as themselves, inside the store, never resolved.
            got = client.get(f"/v1/memory_stores/{sid}/memories/{resp.get_json()['id']}", headers=h)
            assert got.status_code == 200 and got.get_json()["path"] == resp.get_json()["path"]
    assert {p for p in tree_outside(tmp_path) if not p.startswith("root")} == outside_before
