"""Two gunicorn nodes on one PostgreSQL and one SeaweedFS (real servers, 127.0.0.1).

What is written through one node is read through the other; concurrent and conditional
writers split across the nodes lose nothing and win once; a revocation is seen by both;
one sweeper runs for both; a node killed mid-write loses no acknowledged write; a reader of
project.md that stalls mid-body holds up no writer.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import Services, selected_backends
from tests.e2e.conftest import Server, flask_cli, start_server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        "pg" not in selected_backends(), reason="MEMORY_TEST_BACKENDS does not name pg"
    ),
]
PM = "/sandbox/memory/v1"


class _Http:
    """requests' verbs with a bound on every call."""

    def __getattr__(self, method: str) -> Any:
        return functools.partial(getattr(requests, method), timeout=120)


http = _Http()
MS = "/v1/memory_stores"
MiB = 1 << 20


@pytest.fixture(scope="module")
def nodes(
    services: Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Server]]:
    shared = {f"MEMORY_{k}": v for k, v in services.settings().items()}
    shared["MEMORY_SWEEP_INTERVAL"] = "1"
    started: list[Server] = []
    try:
        for name in ("node-a", "node-b"):
            started.append(start_server(tmp_path_factory.mktemp(name), env_extra=shared))
        yield started[0], started[1]
    finally:
        for srv in started:
            srv.stop()


@pytest.fixture(scope="module")
def secret(nodes: tuple[Server, Server]) -> str:
    return nodes[0].token("project_admin")


def _h(secret: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", **extra}


def test_written_on_one_node_read_on_the_other(nodes: tuple[Server, Server], secret: str) -> None:
    a, b = nodes
    h = _h(secret)
    r = http.put(f"{a.url}{PM}/tasks/shared/turns/0", json={"summary_md": "from a"}, headers=h)
    assert r.status_code == 200, r.text
    got = http.get(f"{b.url}{PM}/tasks/shared/turns/0", headers=h)
    assert got.json()["summary_md"] == "from a" and got.headers["ETag"] == r.headers["ETag"]

    def body() -> Iterator[bytes]:
        block = bytes(range(256)) * 4096  # 1 MiB
        for _ in range(50):
            yield block

    digest = hashlib.sha256(b"".join(body())).hexdigest()
    up = http.put(f"{a.url}{PM}/tasks/shared/turns/0/artifacts/big.bin", data=body(), headers=h)
    assert up.status_code == 200, up.text
    assert up.json()["size"] == 50 * MiB
    down = http.get(f"{b.url}{PM}/tasks/shared/turns/0/artifacts/big.bin", headers=h)
    assert down.status_code == 200 and hashlib.sha256(down.content).hexdigest() == digest
    assert down.headers["ETag"] == f'"{digest}"'
    ranged = http.get(
        f"{b.url}{PM}/tasks/shared/turns/0/artifacts/big.bin",
        headers={**h, "Range": "bytes=1048570-1048581"},
    )
    assert ranged.status_code == 206 and ranged.content == down.content[1048570:1048582]
    listed = http.get(f"{b.url}{PM}/tasks", headers=h).json()
    assert "shared" in [t["task_id"] for t in listed["tasks"]]
    digest_md = http.get(f"{b.url}{PM}/project.md", headers=h).text
    assert "## shared" in digest_md and "from a" in digest_md
    store = http.post(f"{a.url}{MS}", json={"name": "team"}, headers=h).json()
    mem = http.post(
        f"{a.url}{MS}/{store['id']}/memories", json={"path": "/n.md", "content": "x"}, headers=h
    ).json()
    read = http.get(f"{b.url}{MS}/{store['id']}/memories/{mem['id']}", headers=h).json()
    assert read["content"] == "x" and read["content_sha256"] == mem["content_sha256"]


def _split(nodes: tuple[Server, Server], n: int) -> list[str]:
    return [nodes[i % 2].url for i in range(n)]


def test_eight_writers_split_across_nodes_lose_nothing(
    nodes: tuple[Server, Server], secret: str
) -> None:
    h = _h(secret)

    def write(i: int, url: str) -> int:
        for k in range(5):
            r = http.put(
                f"{url}{PM}/tasks/busy/turns/{i * 5 + k}",
                json={"summary_md": f"w{i}-{k}"},
                headers=h,
            )
            assert r.status_code == 200, r.text
        return i

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8), _split(nodes, 8)))
    index = http.get(f"{nodes[1].url}{PM}/tasks/busy", headers=h).json()
    assert [t["turn"] for t in index["turns"]] == list(range(40))


