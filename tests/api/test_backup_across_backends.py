"""A backup moves between backends: a deployment on the tree, restored on PostgreSQL + S3 and
from there onto a tree again, answers every GET the same (status, ETag, body: ids, versions,
listing order and cursors, project.md bytes), through `flask --app wsgi export` / `import`;
so does one project of it restored into another project."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from tests.conftest import BufferedClient, FixedClock, Services, selected_backends

pytestmark = pytest.mark.skipif(
    "pg" not in selected_backends(), reason="MEMORY_TEST_BACKENDS does not name pg"
)
PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"


@pytest.fixture
def deployment(
    tmp_path: Path, clock: FixedClock, request: pytest.FixtureRequest
) -> Iterator[Callable[[str, str], Flask]]:
    """An app on the deployment ``name`` of ``kind`` ("tree" or "pg"): a new one on first
    use, the same one after (as a server started again on it)."""
    apps: list[Flask] = []
    configs: dict[str, dict[str, Any]] = {}

    def make(kind: str, name: str) -> Flask:
        if name not in configs:
            configs[name] = {
                "TESTING": True,
                "STORAGE_ROOT": str(tmp_path / name / "root"),
                "TOKENS_FILE": str(tmp_path / name / "tokens.json"),
                "CLOCK": clock,
                "LOCK_TIMEOUT": 5.0,
                "THREADS": 2,
            }
            if kind == "pg":
                services: Services = request.getfixturevalue("services")
                configs[name].update(services.settings())
        app = create_app(configs[name])
        app.test_client_class = BufferedClient
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["storage"].close()


def _client(app: Flask, role: str = "admin") -> FlaskClient:
    _, secret = app.extensions["token_registry"].create(role=role, tenant="acme", project="web")
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {secret}"
    return client


def _ok(response: Any) -> Any:
    assert response.status_code < 300, (response.status_code, response.get_data()[:300])
    return response.get_json()


def _populate(client: FlaskClient, clock: FixedClock) -> list[str]:
    """Tasks with turns and artifacts (one replaced), stores with versions, a deleted memory,
    an archived store and a redacted version; return the GETs that show all of it."""
    gets = [f"{PM}/tasks", f"{PM}/tasks?limit=2", f"{PM}/project.md", f"{MS}?include_archived=true"]
    gets += [f"{MS}?limit=1", f"{PM}/tasks?failed=true", f"{PM}/tasks?model=m1"]
    for t in range(5):
        for turn in range(2):
            meta = {"model": f"m{t % 2}", "exit_code": t % 2, "cost": 0.1 * t, "n": [t, turn]}
            _ok(
                client.put(
                    f"{PM}/tasks/task-{t}/turns/{turn}",
                    json={"meta": meta, "summary_md": f"# {t}.{turn}\n\nünïcode"},
                )
            )
            clock.advance(seconds=1)
            gets += [f"{PM}/tasks/task-{t}/turns/{turn}", f"{PM}/tasks/task-{t}"]
        for name in ("log.txt", "out.bin", "log.txt"):  # the second log.txt replaces the first
            _ok(
                client.put(
                    f"{PM}/tasks/task-{t}/turns/0/artifacts/{name}",
                    data=os.urandom(20_000),
                    headers={"Content-Type": "text/plain"},
                )
            )
            clock.advance(seconds=1)
            gets.append(f"{PM}/tasks/task-{t}/turns/0/artifacts/{name}")
    page = _ok(client.get(f"{PM}/tasks?limit=2"))
    gets.append(f"{PM}/tasks?limit=2&cursor={page['next_cursor']}")
    for name in ("Prefs", "Notes", "Old"):
        store = _ok(client.post(MS, json={"name": name, "metadata": {"n": name}}))
        sid = store["id"]
        first = _ok(client.post(f"{MS}/{sid}/memories", json={"path": "/a/one.md", "content": "1"}))
        clock.advance(seconds=1)
        second = _ok(client.post(f"{MS}/{sid}/memories/{first['id']}", json={"content": "2"}))
        _ok(client.post(f"{MS}/{sid}/memories", json={"path": "/b.md", "content": "b"}))
        gone = _ok(client.post(f"{MS}/{sid}/memories", json={"path": "/c.md", "content": "c"}))
        _ok(client.delete(f"{MS}/{sid}/memories/{gone['id']}"))
        clock.advance(seconds=1)
        gets += [
            f"{MS}/{sid}",
            f"{MS}/{sid}/memories",
            f"{MS}/{sid}/memories?depth=1",
            f"{MS}/{sid}/memories?view=full",
            f"{MS}/{sid}/memories/{first['id']}",
            f"{MS}/{sid}/memories/{gone['id']}",
            f"{MS}/{sid}/memory_versions?view=full",
            f"{MS}/{sid}/memory_versions?memory_id={first['id']}",
            f"{MS}/{sid}/memory_versions/{first['memory_version_id']}",
            f"{MS}/{sid}/memory_versions/{second['memory_version_id']}?view=full",
        ]
        listed = _ok(client.get(f"{MS}/{sid}/memories?limit=1"))
        gets.append(f"{MS}/{sid}/memories?limit=1&page={listed['next_page']}")
        versions = _ok(client.get(f"{MS}/{sid}/memory_versions?limit=2"))
        gets.append(f"{MS}/{sid}/memory_versions?limit=2&page={versions['next_page']}")
        if name == "Notes":
            _ok(client.post(f"{MS}/{sid}/memory_versions/{first['memory_version_id']}/redact"))
        if name == "Old":
            _ok(client.post(f"{MS}/{sid}/archive"))
    return gets


def _answers(client: FlaskClient, gets: list[str]) -> dict[str, tuple[int, str | None, bytes]]:
    """Status, ETag and body of each GET (but an error's request id, new at every request)."""
    out = {}
    for path in gets:
        r = client.get(path)
        body = re.sub(rb"\"req_[0-9A-Z]+\"", b'"req"', r.get_data())
        out[path] = (r.status_code, r.headers.get("ETag"), body)
    return out


def _cli(app: Flask, *args: str) -> str:
    result = app.test_cli_runner().invoke(args=list(args))
    assert result.exit_code == 0, result.output
    return str(result.output)


def _members(backup: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(backup.read_bytes()))) as tar:
        return [(i.name, f.read() if (f := tar.extractfile(i)) else b"") for i in tar]


