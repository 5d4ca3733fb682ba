"""A whole-root backup taken while four writers keep writing, restored into an empty root:
the restored server answers every GET about what the backup covered exactly as the first."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.conftest import REPO, VENV_BIN, Server, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # two servers and writers: `make slow`
PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "flask"), "--app", "wsgi", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Api:
    def __init__(self, server: Server, secret: str, project: str) -> None:
        self.server = server
        self.session = requests.Session()
        self.session.headers.update(
            {"Authorization": f"Bearer {secret}", "X-Sandbox-Project-Id": project}
        )

    def call(self, method: str, path: str, **kw: Any) -> requests.Response:
        r = self.session.request(method, f"{self.server.url}{path}", timeout=30, **kw)
        assert r.status_code < 300, (method, path, r.status_code, r.text[:300])
        return r

    def get(self, path: str) -> tuple[int, str | None, bytes]:
        r = self.session.get(f"{self.server.url}{path}", timeout=30)
        return r.status_code, r.headers.get("ETag"), r.content


def _populate(api: Api) -> list[str]:
    """A project with tasks, artifacts, stores, versions, an archived store and a redacted
    version; return the GETs that describe all of it."""
    gets = [f"{PM}/tasks?limit=2", f"{PM}/project.md", f"{MS}?include_archived=true&limit=1"]
    for t in range(5):
        for turn in range(2):
            api.call(
                "PUT",
                f"{PM}/tasks/task-{t}/turns/{turn}",
                json={"meta": {"model": "m", "exit_code": t % 2}, "summary_md": f"# {t}.{turn}"},
            )
            gets += [f"{PM}/tasks/task-{t}/turns/{turn}", f"{PM}/tasks/task-{t}"]
        api.call(
            "PUT",
            f"{PM}/tasks/task-{t}/turns/0/artifacts/log.txt",
            data=os.urandom(50_000),
            headers={"Content-Type": "text/plain"},
        )
        gets.append(f"{PM}/tasks/task-{t}/turns/0/artifacts/log.txt")
    page = api.call("GET", f"{PM}/tasks?limit=2").json()
    gets.append(f"{PM}/tasks?limit=2&cursor={page['next_cursor']}")
    for name in ("Prefs", "Notes", "Old"):
        store = api.call("POST", MS, json={"name": name, "metadata": {"n": name}}).json()
        sid = store["id"]
        first = api.call(
            "POST", f"{MS}/{sid}/memories", json={"path": "/a/one.md", "content": "1"}
        ).json()
        api.call("POST", f"{MS}/{sid}/memories/{first['id']}", json={"content": "2"})
        api.call("POST", f"{MS}/{sid}/memories", json={"path": "/b.md", "content": "b"})
        gets += [
            f"{MS}/{sid}",
            f"{MS}/{sid}/memories?limit=1",
            f"{MS}/{sid}/memories?depth=1",
            f"{MS}/{sid}/memories/{first['id']}",
            f"{MS}/{sid}/memory_versions?view=full",
            f"{MS}/{sid}/memory_versions/{first['memory_version_id']}",
        ]
        listed = api.call("GET", f"{MS}/{sid}/memories?limit=1").json()
        gets.append(f"{MS}/{sid}/memories?limit=1&page={listed['next_page']}")
        if name == "Notes":
            api.call("POST", f"{MS}/{sid}/memory_versions/{first['memory_version_id']}/redact")
        if name == "Old":
            api.call("POST", f"{MS}/{sid}/archive")
    return gets


def _writer(api: Api, i: int, stop: threading.Event, store: str, done: list[str]) -> None:
    n = 0
    while not stop.is_set():
        api.call("PUT", f"{PM}/tasks/w{i}-{n}/turns/0", json={"summary_md": f"w{i} {n}"})
        memory = api.call(
            "POST", f"{MS}/{store}/memories", json={"path": f"/w{i}/{n}", "content": "x"}
        )
        done += [f"{PM}/tasks/w{i}-{n}/turns/0", f"{MS}/{store}/memories/{memory.json()['id']}"]
        n += 1


def test_a_backup_taken_under_writers_restores_what_it_covered_exactly(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = start_server(tmp_path / "a")
    try:
        secret = first.token("admin", tenant="acme", project="web")
        web, live = Api(first, secret, "web"), Api(first, secret, "live")
        gets = _populate(web)
        store = live.call("POST", MS, json={"name": "Live"}).json()["id"]
        stop, done = threading.Event(), []
        writers = [
            threading.Thread(target=_writer, args=(live, i, stop, store, done)) for i in range(4)
        ]
        for w in writers:
            w.start()
        backup = tmp_path / "all.tar.gz"
        exported = _cli(first.env, "export", str(backup))
        stop.set()
        for w in writers:
            w.join(timeout=30)
        assert exported.returncode == 0, exported.stderr
        assert "exported the whole root" in exported.stdout and len(done) > 8
        recorded = {path: web.get(path) for path in gets}
        written = {path: live.get(path) for path in list(done)}
        restored_root = tmp_path / "b" / "storage"
        env = {**first.env, "MEMORY_STORAGE_ROOT": str(restored_root)}
        imported = _cli(env, "import", str(backup))
        assert imported.returncode == 0, imported.stderr
    finally:
        first.stop()
    # Tokens are configuration, not data: the drill restores the registry from its own copy.
    (tmp_path / "b" / "tokens.json").write_bytes(Path(first.env["MEMORY_TOKENS_FILE"]).read_bytes())
    second = start_server(tmp_path / "b", root=restored_root)
    try:
        web2, live2 = Api(second, secret, "web"), Api(second, secret, "live")
        for path, answer in recorded.items():
            assert web2.get(path) == answer, path
        # What the writers wrote during the backup: each task and memory is there as written,
        # or not at all (written after its moment).
        present = 0
        for path, answer in written.items():
            got = live2.get(path)
            if got[0] == 200:
                present += 1
                assert got == answer, path
            else:
                assert got[0] == 404, (path, got)
        assert present > 0
        check = _cli({**first.env, "MEMORY_STORAGE_ROOT": str(restored_root)}, "fsck")
        assert check.returncode == 0, check.stdout
    finally:
        second.stop()
