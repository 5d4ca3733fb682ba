"""Usage and quotas over HTTP: GET /usage, and every write route of both APIs and the memory
tool at, just under and over a quota (507 in each API's error shape, nothing written); traffic
per hour and token. The tests marked all_backends run on every backend (the conformance suite
checks each backend's quotas under the API)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.limits import QuotaOverride
from tests.conftest import Tokens

PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"


def set_quota(app: Flask, project: str | None = "web", **kw: int) -> None:
    app.extensions["storage"].limits().set_quota("acme", project, QuotaOverride(**kw))


def usage(client: FlaskClient, tokens: Tokens, who: str = "writer", **query: Any) -> Any:
    # A tenant_admin names one project of its tenant (any): the answer covers them all.
    headers = tokens.headers(
        who, **({"X-Sandbox-Project-Id": "web"} if who == "tenant_admin" else {})
    )
    r = client.get(f"{PM}/usage", headers=headers, query_string=query)
    assert r.status_code == 200, r.json
    return r.json


@pytest.mark.all_backends
def test_usage_counts_what_each_api_wrote(client: FlaskClient, tokens: Tokens) -> None:
    h = tokens.headers("writer")
    assert (
        client.put(f"{PM}/tasks/t/turns/0", headers=h, json={"summary_md": "abc"}).status_code
        == 200
    )
    r = client.put(f"{PM}/tasks/t/turns/0/artifacts/a", headers=h, data=b"x" * 1000)
    assert r.status_code == 200
    store = client.post(MS, headers=h, json={"name": "s"}).json["id"]
    assert (
        client.post(
            f"{MS}/{store}/memories", headers=h, json={"path": "/m.md", "content": "hello"}
        ).status_code
        == 200
    )
    body = usage(client, tokens)
    assert body["usage"] == {
        "tasks": 1,
        "turns": 1,
        "artifacts": 1,
        "artifact_bytes": 1000,
        "turn_bytes": 2 + 3,
        "stores": 1,
        "memories": 1,
        "memory_bytes": 5,
        "versions": 1,
        "version_bytes": 5,
        "bytes": 1010,
    }
    assert body["quota"] == {"bytes": None, "tasks": None}
    assert body["tenant_usage"] == body["usage"]
    assert body["projects"] == [] and body["disk"] is None  # a writer sees its project only


@pytest.mark.all_backends
def test_tenant_admins_see_every_project_and_admins_the_disk(
    app: Flask, client: FlaskClient, tokens: Tokens, backend_kind: str
) -> None:
    for project in ("web", "mobile"):
        h = tokens.headers("tenant_admin", **{"X-Sandbox-Project-Id": project})
        client.put(f"{PM}/tasks/t/turns/0", headers=h, json={"summary_md": project})
    set_quota(app, "mobile", bytes=10_000)
    set_quota(app, None, tasks=50)
    body = usage(client, tokens, "tenant_admin")
    assert [(p["project"], p["usage"]["turn_bytes"], p["quota"]) for p in body["projects"]] == [
        ("mobile", 2 + 6, {"bytes": 10_000, "tasks": None}),
        ("web", 2 + 3, {"bytes": None, "tasks": None}),
    ]
    assert body["tenant_usage"]["tasks"] == 2 and body["tenant_quota"]["tasks"] == 50
    assert body["disk"] is None  # the disk is every tenant's: admin tokens only
    r = client.get(
        f"{PM}/usage",
        headers=tokens.headers(
            "admin", **{"X-Sandbox-Tenant-Id": "acme", "X-Sandbox-Project-Id": "web"}
        ),
    )
    disk = r.json["disk"]
    if backend_kind == "tree":
        assert disk["free_bytes"] > 0 and disk["floor_bytes"] > 0
    else:
        assert disk is None  # the database and the object store keep their own disks
    # A reader sees its own project too; the other project's token only its own.
    assert usage(client, tokens, "reader")["usage"]["tasks"] == 1
    assert usage(client, tokens, "other_project")["usage"]["tasks"] == 1


# -- every write route at, just under and over a quota -------------------------------------
class Writes:
    """Each write that adds bytes, and what it costs."""

    def __init__(self, client: FlaskClient, tokens: Tokens) -> None:
        self.client = client
        self.h = tokens.headers("writer")
        self.store = client.post(MS, headers=self.h, json={"name": "s"}).json["id"]
        self.n = 0

    def turn(self, size: int) -> Any:
        self.n += 1
        # A turn costs its meta ("{}") and its summary.
        return self.client.put(
            f"{PM}/tasks/t/turns/{self.n}", headers=self.h, json={"summary_md": "x" * (size - 2)}
        )

    def artifact(self, size: int) -> Any:
        self.n += 1
        return self.client.put(
            f"{PM}/tasks/t/turns/0/artifacts/a{self.n}", headers=self.h, data=b"y" * size
        )

    def turn_with_artifact(self, size: int) -> Any:
        # Turn 0 again, unchanged ("{}" and no summary), with a new artifact of ``size``
        # bytes: one request, beyond the seed (app/api/turn_form.py).
        self.n += 1
        boundary = "quota-form"
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="turn"\r\n\r\n{{}}\r\n'
                f'--{boundary}\r\nContent-Disposition: form-data; name="artifact";'
                f' filename="f{self.n}"\r\n\r\n'
            ).encode()
            + b"f" * size
            + f"\r\n--{boundary}--\r\n".encode()
        )
        return self.client.put(
            f"{PM}/tasks/t/turns/0",
            headers={**self.h, "Content-Type": f"multipart/form-data; boundary={boundary}"},
            data=body,
        )

    def memory(self, size: int) -> Any:
        self.n += 1
        return self.client.post(
            f"{MS}/{self.store}/memories",
            headers=self.h,
            json={"path": f"/m{self.n}.md", "content": "z" * size},
        )

    def memory_update(self, size: int) -> Any:
        # One memory, updated each time: every version is kept, so each costs its size.
        if not hasattr(self, "updated"):
            self.updated = self.memory(0).json["id"]
        return self.client.post(
            f"{MS}/{self.store}/memories/{self.updated}",
            headers=self.h,
            json={"content": "w" * size},
        )

    def tool_create(self, size: int) -> Any:
        self.n += 1
        return self.client.post(
            f"{MS}/{self.store}/memory_tool",
            headers=self.h,
            json={"command": "create", "path": f"/memories/t{self.n}.md", "file_text": "v" * size},
        )


ROUTES: dict[str, Callable[[Writes, int], Any]] = {
    "PUT turn": Writes.turn,
    "PUT artifact": Writes.artifact,
    "PUT turn with an artifact": Writes.turn_with_artifact,
    "POST memory": Writes.memory,
    "POST memory (update)": Writes.memory_update,
    "POST memory_tool create": Writes.tool_create,
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_every_write_route_at_just_under_and_over_the_quota(
    app: Flask, client: FlaskClient, tokens: Tokens, route: str
) -> None:
    writes = Writes(client, tokens)
    client.put(f"{PM}/tasks/t/turns/0", headers=writes.h, json={})  # where artifacts go
    write = ROUTES[route]
    if route == "POST memory (update)":
        assert write(writes, 0).status_code == 200  # the memory it updates
    used = usage(client, tokens)["usage"]["bytes"]
    set_quota(app, bytes=used + 300)
    assert write(writes, 100).status_code == 200  # just under: 200 left
    assert write(writes, 200).status_code == 200  # exactly at the quota
    before = usage(client, tokens)["usage"]
    assert before["bytes"] == used + 300
    r = write(writes, 1)  # one byte over
    assert r.status_code == 507, r.json
    assert r.headers["x-should-retry"] == "false"
    if r.request.path.startswith(MS):
        error = r.json["error"]
        assert error["type"] == "quota_exceeded_error"
        assert error["quota"] == {"level": "project", "name": "acme/web", "kind": "bytes"}
        assert (error["limit"], error["used"], error["needed"]) == (used + 300, used + 300, 1)
        message = error["message"]
    else:
        message = r.json["detail"]
    assert message.startswith("insufficient storage: project acme/web is over its storage quota")
    assert "nothing was written" in message
    assert usage(client, tokens)["usage"] == before


def test_a_memory_tool_edit_over_the_quota_is_507_and_changes_nothing(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    writes = Writes(client, tokens)
    tool = f"{MS}/{writes.store}/memory_tool"
    r = client.post(
        tool,
        headers=writes.h,
        json={"command": "create", "path": "/memories/a.md", "file_text": "line\n"},
    )
    assert r.status_code == 200 and not r.json["is_error"]
    set_quota(app, bytes=5 + 5)  # room for one more version of the same size
    edit = {
        "command": "str_replace",
        "path": "/memories/a.md",
        "old_str": "line",
        "new_str": "LINE",
    }
    assert client.post(tool, headers=writes.h, json=edit).json["is_error"] is False
    edit = {"command": "insert", "path": "/memories/a.md", "insert_line": 1, "insert_text": "more"}
    r = client.post(tool, headers=writes.h, json=edit)
    assert r.status_code == 507 and r.json["error"]["type"] == "quota_exceeded_error"
    view = client.post(tool, headers=writes.h, json={"command": "view", "path": "/memories/a.md"})
    assert "LINE" in view.json["content"] and "more" not in view.json["content"]


@pytest.mark.all_backends
def test_the_task_quota_over_http(app: Flask, client: FlaskClient, tokens: Tokens) -> None:
    h = tokens.headers("writer")
    set_quota(app, tasks=1)
    assert client.put(f"{PM}/tasks/a/turns/0", headers=h, json={}).status_code == 200
    assert client.put(f"{PM}/tasks/a/turns/1", headers=h, json={}).status_code == 200
    r = client.put(f"{PM}/tasks/b/turns/0", headers=h, json={})
    assert r.status_code == 507
    assert "at its task quota" in r.json["detail"] and "1 task(s)" in r.json["detail"]
    assert client.get(f"{PM}/tasks/b", headers=h).status_code == 404
    assert client.delete(f"{PM}/tasks/a", headers=h).status_code == 204
    assert client.put(f"{PM}/tasks/b/turns/0", headers=h, json={}).status_code == 200


@pytest.mark.all_backends
def test_an_artifact_over_quota_is_refused_from_its_content_length(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    h = tokens.headers("writer")
    client.put(f"{PM}/tasks/t/turns/0", headers=h, json={})
    set_quota(app, bytes=2 + 1000)

    class Unread:
        """A body of 1001 bytes that fails the test if the server reads it."""

        at = 0

        def read(self, size: int = -1) -> bytes:
            raise AssertionError("the body of a refused artifact was read")

        def seek(self, offset: int, whence: int = 0) -> None:
            self.at = 1001 if whence == 2 else offset  # the client measures the length

        def tell(self) -> int:
            return self.at

    r = client.put(
        f"{PM}/tasks/t/turns/0/artifacts/big",
        headers=h,
        input_stream=Unread(),
    )
    assert r.status_code == 507, r.json
    assert "needs 1001 bytes more" in r.json["detail"]
    assert client.get(f"{PM}/tasks/t/turns/0", headers=h).json["artifacts"] == []


@pytest.mark.all_backends
def test_traffic_per_hour_and_token(app: Flask, client: FlaskClient, tokens: Tokens) -> None:
    for who in ("writer", "writer", "reader"):
        client.get(f"{PM}/tasks", headers=tokens.headers(who))
    client.put(
        f"{PM}/tasks/t/turns/0",
        headers=tokens.headers("writer"),
        data=json.dumps({}),
        content_type="application/json",
    )
    app.extensions["traffic"].flush()
    rows = usage(client, tokens)["traffic"]
    by_token = {r["token_id"]: r for r in rows}
    assert by_token[tokens.ids["writer"]]["requests"] == 3
    assert by_token[tokens.ids["writer"]]["bytes_in"] == 2
    assert by_token[tokens.ids["writer"]]["bytes_out"] > 0
    assert by_token[tokens.ids["reader"]]["requests"] == 1
    assert all(r["project"] == "web" and r["hour"].endswith(":00:00Z") for r in rows)
    # The usage request itself counts from the next flush on.
    app.extensions["traffic"].flush()
    assert {r["token_id"] for r in usage(client, tokens, "tenant_admin")["traffic"]} >= {
        tokens.ids["writer"],
        tokens.ids["reader"],
    }


def test_hours_is_checked(client: FlaskClient, tokens: Tokens) -> None:
    r = client.get(f"{PM}/usage", headers=tokens.headers("writer"), query_string={"hours": "0"})
    assert r.status_code == 422 and r.json["detail"][0]["loc"] == ["query", "hours"]


def test_traffic_counts_the_bytes_received_not_the_length_claimed(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    h = tokens.headers("writer")
    r = client.put(f"{PM}/tasks/t/turns/0", headers=h, json={})  # 2 bytes
    assert r.status_code in (200, 201), r.json
    # A claim far past any route's limit (and past a 64-bit integer) is refused unread.
    r = client.put(
        f"{PM}/tasks/t/turns/0/artifacts/a.bin",
        headers=h,
        data=b"x",
        content_type="application/octet-stream",
        environ_overrides={"CONTENT_LENGTH": str(10**23)},
    )
    assert r.status_code == 413, r.json
    r = client.put(
        f"{PM}/tasks/t/turns/0/artifacts/b.bin",
        headers=h,
        data=b"12345",
        content_type="application/octet-stream",
    )
    assert r.status_code == 200, r.json
    assert app.extensions["traffic"].flush() == 1
    row = {r["token_id"]: r for r in usage(client, tokens)["traffic"]}[tokens.ids["writer"]]
    assert (row["requests"], row["bytes_in"]) == (3, 7)
    # The next flush still works: nothing the refused request claimed is left to write.
    client.get(f"{PM}/tasks", headers=h)
    assert app.extensions["traffic"].flush() == 1
