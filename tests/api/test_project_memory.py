"""Every endpoint of the project-memory API through the Flask test client."""

from __future__ import annotations

import io
import json

import pytest
from flask.testing import FlaskClient

from tests.conftest import FixedClock, Tokens

# Runs against every backend MEMORY_TEST_BACKENDS names (tests/conftest.py).
pytestmark = pytest.mark.all_backends

BASE = "/sandbox/memory/v1"


def put_turn(
    client: FlaskClient,
    tokens: Tokens,
    task: str,
    turn: int,
    summary: str = "s",
    meta=None,
    who="writer",
    **headers,
):
    body = {"meta": meta if meta is not None else {"model": "m"}, "summary_md": summary}
    return client.put(
        f"{BASE}/tasks/{task}/turns/{turn}", json=body, headers=tokens.headers(who, **headers)
    )


def test_put_then_get_turn_round_trips_every_seed_field(
    client: FlaskClient, tokens: Tokens
) -> None:
    meta = {
        "agent_id": "a1",
        "model": "claude",
        "job_id": "j",
        "sandbox_id": "sb",
        "commit": "abc123",
        "exit_code": 0,
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": 1767225600.5,
        "tokens": {"input": 10, "output": 20},
        "cost": 0.25,
        "claude_session_id": "sess",
        "custom": {"kept": [1, 2, 3]},
    }
    put = put_turn(client, tokens, "task-1", 3, "## Done\n\nAll good.", meta)
    assert put.status_code == 200
    record = put.get_json()
    assert record["task_id"] == "task-1" and record["turn"] == 3
    assert record["meta"] == meta
    assert record["summary_md"] == "## Done\n\nAll good."
    assert record["artifacts"] == []
    assert record["created_at"] == record["updated_at"] == "2026-01-01T00:00:00.000000Z"
    assert record["retain_until"] == "2026-01-31T00:00:00.000000Z"
    assert put.headers["ETag"]
    get = client.get(f"{BASE}/tasks/task-1/turns/3", headers=tokens.headers("reader"))
    assert get.status_code == 200
    assert get.get_json() == record
    assert get.headers["ETag"] == put.headers["ETag"]