def test_of_eight_conditional_writers_with_one_etag_exactly_one_wins(
    nodes: tuple[Server, Server], secret: str
) -> None:
    h = _h(secret)
    first = http.put(f"{nodes[0].url}{PM}/tasks/cond/turns/0", json={}, headers=h)
    etag = first.headers["ETag"]

    def write(i: int, url: str) -> int:
        r = http.put(
            f"{url}{PM}/tasks/cond/turns/0",
            json={"summary_md": f"writer {i}"},
            headers={**h, "If-Match": etag},
        )
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(write, range(8), _split(nodes, 8)))
    assert sorted(codes) == [200] + [412] * 7, codes


def test_content_sha256_preconditions_hold_across_nodes(
    nodes: tuple[Server, Server], secret: str
) -> None:
    h = _h(secret)
    store = http.post(f"{nodes[0].url}{MS}", json={"name": "occ"}, headers=h).json()
    mem = http.post(
        f"{nodes[0].url}{MS}/{store['id']}/memories",
        json={"path": "/shared.md", "content": "seed"},
        headers=h,
    ).json()

    def update(i: int, url: str) -> int:
        r = http.post(
            f"{url}{MS}/{store['id']}/memories/{mem['id']}",
            json={
                "content": f"by {i}",
                "precondition": {"type": "content_sha256", "content_sha256": mem["content_sha256"]},
            },
            headers=h,
        )
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(update, range(8), _split(nodes, 8)))
    assert sorted(codes) == [200] + [409] * 7, codes
    versions = http.get(
        f"{nodes[1].url}{MS}/{store['id']}/memory_versions?memory_id={mem['id']}", headers=h
    ).json()
    assert [v["operation"] for v in versions["data"]] == ["modified", "created"]


def test_a_token_revoked_through_one_node_is_refused_by_the_other(
    nodes: tuple[Server, Server],
) -> None:
    a, b = nodes
    created = flask_cli(
        a.env, "tokens", "create", "--role", "reader", "--tenant", "acme", "--project", "web"
    )
    token_id, token = created.split()[1], created.strip().splitlines()[-1]  # "created <id> ..."
    assert http.get(f"{b.url}{PM}/tasks", headers=_h(token)).status_code == 200
    flask_cli(a.env, "tokens", "revoke", token_id)
    assert http.get(f"{b.url}{PM}/tasks", headers=_h(token)).status_code == 401
    assert http.get(f"{a.url}{PM}/tasks", headers=_h(token)).status_code == 401


def _sweeper_state(services: Services, nodes: tuple[Server, Server]) -> dict[str, Any]:
    import json

    import psycopg

    url = nodes[0].env["MEMORY_DATABASE_URL"]
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state FROM service_state WHERE name = 'sweeper'").fetchone()
    return dict(json.loads(row[0])) if row else {}


def test_one_sweeper_runs_across_nodes(services: Services, nodes: tuple[Server, Server]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = _sweeper_state(services, nodes)
        if len(state.get("recent", [])) >= 3:
            break
        time.sleep(0.5)
    runs = _sweeper_state(services, nodes)["recent"]
    assert len(runs) >= 3
    pids = {r["pid"] for r in runs}
    workers = [set(n.worker_pids()) for n in nodes]
    assert any(pids <= w for w in workers), (pids, workers)  # one node, one worker, leads
    assert len(pids) == 1
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert earlier["finished_epoch"] <= later["started_epoch"]  # never two at once


def test_sigkill_of_one_node_mid_write_loses_no_acknowledged_write(
    services: Services, tmp_path: Path, nodes: tuple[Server, Server], secret: str
) -> None:
    h = _h(secret)
    shared = ("MEMORY_DATABASE_URL", "MEMORY_BLOB_URL", "MEMORY_S3_ENDPOINT_URL")
    env = {k: v for k, v in nodes[0].env.items() if k in shared}
    (tmp_path / "victim").mkdir()
    victim = start_server(tmp_path / "victim", env_extra=env)
    survivor = nodes[1]
    acked: list[int] = []
    stop = time.monotonic() + 4

    def writer(w: int) -> None:
        n = 0
        while time.monotonic() < stop:
            turn = w * 1000 + n
            try:
                r = http.put(
                    f"{victim.url}{PM}/tasks/killed/turns/{turn}",
                    json={"summary_md": f"t{turn}"},
                    headers=h,
                    timeout=5,
                )
            except requests.RequestException:
                return  # the node died under this request: not acknowledged
            if r.status_code == 200:
                acked.append(turn)
            n += 1

    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(writer, w) for w in range(4)]
            time.sleep(1.5)
            for pid in [victim.proc.pid, *victim.worker_pids()]:
                os.kill(pid, signal.SIGKILL)
            for f in futures:
                f.result()
    finally:
        victim.stop()
    assert acked, "no write was acknowledged before the kill"
    index = http.get(f"{survivor.url}{PM}/tasks/killed", headers=h).json()
    stored = {t["turn"] for t in index["turns"]}
    assert set(acked) <= stored
    r = http.put(f"{survivor.url}{PM}/tasks/killed/turns/9999", json={}, headers=h)
    assert r.status_code == 200


