"""An import holds every record to the rules the API holds a write to, before anything is
published, on every backend: a backup made by the service's own export, one field of one
record changed (and the member's SHA-256 and the manifest made to agree again), is refused
with one line naming the member and the field, never a traceback, and the target answers as
before."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from tests.conftest import BufferedClient, FixedClock

pytestmark = pytest.mark.all_backends
PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"
PAX_SHA256 = "PROJECTMEMORY.sha256"
Record = dict[str, Any]


@pytest.fixture
def make_app(
    backend_kind: str, request: pytest.FixtureRequest, tmp_path: Path, clock: FixedClock
) -> Iterator[Callable[[str], Flask]]:
    made: list[Flask] = []

    def make(name: str) -> Flask:
        config: dict[str, Any] = {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / name / "root"),
            "TOKENS_FILE": str(tmp_path / name / "tokens.json"),
            "CLOCK": clock,
            "LOCK_TIMEOUT": 5.0,
            "THREADS": 2,
        }
        if backend_kind != "tree":
            config.update(request.getfixturevalue("services").settings())
        app = create_app(config)
        app.test_client_class = BufferedClient
        made.append(app)
        return app

    yield make
    for app in made:
        app.extensions["traffic"].close()
        app.extensions["storage"].close()


def admin(app: Flask) -> dict[str, str]:
    _, secret = app.extensions["token_registry"].create(role="admin")
    return {"Authorization": f"Bearer {secret}", "X-Sandbox-Tenant-Id": "acme",
            "X-Sandbox-Project-Id": "web"}  # fmt: skip


@pytest.fixture
def backup(make_app: Callable[[str], Flask], tmp_path: Path) -> Path:
    """A backup of acme/web by the service's own export: a task of two turns, one with an
    artifact, and a store whose memory has two versions."""
    app = make_app("source")
    client, h = app.test_client(), admin(app)
    for turn, summary in ((0, "first"), (1, "second")):
        r = client.put(
            f"{PM}/tasks/t/turns/{turn}", json={"meta": {"n": turn}, "summary_md": summary},
            headers=h,
        )  # fmt: skip
        assert r.status_code == 200, r.json
    r = client.put(
        f"{PM}/tasks/t/turns/1/artifacts/a.txt",
        data=b"abc",
        headers={**h, "Content-Type": "text/plain"},
    )
    assert r.status_code == 200, r.json
    store = client.post(MS, headers=h, json={"name": "S"}).json["id"]
    memory = client.post(
        f"{MS}/{store}/memories", headers=h, json={"path": "/a.md", "content": "one"}
    ).json
    r = client.post(f"{MS}/{store}/memories/{memory['id']}", headers=h, json={"content": "two"})
    assert r.status_code == 200, r.json
    path = tmp_path / "web.tar.gz"
    result = app.test_cli_runner().invoke(
        args=["export", "--tenant", "acme", "--project", "web", str(path)]
    )
    assert result.exit_code == 0, result.output
    return path


def members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(i.name, tar.extractfile(i).read()) for i in tar if i.isreg()]  # type: ignore[union-attr]


def rewrite(path: Path, change: Callable[[str, Record], Record | None], out: Path) -> Path:
    """The backup with ``change`` applied to each JSON record (None: unchanged), each member's
    SHA-256 and the manifest's digest made to agree with what it now holds."""
    raw = io.BytesIO()
    chain, n = hashlib.sha256(), 0
    manifest: Record = {}
    with tarfile.open(fileobj=raw, mode="w|gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members(path):
            if name == "manifest.json":
                manifest = json.loads(data)
                continue
            if name.endswith(".json"):
                changed = change(name, copy.deepcopy(json.loads(data)))
                if changed is not None:
                    data = json.dumps(changed).encode()
            sha = hashlib.sha256(data).hexdigest()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.pax_headers = len(data), 0o600, {PAX_SHA256: sha}
            tar.addfile(info, io.BytesIO(data))
            chain.update(f"{name}\0{len(data)}\0{sha}\n".encode())
            n += 1
        manifest.update(members=n, digest=chain.hexdigest())
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    out.write_bytes(raw.getvalue())
    return out


def turn(n: int, edit: Callable[[Record], None]) -> Callable[[str, Record], Record | None]:
    def change(name: str, record: Record) -> Record | None:
        if name.endswith(f"/{n:04d}-turn/meta.json"):
            edit(record)
            return record
        return None

    return change


def version(which: str, edit: Callable[[Record], None]) -> Callable[[str, Record], Record | None]:
    """Edit the ``which`` ("created" or "modified") version of the memory."""

    def change(name: str, record: Record) -> Record | None:
        if "/versions/" in name and record.get("operation") == which:
            edit(record)
            return record
        return None

    return change


def _artifact(field: str, value: Any) -> Callable[[Record], None]:
    return lambda r: r["artifacts"][0].__setitem__(field, value)


def _set(field: str, value: Any) -> Callable[[Record], None]:
    return lambda r: r.__setitem__(field, value)


def _content(text: str) -> Callable[[Record], None]:
    def edit(r: Record) -> None:
        r["content"] = text
        r["content_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        r["content_size_bytes"] = len(text.encode())

    return edit


# case -> (the change, what the refusal names)
CASES: dict[str, tuple[Callable[[str, Record], Record | None], str]] = {
    "retain_until not a time": (turn(0, _set("retain_until", "later")), "retain_until"),
    "retain_until in year 9999": (
        turn(0, _set("retain_until", "9999-12-31T23:59:59.999999Z")),
        "retain_until",
    ),
    "updated_us past any clock": (turn(0, _set("updated_us", 10**30)), "updated_us"),
    "created_at not a time": (turn(0, _set("created_at", "\x00")), "created_at"),
    "a summary over 1 MiB": (turn(0, _set("summary_md", "x" * ((1 << 20) + 1))), "summary_md"),
    "a summary with a lone surrogate": (turn(0, _set("summary_md", "\ud800")), "summary_md"),
    "meta not an object": (turn(0, _set("meta", [1, 2])), "meta"),
    "a content type with CR/LF": (
        turn(1, _artifact("content_type", "text/plain\r\nX-Evil: 1")),
        "content_type",
    ),
    "a content type with NUL": (
        turn(1, _artifact("content_type", "text/pl\x00ain")),
        "content_type",
    ),
    "a memory over 100 KB": (version("modified", _content("y" * 102_401)), "content"),
    "a reserved memory path": (version("created", _set("path", "/.~tmp-x")), "path"),
    "a memory path with NUL": (version("created", _set("path", "/a\x00b.md")), "path"),
    "a content_sha256 that is not the content's": (
        version("modified", _set("content_sha256", "0" * 64)),
        "content_sha256",
    ),
    "a content size that is not the content's": (
        version("modified", _set("content_size_bytes", 4)),
        "content_size_bytes",
    ),
    "a version time past any clock": (version("created", _set("created_us", 10**30)), "created_us"),
    "a memory content that is not text": (version("modified", _set("content", 5)), "content"),
    "a memory path that is not text": (version("created", _set("path", 7)), "path"),
    "a version time that is not a number": (
        version("created", _set("created_us", "soon")),
        "created_us 'soon' is not a whole number",
    ),
    "a turn number that is not a number": (
        turn(0, _set("turn", "first")),
        "turn 'first' is not a whole number",
    ),
    "an operation the API has not": (version("modified", _set("operation", "x")), "operation"),
}


def answers(app: Flask) -> dict[str, Any]:
    client: FlaskClient = app.test_client()
    h = admin(app)
    return {
        "tasks": client.get(f"{PM}/tasks", headers=h).json,
        "stores": client.get(MS, headers=h).json,
        "digest": client.get(f"{PM}/project.md", headers=h).get_data(as_text=True),
    }


def import_refused(app: Flask, path: Path, said: str) -> None:
    before = answers(app)
    result = app.test_cli_runner().invoke(args=["import", str(path)])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: import refused: "), result.output
    assert said in lines[0], lines[0]
    assert answers(app) == before
    fsck = app.test_cli_runner().invoke(args=["fsck"])
    assert fsck.exit_code == 0, fsck.output


@pytest.mark.shared_rule
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_record_the_api_would_refuse_is_refused_and_nothing_is_published(
    make_app: Callable[[str], Flask], backup: Path, tmp_path: Path, case: str
) -> None:
    change, said = CASES[case]
    crafted = rewrite(backup, change, tmp_path / "crafted.tar.gz")
    target = make_app("target")
    import_refused(target, crafted, said)


def test_the_unchanged_backup_imports(
    make_app: Callable[[str], Flask], backup: Path, tmp_path: Path
) -> None:
    """The rewrite itself keeps a backup importable: the refusals above are the change's."""
    same = rewrite(backup, lambda name, record: None, tmp_path / "same.tar.gz")
    target = make_app("target")
    result = target.test_cli_runner().invoke(args=["import", str(same)])
    assert result.exit_code == 0, result.output
    assert [t["task_id"] for t in answers(target)["tasks"]["tasks"]] == ["t"]


def test_a_version_chain_that_loops_is_refused(
    make_app: Callable[[str], Flask], backup: Path, tmp_path: Path
) -> None:
    ids: dict[str, str] = {}
    for name, data in members(backup):
        if "/versions/" in name:
            record = json.loads(data)
            ids[record["operation"]] = record["id"]

    def change(name: str, record: Record) -> Record | None:
        if "/versions/" in name and record["operation"] == "created":
            record["previous_version_id"] = ids["modified"]
            return record
        return None

    crafted = rewrite(backup, change, tmp_path / "loop.tar.gz")
    import_refused(make_app("target"), crafted, "previous_version_id")


def test_a_content_type_with_cr_lf_is_refused_as_such_on_every_backend(
    make_app: Callable[[str], Flask], backup: Path, tmp_path: Path
) -> None:
    """On PostgreSQL it once reached the object store, which refused the header: "object
    store unavailable", a misleading line."""
    change, said = CASES["a content type with CR/LF"]
    crafted = rewrite(backup, change, tmp_path / "crlf.tar.gz")
    import_refused(make_app("target"), crafted, said)
