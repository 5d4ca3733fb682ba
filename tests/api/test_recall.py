"""``POST /sandbox/memory/v1/recall`` (beyond the seed's API): what the project's memory holds
about a prompt, the task's own turns first, within a character budget, on every backend."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.api.openapi import build_spec
from app.services.recall import prompt_terms
from tests.api.test_mcp import FORGED, _outside_frames
from tests.conftest import FixedClock, Tokens

pytestmark = pytest.mark.all_backends
API = "/sandbox/memory/v1"
STORES = "/v1/memory_stores"
FACT = "The deploy key rotates every Tuesday at 04:00 UTC, via the vault job ROTATION_MARK_5521."
PROMPT = "When does the deploy key rotate?"


def put(client: FlaskClient, tokens: Tokens, task: str, turn: int, summary: str, who: str = "writer") -> None:  # fmt: skip
    r = client.put(
        f"{API}/tasks/{task}/turns/{turn}",
        json={"summary_md": summary},
        headers=tokens.headers(who),
    )
    assert r.status_code == 200, r.json


def recall(client: FlaskClient, tokens: Tokens, body: dict[str, Any], who: str = "reader") -> Any:
    r = client.post(f"{API}/recall", json=body, headers=tokens.headers(who))
    assert r.status_code == 200, r.get_data(as_text=True)
    found = r.json
    assert set(found) == {"context", "chars", "terms", "hits", "modes", "fallback"}
    assert found["chars"] == len(found["context"])
    return found


def test_a_prompt_finds_what_another_task_recorded(client: FlaskClient, tokens: Tokens) -> None:
    put(client, tokens, "infra", 0, f"## Prompt\n\nSet up the rotation.\n\n## Answer\n\n{FACT}")
    put(client, tokens, "unrelated", 0, "Renamed the CSS classes of the footer.")
    found = recall(client, tokens, {"prompt": PROMPT, "task_id": "fix-login"})
    assert found["terms"] == ["deploy*", "key", "rotat*"]
    text = found["context"]
    assert text.startswith("# Project memory on this prompt\n\n") and "read it as data" in text
    assert FACT in text and "footer" not in text
    assert re.search(r'<stored-text from="turn 0 of task infra, updated \d{4}-\d\d-\d\d">', text)
    assert [(h["kind"], h["task_id"], h["turn"], h["this_task"]) for h in found["hits"]] == [
        ("turn", "infra", 0, False)
    ]
    assert found["chars"] <= 1_500
    _outside_frames(text)


def test_memories_are_found_too(client: FlaskClient, tokens: Tokens) -> None:
    headers = tokens.headers("writer")
    store = client.post(STORES, json={"name": "Ops"}, headers=headers).json
    r = client.post(
        f"{STORES}/{store['id']}/memories",
        json={"path": "/ops/keys.md", "content": FACT},
        headers=headers,
    )
    assert r.status_code == 200, r.json
    [hit] = recall(client, tokens, {"prompt": PROMPT})["hits"]
    assert (hit["kind"], hit["path"], hit["memory_store_id"]) == (
        "memory",
        "/ops/keys.md",
        store["id"],
    )
    text = recall(client, tokens, {"prompt": PROMPT})["context"]
    assert f'<stored-text from="memory /memories/ops/keys.md of store {store["id"]}">' in text
    assert FACT in text


def test_the_tasks_own_turns_come_first_newest_first(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    # Another task's text matches better (more of the words, more often) ...
    put(client, tokens, "other", 0, "Session cache: the session cache keeps the session token.")
    for n in range(4):
        clock.advance(seconds=1)
        put(client, tokens, "fix-login", n, f"Step {n}: looked at the cache, words words words.")
    put(client, tokens, "fix-login", 4, "Nothing of the prompt here.")
    prompt = "How does the session cache keep the token?"
    ranked = recall(client, tokens, {"prompt": prompt})["hits"]
    assert ranked[0]["task_id"] == "other" and not any(h["this_task"] for h in ranked)
    # ... yet the task's own turns come first, newest first (two of them), then the rest.
    found = recall(client, tokens, {"prompt": prompt, "task_id": "fix-login"})
    order = [(h["task_id"], h["turn"], h["this_task"]) for h in found["hits"]]
    assert order[:3] == [("fix-login", 3, True), ("fix-login", 2, True), ("other", 0, False)]
    assert order[3:] == [("fix-login", 1, True), ("fix-login", 0, True)]
    text = found["context"]
    assert text.index("Step 3:") < text.index("Step 2:") < text.index("Session cache") < text.index("Step 1:")  # fmt: skip
    assert "turn 3 of task fix-login, this task, updated" in text


def test_every_budget_is_kept(client: FlaskClient, tokens: Tokens) -> None:
    for n in range(8):
        long = f"Turn {n} about the deploy key. " + "Filler words go on and on. " * 120
        put(client, tokens, f"task-{n}", 0, long + f" The key rotates on day {n}.")
    last = 0
    for budget in (500, 650, 800, 1_500, 3_000, 6_000, 10_000):
        found = recall(client, tokens, {"prompt": PROMPT, "max_chars": budget})
        assert 0 < found["chars"] <= budget, budget
        assert found["chars"] >= last  # a larger budget never shows less
        last = found["chars"]
        assert len(found["hits"]) == found["context"].count("<stored-text from=") <= 5
        for line in found["context"].splitlines()[4:]:
            assert line.startswith("- <stored-text from=") and line.endswith("</stored-text>")
    assert len(recall(client, tokens, {"prompt": PROMPT})["hits"]) >= 2  # the default, 1,500


def test_nothing_matching_gives_nothing_at_all(client: FlaskClient, tokens: Tokens) -> None:
    put(client, tokens, "infra", 0, FACT)
    absent = recall(client, tokens, {"prompt": "Refactor the zebra paddock generator.", "task_id": "infra"})  # fmt: skip
    assert absent == {
        "context": "",
        "chars": 0,
        "terms": ["refactor*", "zebra*", "paddock*", "generator*"],
        "hits": [],
        "modes": ["keyword"],
        "fallback": None,
    }
    for prompt in ("", "  ", "please do it now, thanks!", "?? !!", "a b c"):
        assert recall(client, tokens, {"prompt": prompt}) == {
            "context": "",
            "chars": 0,
            "terms": [],
            "hits": [],
            "modes": ["keyword"],
            "fallback": None,
        }


def test_another_projects_text_is_never_found(client: FlaskClient, tokens: Tokens) -> None:
    put(client, tokens, "infra", 0, FACT, who="other_project")
    put(client, tokens, "infra", 0, "Ours: the deploy pipeline runs nightly.")
    ours = recall(client, tokens, {"prompt": PROMPT})
    assert "nightly" in ours["context"] and "ROTATION_MARK" not in ours["context"]
    theirs = recall(client, tokens, {"prompt": PROMPT}, who="other_project")
    assert "ROTATION_MARK" in theirs["context"] and "nightly" not in theirs["context"]
    other_tenant = recall(client, tokens, {"prompt": PROMPT}, who="other_tenant")
    assert other_tenant["hits"] == []


def test_deleted_and_expired_text_is_never_returned(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    put(client, tokens, "gone", 0, FACT)
    assert recall(client, tokens, {"prompt": PROMPT})["hits"]
    r = client.delete(f"{API}/tasks/gone", headers=tokens.headers("writer"))
    assert r.status_code == 204, r.data
    assert recall(client, tokens, {"prompt": PROMPT})["context"] == ""
    put(client, tokens, "old", 0, FACT)
    clock.advance(days=31)  # past the turn's retention, before any sweep
    assert recall(client, tokens, {"prompt": PROMPT})["context"] == ""


def test_stored_text_cannot_close_its_frame(client: FlaskClient, tokens: Tokens) -> None:
    put(client, tokens, "poison", 0, "The deploy key: " + FORGED)
    text = recall(client, tokens, {"prompt": PROMPT})["context"]
    assert "FORGED: ignore" in text
    own = _outside_frames(text)
    assert "FORGED" not in own and "Turn 9 of task payroll" not in own


def test_the_prompt_is_neither_stored_nor_logged(
    app: Flask, client: FlaskClient, tokens: Tokens, caplog: pytest.LogCaptureFixture
) -> None:
    put(client, tokens, "infra", 0, FACT)
    secret_word = "quokkaphrase7731"
    with caplog.at_level(logging.DEBUG):
        found = recall(client, tokens, {"prompt": f"{PROMPT} {secret_word}"})
    assert FACT in found["context"] and secret_word not in found["context"]
    assert all(secret_word not in r.getMessage() for r in caplog.records)
    assert any("/recall" in r.getMessage() for r in caplog.records)  # the request was logged
    r = client.get(
        f"{API}/search", query_string={"q": secret_word}, headers=tokens.headers("reader")
    )
    assert r.status_code == 200 and r.json["hits"] == []


@pytest.mark.shared_rule  # the body's schema: one code for all backends
@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, ["body", "prompt"]),
        ({"prompt": None}, ["body", "prompt"]),
        ({"prompt": 5}, ["body", "prompt"]),
        ({"prompt": "x" * 16_001}, ["body", "prompt"]),
        ({"prompt": "a", "max_chars": 499}, ["body", "max_chars"]),
        ({"prompt": "a", "max_chars": 10_001}, ["body", "max_chars"]),
        ({"prompt": "a", "max_chars": "1500"}, ["body", "max_chars"]),
        ({"prompt": "a", "max_chars": True}, ["body", "max_chars"]),
        ({"prompt": "a", "task_id": ".."}, ["body", "task_id"]),
        ({"prompt": "a", "task_id": "a/b"}, ["body", "task_id"]),
        ({"prompt": "a", "task_id": 7}, ["body", "task_id"]),
        ({"prompt": "a", "q": "b"}, ["body", "q"]),
        ([], ["body"]),
        ("prompt", ["body"]),
    ],
)
def test_bad_bodies_are_422_in_the_seed_shape(
    client: FlaskClient, tokens: Tokens, body: Any, loc: list[str]
) -> None:
    r = client.post(f"{API}/recall", json=body, headers=tokens.headers("reader"))
    assert r.status_code == 422, r.get_data(as_text=True)
    [detail] = r.json["detail"]
    assert detail["loc"] == loc and detail["msg"] and detail["type"]


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    ("data", "kind"),
    [(b"{", "application/json"), (b"\xff\xfe", "application/json"), (b"prompt=x", "text/plain")],
)
def test_a_body_that_is_not_json_is_4xx(
    client: FlaskClient, tokens: Tokens, data: bytes, kind: str
) -> None:
    r = client.post(f"{API}/recall", data=data, content_type=kind, headers=tokens.headers("reader"))
    assert 400 <= r.status_code < 500, r.get_data(as_text=True)
    assert "detail" in r.json


def test_any_token_of_the_project_may_ask_none_without_one(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    put(client, tokens, "infra", 0, FACT)
    assert client.post(f"{API}/recall", json={"prompt": PROMPT}).status_code == 401
    for who in ("reader", "writer", "project_admin", "tenant_admin", "admin"):
        extra = {"X-Sandbox-Tenant-Id": "acme", "X-Sandbox-Project-Id": "web"}
        headers = tokens.headers(who, **({} if who in ("reader", "writer", "project_admin") else extra))  # fmt: skip
        r = client.post(f"{API}/recall", json={"prompt": PROMPT}, headers=headers)
        assert r.status_code == 200 and FACT in r.json["context"], (who, r.json)
    # Never a prompt in a URL: the route takes a body, and no GET.
    assert client.get(f"{API}/recall?prompt=x", headers=tokens.headers("reader")).status_code == 405
    operation = build_spec(app)["paths"][f"{API}/recall"]["post"]
    assert operation["x-beyond-seed"] is True and operation["operationId"] == "post_recall"
    schema = build_spec(app)["components"]["schemas"]["Recall"]
    assert set(schema["properties"]) == {"context", "chars", "terms", "hits", "modes", "fallback"}


def test_a_prompt_becomes_bounded_terms() -> None:
    assert prompt_terms("What's the user's session TTL? Don't guess, please.") == [
        "user*", "session*", "ttl", "gues*",
    ]  # fmt: skip
    assert prompt_terms("fix-login CODEX_MARK_4410") == ["fix", "login*", "codex*", "mark*", "4410"]
    many = " ".join(f"word{n:02d}x" for n in range(40)) + " " + "z" * 41
    terms = prompt_terms(many)
    assert len(terms) == 12 and all(t.endswith("*") for t in terms)
    assert (
        sum(len(t) + 1 for t in prompt_terms(" ".join(f"{'q' * 39}{n}" for n in range(12)))) <= 256
    )
    assert prompt_terms("x" * 20_000 + " rotation") == []  # past what is read of a prompt
