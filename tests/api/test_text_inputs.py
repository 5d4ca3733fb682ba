"""Every text input of both APIs and of /mcp, fuzzed on every backend: never a 500, and the
same answer from each, given by the rule the input follows.

One rule for NUL (U+0000), whichever backend stores the data: free text (a turn's summary
and meta, a store's description and metadata, a memory's content) is stored and given back
as sent, NUL and all; a value with a rule of its own (an id, a name, a path, a media type, a
query, a cursor, a time) refuses every control character, NUL included, with the API's
validation error (422, or 400 on the memory-stores API). A filter value that holds a NUL
matches nothing.
"""

from __future__ import annotations

import itertools
import json
from typing import Any
from urllib.parse import quote

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, example, given, settings, strategies as st
from werkzeug.test import TestResponse

from app.api.common import strict_int
from app.storage.core import store_rules
from app.storage.core.clock import is_time
from app.storage.core.errors import InvalidName
from app.storage.core.names import validate_artifact_name, validate_id
from app.storage.core.query import parse_query
from app.storage.core.store_records import OPERATIONS
from app.storage.core.task_rules import check_content_type
from tests.conftest import Tokens

pytestmark = pytest.mark.all_backends

PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"
_n = itertools.count()

# Any text (hypothesis leaves lone surrogates out: JSON text cannot carry them unescaped),
# and text built around a NUL, the character PostgreSQL's text refuses.
TEXT = st.one_of(
    st.text(max_size=24),
    st.builds(lambda a, b: f"{a}\x00{b}", st.text(max_size=8), st.text(max_size=8)),
    st.sampled_from(["\x00", "a\x00", "\x00\x00", "\x7f", "\u2028", "\ufeff", "é", "🚀", " "]),
)
# What a header can carry through the test client: latin-1, no line break.
HEADER_TEXT = st.one_of(
    st.text(st.characters(max_codepoint=0xFF, exclude_characters="\r\n"), max_size=24),
    st.sampled_from(["\x00", "a\x00b", "web", "*", '"x"']),
)
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
NUL_EXAMPLES = ["\x00", "a\x00b"]


def _takes(check: Any, *args: Any) -> bool:
    try:
        check(*args)
    except InvalidName:
        return False
    return True


def _validation_422(r: TestResponse) -> None:
    assert r.status_code == 422, (r.status_code, r.data[:300])
    detail = r.get_json()["detail"]
    assert detail and all({"loc", "msg", "type"} <= set(item) for item in detail)


def _envelope_400(r: TestResponse) -> None:
    assert r.status_code == 400, (r.status_code, r.data[:300])
    body = r.get_json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


def _url(value: str) -> str:
    return quote(value, safe="")


@pytest.fixture
def h(tokens: Tokens) -> dict[str, str]:
    return tokens.headers("writer")


@pytest.fixture
def store(client: FlaskClient, h: dict[str, str]) -> str:
    r = client.post(MS, json={"name": "fuzz"}, headers=h)
    assert r.status_code == 200
    return str(r.get_json()["id"])


# -- project memory: free text is stored as sent ---------------------------------------------
META_STRINGS = ["agent_id", "model", "job_id", "sandbox_id", "commit", "claude_session_id"]


@SETTINGS
@given(value=TEXT, field=st.sampled_from([*META_STRINGS, "note"]))
@example(value="a\x00b", field="model")
@example(value="a\x00b", field="agent_id")
def test_meta_strings_are_stored_as_sent(
    client: FlaskClient, h: dict[str, str], value: str, field: str
) -> None:
    task = f"t{next(_n)}"
    meta = {field: value, "deep": {"list": [value], value: field}}
    r = client.put(f"{PM}/tasks/{task}/turns/0", json={"meta": meta}, headers=h)
    assert r.status_code == 200, r.data[:300]
    assert client.get(f"{PM}/tasks/{task}/turns/0", headers=h).get_json()["meta"] == meta
    # Everything that reads what the turn left behind still answers.
    assert client.get(f"{PM}/tasks/{task}", headers=h).get_json()["turns"][0]["meta"] == meta
    assert client.get(f"{PM}/tasks?limit=5", headers=h).status_code == 200
    assert client.get(f"{PM}/project.md", headers=h).status_code == 200
    assert client.get(f"{PM}/search?q={task}", headers=h).status_code == 200


