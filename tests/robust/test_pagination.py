"""Paging through 1,000 tasks at 50 a page while another client adds 100 and updates 50.

No task appears twice; every task nobody touched during the walk appears exactly once. A
tampered cursor, or one from another project, is refused with 422.
"""

from __future__ import annotations

import base64
import random

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.names import Scope
from tests.conftest import FixedClock, Tokens
from tests.robust.helpers import BASE


def _seed(app: Flask, clock: FixedClock, n: int) -> None:
    store = app.extensions["storage"].tasks
    for i in range(n):
        clock.advance(seconds=1)
        store.put_turn(Scope("acme", "web"), f"task-{i:04d}", 0, meta={}, summary_md="")


def _walk(
    client: FlaskClient,
    tokens: Tokens,
    app: Flask,
    clock: FixedClock,
    *,
    total: int,
    added: int,
    updated: int,
) -> None:
    _seed(app, clock, total)
    store = app.extensions["storage"].tasks
    rng = random.Random(3)
    h = tokens.headers("reader")
    pages = total // 50
    add_at = sorted(rng.sample(range(1, pages), min(10, pages - 1)))
    to_update = rng.sample([f"task-{i:04d}" for i in range(total)], updated)
    touched = set(to_update)
    seen: list[str] = []
    cursor = None
    page_no = 0
    while True:
        url = f"{BASE}/tasks?limit=50" + (f"&cursor={cursor}" if cursor else "")
        resp = client.get(url, headers=h)
        assert resp.status_code == 200, resp.data
        body = resp.get_json()
        seen += [t["task_id"] for t in body["tasks"]]
        page_no += 1
        if page_no in add_at:
            # Another client, between two pages: new tasks and updates of old ones.
            for _ in range(added // len(add_at)):
                clock.advance(seconds=1)
                new_id = f"new-{rng.randrange(10**9):09d}"
                store.put_turn(Scope("acme", "web"), new_id, 0, meta={}, summary_md="")
                touched.add(new_id)
            for task_id in to_update[: updated // len(add_at)]:
                clock.advance(seconds=1)
                store.put_turn(Scope("acme", "web"), task_id, 1, meta={}, summary_md="updated")
            del to_update[: updated // len(add_at)]
        cursor = body["next_cursor"]
        if cursor is None:
            break
        assert page_no < 10 * pages, "the walk does not end"
    assert len(seen) == len(set(seen)), "a task appeared twice"
    untouched = {f"task-{i:04d}" for i in range(total)} - touched
    assert untouched <= set(seen), f"{len(untouched - set(seen))} untouched tasks were skipped"


def test_paging_under_concurrent_inserts_and_updates(
    client: FlaskClient, tokens: Tokens, app: Flask, clock: FixedClock
) -> None:
    _walk(client, tokens, app, clock, total=1000, added=100, updated=50)


def test_tampered_and_foreign_cursors_are_refused(
    client: FlaskClient, tokens: Tokens, app: Flask, clock: FixedClock
) -> None:
    _seed(app, clock, 5)
    h = tokens.headers("project_admin")
    cursor = client.get(f"{BASE}/tasks?limit=2", headers=h).get_json()["next_cursor"]
    assert cursor
    raw = bytearray(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    forged = []
    for i in (0, len(raw) // 2, len(raw) - 1):
        flipped = bytearray(raw)
        flipped[i] ^= 1
        forged.append(base64.urlsafe_b64encode(bytes(flipped)).decode().rstrip("="))
    body_only = raw[:-16].replace(b'"u":', b'"u":1')
    forged += [
        cursor[:-2],
        cursor + "AA",
        base64.urlsafe_b64encode(bytes(body_only)).decode(),
        "null",
    ]
    for bad in forged:
        resp = client.get(f"{BASE}/tasks?limit=2&cursor={bad}", headers=h)
        assert resp.status_code == 422, (bad, resp.status_code)
        assert resp.get_json()["detail"][0]["loc"] == ["query", "cursor"]
    # Valid for acme/web, replayed into acme/mobile by a token that may read both.
    other = client.get(
        f"{BASE}/tasks?limit=2&cursor={cursor}",
        headers=tokens.headers("tenant_admin", **{"X-Sandbox-Project-Id": "mobile"}),
    )
    assert other.status_code == 422


@pytest.mark.soak
def test_paging_under_change_soak(
    client: FlaskClient, tokens: Tokens, app: Flask, clock: FixedClock
) -> None:
    _walk(client, tokens, app, clock, total=5000, added=500, updated=500)