def test_tree_to_postgresql_to_tree_answers_every_get_the_same(
    deployment: Callable[[str, str], Flask], tmp_path: Path, clock: FixedClock
) -> None:
    tree = deployment("tree", "first")
    gets = _populate(_client(tree), clock)
    expected = _answers(_client(tree, "reader"), gets)
    assert all(status == 200 for status, _, _ in expected.values() if status != 404)
    first = tmp_path / "first.tar.gz"
    assert "exported" in _cli(tree, "export", str(first))

    assert "imported 5 task(s), 10 turn(s), 10 artifact(s)" in _cli(
        deployment("pg", "second"), "import", str(first)
    )
    pg = deployment("pg", "second")  # started on the restored deployment: its cursor key
    assert _answers(_client(pg, "reader"), gets) == expected
    second = tmp_path / "second.tar.gz"
    _cli(pg, "export", str(second))
    assert _members(second) == _members(first)

    _cli(deployment("tree", "third"), "import", str(second))
    again = deployment("tree", "third")
    assert _answers(_client(again, "reader"), gets) == expected
    assert "fsck: clean" in _cli(again, "fsck") and "fsck: clean" in _cli(pg, "fsck")

    # One project of the tree, into another project on PostgreSQL.
    web = tmp_path / "web.tar.gz"
    _cli(tree, "export", "--tenant", "acme", "--project", "web", str(web))
    copy = deployment("pg", "fourth")
    _cli(copy, "import", "--tenant", "acme", "--project", "copy", str(web))
    _, secret = copy.extensions["token_registry"].create(
        role="reader", tenant="acme", project="copy"
    )
    reader = copy.test_client()
    reader.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {secret}"
    got = _answers(reader, gets)
    for path in gets:
        if path.endswith("project.md"):  # its title names the project
            assert got[path][2].replace(b"acme/copy", b"acme/web") == expected[path][2]
        elif "page=" not in path and "cursor=" not in path:  # signed for a project by a key
            assert got[path][:2] == expected[path][:2], path
            assert _uncursored(got[path][2]) == _uncursored(expected[path][2]), path


def _uncursored(body: bytes) -> Any:
    try:
        found = json.loads(body)
    except ValueError:
        return body  # an artifact's bytes
    if isinstance(found, dict):
        found.pop("next_cursor", None)
        found.pop("next_page", None)
    return found
