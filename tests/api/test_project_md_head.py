"""``GET project.md?limit=N`` and ``?since=<time>`` (beyond the seed's API): the start of the
digest, byte for byte, on both backends, whether the sections come from the base or were
spliced in since, or expired meanwhile."""

from __future__ import annotations

import re

import pytest
from flask.testing import FlaskClient

from tests.conftest import FixedClock, Tokens

pytestmark = pytest.mark.all_backends
DIGEST = "/sandbox/memory/v1/project.md"
TASKS = "/sandbox/memory/v1/tasks"
# A section starts with its heading and its "Latest turn" line (app/storage/core/digest.py).
SECTION = re.compile(rb"\n## (task-[0-9]{2})\n\nLatest turn: ")


def put(client: FlaskClient, tokens: Tokens, task: str, summary: str, turn: int = 0) -> None:
    r = client.put(
        f"{TASKS}/{task}/turns/{turn}",
        json={"summary_md": summary},
        headers=tokens.headers("writer"),
    )
    assert r.status_code == 200, r.json


def get(client: FlaskClient, tokens: Tokens, query: str = "") -> bytes:
    r = client.get(f"{DIGEST}{query}", headers=tokens.headers("reader"))
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.mimetype == "text/markdown"
    return r.get_data()


def sections(body: bytes) -> list[tuple[str, int]]:
    """(task id, offset) of each section of a digest, in order."""
    return [(m.group(1).decode(), m.start()) for m in SECTION.finditer(body)]


def first(body: bytes, n: int) -> bytes:
    """The title and the first ``n`` sections of ``body``."""
    found = sections(body)
    return body if n >= len(found) else body[: found[n][1]]


def check_heads(client: FlaskClient, tokens: Tokens) -> bytes:
    """Every ``limit`` gives the start of the whole body; returns the body."""
    body = get(client, tokens)
    count = len(sections(body))
    for n in [1, 2, 3, count - 1, count, count + 5]:
        if n >= 1:
            assert get(client, tokens, f"?limit={n}") == first(body, n), n
    return body


def test_heads_are_the_start_of_the_digest(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    # Big sections: the tree's base is then past what a read compacts at once, so later
    # writes are spliced into it.
    for i in range(12):
        clock.advance(seconds=1)
        put(client, tokens, f"task-{i:02d}", f"# Task {i}\n\n" + "lorem ipsum " * 2500)
    body = check_heads(client, tokens)
    assert [t for t, _ in sections(body)] == [f"task-{i:02d}" for i in reversed(range(12))]
    # Old tasks written again move to the top; a new one comes; one is deleted.
    for task in ("task-03", "task-07"):
        clock.advance(seconds=1)
        put(client, tokens, task, f"{task} again, with a turn 1", turn=1)
    clock.advance(seconds=1)
    put(client, tokens, "task-12", "a new task")
    assert (
        client.delete(f"{TASKS}/task-10", headers=tokens.headers("project_admin")).status_code
        == 204
    )
    body = check_heads(client, tokens)
    order = [t for t, _ in sections(body)]
    assert order[:3] == ["task-12", "task-07", "task-03"] and "task-10" not in order


def test_since_takes_the_tasks_updated_from_then_on(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    for i in range(8):
        clock.advance(seconds=10)
        put(client, tokens, f"task-{i:02d}", f"summary {i}")
    listed = client.get(f"{TASKS}?limit=100", headers=tokens.headers("reader")).json["tasks"]
    body = get(client, tokens)
    for k, task in enumerate(listed):
        assert get(client, tokens, f"?since={task['updated_at']}") == first(body, k + 1)
    newest = listed[0]["updated_at"]
    from app.storage.core.clock import parse_iso_us

    epoch = parse_iso_us(listed[2]["updated_at"]) / 1_000_000
    assert get(client, tokens, f"?since={epoch:.6f}") == first(body, 3)
    assert get(client, tokens, f"?since={listed[4]['updated_at']}&limit=2") == first(body, 2)
    title = body[: sections(body)[0][1]]
    assert get(client, tokens, "?since=2999-01-01T00:00:00Z") == title  # nothing since then
    assert get(client, tokens, "?since=0") == body
    assert get(client, tokens, f"?since={newest.replace('+00:00', '%2B00:00')}").startswith(title)


def test_expired_and_empty(client: FlaskClient, tokens: Tokens, clock: FixedClock) -> None:
    assert get(client, tokens, "?limit=3") == get(client, tokens)  # no project yet
    for i in range(4):
        clock.advance(seconds=1)
        put(client, tokens, f"task-{i:02d}", f"old {i}")
    clock.advance(days=20)
    for i in range(4, 7):
        clock.advance(seconds=1)
        put(client, tokens, f"task-{i:02d}", f"new {i}")
    clock.advance(days=15)  # the first four have expired, not yet swept
    body = check_heads(client, tokens)
    assert [t for t, _ in sections(body)] == ["task-06", "task-05", "task-04"]
    clock.advance(days=30)  # every turn has expired
    body = get(client, tokens)
    assert body.endswith(b"No tasks yet.\n")
    assert get(client, tokens, "?limit=1") == body


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ("?limit=0", "limit"),
        ("?limit=1001", "limit"),
        ("?limit=two", "limit"),
        ("?limit=", "limit"),
        ("?since=yesterday", "since"),
        ("?since=", "since"),
        ("?since=1e9", "since"),
    ],
)
def test_bad_parameters_are_422(client: FlaskClient, tokens: Tokens, query: str, loc: str) -> None:
    r = client.get(f"{DIGEST}{query}", headers=tokens.headers("reader"))
    assert r.status_code == 422 and r.json["detail"][0]["loc"] == ["query", loc]