@SETTINGS
@given(value=TEXT)
@example(value="a\x00b")
def test_summaries_are_stored_as_sent(client: FlaskClient, h: dict[str, str], value: str) -> None:
    task = f"s{next(_n)}"
    r = client.put(f"{PM}/tasks/{task}/turns/0", json={"summary_md": value}, headers=h)
    assert r.status_code == 200, r.data[:300]
    assert client.get(f"{PM}/tasks/{task}/turns/0", headers=h).get_json()["summary_md"] == value
    assert client.get(f"{PM}/project.md", headers=h).status_code == 200
    assert client.get(f"{PM}/search?q={task}", headers=h).status_code == 200


@SETTINGS
@given(value=TEXT | st.sampled_from(["2026-01-01T00:00:00Z", "2026-02-30", "2026-01-01"]))
@example(value="2026-01-01T00:00:00\x00")
@example(value="2026-01-01X10:00")  # ISO 8601 to Python, not RFC 3339
def test_meta_times_follow_rfc_3339(client: FlaskClient, h: dict[str, str], value: str) -> None:
    task = f"i{next(_n)}"
    r = client.put(f"{PM}/tasks/{task}/turns/0", json={"meta": {"started_at": value}}, headers=h)
    if not is_time(value):
        _validation_422(r)
        return
    assert r.status_code == 200, r.data[:300]
    assert r.get_json()["meta"] == {"started_at": value}


# -- project memory: values with a rule of their own -----------------------------------------
@SETTINGS
@given(value=TEXT | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True))
@example(value="a\x00b")
def test_task_ids_in_the_path(client: FlaskClient, h: dict[str, str], value: str) -> None:
    r = client.put(f"{PM}/tasks/{_url(value)}/turns/0", json={}, headers=h)
    if _takes(validate_id, "task_id", value):
        assert r.status_code == 200 and r.get_json()["task_id"] == value
        assert client.get(f"{PM}/tasks/{_url(value)}", headers=h).status_code == 200
    elif r.status_code != 404:  # no route: an empty id, a '/' in it
        _validation_422(r)


@SETTINGS
@given(value=TEXT | st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True))
@example(value="a\x00b")
def test_artifact_names_in_the_path(client: FlaskClient, h: dict[str, str], value: str) -> None:
    assert client.put(f"{PM}/tasks/a/turns/0", json={}, headers=h).status_code == 200
    url = f"{PM}/tasks/a/turns/0/artifacts/{_url(value)}"
    r = client.put(url, data=b"x", headers=h)
    if _takes(validate_artifact_name, value):
        assert r.status_code == 200 and r.get_json()["name"] == value
        assert client.get(url, headers=h).data == b"x"
    elif r.status_code != 404:
        _validation_422(r)


@SETTINGS
@given(value=HEADER_TEXT | st.sampled_from(["text/plain", "text/plain; charset=utf-8"]))
@example(value="text/plain; x=\x00")
def test_artifact_content_types(client: FlaskClient, h: dict[str, str], value: str) -> None:
    assert client.put(f"{PM}/tasks/c/turns/0", json={}, headers=h).status_code == 200
    url = f"{PM}/tasks/c/turns/0/artifacts/a"
    r = client.put(url, data=b"x", headers={**h, "Content-Type": value})
    kept = value.strip() or "application/octet-stream"
    if _takes(check_content_type, kept):
        assert r.status_code == 200 and r.get_json()["content_type"] == kept
    else:
        _validation_422(r)