@pytest.mark.slow
def test_a_slow_reader_of_project_md_sees_one_moment_and_holds_up_no_writer(
    nodes: tuple[Server, Server], secret: str
) -> None:
    """A client that stops reading project.md mid-body keeps the snapshot it opened; writers
    through both nodes go on meanwhile, and the next read has all they wrote."""
    a, b = nodes
    h = _h(secret)
    filler = "notes " * 2700  # ~16 KB a section: the body is far more than socket buffers

    def put(i: int, text: str, node: Server) -> None:
        r = http.put(
            f"{node.url}{PM}/tasks/slow-{i:04d}/turns/0", json={"summary_md": text}, headers=h
        )
        assert r.status_code == 200, r.text

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: put(i, f"{i} {filler}", (a, b)[i % 2]), range(1500)))
    whole = http.get(f"{a.url}{PM}/project.md", headers=h)
    assert len(whole.content) > 20 * MiB
    with requests.get(f"{a.url}{PM}/project.md", headers=h, stream=True, timeout=120) as slow:
        head = slow.raw.read(64 * 1024)
        for i in range(0, 40):  # the oldest tasks move to the top; new ones appear
            put(i, f"rewritten {i}", (a, b)[i % 2])
            put(2000 + i, f"new {i}", (b, a)[i % 2])
        rest = slow.raw.read()
    assert len(head) + len(rest) == int(slow.headers["Content-Length"])
    assert head + rest == whole.content
    after = http.get(f"{b.url}{PM}/project.md", headers=h).text
    assert "rewritten 39" in after and "new 39" in after
    assert after.index("## slow-2039") < after.index("## slow-0039") < after.index("## slow-0040")


def _require_nginx() -> None:
    """nginx from Debian (.ci/run installs it): missing, the test fails, unless
    MEMORY_ALLOW_NO_NGINX=1 asks for a skip on a machine without it (never in CI)."""
    if shutil.which("nginx", path="/usr/sbin:/usr/bin") is None:
        if os.environ.get("MEMORY_ALLOW_NO_NGINX") == "1":
            pytest.skip("nginx is not installed (MEMORY_ALLOW_NO_NGINX=1)")
        pytest.fail("nginx is not installed: apt-get install nginx (or MEMORY_ALLOW_NO_NGINX=1)")


def test_nginx_in_front_spreads_requests_and_skips_a_node_that_is_down(
    nodes: tuple[Server, Server], secret: str, tmp_path: Path
) -> None:
    """deploy/proxy.py's nginx, as deploy/cluster.py starts it, with a third upstream that
    refuses connections, as a killed node does."""
    _require_nginx()
    from deploy import proxy
    from tests.e2e.conftest import free_port

    down = f"127.0.0.1:{free_port()}"
    live = [n.url.removeprefix("http://") for n in nodes]
    port = free_port()
    proc = proxy.start("nginx", [down, *live], port, tmp_path / "nginx")
    try:
        url, h = f"http://127.0.0.1:{port}", _h(secret)
        for i in range(6):
            r = http.put(
                f"{url}{PM}/tasks/proxied/turns/{i}", json={"summary_md": f"{i}"}, headers=h
            )
            assert r.status_code == 200, r.text
            assert (
                http.get(f"{url}{PM}/tasks/proxied/turns/{i}", headers=h).json()["summary_md"]
                == f"{i}"
            )
        # A browser signs in through the proxy: its Origin holds the proxy's port, which
        # the node sees only if the proxy passes the Host header whole.
        browser = requests.Session()
        form = browser.get(f"{url}/console/signin")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert form.status_code == 200 and csrf is not None
        signed_in = browser.post(
            f"{url}/console/signin",
            data={"csrf": csrf.group(1), "token": secret},
            headers={"Origin": url, "Sec-Fetch-Site": "same-origin"},
            allow_redirects=False,
        )
        assert signed_in.status_code == 303, signed_in.text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    served = {
        line.rsplit("upstream=", 1)[1].split(", ")[-1]
        for line in (tmp_path / "nginx" / "nginx-access.log").read_text().splitlines()
        if "/proxied/" in line
    }
    assert served == set(live)  # both nodes answered, the one that is down never did
