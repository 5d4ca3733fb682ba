"""A link planted anywhere in the tree is never followed, by any code path.

Each case copies a small root (tasks with artifacts, a memory store with memories and
versions, a deleted memory, a second tenant), replaces one entry with a symlink to a
directory (or a file) outside the root, and drives one operation that can reach it: both
APIs, the memory tool, the sweeper, fsck (check and repair), export, import and the start-up
recovery. Afterwards the outside tree is byte-for-byte unchanged (no file read into a
response or an archive, none written, none deleted), no request is a 5xx, every request
that addresses the linked entry is a 4xx, and every operation of the tree reports the link.

Each case copies the tree and builds an app: the whole matrix (800 cases) runs in `make slow`;
`make test` keeps, for each operation, two sites (one it must refuse or report, one it need
not), and each site at least once (``representative``).
"""

from __future__ import annotations

import gzip
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.storage.core.names import Scope
from tests.conftest import T0, BufferedClient, FixedClock
from tests.storage._helpers import snapshot

MARKER = b"OUTSIDE-MARKER"
ACME = Scope("acme", "web")
OLD = time.time() - 3 * 86400  # older than every grace period


@dataclass
class Golden:
    """A root built once through the APIs; each test works on a copy."""

    path: Path
    tokens_file: Path
    secrets: dict[str, str]
    store_id: str
    store_dir: str
    memory_a: str
    old_version: str
    archive: Path


