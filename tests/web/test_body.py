"""A body the worker left on the socket is read only for a sender the app knows.

The worker (app/ops/serving.py) says so through ``worker_request.body_pending``; here the
test sets it, as the worker would around a request with a large body or one whose client
waits for "100 Continue". tests/e2e/test_slow_clients.py checks the same on a real gunicorn.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

from app.web.body import PENDING_CONTINUE, PENDING_LARGE, READ_AHEAD_BYTES, worker_request
from tests.conftest import Tokens

BASE = "/sandbox/memory/v1"


@pytest.fixture
def pending() -> Iterator[None]:
    yield
    worker_request.body_pending = ""


def signin_form(client: FlaskClient, token: str) -> dict[str, str]:
    page = client.get("/console/signin").get_data(as_text=True)
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match is not None
    return {"csrf": match.group(1), "token": token}


def test_the_signin_form_is_not_read_when_its_body_is_still_on_the_socket(
    client: FlaskClient, tokens: Tokens, pending: None
) -> None:
    form = signin_form(client, tokens.secrets["writer"])
    worker_request.body_pending = PENDING_LARGE
    r = client.post("/console/signin", data=form)
    assert r.status_code == 413 and "read only with a credential" in r.get_data(as_text=True)
    worker_request.body_pending = PENDING_CONTINUE
    r = client.post("/console/signin", data=form)
    assert r.status_code == 417 and "Expect: 100-continue" in r.get_data(as_text=True)
    # Read ahead whole by the worker, the same form signs in.
    worker_request.body_pending = ""
    assert client.post("/console/signin", data=form).status_code == 303


def test_a_known_sender_s_pending_body_is_read(
    client: FlaskClient, tokens: Tokens, pending: None
) -> None:
    worker_request.body_pending = PENDING_LARGE
    big = {"summary_md": "x" * (2 * READ_AHEAD_BYTES)}
    r = client.put(f"{BASE}/tasks/t/turns/0", json=big, headers=tokens.headers("writer"))
    assert r.status_code == 200, r.get_data(as_text=True)
    # Without a credential the API refuses on the head, before any read: 401, not 413.
    assert client.put(f"{BASE}/tasks/t/turns/1", json=big).status_code == 401