@SETTINGS
@given(value=TEXT | st.sampled_from(["fix login", '"a phrase"', "pre*", "a OR b"]))
@example(value="a\x00b")
def test_search_queries(client: FlaskClient, h: dict[str, str], value: str) -> None:
    r = client.get(f"{PM}/search?q={_url(value)}", headers=h)
    if _takes(parse_query, value):
        assert r.status_code == 200, r.data[:300]
    else:
        _validation_422(r)


@SETTINGS
@given(value=TEXT)
@example(value="\x00")
def test_cursors_and_times_in_the_query(client: FlaskClient, h: dict[str, str], value: str) -> None:
    for url in (f"{PM}/tasks?cursor=", f"{PM}/search?q=a&cursor="):
        r = client.get(url + _url(value), headers=h)
        if value:
            _validation_422(r)
        else:
            assert r.status_code == 200
    r = client.get(f"{PM}/project.md?since={_url(value)}", headers=h)
    assert r.status_code in (200, 422), r.data[:300]
    if r.status_code == 422:
        _validation_422(r)


@SETTINGS
@given(value=TEXT | st.integers(-5, 2000).map(str))
@example(value="1\x00")
def test_integers_in_the_query(client: FlaskClient, h: dict[str, str], value: str) -> None:
    number = strict_int(value)
    for url, high in ((f"{PM}/tasks?limit=", 1000), (f"{PM}/usage?hours=", 720)):
        r = client.get(url + _url(value), headers=h)
        if number is not None and 1 <= number <= high:
            assert r.status_code == 200, (url, r.data[:300])
        else:
            _validation_422(r)


@SETTINGS
@given(value=HEADER_TEXT)
@example(value="web\x00")
def test_scoping_headers(client: FlaskClient, tokens: Tokens, value: str) -> None:
    for who, headers in (
        ("tenant_admin", {"X-Sandbox-Project-Id": value}),
        ("admin", {"X-Sandbox-Tenant-Id": value, "X-Sandbox-Project-Id": "p"}),
    ):
        r = client.get(f"{PM}/whoami", headers=tokens.headers(who, **headers))
        if _takes(validate_id, "id", value):
            assert r.status_code == 200, r.data[:300]
            assert value in (r.get_json()["tenant"], r.get_json()["project"])
        else:
            _validation_422(r)


@SETTINGS
@given(value=HEADER_TEXT)
@example(value="*")
@example(value="\x00")
def test_conditional_headers(client: FlaskClient, h: dict[str, str], value: str) -> None:
    task = f"c{next(_n)}"
    r = client.put(f"{PM}/tasks/{task}/turns/0", json={}, headers={**h, "If-Match": value})
    assert r.status_code in (200, 412), r.data[:300]
    r = client.put(f"{PM}/tasks/{task}/turns/1", json={}, headers={**h, "If-None-Match": value})
    assert r.status_code == (200 if value.strip() == "*" else 400), r.data[:300]


# -- memory stores: free text is stored as sent ------------------------------------------------
@SETTINGS
@given(description=TEXT, key=TEXT.filter(lambda k: 1 <= len(k) <= 64), value=TEXT)
@example(description="d\x00", key="k\x00", value="v\x00")
def test_store_descriptions_and_metadata_are_stored_as_sent(
    client: FlaskClient, h: dict[str, str], description: str, key: str, value: str
) -> None:
    body = {"name": "s", "description": description, "metadata": {key: value}}
    r = client.post(MS, json=body, headers=h)
    assert r.status_code == 200, r.data[:300]
    sid = r.get_json()["id"]
    got = client.get(f"{MS}/{sid}", headers=h).get_json()
    assert (got["description"], got["metadata"]) == (description, {key: value})
    patch = {"description": value, "metadata": {key: None, value or "k": description}}
    r = client.post(f"{MS}/{sid}", json=patch, headers=h)
    assert r.status_code == 200, r.data[:300]
    got = client.get(f"{MS}/{sid}", headers=h).get_json()
    assert (got["description"], got["metadata"]) == (value, {value or "k": description})
    assert client.get(f"{MS}?limit=100", headers=h).status_code == 200