def test_upsert_keeps_created_at_and_moves_updated_at(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    first = put_turn(client, tokens, "t", 0, "one").get_json()
    clock.advance(hours=1)
    second = put_turn(client, tokens, "t", 0, "two", {"model": "x"}).get_json()
    assert second["created_at"] == first["created_at"]
    assert second["updated_at"] > first["updated_at"]
    assert second["retain_until"] > first["retain_until"]
    assert second["summary_md"] == "two" and second["meta"] == {"model": "x"}


def test_defaults_when_meta_and_summary_are_omitted(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.put(f"{BASE}/tasks/t/turns/0", json={}, headers=tokens.headers("writer"))
    assert resp.status_code == 200
    assert resp.get_json()["meta"] == {} and resp.get_json()["summary_md"] == ""


def test_task_index_lists_turns_meta_and_artifact_names(
    client: FlaskClient, tokens: Tokens
) -> None:
    put_turn(client, tokens, "t", 0, meta={"model": "a"})
    put_turn(client, tokens, "t", 1, meta={"model": "b"})
    client.put(
        f"{BASE}/tasks/t/turns/1/artifacts/log.txt", data=b"x", headers=tokens.headers("writer")
    )
    resp = client.get(f"{BASE}/tasks/t", headers=tokens.headers("reader"))
    assert resp.status_code == 200
    index = resp.get_json()
    assert index["task_id"] == "t"
    assert index["owner"] == tokens.ids["writer"]
    assert index["latest_turn"] == 1 and index["turn_count"] == 2
    assert [t["turn"] for t in index["turns"]] == [0, 1]
    assert [t["meta"] for t in index["turns"]] == [{"model": "a"}, {"model": "b"}]
    assert index["turns"][1]["artifacts"] == ["log.txt"]
    assert "summary_md" not in index["turns"][0]


def test_list_tasks_most_recent_first_with_cursor(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    for i in range(7):
        put_turn(client, tokens, f"task-{i}", 0)
        clock.advance(seconds=1)
    put_turn(client, tokens, "task-2", 1)  # task-2 becomes the most recent
    seen = []
    cursor = None
    while True:
        url = f"{BASE}/tasks?limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(url, headers=tokens.headers("reader")).get_json()
        assert page["total"] == 7
        seen += [t["task_id"] for t in page["tasks"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ["task-2", "task-6", "task-5", "task-4", "task-3", "task-1", "task-0"]
    first = client.get(f"{BASE}/tasks", headers=tokens.headers("reader")).get_json()["tasks"][0]
    assert first == {
        "task_id": "task-2",
        "latest_turn": 1,
        "turn_count": 2,
        "updated_at": first["updated_at"],
        "retain_until": first["retain_until"],
    }


def test_list_of_empty_project(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.get(f"{BASE}/tasks", headers=tokens.headers("reader"))
    assert resp.get_json() == {"tasks": [], "total": 0, "next_cursor": None}


def test_project_md_has_one_section_per_task_with_latest_summary(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    put_turn(client, tokens, "alpha", 0, "alpha zero")
    put_turn(client, tokens, "alpha", 1, "alpha **one**")
    clock.advance(seconds=5)
    put_turn(client, tokens, "beta", 0, "beta zero")
    resp = client.get(f"{BASE}/project.md", headers=tokens.headers("reader"))
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "text/markdown; charset=utf-8"
    text = resp.get_data(as_text=True)
    assert text.startswith("# Project memory: acme/web\n")
    assert text.index("## beta") < text.index("## alpha")
    assert "alpha **one**" in text and "alpha zero" not in text and "beta zero" in text
    assert "Latest turn: 1" in text
    # A later write shows up on the next read.
    clock.advance(seconds=1)
    put_turn(client, tokens, "alpha", 2, "alpha two")
    text = client.get(f"{BASE}/project.md", headers=tokens.headers("reader")).get_data(as_text=True)
    assert "alpha two" in text and "alpha **one**" not in text
    assert text.index("## alpha") < text.index("## beta")


def test_project_md_of_empty_project(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.get(f"{BASE}/project.md", headers=tokens.headers("reader"))
    assert resp.status_code == 200
    assert resp.get_data(as_text=True).startswith("# Project memory: acme/web")


def test_delete_task_by_owner(client: FlaskClient, tokens: Tokens) -> None:
    put_turn(client, tokens, "t", 0)
    assert client.delete(f"{BASE}/tasks/t", headers=tokens.headers("writer")).status_code == 204
    assert client.get(f"{BASE}/tasks/t", headers=tokens.headers("reader")).status_code == 404
    assert (
        client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).status_code == 404
    )
    assert client.get(f"{BASE}/tasks", headers=tokens.headers("reader")).get_json()["total"] == 0
    assert "## t" not in client.get(
        f"{BASE}/project.md", headers=tokens.headers("reader")
    ).get_data(as_text=True)
    assert client.delete(f"{BASE}/tasks/t", headers=tokens.headers("writer")).status_code == 404


def test_delete_needs_owner_or_project_admin(client: FlaskClient, tokens: Tokens) -> None:
    put_turn(client, tokens, "t", 0, who="writer")
    refused = client.delete(f"{BASE}/tasks/t", headers=tokens.headers("writer2"))
    assert refused.status_code == 403
    assert refused.get_json() == {
        "detail": "only the task's owner or a project_admin may delete it"
    }
    assert client.get(f"{BASE}/tasks/t", headers=tokens.headers("reader")).status_code == 200
    assert (
        client.delete(f"{BASE}/tasks/t", headers=tokens.headers("project_admin")).status_code == 204
    )


@pytest.mark.parametrize("who", ["tenant_admin", "admin"])
def test_delete_by_higher_roles(client: FlaskClient, tokens: Tokens, who: str) -> None:
    put_turn(client, tokens, "t", 0)
    extra = {"X-Sandbox-Project-Id": "web"}
    if who == "admin":
        extra["X-Sandbox-Tenant-Id"] = "acme"
    assert client.delete(f"{BASE}/tasks/t", headers=tokens.headers(who, **extra)).status_code == 204


def test_artifact_round_trip_keeps_content_type(client: FlaskClient, tokens: Tokens) -> None:
    put_turn(client, tokens, "t", 0)
    body = bytes(range(256)) * 100
    put = client.put(
        f"{BASE}/tasks/t/turns/0/artifacts/data.bin",
        data=body,
        headers=tokens.headers("writer", **{"Content-Type": "image/png"}),
    )
    assert put.status_code == 200
    record = put.get_json()
    assert record["name"] == "data.bin" and record["content_type"] == "image/png"
    assert record["size"] == len(body) and record["task_id"] == "t" and record["turn"] == 0
    assert record["updated_at"]
    get = client.get(f"{BASE}/tasks/t/turns/0/artifacts/data.bin", headers=tokens.headers("reader"))
    assert get.status_code == 200
    assert get.data == body
    assert get.headers["Content-Type"] == "image/png"
    assert get.headers["Content-Length"] == str(len(body))
    assert get.headers["X-Content-Type-Options"] == "nosniff"
    turn = client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).get_json()
    assert turn["artifacts"] == [
        {
            "name": "data.bin",
            "content_type": "image/png",
            "size": len(body),
            "updated_at": record["updated_at"],
        }
    ]


def test_artifact_default_content_type(client: FlaskClient, tokens: Tokens) -> None:
    put_turn(client, tokens, "t", 0)
    resp = client.put(
        f"{BASE}/tasks/t/turns/0/artifacts/blob",
        input_stream=io.BytesIO(b"abc"),
        headers={**tokens.headers("writer"), "Content-Length": "3"},
    )
    assert resp.status_code == 200
    assert resp.get_json()["content_type"] == "application/octet-stream"


def test_artifact_on_missing_turn_is_404(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.put(
        f"{BASE}/tasks/t/turns/0/artifacts/a", data=b"x", headers=tokens.headers("writer")
    )
    assert resp.status_code == 404
    assert "PUT the turn first" in resp.get_json()["detail"]


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    "ctype",
    ["text/html", "image/svg+xml", "application/javascript", "text/xml", "application/x-unknown"],
)
def test_active_content_is_served_as_a_sandboxed_download(
    client: FlaskClient, tokens: Tokens, ctype: str
) -> None:
    put_turn(client, tokens, "t", 0)
    client.put(
        f"{BASE}/tasks/t/turns/0/artifacts/x.html",
        data=b"<script>alert(1)</script>",
        headers=tokens.headers("writer", **{"Content-Type": ctype}),
    )
    get = client.get(f"{BASE}/tasks/t/turns/0/artifacts/x.html", headers=tokens.headers("reader"))
    assert get.headers["Content-Disposition"].startswith("attachment")
    assert get.headers["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in get.headers["Content-Security-Policy"]


def test_artifact_conditional_get_and_range(client: FlaskClient, tokens: Tokens) -> None:
    put_turn(client, tokens, "t", 0)
    client.put(
        f"{BASE}/tasks/t/turns/0/artifacts/a.txt",
        data=b"0123456789",
        headers=tokens.headers("writer", **{"Content-Type": "text/plain"}),
    )
    first = client.get(f"{BASE}/tasks/t/turns/0/artifacts/a.txt", headers=tokens.headers("reader"))
    etag = first.headers["ETag"]
    again = client.get(
        f"{BASE}/tasks/t/turns/0/artifacts/a.txt",
        headers=tokens.headers("reader", **{"If-None-Match": etag}),
    )
    assert again.status_code == 304 and again.data == b""
    part = client.get(
        f"{BASE}/tasks/t/turns/0/artifacts/a.txt",
        headers=tokens.headers("reader", Range="bytes=2-5"),
    )
    assert part.status_code == 206 and part.data == b"2345"
    assert part.headers["Content-Range"] == "bytes 2-5/10"


def test_artifact_get_preconditions_and_ranges_follow_rfc_9110(
    client: FlaskClient, tokens: Tokens
) -> None:
    put_turn(client, tokens, "t", 0)
    url = f"{BASE}/tasks/t/turns/0/artifacts/a.txt"
    client.put(url, data=b"0123456789", headers=tokens.headers("writer"))

    def get(**headers: str):  # noqa: ANN202
        return client.get(url, headers=tokens.headers("reader", **headers))

    whole = get()
    etag = whole.headers["ETag"]
    # No Last-Modified: nothing to compare an If-Modified-Since with, however late.
    assert "Last-Modified" not in whole.headers
    assert get(**{"If-Modified-Since": "Tue, 01 Dec 2099 00:00:00 GMT"}).status_code == 200
    # If-Match: a list passes when a member is the ETag; a failure is the API's JSON 412.
    for passing in (etag, f'"x", {etag}', "*"):
        assert get(**{"If-Match": passing}).data == b"0123456789", passing
    for failing in ('"x"', f"W/{etag}", f"junk{etag}", etag[1:-1]):
        resp = get(**{"If-Match": failing})
        assert resp.status_code == 412 and set(resp.json) == {"detail"}, failing
    # If-None-Match: a member that is no entity tag matches nothing.
    assert get(**{"If-None-Match": f"junk{etag}"}).status_code == 200
    # A Range that is not one well-formed byte range is ignored: the whole body, 200.
    for ignored in ("bytes=0-1,3-4", "items=0-1", "bytes=abc", "bytes=3-1"):
        resp = get(Range=ignored)
        assert (resp.status_code, resp.data) == (200, b"0123456789"), ignored
    for wanted, body in (("bytes=-3", b"789"), ("bytes=8-", b"89"), ("bytes=8-20", b"89")):
        resp = get(Range=wanted)
        assert (resp.status_code, resp.data) == (206, body), wanted
    past = get(Range="bytes=20-30")
    assert past.status_code == 416 and past.headers["Content-Range"] == "bytes */10"


def test_a_write_if_match_list_passes_when_a_member_is_the_etag(
    client: FlaskClient, tokens: Tokens
) -> None:
    put_turn(client, tokens, "t", 0)
    url = f"{BASE}/tasks/t/turns/0/artifacts/a.txt"
    etag = client.put(url, data=b"one", headers=tokens.headers("writer")).headers["ETag"]
    for failing in (f"W/{etag}", f"junk{etag}", '"x", "y"'):
        resp = client.put(
            url, data=b"two", headers=tokens.headers("writer", **{"If-Match": failing})
        )
        assert resp.status_code == 412, failing
    resp = client.put(
        url, data=b"two", headers=tokens.headers("writer", **{"If-Match": f'"x", {etag}'})
    )
    assert resp.status_code == 200, resp.json
    turn = f"{BASE}/tasks/t/turns/0"
    turn_etag = client.get(turn, headers=tokens.headers("reader")).headers["ETag"]
    resp = client.put(
        turn,
        json={"summary_md": "new"},
        headers=tokens.headers("writer", **{"If-Match": f'"a,b", {turn_etag}'}),
    )
    assert resp.status_code == 200, resp.json


@pytest.mark.parametrize("kind", ["turn", "artifact"])
def test_conditional_get_answers_304_when_if_none_match_holds_the_etag(
    client: FlaskClient, tokens: Tokens, kind: str
) -> None:
    put_turn(client, tokens, "t", 0)
    url = f"{BASE}/tasks/t/turns/0"
    if kind == "artifact":
        url += "/artifacts/a.txt"
        client.put(url, data=b"one", headers=tokens.headers("writer"))
    etag = client.get(url, headers=tokens.headers("reader")).headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"')

    def get(if_none_match: str, method: str = "GET"):  # noqa: ANN202
        return client.open(
            url, method=method, headers=tokens.headers("reader", **{"If-None-Match": if_none_match})
        )

    for matching in (
        etag,
        f"W/{etag}",  # weak comparison for GET
        f'"x", {etag}',
        f'"a,b", W/{etag}, "y"',  # a comma inside an entity tag is not a separator
        "*",
        '"x", *',
        f"garbage, {etag}",
    ):
        resp = get(matching)
        assert resp.status_code == 304, (matching, resp.status_code)
        assert resp.data == b"" and resp.headers["ETag"] == etag
    assert get(etag, method="HEAD").status_code == 304
    for other in ('"x"', '"x", "y"', f'"{etag}"', etag[1:-1], "W/", ""):
        resp = get(other)
        assert resp.status_code == 200 and resp.headers["ETag"] == etag, other
    # A new version: the old ETag no longer matches.
    if kind == "turn":
        client.put(url, json={"summary_md": "two"}, headers=tokens.headers("writer"))
    else:
        client.put(url, data=b"two", headers=tokens.headers("writer"))
    assert get(etag).status_code == 200


def test_artifact_too_large_by_content_length(app, client: FlaskClient, tokens: Tokens) -> None:
    app.extensions["storage"].tasks.max_artifact_bytes = 10
    put_turn(client, tokens, "t", 0)
    ok = client.put(
        f"{BASE}/tasks/t/turns/0/artifacts/a", data=b"x" * 10, headers=tokens.headers("writer")
    )
    assert ok.status_code == 200
    big = client.put(
        f"{BASE}/tasks/t/turns/0/artifacts/b", data=b"x" * 11, headers=tokens.headers("writer")
    )
    assert big.status_code == 413
    assert "10 bytes" in big.get_json()["detail"]
    turn = client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).get_json()
    assert [a["name"] for a in turn["artifacts"]] == ["a"]


def test_conditional_turn_writes(client: FlaskClient, tokens: Tokens) -> None:
    url = f"{BASE}/tasks/t/turns/0"
    created = client.put(url, json={}, headers=tokens.headers("writer", **{"If-None-Match": "*"}))
    assert created.status_code == 200
    again = client.put(url, json={}, headers=tokens.headers("writer", **{"If-None-Match": "*"}))
    assert again.status_code == 412
    etag = created.headers["ETag"]
    ok = client.put(
        url, json={"summary_md": "v2"}, headers=tokens.headers("writer", **{"If-Match": etag})
    )
    assert ok.status_code == 200
    stale = client.put(
        url, json={"summary_md": "v3"}, headers=tokens.headers("writer", **{"If-Match": etag})
    )
    assert stale.status_code == 412
    assert client.get(url, headers=tokens.headers("reader")).get_json()["summary_md"] == "v2"


def test_expired_turns_are_invisible(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    put_turn(client, tokens, "old", 0, "old summary")
    clock.advance(days=29)
    put_turn(client, tokens, "new", 0, "new summary")
    clock.advance(days=1)  # "old" is now exactly 30 days old
    h = tokens.headers("reader")
    assert client.get(f"{BASE}/tasks/old/turns/0", headers=h).status_code == 404
    assert client.get(f"{BASE}/tasks/old", headers=h).status_code == 404
    listing = client.get(f"{BASE}/tasks", headers=h).get_json()
    assert [t["task_id"] for t in listing["tasks"]] == ["new"] and listing["total"] == 1
    digest = client.get(f"{BASE}/project.md", headers=h).get_data(as_text=True)
    assert "old summary" not in digest and "new summary" in digest


def test_correlation_id_is_echoed_or_generated(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.get(
        f"{BASE}/tasks", headers=tokens.headers("reader", **{"x-correlation-id": "run-42"})
    )
    assert resp.headers["x-correlation-id"] == "run-42"
    generated = client.get(f"{BASE}/tasks")  # an error response carries one too
    assert generated.status_code == 401
    assert len(generated.headers["x-correlation-id"]) == 26


def test_unicode_summary_and_meta(client: FlaskClient, tokens: Tokens) -> None:
    resp = put_turn(client, tokens, "t", 0, "héllo ✓ 🚀", {"note": "naïve"})
    assert resp.status_code == 200
    got = client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader"))
    assert got.get_json()["summary_md"] == "héllo ✓ 🚀"
    assert json.loads(got.data)["meta"] == {"note": "naïve"}


def test_responses_carry_integers_beyond_64_bits_exactly(
    client: FlaskClient, tokens: Tokens
) -> None:
    # Responses are encoded by orjson, which refuses them: the fallback must answer exactly.
    meta = {"big": 2**70, "text": "日本"}
    resp = client.put(
        f"{BASE}/tasks/t/turns/0",
        json={"meta": meta, "summary_md": "s"},
        headers=tokens.headers("writer"),
    )
    assert resp.status_code == 200, resp.data
    for url in (f"{BASE}/tasks/t/turns/0", f"{BASE}/tasks/t"):
        got = client.get(url, headers=tokens.headers("reader"))
        assert got.status_code == 200 and b"1180591620717411303424" in got.data
        assert got.is_json
    assert (
        client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).json["meta"] == meta
    )