def _headers(secret: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", **extra}


def _make_app(root: Path, tokens_file: Path, clock: FixedClock) -> Flask:
    app = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(root),
            "TOKENS_FILE": str(tokens_file),
            "CLOCK": clock,
            "LOCK_TIMEOUT": 2.0,
            "SWEEP_INTERVAL": 0,
        }
    )
    app.test_client_class = BufferedClient
    return app


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Golden:
    base = tmp_path_factory.mktemp("golden")
    root, tokens_file = base / "root", base / "tokens.json"
    app = _make_app(root, tokens_file, FixedClock())
    registry = app.extensions["token_registry"]
    secrets = {}
    for name, kwargs in {
        "writer": {"role": "writer", "tenant": "acme", "project": "web"},
        "padmin": {"role": "project_admin", "tenant": "acme", "project": "web"},
        "tadmin": {"role": "tenant_admin", "tenant": "acme"},
        "beta": {"role": "writer", "tenant": "beta", "project": "web"},
    }.items():
        secrets[name] = registry.create(**kwargs)[1]
    client = app.test_client()
    w, b = _headers(secrets["writer"]), _headers(secrets["beta"])
    pm = "/sandbox/memory/v1"
    for task, turns in (("keep", (0,)), ("evil", (0, 1))):
        for turn in turns:
            r = client.put(
                f"{pm}/tasks/{task}/turns/{turn}", json={"summary_md": f"{task} {turn}"}, headers=w
            )
            assert r.status_code == 200, r.json
        r = client.put(
            f"{pm}/tasks/{task}/turns/0/artifacts/a.bin",
            data=b"inside bytes",
            headers={**w, "Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 200, r.json
    # A deleted task leaves the trash directory behind.
    client.put(f"{pm}/tasks/gone/turns/0", json={"summary_md": "x"}, headers=w)
    assert client.delete(f"{pm}/tasks/gone", headers=w).status_code == 204
    assert client.get(f"{pm}/project.md", headers=w).status_code == 200
    assert (
        client.put(f"{pm}/tasks/bt/turns/0", json={"summary_md": "b"}, headers=b).status_code == 200
    )

    ms = "/v1/memory_stores"
    store = client.post(ms, json={"name": "Notes"}, headers=w).json
    sid = store["id"]
    a = client.post(f"{ms}/{sid}/memories", json={"path": "/a.md", "content": "one"}, headers=w)
    memory_a = a.json["id"]
    old_version = a.json["memory_version_id"]
    r = client.post(f"{ms}/{sid}/memories/{memory_a}", json={"content": "two"}, headers=w)
    assert r.status_code == 200, r.json
    client.post(f"{ms}/{sid}/memories", json={"path": "/dir/b.md", "content": "b"}, headers=w)
    g = client.post(f"{ms}/{sid}/memories", json={"path": "/gone.md", "content": "g"}, headers=w)
    client.delete(f"{ms}/{sid}/memories/{g.json['id']}", headers=w)
    beta_store = client.post(ms, json={"name": "Beta notes"}, headers=b).json
    client.post(
        f"{ms}/{beta_store['id']}/memories", json={"path": "/secret.md", "content": "s"}, headers=b
    )
    (store_dir,) = [
        e.name for e in os.scandir(root / "acme" / "web" / "_stores") if not e.name.startswith(".")
    ]
    archive = base / "acme-web.tar.gz"
    app.extensions["storage"].export(archive, tenant="acme", project="web")
    return Golden(root, tokens_file, secrets, sid, store_dir, memory_a, old_version, archive)


# -- where links are planted ----------------------------------------------------------------
STORE = ("acme", "web", "_stores", "{store}")
TURN = ("acme", "web", "evil", "0000-turn")
SITES: dict[str, tuple[tuple[str, ...], str]] = {
    "tenant": (("acme",), "dir"),
    "project": (("acme", "web"), "dir"),
    "stores_dir": (("acme", "web", "_stores"), "dir"),
    "store_dir": (STORE, "dir"),
    "memories_dir": ((*STORE, "memories"), "dir"),
    "versions_dir": ((*STORE, "versions"), "dir"),
    "store_json": ((*STORE, "store.json"), "file"),
    "store_index": ((*STORE, "index.sqlite3"), "file"),
    "memory_file": ((*STORE, "memories", "a.md"), "file"),
    "task": (("acme", "web", "evil"), "dir"),
    "turn": (TURN, "dir"),
    "artifacts_dir": ((*TURN, "artifacts"), "dir"),
    "artifact": ((*TURN, "artifacts", "a.bin"), "file"),
    "meta_json": ((*TURN, "meta.json"), "file"),
    "index_json": (("acme", "web", "evil", "index.json"), "file"),
    "task_json": (("acme", "web", "evil", "task.json"), "file"),
    "listing": (("acme", "web", "_listing.sqlite3"), "file"),
    "ledger": (("acme", "web", "_ledger.sqlite3"), "file"),
    "digest": (("acme", "web", "_project.md"), "file"),
    "locks": ((".locks",), "dir"),
    "trash": ((".trash",), "dir"),
}


def _outside(base: Path) -> tuple[Path, Path]:
    """A directory of old files named like the tree's own, and one outside file."""
    outside = base / "outside"
    names = [
        "a.conf",
        "b.conf",
        "sub/c.conf",
        "a.md",
        "dir/b.md",
        "a.bin",
        "meta.json",
        "index.json",
        "task.json",
        "store.json",
        "summary.md",
        "0000-turn/meta.json",
        "0000-turn/artifacts/a.bin",
        "web/evil/index.json",
        ".~tmp-old",
    ]
    for name in names:
        path = outside / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(MARKER + b" " + name.encode())
    file = base / "outside.file"
    file.write_bytes(MARKER + b" file")
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (OLD, OLD))
    return outside, file


@dataclass
class Case:
    app: Flask
    client: FlaskClient
    clock: FixedClock
    root: Path
    base: Path
    golden: Golden
    site: str
    link: Path

    def h(self, who: str = "writer", **extra: str) -> dict[str, str]:
        return _headers(self.golden.secrets[who], **extra)


def representative(ops: list[str], must: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The (site, op) pairs `make test` keeps: for each op, one site of ``must[op]`` and one
    outside it, taken in turn so that the ops spread over the sites; then the first op for
    any site none of those reached."""
    sites = sorted(SITES)
    kept: set[tuple[str, str]] = set()
    for n, op in enumerate(sorted(ops)):
        inside = [s for s in sites if s in must[op]]
        outside = [s for s in sites if s not in must[op]]
        kept |= {(group[n % len(group)], op) for group in (inside, outside) if group}
    reached = {site for site, _ in kept}
    kept |= {(site, sorted(ops)[0]) for site in sites if site not in reached}
    return kept


def matrix(ops: list[str], must: dict[str, set[str]]) -> list[Any]:
    """Every (site, op) pair; those ``representative`` leaves out are marked slow."""
    kept = representative(ops, must)
    return [
        pytest.param(
            site, op, id=f"{op}-{site}", marks=() if (site, op) in kept else pytest.mark.slow
        )
        for op in sorted(ops)
        for site in sorted(SITES)
    ]


@pytest.fixture
def case(request: pytest.FixtureRequest, golden: Golden, tmp_path: Path) -> Iterator[Case]:
    """The golden tree with a link planted at the site ``request.param`` names."""
    site = request.param
    root = tmp_path / "root"
    shutil.copytree(golden.path, root, symlinks=True)
    tokens_file = tmp_path / "tokens.json"
    shutil.copy(golden.tokens_file, tokens_file)
    outside, outside_file = _outside(tmp_path)
    parts, kind = SITES[site]
    link = root.joinpath(*(p.format(store=golden.store_dir) for p in parts))
    assert link.exists(), f"{link} is not part of the golden tree"
    if link.is_dir():
        shutil.rmtree(link)
    else:
        link.unlink()
    os.symlink(outside if kind == "dir" else outside_file, link)
    before = snapshot(tmp_path / "outside"), outside_file.read_bytes()
    app = _make_app(root, tokens_file, FixedClock(T0 + timedelta(hours=1)))
    yield Case(app, app.test_client(), app.config["CLOCK"], root, tmp_path, golden, site, link)
    after = snapshot(tmp_path / "outside"), outside_file.read_bytes()
    assert after == before, f"the outside tree changed through the link at {site}"


# -- operations -----------------------------------------------------------------------------
PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"


def _http(method: str, url: str, who: str = "writer", **kwargs: Any) -> Callable[[Case], Any]:
    extra = kwargs.pop("extra", {})

    def run(c: Case) -> Any:
        target = url.format(
            store=c.golden.store_id, mem=c.golden.memory_a, ver=c.golden.old_version
        )
        return c.client.open(target, method=method, headers=c.h(who, **extra), **kwargs)

    return run


def _tool(command: dict[str, Any]) -> Callable[[Case], Any]:
    return _http("POST", MS + "/{store}/memory_tool", json=command)


HTTP_OPS: dict[str, Callable[[Case], Any]] = {
    "get_turn": _http("GET", PM + "/tasks/evil/turns/0"),
    "put_turn": _http("PUT", PM + "/tasks/evil/turns/0", json={"summary_md": "new"}),
    "put_new_task": _http("PUT", PM + "/tasks/fresh/turns/0", json={"summary_md": "new"}),
    "put_artifact": _http(
        "PUT",
        PM + "/tasks/evil/turns/0/artifacts/a.bin",
        data=b"new bytes",
        extra={"Content-Type": "text/plain"},
    ),
    "put_artifact_other_name": _http(
        "PUT", PM + "/tasks/evil/turns/0/artifacts/a.conf", data=b"new bytes"
    ),
    "get_artifact": _http("GET", PM + "/tasks/evil/turns/0/artifacts/a.bin"),
    "get_task": _http("GET", PM + "/tasks/evil"),
    "list_tasks": _http("GET", PM + "/tasks"),
    "project_md": _http("GET", PM + "/project.md"),
    "ledger": _http("GET", PM + "/ledger?group_by=day,model"),
    "timeline": _http("GET", PM + "/timeline"),
    "delete_task": _http("DELETE", PM + "/tasks/evil", who="padmin"),
    "list_stores": _http("GET", MS),
    "create_store": _http("POST", MS, json={"name": "Another"}),
    "get_store": _http("GET", MS + "/{store}"),
    "update_store": _http("POST", MS + "/{store}", who="padmin", json={"name": "Renamed"}),
    "archive_store": _http("POST", MS + "/{store}/archive", who="padmin"),
    "delete_store": _http("DELETE", MS + "/{store}", who="padmin"),
    "create_memory": _http(
        "POST", MS + "/{store}/memories", json={"path": "/other.md", "content": "x"}
    ),
    "create_memory_outside_name": _http(
        "POST", MS + "/{store}/memories", json={"path": "/a.conf", "content": "rewritten"}
    ),
    "create_memory_deep": _http(
        "POST", MS + "/{store}/memories", json={"path": "/sub/c.conf", "content": "rewritten"}
    ),
    "update_memory": _http("POST", MS + "/{store}/memories/{mem}", json={"content": "three"}),
    "rename_memory": _http("POST", MS + "/{store}/memories/{mem}", json={"path": "/b.conf"}),
    "get_memory": _http("GET", MS + "/{store}/memories/{mem}"),
    "list_memories": _http("GET", MS + "/{store}/memories?view=full"),
    "delete_memory": _http("DELETE", MS + "/{store}/memories/{mem}"),
    "list_versions": _http("GET", MS + "/{store}/memory_versions?view=full"),
    "get_version": _http("GET", MS + "/{store}/memory_versions/{ver}"),
    "redact_version": _http("POST", MS + "/{store}/memory_versions/{ver}/redact", who="padmin"),
    "tool_view": _tool({"command": "view", "path": "/memories"}),
    "tool_view_file": _tool({"command": "view", "path": "/memories/a.md"}),
    "tool_create": _tool({"command": "create", "path": "/memories/a.conf", "file_text": "x"}),
    "tool_str_replace": _tool(
        {"command": "str_replace", "path": "/memories/a.md", "old_str": "two", "new_str": "2"}
    ),
    "tool_delete": _tool({"command": "delete", "path": "/memories/dir"}),
}

# Requests that address the linked entry: each must be refused with a 4xx.
TASK_SITES = {"tenant", "project", "task", "turn", "meta_json", "index_json", "task_json"}
# A store's own record and its index: what store-level requests and memory-level requests
# each read (a request that reads neither is not refused because one of them is a link).
STORE = {"tenant", "project", "stores_dir", "store_dir"}
STORE_SITES = STORE | {"store_json"}
MEMORY_SITES = STORE | {"store_index"}
WRITE_SITES = STORE_SITES | MEMORY_SITES | {"versions_dir"}
MUST_REFUSE: dict[str, set[str]] = {
    "get_turn": TASK_SITES - {"index_json", "task_json"},
    "put_turn": TASK_SITES | {"listing", "ledger"},
    "put_new_task": {"tenant", "project", "listing", "ledger"},
    "put_artifact": TASK_SITES - {"task_json"} | {"artifacts_dir", "listing"},
    "put_artifact_other_name": TASK_SITES - {"task_json"} | {"artifacts_dir", "listing"},
    "get_artifact": TASK_SITES - {"index_json", "task_json"} | {"artifacts_dir", "artifact"},
    "get_task": {"tenant", "project", "task", "index_json"},
    "list_tasks": {"tenant", "project", "listing"},
    "project_md": {"tenant", "project", "listing", "digest"},
    "ledger": {"tenant", "project", "listing", "ledger"},
    "timeline": {"tenant", "project", "listing", "ledger"},
    # A link inside a deleted task is removed as a link; its target is never touched.
    "delete_task": {"tenant", "project", "task", "index_json", "listing", "ledger"},
    "list_stores": {"tenant", "project", "stores_dir"},
    "create_store": {"tenant", "project", "stores_dir"},
    "get_store": STORE_SITES,
    "update_store": STORE_SITES,
    "archive_store": STORE_SITES,
    "delete_store": STORE_SITES,
    "create_memory": WRITE_SITES | {"memories_dir"},
    "create_memory_outside_name": WRITE_SITES | {"memories_dir"},
    "create_memory_deep": WRITE_SITES | {"memories_dir"},
    "update_memory": WRITE_SITES | {"memories_dir", "memory_file"},
    "rename_memory": WRITE_SITES | {"memories_dir", "memory_file"},
    "get_memory": MEMORY_SITES | {"versions_dir"},
    "list_memories": MEMORY_SITES | {"versions_dir"},
    "delete_memory": WRITE_SITES | {"memories_dir", "memory_file"},
    "list_versions": MEMORY_SITES | {"versions_dir"},
    "get_version": STORE | {"versions_dir"},
    "redact_version": MEMORY_SITES | {"versions_dir"},
    "tool_view": STORE_SITES | MEMORY_SITES,
    "tool_view_file": STORE_SITES | MEMORY_SITES | {"versions_dir"},
    "tool_create": WRITE_SITES | {"memories_dir"},
    "tool_str_replace": WRITE_SITES | {"memories_dir", "memory_file"},
    "tool_delete": WRITE_SITES | {"memories_dir"},
}


def _check_http(c: Case, name: str, response: Any) -> None:
    body = response.get_data()
    assert response.status_code < 500, f"{name}: {response.status_code} {body[:300]!r}"
    assert MARKER not in body, f"{name} served bytes from outside the root"
    refused = response.status_code >= 400
    if name.startswith("tool_") and response.status_code == 200:
        refused = bool(response.json.get("is_error"))
    if c.site in MUST_REFUSE[name]:
        assert refused, f"{name} through a link at {c.site}: {response.status_code} {body[:300]!r}"


@pytest.mark.parametrize(("case", "op"), matrix(list(HTTP_OPS), MUST_REFUSE), indirect=["case"])
def test_request_never_follows_a_planted_link(case: Case, op: str) -> None:
    _check_http(case, op, HTTP_OPS[op](case))


# -- the operations of the tree -------------------------------------------------------------
def _mentions_link(text: str, case: Case) -> bool:
    rel = str(case.link.relative_to(case.root))
    return "symlink" in text and rel in text


def _sweep(c: Case, *, later: bool = False, dry_run: bool = False) -> str:
    from app.ops.sweeper import run_sweep

    now = c.clock() + (timedelta(days=60) if later else timedelta(0))
    outcome = run_sweep(c.app, now=now, dry_run=dry_run)
    return "\n".join(outcome.lines() + list(outcome.errors))


def _fsck(c: Case, *, repair: bool) -> str:
    report = c.app.extensions["storage"].fsck(repair=repair)
    return "\n".join(report.problems + report.unrepairable + report.notes)


def _recovery(c: Case) -> str:
    """A start after an unclean stop that may have lost unsynced data: the recovery at
    start, then the full check the first housekeeping leader runs."""
    from app.ops.sweeper import startup_recovery
    from app.storage.core.errors import StorageError
    from app.storage.core.names import SENTINEL as RUNNING_SENTINEL
    from app.storage.tree.fs.txn import Key

    storage = c.app.extensions["storage"]
    (c.root / RUNNING_SENTINEL).write_text("1\n")  # a sentinel that proves nothing survived
    try:
        storage.tasks.txns.mark(Key(ACME, "evil"))  # and writes in flight on what was linked
        storage.stores.txns.mark(Key(ACME, c.golden.store_id))
        lines = startup_recovery(c.app)
    except StorageError as exc:  # a linked lock tree: the server refuses to start, and says why
        return str(exc)
    report = storage.full_check()
    assert report is not None
    return "\n".join(lines + report.problems + report.unrepairable)


def _export(c: Case) -> str:
    from app.storage.core.errors import StorageError

    out = c.base / "export.tar.gz"
    try:
        c.app.extensions["storage"].export(out)  # the whole root
    except StorageError as exc:
        return str(exc)
    assert MARKER not in gzip.decompress(out.read_bytes()), "export read through a link"
    return ""


def _import(c: Case) -> str:
    from app.storage.core.errors import StorageError

    try:
        with open(c.golden.archive, "rb") as fh:
            c.app.extensions["storage"].import_(fh, overwrite=True)
    except StorageError as exc:
        return str(exc)
    return ""


TREE_OPS: dict[str, Callable[[Case], str]] = {
    "sweep": _sweep,
    "sweep_expired": lambda c: _sweep(c, later=True),
    "sweep_dry_run": lambda c: _sweep(c, later=True, dry_run=True),
    "fsck": lambda c: _fsck(c, repair=False),
    "fsck_repair": lambda c: _fsck(c, repair=True),
    "recovery": _recovery,
    "export": _export,
    "import": _import,
}
# What each operation of the tree must report (every site it walks).
MUST_REPORT: dict[str, set[str]] = {
    "fsck": set(SITES),
    "fsck_repair": set(SITES),
    "recovery": set(SITES),
    "sweep": {
        "tenant",
        "project",
        "task",
        "turn",
        "artifacts_dir",
        "stores_dir",
        "store_dir",
        "trash",
    },
    "sweep_expired": {
        "tenant",
        "project",
        "task",
        "turn",
        "stores_dir",
        "store_dir",
        "versions_dir",
    },
    "sweep_dry_run": {"tenant", "project", "task", "turn", "stores_dir", "store_dir"},
    "export": {"tenant", "project", "task", "turn", "artifacts_dir", "artifact", "meta_json"},
    "import": {"tenant", "project", "task"},
}


@pytest.mark.parametrize(("case", "op"), matrix(list(TREE_OPS), MUST_REPORT), indirect=["case"])
def test_tree_operation_never_follows_a_planted_link(case: Case, op: str) -> None:
    text = TREE_OPS[op](case)
    if case.site in MUST_REPORT[op]:
        assert "symlink" in text or "link" in text, (
            f"{op} did not report the link at {case.site}:\n{text}"
        )
    if op in ("fsck", "fsck_repair", "recovery"):
        assert _mentions_link(text, case), f"{op} does not name {case.link}:\n{text}"


def test_fsck_repair_then_check_still_reports_the_link_and_leaves_it(
    golden: Golden, tmp_path: Path
) -> None:
    """A link is never repaired away by following it; a person removes it."""
    root = tmp_path / "root"
    shutil.copytree(golden.path, root, symlinks=True)
    shutil.copy(golden.tokens_file, tmp_path / "tokens.json")
    outside, _ = _outside(tmp_path)
    link = root / "acme" / "web" / "_stores" / golden.store_dir / "memories"
    shutil.rmtree(link)
    os.symlink(outside, link)
    app = _make_app(root, tmp_path / "tokens.json", FixedClock(T0))
    case = Case(
        app, app.test_client(), app.config["CLOCK"], root, tmp_path, golden, "memories_dir", link
    )
    _fsck(case, repair=True)
    assert os.path.islink(link)
    assert _mentions_link(_fsck(case, repair=False), case)


def test_a_project_linked_to_another_tenant_is_refused(golden: Golden, tmp_path: Path) -> None:
    """acme/linked -> beta/web: acme's tenant admin neither sees nor writes beta's data."""
    root = tmp_path / "root"
    shutil.copytree(golden.path, root, symlinks=True)
    shutil.copy(golden.tokens_file, tmp_path / "tokens.json")
    os.symlink(root / "beta" / "web", root / "acme" / "linked")
    before = snapshot(root / "beta")
    app = _make_app(root, tmp_path / "tokens.json", FixedClock(T0 + timedelta(hours=1)))
    client = app.test_client()
    h = _headers(golden.secrets["tadmin"], **{"X-Sandbox-Project-Id": "linked"})
    responses = [
        client.get(MS, headers=h),
        client.post(MS, json={"name": "planted"}, headers=h),
        client.get(f"{PM}/tasks", headers=h),
        client.get(f"{PM}/tasks/bt", headers=h),
        client.put(f"{PM}/tasks/x/turns/0", json={"summary_md": "x"}, headers=h),
        client.get(f"{PM}/project.md", headers=h),
    ]
    for r in responses:
        assert 400 <= r.status_code < 500, (r.status_code, r.get_data()[:300])
        assert b"Beta notes" not in r.get_data() and b"bt" not in r.get_data()
    assert snapshot(root / "beta") == before
    beta = client.get(MS, headers=_headers(golden.secrets["beta"])).json
    assert [s["name"] for s in beta["data"]] == ["Beta notes"]