@SETTINGS
@given(content=TEXT)
@example(content="a\x00b")
def test_memory_contents_are_stored_as_sent(
    client: FlaskClient, h: dict[str, str], store: str, content: str
) -> None:
    folder = f"/m{next(_n)}/"
    path = f"{folder}a.md"
    r = client.post(f"{MS}/{store}/memories", json={"path": path, "content": content}, headers=h)
    assert r.status_code == 200, r.data[:300]
    mid = r.get_json()["id"]
    assert client.get(f"{MS}/{store}/memories/{mid}", headers=h).get_json()["content"] == content
    edited = content + "\x00" + content
    r = client.post(f"{MS}/{store}/memories/{mid}", json={"content": edited}, headers=h)
    assert r.status_code == 200, r.data[:300]
    listed = client.get(f"{MS}/{store}/memories?view=full&path_prefix={folder}", headers=h)
    assert [(m["path"], m["content"]) for m in listed.get_json()["data"]] == [(path, edited)]
    versions = client.get(f"{MS}/{store}/memory_versions?view=full&limit=2", headers=h).get_json()
    assert [v["content"] for v in versions["data"]] == [edited, content]
    assert client.get(f"{PM}/search?q=m", headers=h).status_code == 200


# -- memory stores: values with a rule of their own --------------------------------------------
@SETTINGS
@given(value=TEXT)
@example(value="s\x00")
def test_store_names(client: FlaskClient, h: dict[str, str], value: str) -> None:
    r = client.post(MS, json={"name": value}, headers=h)
    if _takes(store_rules.validate_name, value):
        assert r.status_code == 200 and r.get_json()["name"] == value
    else:
        _envelope_400(r)


@SETTINGS
@given(value=TEXT | TEXT.map(lambda t: "/" + t) | TEXT.map(lambda t: f"/a/{t}/b"))
@example(value="/a\x00b")
def test_memory_paths(client: FlaskClient, h: dict[str, str], store: str, value: str) -> None:
    r = client.post(f"{MS}/{store}/memories", json={"path": value, "content": "x"}, headers=h)
    if not _takes(store_rules.validate_memory_path, value):
        _envelope_400(r)
        return
    assert r.status_code == 200 and r.get_json()["path"] == value, r.data[:300]
    mid = r.get_json()["id"]
    assert client.get(f"{MS}/{store}/memories/{mid}", headers=h).get_json()["path"] == value
    assert client.delete(f"{MS}/{store}/memories/{mid}", headers=h).status_code == 200


@SETTINGS
@given(value=TEXT | TEXT.map(lambda t: f"/{t}/"))
@example(value="/a\x00/")
def test_path_prefixes(client: FlaskClient, h: dict[str, str], store: str, value: str) -> None:
    r = client.get(f"{MS}/{store}/memories?path_prefix={_url(value)}", headers=h)
    if _takes(store_rules.validate_path_prefix, value):
        assert r.status_code == 200, r.data[:300]
    else:
        _envelope_400(r)


@SETTINGS
@given(value=TEXT | st.sampled_from(["0" * 64, "A" * 64]))
@example(value="\x00" * 64)
def test_content_hashes(client: FlaskClient, h: dict[str, str], store: str, value: str) -> None:
    path = f"/h{next(_n)}"
    made = client.post(f"{MS}/{store}/memories", json={"path": path, "content": ""}, headers=h)
    mid = made.get_json()["id"]
    body = {"content": "y", "precondition": {"type": "content_sha256", "content_sha256": value}}
    updated = client.post(f"{MS}/{store}/memories/{mid}", json=body, headers=h)
    deleted = client.delete(
        f"{MS}/{store}/memories/{mid}?expected_content_sha256={_url(value)}", headers=h
    )
    for r in (updated, deleted):
        if _takes(store_rules.validate_sha256, value, "sha"):
            assert r.status_code == 409, r.data[:300]  # not the content's hash
        else:
            _envelope_400(r)


