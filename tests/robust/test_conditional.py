"""Conditional writes: If-Match / If-None-Match on turns and artifacts, and racing writers.

The races run against a real gunicorn: 8 writers holding the same ETag (or all creating
with ``If-None-Match: *``) PUT at once; exactly one gets 200, every other one 412, and the
stored record is the winner's.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from flask.testing import FlaskClient

from tests.conftest import Tokens
from tests.robust.helpers import BASE, auth

RACERS = 8


def _paths(kind: str) -> tuple[str, str]:
    turn = f"{BASE}/tasks/t/turns/0"
    return (turn, turn) if kind == "turn" else (turn, f"{turn}/artifacts/a.bin")


def _put(client: FlaskClient, kind: str, url: str, value: str, headers: dict[str, str]) -> Any:
    if kind == "turn":
        return client.put(url, json={"summary_md": value}, headers=headers)
    return client.put(url, data=value.encode(), headers={**headers, "Content-Type": "text/plain"})


@pytest.mark.parametrize("kind", ["turn", "artifact"])
def test_if_match_and_if_none_match(client: FlaskClient, tokens: Tokens, kind: str) -> None:
    h = tokens.headers("writer")
    turn_url, url = _paths(kind)
    if kind == "artifact":
        client.put(turn_url, json={}, headers=h)
    first = _put(client, kind, url, "one", {**h, "If-None-Match": "*"})
    assert first.status_code == 200 and first.headers["ETag"]
    etag = first.headers["ETag"]
    assert _put(client, kind, url, "again", {**h, "If-None-Match": "*"}).status_code == 412
    assert _put(client, kind, url, "stale", {**h, "If-Match": '"not-it"'}).status_code == 412
    second = _put(client, kind, url, "two", {**h, "If-Match": etag})
    assert second.status_code == 200 and second.headers["ETag"] != etag
    # The first ETag is spent: a writer still holding it loses.
    lost = _put(client, kind, url, "late", {**h, "If-Match": etag})
    assert lost.status_code == 412 and set(lost.get_json()) == {"detail"}
    got = client.get(url, headers=h)
    assert got.headers["ETag"] == second.headers["ETag"]
    value = got.get_json()["summary_md"] if kind == "turn" else got.get_data(as_text=True)
    assert value == "two"


def test_if_match_star_needs_an_existing_turn(client: FlaskClient, tokens: Tokens) -> None:
    h = tokens.headers("writer")
    assert (
        client.put(f"{BASE}/tasks/t/turns/0", json={}, headers={**h, "If-Match": "*"}).status_code
        == 412
    )
    assert client.get(f"{BASE}/tasks/t", headers=h).status_code == 404


def test_etags_are_documented(client: FlaskClient) -> None:
    import yaml

    spec = yaml.safe_load(client.get(f"{BASE}/openapi.yaml").data)
    for path, method in [
        ("/sandbox/memory/v1/tasks/{task_id}/turns/{turn}", "put"),
        ("/sandbox/memory/v1/tasks/{task_id}/turns/{turn}", "get"),
        ("/sandbox/memory/v1/tasks/{task_id}/turns/{turn}/artifacts/{name}", "put"),
        ("/sandbox/memory/v1/tasks/{task_id}/turns/{turn}/artifacts/{name}", "get"),
    ]:
        op = spec["paths"][path][method]
        assert "ETag" in op["responses"]["200"].get("headers", {}), (path, method)
        if method == "put":
            names = {p["name"] for p in op["parameters"]}
            assert {"If-Match", "If-None-Match"} <= names, (path, names)
            assert "412" in op["responses"], (path, method)


def _race(
    url: str, secret: str, kind: str, headers: dict[str, str], round_: int = 0
) -> list[tuple[int, str]]:
    barrier = threading.Barrier(RACERS)

    def one(i: int) -> tuple[int, str]:
        # Unique per round: an artifact's ETag is its sha256, so rewriting identical bytes
        # would rightly keep it and let a second writer holding it through.
        value = f"racer {i} round {round_}"
        with requests.Session() as s:
            s.headers.update({**auth(secret), **headers})
            barrier.wait(timeout=30)
            if kind == "turn":
                resp = s.put(url, json={"summary_md": value}, timeout=60)
            else:
                resp = s.put(
                    url, data=value.encode(), headers={"Content-Type": "text/plain"}, timeout=60
                )
        return resp.status_code, value

    with ThreadPoolExecutor(max_workers=RACERS) as pool:
        return list(pool.map(one, range(RACERS)))


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["turn", "artifact"])
def test_racing_writers_with_one_etag_exactly_one_wins(live_factory: Any, kind: str) -> None:
    server = live_factory(workers=2, threads=4)
    secret = server.token("writer")
    turn_url = f"{server.url}{BASE}/tasks/t/turns/0"
    url = turn_url if kind == "turn" else f"{turn_url}/artifacts/a.bin"
    with requests.Session() as s:
        s.headers.update(auth(secret))
        s.put(turn_url, json={"summary_md": "base"}, timeout=30)
        if kind == "artifact":
            s.put(url, data=b"base", timeout=30)
        etag = s.get(url, timeout=30).headers["ETag"]
    for round_ in range(3):
        results = _race(url, secret, kind, {"If-Match": etag}, round_)
        winners = [v for code, v in results if code == 200]
        assert sorted(code for code, _ in results) == [200] + [412] * (RACERS - 1), (
            round_,
            results,
        )
        with requests.Session() as s:
            s.headers.update(auth(secret))
            got = s.get(url, timeout=30)
        value = got.json()["summary_md"] if kind == "turn" else got.text
        assert value == winners[0]
        etag = got.headers["ETag"]


@pytest.mark.e2e
def test_racing_creates_exactly_one_wins(live_factory: Any) -> None:
    server = live_factory(workers=2, threads=4)
    secret = server.token("writer")
    for n in range(3):
        url = f"{server.url}{BASE}/tasks/new-{n}/turns/0"
        results = _race(url, secret, "turn", {"If-None-Match": "*"})
        assert sorted(code for code, _ in results) == [200] + [412] * (RACERS - 1), results
        winner = next(v for code, v in results if code == 200)
        got = requests.get(url, headers=auth(secret), timeout=30).json()
        assert got["summary_md"] == winner
