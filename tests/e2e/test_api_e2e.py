"""A real gunicorn (2 gthread workers), tokens from the CLI, 8 concurrent clients."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import REPO, Server, flask_cli, start_server

BASE = "/sandbox/memory/v1"
pytestmark = pytest.mark.e2e


def test_concurrent_clients_on_one_task_and_ten_others(server: Server) -> None:
    secret = server.token("writer")
    headers = {"Authorization": f"Bearer {secret}"}
    jobs = [("hot", n) for n in range(200)] + [
        (f"task-{i}", n) for i in range(10) for n in range(20)
    ]

    def write(job: tuple[str, int]) -> int:
        task, turn = job
        with requests.Session() as session:
            resp = session.put(
                f"{server.url}{BASE}/tasks/{task}/turns/{turn}",
                json={
                    "meta": {"model": "e2e", "exit_code": 0},
                    "summary_md": f"{task} turn {turn}",
                },
                headers=headers,
                timeout=30,
            )
        return resp.status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(write, jobs))
    assert statuses.count(200) == len(jobs), {s: statuses.count(s) for s in set(statuses)}

    with requests.Session() as s:
        s.headers.update(headers)
        hot = s.get(f"{server.url}{BASE}/tasks/hot", timeout=10).json()
        assert hot["turn_count"] == 200 and hot["latest_turn"] == 199
        assert [t["turn"] for t in hot["turns"]] == list(range(200))
        for turn in (0, 57, 199):
            assert (
                s.get(f"{server.url}{BASE}/tasks/hot/turns/{turn}", timeout=10).json()["summary_md"]
                == f"hot turn {turn}"
            )
        listing = s.get(f"{server.url}{BASE}/tasks?limit=100", timeout=10).json()
        assert listing["total"] == 11
        by_id = {t["task_id"]: t for t in listing["tasks"]}
        for i in range(10):
            assert (
                by_id[f"task-{i}"]["turn_count"] == 20 and by_id[f"task-{i}"]["latest_turn"] == 19
            )
        digest = s.get(f"{server.url}{BASE}/project.md", timeout=10).text
    assert "hot turn 199" in digest
    for i in range(10):
        assert f"task-{i} turn 19" in digest and f"## task-{i}" in digest
    leftovers = [p for p in server.root.rglob(".~tmp-*")]
    assert leftovers == []


def test_tokens_revoked_with_the_cli_are_refused_by_every_worker(server: Server) -> None:
    secret = server.token("reader")
    url = f"{server.url}{BASE}/tasks"
    headers = {"Authorization": f"Bearer {secret}"}
    # Several connections so that both workers serve the token before the revocation.
    assert all(requests.get(url, headers=headers, timeout=10).status_code == 200 for _ in range(8))
    token_id = flask_cli(server.env, "tokens", "list").strip().splitlines()[-1].split()[0]
    flask_cli(server.env, "tokens", "revoke", token_id)
    assert all(requests.get(url, headers=headers, timeout=10).status_code == 401 for _ in range(8))


def test_streamed_chunked_upload_of_exactly_the_limit(tmp_path: Path) -> None:
    limit = 1 << 20
    srv = start_server(tmp_path, env_extra={"MEMORY_MAX_ARTIFACT_BYTES": str(limit)})
    try:
        headers = {"Authorization": f"Bearer {srv.token('writer')}"}
        assert (
            requests.put(
                f"{srv.url}{BASE}/tasks/t/turns/0", json={}, headers=headers, timeout=10
            ).status_code
            == 200
        )

        def chunks(total: int):
            sent = 0
            while sent < total:
                n = min(65536, total - sent)
                sent += n
                yield b"a" * n

        url = f"{srv.url}{BASE}/tasks/t/turns/0/artifacts/big.bin"
        exact = requests.put(url, data=chunks(limit), headers=headers, timeout=30)
        assert exact.status_code == 200 and exact.json()["size"] == limit
        over = requests.put(f"{url}2", data=chunks(limit + 1), headers=headers, timeout=30)
        assert over.status_code == 413
        over_cl = requests.put(f"{url}3", data=b"a" * (limit + 1), headers=headers, timeout=30)
        assert over_cl.status_code == 413
        names = [
            a["name"]
            for a in requests.get(
                f"{srv.url}{BASE}/tasks/t/turns/0", headers=headers, timeout=10
            ).json()["artifacts"]
        ]
        assert names == ["big.bin"]
        assert list(srv.root.rglob(".~tmp-*")) == []
    finally:
        srv.stop()


def test_first_start_prints_a_working_token_and_curl_example(tmp_path: Path) -> None:
    srv = start_server(tmp_path)
    try:
        out = srv.log()
        secret_lines = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("pm_")]
        assert len(secret_lines) == 1
        curl = [ln for ln in out.splitlines() if "curl -s -X PUT" in ln]
        assert curl and srv.url in curl[0]
        # Run the printed example (both commands) the way a newcomer pastes it.
        example = out[out.index("Try it:") :].split("\n\n")[0].splitlines()[1:]
        script = "\n".join(example)
        result = subprocess.run(
            ["bash", "-c", "set -e\n" + script],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
        assert result.returncode == 0, result.stderr
        assert '"summary_md":"First turn."' in result.stdout
        assert "## hello" in result.stdout
    finally:
        srv.stop()
    # A second start prints no new token.
    again = start_server(tmp_path)
    try:
        assert not [ln for ln in again.log().splitlines() if ln.strip().startswith("pm_")]
    finally:
        again.stop()