@SETTINGS
@given(value=TEXT, field=st.sampled_from(["memory_id", "api_key_id", "session_id"]))
@example(value="\x00", field="api_key_id")
@example(value="\x00", field="memory_id")
def test_version_filters(
    client: FlaskClient, h: dict[str, str], store: str, value: str, field: str
) -> None:
    client.post(f"{MS}/{store}/memories", json={"path": f"/v{next(_n)}", "content": ""}, headers=h)
    for name in (field, "service_account_id"):
        r = client.get(f"{MS}/{store}/memory_versions?{name}={_url(value)}", headers=h)
        assert r.status_code == 200, r.data[:300]
        assert r.get_json()["data"] == []  # no writer and no memory has such an id
    r = client.get(f"{MS}/{store}/memory_versions?operation={_url(value)}", headers=h)
    if value in OPERATIONS:
        assert r.status_code == 200
    else:
        _envelope_400(r)


@SETTINGS
@given(value=TEXT | st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01 00:00:00+00:00"]))
@example(value="\x00")
def test_list_parameters(client: FlaskClient, h: dict[str, str], store: str, value: str) -> None:
    for url in (MS, f"{MS}/{store}/memories", f"{MS}/{store}/memory_versions"):
        r = client.get(f"{url}?page={_url(value)}", headers=h)
        if value:
            _envelope_400(r)
        else:
            assert r.status_code == 200
        for name in ("view", "depth", "limit", "include_archived", "created_at[gte]"):
            r = client.get(f"{url}?{name}={_url(value)}", headers=h)
            assert r.status_code in (200, 400), (url, name, r.data[:300])
            if r.status_code == 400:
                _envelope_400(r)


# -- /mcp ------------------------------------------------------------------------------------
def _tool(client: FlaskClient, h: dict[str, str], tool: str, /, **arguments: Any) -> str:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    r = client.post(
        "/mcp",
        data=json.dumps(body),
        headers={**h, "Content-Type": "application/json", "Accept": "application/json"},
    )
    assert r.status_code == 200, r.data[:300]
    text: str = r.get_json()["result"]["content"][0]["text"]
    assert "internal error" not in text, text
    return text


@SETTINGS
@given(value=TEXT, field=st.sampled_from(META_STRINGS))
@example(value="a\x00b", field="model")
@example(value="a\x00b", field="agent_id")
def test_record_turn_stores_meta_and_summary_as_sent(
    client: FlaskClient, h: dict[str, str], value: str, field: str
) -> None:
    task = f"r{next(_n)}"
    text = _tool(client, h, "record_turn", task_id=task, summary_md=value, meta={field: value})
    assert text.startswith("Recorded turn 0"), text
    turn = client.get(f"{PM}/tasks/{task}/turns/0", headers=h).get_json()
    assert (turn["meta"], turn["summary_md"]) == ({field: value}, value)


@SETTINGS
@given(
    value=TEXT,
    call=st.sampled_from(
        [
            ("search", "query", {}),
            ("search", "cursor", {"query": "a"}),
            ("list_tasks", "cursor", {}),
            ("read_task", "task_id", {}),
            ("read_turn", "task_id", {"turn": 0}),
            ("read_artifact", "name", {"task_id": "a", "turn": 0}),
            ("record_turn", "task_id", {"summary_md": "x"}),
            ("memory", "store", {"command": "view", "path": "/memories"}),
            ("memory", "path", {"store": "fuzz", "command": "view"}),
            ("memory", "path", {"store": "fuzz", "command": "create", "file_text": "x"}),
            ("memory", "file_text", {"store": "fuzz", "command": "create", "path": "/memories/n"}),
        ]
    ),
)
@example(value="a\x00b", call=("memory", "path", {"store": "fuzz", "command": "view"}))
def test_every_text_argument_of_the_tools(
    client: FlaskClient, h: dict[str, str], store: str, value: str, call: tuple[str, str, dict]
) -> None:
    name, field, others = call
    _tool(client, h, name, **{**others, field: value})
