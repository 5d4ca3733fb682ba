"""Every validation failure answers 422 HTTPValidationError with loc naming the fault."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from tests.conftest import Tokens

BASE = "/sandbox/memory/v1"


def assert_422(resp, loc: list, type_: str | None = None) -> dict:
    assert resp.status_code == 422, resp.data
    body = resp.get_json()
    assert set(body) == {"detail"} and isinstance(body["detail"], list) and body["detail"]
    for item in body["detail"]:
        assert {"loc", "msg", "type"} <= set(item) <= {"loc", "msg", "type", "input", "ctx"}
    match = [d for d in body["detail"] if d["loc"] == loc]
    assert match, f"no error at {loc}: {body}"
    if type_:
        assert match[0]["type"] == type_
    return match[0]


@pytest.mark.parametrize(
    ("meta", "field", "type_"),
    [
        ({"exit_code": "1"}, "exit_code", "int_type"),
        ({"exit_code": 1.5}, "exit_code", "int_type"),
        ({"exit_code": True}, "exit_code", "int_type"),
        ({"agent_id": 5}, "agent_id", "string_type"),
        ({"model": ["x"]}, "model", "string_type"),
        ({"started_at": "yesterday"}, "started_at", "value_error"),
        ({"ended_at": True}, "ended_at", "value_error"),
        ({"tokens": 1.5}, "tokens", "value_error"),
        ({"tokens": "10"}, "tokens", "value_error"),
        ({"cost": "cheap"}, "cost", "value_error"),
        ({"cost": True}, "cost", "value_error"),
    ],
)
def test_turn_meta_types(
    client: FlaskClient, tokens: Tokens, meta: dict, field: str, type_: str
) -> None:
    resp = client.put(
        f"{BASE}/tasks/t/turns/0", json={"meta": meta}, headers=tokens.headers("writer")
    )
    item = assert_422(resp, ["body", "meta", field], type_)
    assert item["input"] == meta[field]


@pytest.mark.parametrize(
    "meta",
    [
        {"started_at": "2026-01-01T00:00:00+02:00", "ended_at": 1767225600},
        {"tokens": 5, "cost": {"usd": 1.2}},
        {"tokens": {"in": 1}, "cost": 3},
        {"exit_code": None, "model": None},
    ],
)
def test_turn_meta_accepted_forms(client: FlaskClient, tokens: Tokens, meta: dict) -> None:
    resp = client.put(
        f"{BASE}/tasks/t/turns/0", json={"meta": meta}, headers=tokens.headers("writer")
    )
    assert resp.status_code == 200
    assert resp.get_json()["meta"] == meta


def test_summary_limit_is_one_mib_of_utf8(client: FlaskClient, tokens: Tokens) -> None:
    ok = "é" * (512 * 1024)  # exactly 1 MiB of UTF-8
    resp = client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": ok}, headers=tokens.headers("writer")
    )
    assert resp.status_code == 200
    resp = client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": ok + "x"}, headers=tokens.headers("writer")
    )
    assert_422(resp, ["body", "summary_md"])
    assert (
        client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).get_json()[
            "summary_md"
        ]
        == ok
    )


def test_summary_must_be_a_string(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": 12}, headers=tokens.headers("writer")
    )
    assert_422(resp, ["body", "summary_md"], "string_type")


def test_unknown_top_level_field(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary": "typo"}, headers=tokens.headers("writer")
    )
    assert_422(resp, ["body", "summary"], "extra_forbidden")


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"",
        b"[1, 2]",
        b'"text"',
        b'{"a": NaN}',
        b"\xff\xfe",
        b'{"summary_md": "\\ud800"}',
        b"[" * 5000,
    ],
)
def test_body_that_is_not_a_json_object(client: FlaskClient, tokens: Tokens, raw: bytes) -> None:
    resp = client.put(
        f"{BASE}/tasks/t/turns/0",
        data=raw,
        headers=tokens.headers("writer", **{"Content-Type": "application/json"}),
    )
    assert_422(resp, ["body"])


def test_deeply_nested_meta_is_refused(client: FlaskClient, tokens: Tokens) -> None:
    meta: dict = {}
    node = meta
    for _ in range(100):
        node["x"] = {}
        node = node["x"]
    resp = client.put(
        f"{BASE}/tasks/t/turns/0", json={"meta": meta}, headers=tokens.headers("writer")
    )
    assert_422(resp, ["body"])


@pytest.mark.parametrize(
    "task_id",
    ["-lead", ".hidden", "a" * 129, "sp ace", "naïve", "a%00b", "‥", "．．"],
)
def test_invalid_task_id_in_path(client: FlaskClient, tokens: Tokens, task_id: str) -> None:
    resp = client.get(f"{BASE}/tasks/{task_id}", headers=tokens.headers("reader"))
    assert_422(resp, ["path", "task_id"])
    resp = client.put(f"{BASE}/tasks/{task_id}/turns/0", json={}, headers=tokens.headers("writer"))
    assert_422(resp, ["path", "task_id"])


@pytest.mark.parametrize(
    "turn", ["-1", "10000", "1.5", "x", "99999999999", "٣", "²", "1" * 5000, "+5", " 1", "1_0"]
)
def test_invalid_turn_in_path(client: FlaskClient, tokens: Tokens, turn: str) -> None:
    resp = client.get(f"{BASE}/tasks/t/turns/{turn}", headers=tokens.headers("reader"))
    assert_422(resp, ["path", "turn"], "int_parsing")


def test_turn_bounds_and_zero_padding(client: FlaskClient, tokens: Tokens) -> None:
    for turn in ("0", "9999"):
        assert (
            client.put(
                f"{BASE}/tasks/t/turns/{turn}", json={}, headers=tokens.headers("writer")
            ).status_code
            == 200
        )
    assert (
        client.get(f"{BASE}/tasks/t/turns/0009999", headers=tokens.headers("reader")).get_json()[
            "turn"
        ]
        == 9999
    )


@pytest.mark.parametrize("name", [".", "..", "a" * 129, "sp ace", "naïve"])
def test_invalid_artifact_name(client: FlaskClient, tokens: Tokens, name: str) -> None:
    client.put(f"{BASE}/tasks/t/turns/0", json={}, headers=tokens.headers("writer"))
    resp = client.put(
        f"{BASE}/tasks/t/turns/0/artifacts/{name}", data=b"x", headers=tokens.headers("writer")
    )
    assert resp.status_code in (404, 422)
    if resp.status_code == 422:
        assert_422(resp, ["path", "name"])


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ("limit=0", ["query", "limit"]),
        ("limit=1001", ["query", "limit"]),
        ("limit=abc", ["query", "limit"]),
        ("cursor=garbage", ["query", "cursor"]),
        ("cursor=" + "A" * 2000, ["query", "cursor"]),
    ],
)
def test_invalid_list_query(client: FlaskClient, tokens: Tokens, query: str, loc: list) -> None:
    assert_422(client.get(f"{BASE}/tasks?{query}", headers=tokens.headers("reader")), loc)


@pytest.mark.parametrize(
    ("limit", "type_"),
    [
        ("²", "int_parsing"),  # str.isdigit says yes, int() says no
        ("٥٠", "int_parsing"),  # Arabic-Indic 50: int() would take it
        ("-1", "int_parsing"),  # no sign where a negative value means nothing
        ("+5", "int_parsing"),
        (" 5", "int_parsing"),
        ("1_0", "int_parsing"),
        ("", "int_parsing"),
        ("9" * 21, "int_parsing"),  # over the digit bound: refused unread
        ("9" * 20, "value_error"),  # in the bound: a number, out of range
        ("0", "value_error"),
    ],
)
def test_limit_is_ascii_digits_only(
    client: FlaskClient, tokens: Tokens, limit: str, type_: str
) -> None:
    resp = client.get(
        f"{BASE}/tasks", query_string={"limit": limit}, headers=tokens.headers("reader")
    )
    item = assert_422(resp, ["query", "limit"], type_)
    assert item["input"] == limit


def test_limit_with_leading_zeros_is_the_number(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.get(f"{BASE}/tasks?limit=0050", headers=tokens.headers("reader"))
    assert resp.status_code == 200, resp.data


def test_cursor_from_another_project_is_refused(client: FlaskClient, tokens: Tokens) -> None:
    for i in range(3):
        client.put(f"{BASE}/tasks/t{i}/turns/0", json={}, headers=tokens.headers("writer"))
    cursor = client.get(f"{BASE}/tasks?limit=1", headers=tokens.headers("reader")).get_json()[
        "next_cursor"
    ]
    assert cursor
    resp = client.get(f"{BASE}/tasks?cursor={cursor}", headers=tokens.headers("other_project"))
    assert_422(resp, ["query", "cursor"])
    tampered = cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")
    assert_422(
        client.get(f"{BASE}/tasks?cursor={tampered}", headers=tokens.headers("reader")),
        ["query", "cursor"],
    )


def test_bad_content_type_header_for_artifact(client: FlaskClient, tokens: Tokens) -> None:
    client.put(f"{BASE}/tasks/t/turns/0", json={}, headers=tokens.headers("writer"))
    resp = client.put(
        f"{BASE}/tasks/t/turns/0/artifacts/a",
        data=b"x",
        headers=tokens.headers("writer", **{"Content-Type": "not a type"}),
    )
    assert_422(resp, ["header", "Content-Type"])


def test_bad_scope_header(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.get(
        f"{BASE}/tasks",
        headers=tokens.headers("tenant_admin", **{"X-Sandbox-Project-Id": "../etc"}),
    )
    assert_422(resp, ["header", "X-Sandbox-Project-Id"])


def test_json_body_over_the_limit_is_413(app, client: FlaskClient, tokens: Tokens) -> None:
    body = b'{"summary_md": "' + b"x" * (app.config["MAX_JSON_BYTES"] + 10) + b'"}'
    resp = client.put(
        f"{BASE}/tasks/t/turns/0",
        data=body,
        headers=tokens.headers("writer", **{"Content-Type": "application/json"}),
    )
    assert resp.status_code == 413
    assert str(app.config["MAX_JSON_BYTES"]) in resp.get_json()["detail"]


def test_method_not_allowed_keeps_allow_header(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.post(f"{BASE}/tasks/t", headers=tokens.headers("writer"))
    assert resp.status_code == 405
    assert "GET" in resp.headers["Allow"] and "DELETE" in resp.headers["Allow"]
    assert isinstance(resp.get_json()["detail"], str)


def test_unknown_route_is_404_with_detail(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.get(f"{BASE}/nope", headers=tokens.headers("reader"))
    assert resp.status_code == 404 and isinstance(resp.get_json()["detail"], str)


@pytest.mark.parametrize("name", ["a/b", "a%2Fb", "dir/sub/file.txt", "a/", "a%0A", "a%0Ab/c"])
def test_an_artifact_name_with_a_slash_or_line_break_is_a_422_naming_the_rule(
    client: FlaskClient, tokens: Tokens, name: str
) -> None:
    headers = tokens.headers("writer")
    assert client.put(f"{BASE}/tasks/t/turns/0", json={}, headers=headers).status_code == 200
    url = f"{BASE}/tasks/t/turns/0/artifacts/{name}"
    sent = (
        client.put(url, data=b"x", headers=headers),
        client.get(url, headers=headers),
        client.delete(url, headers=headers),
    )
    for resp in sent:
        error = assert_422(resp, ["path", "name"], "string_pattern_mismatch")
        assert "[A-Za-z0-9._-]{1,128}" in error["msg"]
    assert client.get(f"{BASE}/tasks/t/turns/0", headers=headers).get_json()["artifacts"] == []
