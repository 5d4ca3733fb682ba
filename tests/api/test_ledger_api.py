"""``GET /ledger``, ``GET /timeline`` and the price table over HTTP (beyond the seed's API): any
token of the project reads them, a project_admin sets the prices; every figure is named with
its unit; bad input is the seed's 422, never a 500; another project's turns never show."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.names import Scope
from app.storage.core.users import User, user_id
from tests.conftest import FixedClock, Tokens

pytestmark = pytest.mark.all_backends
PM = "/sandbox/memory/v1"


def put(client: FlaskClient, auth: Tokens, task: str, turn: int, **meta: Any) -> None:
    r = client.put(
        f"{PM}/tasks/{task}/turns/{turn}",
        headers=auth.headers("writer"),
        json={"meta": meta, "summary_md": f"{task} {turn}"},
    )
    assert r.status_code == 200, r.json


def seed(client: FlaskClient, tokens: Tokens) -> None:
    base: dict[str, Any] = {
        "tokens": {"input": 1000, "output": 100, "cache_read": 10, "cache_creation": 1}
    }
    put(client, tokens, "fix-login", 0, agent_id="claude-code", model="opus", branch="main",
        claude_session_id="s1", started_at="2025-12-31T09:00:00Z",
        ended_at="2025-12-31T09:01:30Z", exit_code=0, **base)  # fmt: skip
    put(client, tokens, "fix-login", 1, agent_id="claude-code", model="opus", branch="main",
        claude_session_id="s1", started_at="2025-12-31T10:00:00Z", exit_code=1, cost=0.25,
        **base)  # fmt: skip
    put(client, tokens, "ci", 0, agent_id="codex", model="gpt-5", branch="feature/x",
        codex_session_id="s2", started_at="2025-12-30T23:00:00Z", **base)  # fmt: skip


def get(client: FlaskClient, tokens: Tokens, path: str, who: str = "reader", **query: Any) -> Any:
    r = client.get(f"{PM}/{path}", headers=tokens.headers(who), query_string=query)
    assert r.status_code == 200, r.json
    return r.json


def test_the_ledger_sums_by_what_is_asked(client: FlaskClient, tokens: Tokens) -> None:
    seed(client, tokens)
    body = get(client, tokens, "ledger", group_by="day,model")
    assert body["group_by"] == ["day", "model"]
    assert (body["since"], body["until"], body["next_cursor"]) == (None, None, None)
    assert body["totals"] == {
        "turns": 3,
        "sessions": 2,
        "input_tokens": 3000,
        "output_tokens": 300,
        "cache_read_tokens": 30,
        "cache_creation_tokens": 3,
        "cost_usd": 0.25,
        "reported_cost_usd": 0.25,
        "unpriced_turns": 2,
        "wall_seconds": 90.0,
        "nonzero_exits": 1,
    }
    assert [(r["day"], r["model"], r["turns"], r["sessions"]) for r in body["rows"]] == [
        ("2025-12-31", "opus", 2, 1),
        ("2025-12-30", "gpt-5", 1, 1),
    ]
    by_branch = get(client, tokens, "ledger", group_by="branch", agent="codex")
    assert [(r["branch"], r["turns"]) for r in by_branch["rows"]] == [("feature/x", 1)]
    totals = get(client, tokens, "ledger", group_by="", since="2025-12-31T12:00:00Z")
    assert totals["rows"] == [] and totals["totals"]["turns"] == 2
    assert totals["since"] == "2025-12-31"
    # The default grouping is by day; a task or session grouping reads the finer rollup.
    assert [r["day"] for r in get(client, tokens, "ledger")["rows"]] == [
        "2025-12-31",
        "2025-12-30",
    ]
    tasks = get(client, tokens, "ledger", group_by="task,session", limit=1)
    assert [(r["task"], r["session"]) for r in tasks["rows"]] == [("ci", "s2")]
    more = get(
        client, tokens, "ledger", group_by="task,session", limit=1, cursor=tasks["next_cursor"]
    )
    assert [(r["task"], r["session"]) for r in more["rows"]] == [("fix-login", "s1")]


def test_relative_times_read_the_servers_clock(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    seed(client, tokens)  # the clock is 2026-01-01T00:00Z
    assert get(client, tokens, "ledger", group_by="", since="1d")["totals"]["turns"] == 2
    assert get(client, tokens, "ledger", group_by="", since="yesterday")["since"] == "2025-12-31"
    assert get(client, tokens, "timeline", since="14h")["turns"] == [
        {
            "task_id": "fix-login",
            "turn": 1,
            "at": "2025-12-31T10:00:00.000000Z",
            "agent": "claude-code",
            "model": "opus",
            "branch": "main",
            "session": "s1",
            "commit": None,
            "input_tokens": 1000,
            "output_tokens": 100,
            "cache_read_tokens": 10,
            "cache_creation_tokens": 1,
            "cost_usd": 0.25,
            "wall_seconds": 0.0,
            "exit_code": 1,
        }
    ]


def test_the_timeline_pages_newest_first(client: FlaskClient, tokens: Tokens) -> None:
    seed(client, tokens)
    first = get(client, tokens, "timeline", limit=2)
    rest = get(client, tokens, "timeline", limit=2, cursor=first["next_cursor"])
    assert rest["next_cursor"] is None
    assert [(t["task_id"], t["turn"]) for t in first["turns"] + rest["turns"]] == [
        ("fix-login", 1),
        ("fix-login", 0),
        ("ci", 0),
    ]
    mine = get(client, tokens, "timeline", branch="main", since="2025-12-31T09:30:00Z")
    assert [t["turn"] for t in mine["turns"]] == [1]


def test_a_project_admin_sets_the_prices_every_read_uses(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    seed(client, tokens)
    assert get(client, tokens, "ledger/prices") == {"unit": "USD per million tokens", "models": {}}
    table = {"models": {"opus": {"input": 15, "output": 75}, "gpt-5": {"input": 1.25}}}
    refused = client.put(f"{PM}/ledger/prices", headers=tokens.headers("writer"), json=table)
    assert refused.status_code == 403
    r = client.put(f"{PM}/ledger/prices", headers=tokens.headers("project_admin"), json=table)
    assert r.status_code == 200, r.json
    assert r.json["models"]["opus"] == {
        "input": 15.0,
        "output": 75.0,
        "cache_read": 0.0,
        "cache_creation": 0.0,
    }
    totals = get(client, tokens, "ledger", group_by="")["totals"]
    # opus turn 0: 1000 in, 100 out; gpt-5: 1000 in; the turn with a cost keeps its own.
    assert totals["cost_usd"] == pytest.approx(0.25 + (15_000 + 7_500) / 1e6 + 1_250 / 1e6)
    assert totals["unpriced_turns"] == 0
    events = app.extensions["storage"].audit_log.page(Scope("acme", "web")).events
    assert any(e.subject == "ledger prices" for e in events)
    cleared = client.put(
        f"{PM}/ledger/prices", headers=tokens.headers("project_admin"), json={"models": {}}
    )
    assert cleared.json["models"] == {}


@pytest.mark.parametrize(
    ("path", "query", "loc"),
    [
        ("ledger", {"group_by": "week"}, "group_by"),
        ("ledger", {"group_by": "day,"}, "group_by"),
        ("ledger", {"since": "last tuesday"}, "since"),
        ("ledger", {"until": "0d"}, "until"),
        ("ledger", {"limit": "0"}, "limit"),
        ("ledger", {"limit": "1001"}, "limit"),
        ("ledger", {"agent": "a\x01b"}, "agent"),
        ("ledger", {"model": "m" * 257}, "model"),
        ("ledger", {"cursor": "not-a-cursor"}, "cursor"),
        ("timeline", {"since": "2026-02-30"}, "since"),
        ("timeline", {"limit": "x"}, "limit"),
        ("timeline", {"branch": "\x00"}, "branch"),
        ("timeline", {"cursor": "x"}, "cursor"),
    ],
)
def test_bad_input_is_a_422_at_its_parameter(
    client: FlaskClient, tokens: Tokens, path: str, query: dict[str, str], loc: str
) -> None:
    r = client.get(f"{PM}/{path}", headers=tokens.headers("reader"), query_string=query)
    assert r.status_code == 422, r.json
    assert r.json["detail"][0]["loc"] == ["query", loc]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"models": []},
        {"models": {"opus": {"input": -1}}},
        {"models": {"opus": {"input": "15"}}},
        {"models": {"opus": {"tokens": 1}}},
        {"models": {"": {"input": 1}}},
        {"models": {"m" * 65: {"input": 1}}},
        {"models": {"opus": {"input": 1e7}}},
        {"models": {"opus": 3}},
        {"models": {}, "extra": 1},
    ],
)
def test_a_bad_price_table_is_a_422_and_changes_nothing(
    client: FlaskClient, tokens: Tokens, body: dict[str, Any]
) -> None:
    h = tokens.headers("project_admin")
    assert (
        client.put(f"{PM}/ledger/prices", headers=h, json={"models": {"a": {}}}).status_code == 200
    )
    r = client.put(f"{PM}/ledger/prices", headers=h, json=body)
    assert r.status_code == 422, r.json
    assert isinstance(r.json["detail"], list)
    assert get(client, tokens, "ledger/prices")["models"] == {
        "a": {"input": 0.0, "output": 0.0, "cache_read": 0.0, "cache_creation": 0.0}
    }


def test_projects_and_tenants_never_see_each_others_turns(
    client: FlaskClient, tokens: Tokens
) -> None:
    seed(client, tokens)
    for who in ("other_project", "other_tenant"):
        assert get(client, tokens, "ledger", who=who, group_by="")["totals"]["turns"] == 0
        assert get(client, tokens, "timeline", who=who)["turns"] == []
    # A cursor of one project is refused by another.
    page = get(client, tokens, "timeline", limit=1)
    r = client.get(
        f"{PM}/timeline",
        headers=tokens.headers("other_project"),
        query_string={"limit": 1, "cursor": page["next_cursor"]},
    )
    assert r.status_code == 422


def test_the_routes_need_a_token_and_are_beyond_the_seed(client: FlaskClient) -> None:
    for path in ("ledger", "timeline", "ledger/prices"):
        assert client.get(f"{PM}/{path}").status_code == 401
    doc = client.get(f"{PM}/openapi.json").json or {}
    paths = doc.get("paths") or {}
    if not paths:
        import yaml

        paths = yaml.safe_load(client.get(f"{PM}/openapi.yaml").data)["paths"]
    for path, method in (
        ("/ledger", "get"),
        ("/timeline", "get"),
        ("/ledger/prices", "get"),
        ("/ledger/prices", "put"),
    ):
        assert paths[f"{PM}{path}"][method]["x-beyond-seed"] is True


def test_the_answers_are_in_their_schemas_shape(client: FlaskClient, tokens: Tokens) -> None:
    """The views build their bodies by hand (a schema's dump of a page costs more than the
    read): each is what its schema dumps of it (a row's keys come in group_by's order)."""
    from app.schemas import project_memory as s

    seed(client, tokens)
    for group_by in ("day,model", "task,session,branch,agent", ""):
        body = get(client, tokens, "ledger", group_by=group_by)
        assert s.LedgerReport().dump(body) == body
    body = get(client, tokens, "timeline")
    assert json.dumps(s.Timeline().dump(body)) == json.dumps(body)  # key order too


def test_a_cursor_resumes_under_a_relative_since_the_clock_moved(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    seed(client, tokens)
    first = get(client, tokens, "timeline", since="2d", limit=1)
    ledger = get(client, tokens, "ledger", group_by="day,model", since="2d", limit=1)
    clock.advance(minutes=5)  # "2d" now names another moment: the same question all the same
    rest = get(client, tokens, "timeline", since="2d", limit=5, cursor=first["next_cursor"])
    more = get(
        client, tokens, "ledger", group_by="day,model", since="2d", cursor=ledger["next_cursor"]
    )
    assert [t["turn"] for t in first["turns"] + rest["turns"]] == [1, 0, 0]
    assert [r["model"] for r in ledger["rows"] + more["rows"]] == ["opus", "gpt-5"]
    # Another filter is another question.
    r = client.get(
        f"{PM}/timeline",
        headers=tokens.headers("reader"),
        query_string={"agent": "codex", "cursor": first["next_cursor"]},
    )
    assert r.status_code == 422


@pytest.mark.parametrize(
    ("query", "since", "until", "turns"),
    [
        ({"since": "999999w"}, "1970-01-01", None, 3),
        ({"since": "0001-01-01"}, "1970-01-01", None, 3),
        ({"until": "0001-01-01"}, None, "1969-12-31", 0),
    ],
)
def test_a_moment_before_the_epoch_reads_as_the_epoch(
    client: FlaskClient,
    tokens: Tokens,
    query: dict[str, str],
    since: str | None,
    until: str | None,
    turns: int,
) -> None:
    seed(client, tokens)
    for path in ("ledger", "timeline"):
        r = client.get(f"{PM}/{path}", headers=tokens.headers("reader"), query_string=query)
        assert r.status_code == 200, (path, r.json)
    body = get(client, tokens, "ledger", **query)
    assert (body["since"], body["until"], body["totals"]["turns"]) == (since, until, turns)


def test_the_ledger_by_owner_names_the_person_behind_each_token(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    """group_by=owner sums each task's turns under the token that created the task, and
    names it as pages do ("Ana via laptop" for a person's token), paged like any grouping."""
    ana = user_id("https://idp.example", "ana")
    app.extensions["storage"].users.change(
        ana,
        lambda _: User(ana, "https://idp.example", "ana", "ana@example.com", "Ana", "2026-01-01",
                       role="writer", tenant="acme", project="web"),
    )  # fmt: skip
    made, secret = tokens.registry.create(
        role="writer", tenant="acme", project="web", name="laptop", user=ana
    )
    tokens.secrets["ana"], tokens.ids["ana"] = secret, made.id
    seed(client, tokens)  # the writer's: fix-login (2 turns), ci (1 turn)
    for turn in (0, 1):
        r = client.put(
            f"{PM}/tasks/ana-task/turns/{turn}",
            headers=tokens.headers("ana"),
            json={"meta": {"model": "opus", "tokens": {"input": 5, "output": 1},
                           "started_at": "2025-12-31T11:00:00Z"}, "summary_md": "x"},
        )  # fmt: skip
        assert r.status_code == 200, r.json
    body = get(client, tokens, "ledger", group_by="owner")
    by_owner = {r["owner"]: r for r in body["rows"]}
    assert set(by_owner) == {tokens.ids["writer"], made.id}
    assert by_owner[made.id]["owner_name"] == "Ana via laptop"
    assert by_owner[made.id]["turns"] == 2 and by_owner[made.id]["input_tokens"] == 10
    assert by_owner[tokens.ids["writer"]]["turns"] == 3
    assert by_owner[tokens.ids["writer"]]["input_tokens"] == 3000
    assert body["totals"]["turns"] == 5 == sum(r["turns"] for r in body["rows"])
    # Paged: one owner a page, in byte order, the totals on every page.
    first = get(client, tokens, "ledger", group_by="owner", limit=1)
    rest = get(client, tokens, "ledger", group_by="owner", limit=1, cursor=first["next_cursor"])
    assert [r["owner"] for r in first["rows"] + rest["rows"]] == sorted(by_owner)
    assert rest["next_cursor"] is None and rest["totals"] == body["totals"]
    # With other dimensions: by owner and model.
    mixed = get(client, tokens, "ledger", group_by="owner,model")
    assert {(r["owner"], r["model"], r["turns"]) for r in mixed["rows"]} == {
        (made.id, "opus", 2),
        (tokens.ids["writer"], "gpt-5", 1),
        (tokens.ids["writer"], "opus", 2),
    }
