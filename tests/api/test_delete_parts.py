"""Deleting one turn or one artifact over HTTP, on every backend: roles, preconditions, 404s,
and what follows the delete (the task index, the listing, project.md, search, usage)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from flask.testing import FlaskClient

from tests.conftest import Tokens

pytestmark = pytest.mark.all_backends

PM = "/sandbox/memory/v1"
SECRET = "Qqzxleakedsecretgamma"


def put_turn(
    client: FlaskClient, tokens: Tokens, task: str, turn: int, summary: str, who: str = "writer"
) -> Any:
    r = client.put(
        f"{PM}/tasks/{task}/turns/{turn}",
        json={"meta": {"model": "m"}, "summary_md": summary},
        headers=tokens.headers(who),
    )
    assert r.status_code == 200, r.json
    return r


def put_artifact(
    client: FlaskClient, tokens: Tokens, task: str, turn: int, name: str, data: bytes
) -> Any:
    r = client.put(
        f"{PM}/tasks/{task}/turns/{turn}/artifacts/{name}",
        data=data,
        headers=tokens.headers("writer", **{"Content-Type": "text/plain"}),
    )
    assert r.status_code == 200, r.json
    return r


def usage(client: FlaskClient, tokens: Tokens) -> dict[str, int]:
    r = client.get(f"{PM}/usage", headers=tokens.headers("writer"))
    assert r.status_code == 200, r.json
    return {k: r.json["usage"][k] for k in ("tasks", "turns", "artifacts", "artifact_bytes")} | {
        "turn_bytes": r.json["usage"]["turn_bytes"]
    }


def get(client: FlaskClient, tokens: Tokens, path: str) -> Any:
    return client.get(f"{PM}{path}", headers=tokens.headers("reader"))


def search(client: FlaskClient, tokens: Tokens, query: str) -> list[tuple[str, int]]:
    r = client.get(f"{PM}/search", headers=tokens.headers("reader"), query_string={"q": query})
    assert r.status_code == 200, r.json
    return [(h["task_id"], h["turn"]) for h in r.json["hits"]]


# -- a turn -----------------------------------------------------------------------------------
def test_deleting_a_turn_removes_it_everywhere_and_frees_its_usage(
    client: FlaskClient, tokens: Tokens
) -> None:
    put_turn(client, tokens, "t", 0, "first turn, kept")
    put_turn(client, tokens, "t", 1, f"the key is {SECRET}")
    put_artifact(client, tokens, "t", 1, "log.txt", b"x" * 300)
    put_turn(client, tokens, "other", 0, "another task")
    before = usage(client, tokens)
    assert search(client, tokens, SECRET) == [("t", 1)]
    assert SECRET in get(client, tokens, "/project.md").get_data(as_text=True)

    r = client.delete(f"{PM}/tasks/t/turns/1", headers=tokens.headers("writer"))
    assert r.status_code == 204 and r.get_data() == b""

    assert get(client, tokens, "/tasks/t/turns/1").status_code == 404
    assert get(client, tokens, "/tasks/t/turns/1/artifacts/log.txt").status_code == 404
    index = get(client, tokens, "/tasks/t").json
    assert [t["turn"] for t in index["turns"]] == [0]
    assert index["latest_turn"] == 0 and index["turn_count"] == 1
    listed = {t["task_id"]: t for t in get(client, tokens, "/tasks").json["tasks"]}
    assert listed["t"]["latest_turn"] == 0 and listed["t"]["turn_count"] == 1
    digest = get(client, tokens, "/project.md").get_data(as_text=True)
    assert SECRET not in digest and "first turn, kept" in digest
    assert search(client, tokens, SECRET) == []
    assert search(client, tokens, "kept") == [("t", 0)]
    after = usage(client, tokens)
    assert after["tasks"] == before["tasks"]
    assert after["turns"] == before["turns"] - 1
    assert after["artifacts"] == before["artifacts"] - 1
    assert after["artifact_bytes"] == before["artifact_bytes"] - 300
    # A turn counts its meta as compact JSON plus its summary.
    assert after["turn_bytes"] == before["turn_bytes"] - len(f'{{"model":"m"}}the key is {SECRET}')
    # Gone: a second delete is a 404, and the turn can be written again.
    assert client.delete(f"{PM}/tasks/t/turns/1", headers=tokens.headers("writer")).status_code == (
        404
    )
    put_turn(client, tokens, "t", 1, "written again")
    assert get(client, tokens, "/tasks/t/turns/1").json["artifacts"] == []


def test_deleting_the_last_turn_deletes_the_task(client: FlaskClient, tokens: Tokens) -> None:
    put_turn(client, tokens, "solo", 0, f"only turn {SECRET}")
    put_turn(client, tokens, "other", 0, "stays")
    before = usage(client, tokens)
    assert client.delete(
        f"{PM}/tasks/solo/turns/0", headers=tokens.headers("writer")
    ).status_code == (204)
    assert get(client, tokens, "/tasks/solo").status_code == 404
    page = get(client, tokens, "/tasks").json
    assert [t["task_id"] for t in page["tasks"]] == ["other"] and page["total"] == 1
    assert "## solo" not in get(client, tokens, "/project.md").get_data(as_text=True)
    after = usage(client, tokens)
    assert after["tasks"] == before["tasks"] - 1 and after["turns"] == before["turns"] - 1


def test_a_turn_delete_honours_if_match(client: FlaskClient, tokens: Tokens) -> None:
    etag = put_turn(client, tokens, "t", 0, "v1").headers["ETag"]
    newer = put_turn(client, tokens, "t", 0, "v2").headers["ETag"]
    assert etag != newer
    stale = client.delete(
        f"{PM}/tasks/t/turns/0", headers=tokens.headers("writer", **{"If-Match": etag})
    )
    assert stale.status_code == 412 and "detail" in stale.json
    assert get(client, tokens, "/tasks/t/turns/0").json["summary_md"] == "v2"
    ok = client.delete(
        f"{PM}/tasks/t/turns/0", headers=tokens.headers("writer", **{"If-Match": newer})
    )
    assert ok.status_code == 204


@pytest.mark.parametrize(
    ("who", "status"),
    [
        ("reader", 403),
        ("writer2", 403),
        ("other_project", 403),
        ("project_admin", 204),
        ("tenant_admin", 204),
        ("admin", 204),
    ],
)
def test_a_turn_is_deleted_by_its_tasks_owner_or_a_project_admin(
    client: FlaskClient, tokens: Tokens, who: str, status: int
) -> None:
    put_turn(client, tokens, "t", 0, "one")
    put_turn(client, tokens, "t", 1, "two")
    extra = {"X-Sandbox-Project-Id": "web"} if who in ("tenant_admin", "admin") else {}
    if who == "admin":
        extra["X-Sandbox-Tenant-Id"] = "acme"
    if who == "other_project":
        extra["X-Sandbox-Project-Id"] = "web"
    r = client.delete(f"{PM}/tasks/t/turns/1", headers=tokens.headers(who, **extra))
    assert r.status_code == status, r.json
    assert (get(client, tokens, "/tasks/t/turns/1").status_code == 404) == (status == 204)
    if who == "writer2":
        assert r.json == {"detail": "only the task's owner or a project_admin may delete it"}


def test_deleting_a_turn_that_is_not_there_is_404(client: FlaskClient, tokens: Tokens) -> None:
    h = tokens.headers("writer")
    assert client.delete(f"{PM}/tasks/nope/turns/0", headers=h).status_code == 404
    put_turn(client, tokens, "t", 0, "one")
    r = client.delete(f"{PM}/tasks/t/turns/5", headers=h)
    assert r.status_code == 404 and "detail" in r.json
    assert client.delete(f"{PM}/tasks/t/turns/abc", headers=h).status_code == 422
    assert client.delete(f"{PM}/tasks/t/turns/10000", headers=h).status_code == 422
    assert client.delete(f"{PM}/tasks/..%2Fx/turns/0", headers=h).status_code in (404, 422)
    assert get(client, tokens, "/tasks/t/turns/0").status_code == 200


# -- an artifact ------------------------------------------------------------------------------
def test_deleting_an_artifact_keeps_the_turn_and_frees_its_bytes(
    client: FlaskClient, tokens: Tokens
) -> None:
    put_turn(client, tokens, "t", 0, "with two artifacts")
    put_artifact(client, tokens, "t", 0, "keep.txt", b"k" * 10)
    put_artifact(client, tokens, "t", 0, "leak.txt", SECRET.encode() * 20)
    before = usage(client, tokens)
    turn_etag = get(client, tokens, "/tasks/t/turns/0").headers["ETag"]

    r = client.delete(f"{PM}/tasks/t/turns/0/artifacts/leak.txt", headers=tokens.headers("writer"))
    assert r.status_code == 204 and r.get_data() == b""

    assert get(client, tokens, "/tasks/t/turns/0/artifacts/leak.txt").status_code == 404
    assert get(client, tokens, "/tasks/t/turns/0/artifacts/keep.txt").get_data() == b"k" * 10
    record = get(client, tokens, "/tasks/t/turns/0")
    assert [a["name"] for a in record.json["artifacts"]] == ["keep.txt"]
    assert record.json["summary_md"] == "with two artifacts"
    assert record.headers["ETag"] != turn_etag  # the turn changed
    index = get(client, tokens, "/tasks/t").json
    assert index["turns"][0]["artifacts"] == ["keep.txt"]
    after = usage(client, tokens)
    assert after["artifacts"] == before["artifacts"] - 1
    assert after["artifact_bytes"] == before["artifact_bytes"] - len(SECRET) * 20
    assert after["turns"] == before["turns"] and after["tasks"] == before["tasks"]
    assert (
        client.delete(
            f"{PM}/tasks/t/turns/0/artifacts/leak.txt", headers=tokens.headers("writer")
        ).status_code
        == 404
    )


def test_an_artifact_delete_honours_if_match(client: FlaskClient, tokens: Tokens) -> None:
    put_turn(client, tokens, "t", 0, "s")
    old = put_artifact(client, tokens, "t", 0, "a.bin", b"one").headers["ETag"]
    new = put_artifact(client, tokens, "t", 0, "a.bin", b"two").headers["ETag"]
    url = f"{PM}/tasks/t/turns/0/artifacts/a.bin"
    stale = client.delete(url, headers=tokens.headers("writer", **{"If-Match": old}))
    assert stale.status_code == 412
    assert get(client, tokens, "/tasks/t/turns/0/artifacts/a.bin").get_data() == b"two"
    assert client.delete(
        url, headers=tokens.headers("writer", **{"If-Match": new})
    ).status_code == (204)


@pytest.mark.parametrize(
    ("who", "status"),
    [("reader", 403), ("writer2", 403), ("project_admin", 204), ("tenant_admin", 204)],
)
def test_an_artifact_is_deleted_by_its_tasks_owner_or_a_project_admin(
    client: FlaskClient, tokens: Tokens, who: str, status: int
) -> None:
    put_turn(client, tokens, "t", 0, "s")
    put_artifact(client, tokens, "t", 0, "a.bin", b"data")
    extra = {"X-Sandbox-Project-Id": "web"} if who == "tenant_admin" else {}
    r = client.delete(f"{PM}/tasks/t/turns/0/artifacts/a.bin", headers=tokens.headers(who, **extra))
    assert r.status_code == status, r.json
    found = get(client, tokens, "/tasks/t/turns/0/artifacts/a.bin").status_code
    assert found == (404 if status == 204 else 200)


def test_deleting_an_artifact_that_is_not_there_is_404(client: FlaskClient, tokens: Tokens) -> None:
    h = tokens.headers("writer")
    assert client.delete(f"{PM}/tasks/t/turns/0/artifacts/a", headers=h).status_code == 404
    put_turn(client, tokens, "t", 0, "s")
    assert client.delete(f"{PM}/tasks/t/turns/0/artifacts/a", headers=h).status_code == 404
    assert client.delete(f"{PM}/tasks/t/turns/1/artifacts/a", headers=h).status_code == 404
    assert client.delete(f"{PM}/tasks/t/turns/0/artifacts/.x", headers=h).status_code in (
        404,
        422,
    )


def test_both_routes_are_in_the_openapi_document_as_beyond_the_seed(client: FlaskClient) -> None:
    spec = yaml.safe_load(client.get(f"{PM}/openapi.yaml").data)
    turn = spec["paths"]["/sandbox/memory/v1/tasks/{task_id}/turns/{turn}"]["delete"]
    artifact = spec["paths"]["/sandbox/memory/v1/tasks/{task_id}/turns/{turn}/artifacts/{name}"][
        "delete"
    ]
    for op in (turn, artifact):
        assert {"204", "403", "404", "412"} <= set(op["responses"])
        assert any(p["name"] == "If-Match" for p in op["parameters"])
        assert op.get("x-beyond-seed") is True
