"""A search's cost is bounded whatever the document (real gunicorn, 2 workers of 16 threads,
each backend MEMORY_TEST_BACKENDS names): one query over a 1 MiB summary made of matching
words answers in bounded time, /healthz and another project's list keep answering within a
second while 32 such searches run, every search answers 200 or a JSON 503 (never a hung
request or a 500), and SIGTERM stops the server while they run (on the first backend in
`make test`, on the others in `make slow`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import backends_first_then_slow, selected_backends
from tests.e2e.conftest import Server, start_server

pytestmark = pytest.mark.e2e
PM = "/sandbox/memory/v1"
# Just under the 1 MiB summary limit, every word a match of the query.
SUMMARY = ("passed test " * 90_000)[: (1 << 20) - 16].rstrip()
QUERY = "passed test"
# Far beyond any bound the service keeps, far below the minutes the unbounded search took.
CLIENT_TIMEOUT = 30.0


def _start(request: pytest.FixtureRequest, tmp_path: Path) -> Server:
    env = {"MEMORY_SWEEP_INTERVAL": "0"}
    if request.param == "pg":
        services = request.getfixturevalue("services")
        env |= {f"MEMORY_{k}": v for k, v in services.settings().items()}
    return start_server(tmp_path, workers=2, threads=16, env_extra=env)


def headers(server: Server, project: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token('writer', project=project)}"}


def load(server: Server) -> tuple[dict[str, str], dict[str, str]]:
    """The project with the worst document, and another project of the tenant."""
    worst, other = headers(server, "web"), headers(server, "other")
    for task, summary in (("worst", SUMMARY), ("plain", "a plain turn: passed test")):
        r = requests.put(
            f"{server.url}{PM}/tasks/{task}/turns/0",
            json={"summary_md": summary},
            headers=worst,
            timeout=60,
        )
        assert r.status_code == 200, r.text
    r = requests.put(
        f"{server.url}{PM}/tasks/t/turns/0", json={"summary_md": "x"}, headers=other, timeout=60
    )
    assert r.status_code == 200
    return worst, other


@pytest.fixture(scope="module", params=selected_backends())
def loaded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, dict[str, str], dict[str, str]]]:
    """One server per backend for the tests that leave it running, loaded once."""
    srv = _start(request, tmp_path_factory.mktemp("search-bounded"))
    try:
        yield (srv, *load(srv))
    finally:
        srv.stop()


@pytest.fixture(params=backends_first_then_slow())
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    srv = _start(request, tmp_path)
    try:
        yield srv
    finally:
        srv.stop()


def search(server: Server, auth: dict[str, str]) -> requests.Response:
    return requests.get(
        f"{server.url}{PM}/search",
        params={"q": QUERY, "limit": 20},
        headers=auth,
        timeout=CLIENT_TIMEOUT,
    )


def test_one_search_over_a_megabyte_of_matches_answers_in_bounded_time(
    loaded: tuple[Server, dict[str, str], dict[str, str]],
) -> None:
    server, worst, _ = loaded
    started = time.monotonic()
    r = search(server, worst)
    took = time.monotonic() - started
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert {h["task_id"] for h in hits} == {"worst", "plain"}
    snippet = next(h["snippet"] for h in hits if h["task_id"] == "worst")
    assert "\x02passed\x03" in snippet and len(snippet) < 400
    assert took < CLIENT_TIMEOUT


def test_health_and_other_projects_answer_while_32_searches_run(
    loaded: tuple[Server, dict[str, str], dict[str, str]],
) -> None:
    server, worst, other = loaded
    stop = threading.Event()
    statuses: list[int] = []

    def searcher() -> None:
        while not stop.is_set():
            r = search(server, worst)
            if r.status_code == 503:
                assert r.json()["detail"] and "Retry-After" in r.headers
            statuses.append(r.status_code)

    slowest = {"healthz": 0.0, "list": 0.0}
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        running = [pool.submit(searcher) for _ in range(32)]
        time.sleep(0.5)
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            for name, url, auth in (
                ("healthz", f"{server.url}/healthz", {}),
                ("list", f"{server.url}{PM}/tasks", other),
            ):
                started = time.monotonic()
                r = requests.get(url, headers=auth, timeout=5)
                assert r.status_code == 200, (name, r.status_code)
                slowest[name] = max(slowest[name], time.monotonic() - started)
            time.sleep(0.1)
        stop.set()
        for future in running:
            future.result(timeout=CLIENT_TIMEOUT + 5)
    assert slowest["healthz"] < 1.0, slowest
    assert slowest["list"] < 1.0, slowest
    assert statuses and set(statuses) <= {200, 503}, sorted(set(statuses))
    assert 200 in statuses


def test_sigterm_stops_the_server_while_searches_run(server: Server) -> None:
    worst, _ = load(server)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        running = [pool.submit(search, server, worst) for _ in range(8)]
        time.sleep(0.5)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=20)
        stopped = time.monotonic() - started
        for future in running:
            # Cut off by the stop: what a client of a stopping server sees.
            with contextlib.suppress(requests.RequestException):
                future.result(timeout=CLIENT_TIMEOUT)
    assert stopped < 10, stopped
