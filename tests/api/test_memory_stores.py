"""The memory-stores API: every endpoint, every rule of the store and memory semantics, every
error type."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests.conftest import FixedClock, Tokens

# Runs against every backend MEMORY_TEST_BACKENDS names (tests/conftest.py).
pytestmark = pytest.mark.all_backends

BASE = "/v1/memory_stores"
ULID_TAIL = "[0-9A-HJKMNP-TV-Z]{26}"


class Api:
    """A client bound to one token: ``api.post(url, json=...)`` and friends."""

    def __init__(self, client: FlaskClient, tokens: Tokens, who: str = "writer") -> None:
        self.client = client
        self.tokens = tokens
        self.who = who

    def as_(self, who: str) -> Api:
        return Api(self.client, self.tokens, who)

    def call(self, method: str, url: str, **kwargs: Any) -> TestResponse:
        headers = {**self.tokens.headers(self.who), **kwargs.pop("headers", {})}
        return self.client.open(url, method=method, headers=headers, **kwargs)

    def get(self, url: str, **kw: Any) -> TestResponse:
        return self.call("GET", url, **kw)

    def post(self, url: str, **kw: Any) -> TestResponse:
        return self.call("POST", url, **kw)

    def patch(self, url: str, **kw: Any) -> TestResponse:
        return self.call("PATCH", url, **kw)

    def delete(self, url: str, **kw: Any) -> TestResponse:
        return self.call("DELETE", url, **kw)

    # shortcuts that assert success
    def store(self, name: str = "User Preferences", **body: Any) -> dict[str, Any]:
        r = self.post(BASE, json={"name": name, **body})
        assert r.status_code == 200, r.json
        return r.json  # type: ignore[return-value]

    def memory(self, store_id: str, path: str, content: str = "x") -> dict[str, Any]:
        r = self.post(f"{BASE}/{store_id}/memories", json={"path": path, "content": content})
        assert r.status_code == 200, r.json
        return r.json  # type: ignore[return-value]

    def versions(self, store_id: str, **query: Any) -> list[dict[str, Any]]:
        r = self.get(f"{BASE}/{store_id}/memory_versions", query_string={"limit": 100, **query})
        assert r.status_code == 200, r.json
        return r.json["data"]  # type: ignore[index,no-any-return]


@pytest.fixture
def api(client: FlaskClient, tokens: Tokens) -> Api:
    return Api(client, tokens)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def assert_error(r: TestResponse, status: int, error_type: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.json)
    body = r.json
    assert body is not None
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["request_id"].startswith("req_") and len(body["request_id"]) > 4
    return body


def store_dir(app: Flask, store_id: str) -> Path:
    return Path(app.config["STORAGE_ROOT"]) / "acme" / "web" / "_stores" / store_id


# -- stores ----------------------------------------------------------------------------------
def test_create_store_shape_and_defaults(api: Api, clock: FixedClock) -> None:
    body = api.store("User Preferences")
    assert re.fullmatch(f"memstore_{ULID_TAIL}", body["id"])
    assert body["type"] == "memory_store"
    assert body["name"] == "User Preferences"
    assert body["description"] == ""
    assert body["metadata"] == {}
    assert body["archived_at"] is None
    assert body["created_at"] == body["updated_at"] == "2026-01-01T00:00:00.000000Z"
    full = api.store("B", description="d", metadata={"end_user": "u_123"})
    assert full["description"] == "d" and full["metadata"] == {"end_user": "u_123"}


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": ""},
        {"name": "x" * 256},
        {"name": "a\x00b"},
        {"name": "line\nbreak"},
        {"name": 5},
        {"name": None},
        {"name": "ok", "description": "d" * 1025},
        {"name": "ok", "metadata": {str(i): "v" for i in range(17)}},
        {"name": "ok", "metadata": {"k" * 65: "v"}},
        {"name": "ok", "metadata": {"": "v"}},
        {"name": "ok", "metadata": {"k": "v" * 513}},
        {"name": "ok", "metadata": {"k": 1}},
        {"name": "ok", "metadata": ["k"]},
        {"name": "ok", "unknown_field": 1},
    ],
)
def test_create_store_refuses_bad_bodies(api: Api, body: dict[str, Any]) -> None:
    assert_error(api.post(BASE, json=body), 400, "invalid_request_error")


def test_store_limits_are_inclusive(api: Api) -> None:
    body = api.store(
        "x" * 255,
        description="d" * 1024,
        metadata={f"{i:064d}": "v" * 512 for i in range(16)},
    )
    assert len(body["metadata"]) == 16


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    "raw",
    [b"\xff\xfe", b"not json", b"[1, 2]", b'"name"', b"", b'{"name": "a"', b"NaN"],
)
def test_create_store_refuses_malformed_json(api: Api, raw: bytes) -> None:
    r = api.post(BASE, data=raw, headers={"Content-Type": "application/json"})
    assert_error(r, 400, "invalid_request_error")


def test_list_stores_newest_first_paged_and_filtered(api: Api, clock: FixedClock) -> None:
    ids = []
    for i in range(5):
        ids.append(api.store(f"s{i}")["id"])
        clock.advance(hours=1)
    r = api.get(BASE)
    assert [s["id"] for s in r.json["data"]] == ids[::-1]
    assert r.json["next_page"] is None
    seen, page = [], None
    while True:
        q = {"limit": 2, **({"page": page} if page else {})}
        r = api.get(BASE, query_string=q)
        assert r.status_code == 200 and len(r.json["data"]) <= 2
        seen += [s["id"] for s in r.json["data"]]
        page = r.json["next_page"]
        if page is None:
            break
        assert page.startswith("page_")
    assert seen == ids[::-1]
    r = api.get(
        BASE,
        query_string={
            "created_at[gte]": "2026-01-01T01:00:00Z",
            "created_at[lte]": "2026-01-01T03:00:00+00:00",
        },
    )
    assert [s["id"] for s in r.json["data"]] == ids[3:0:-1]


def test_list_stores_include_archived(api: Api) -> None:
    kept, archived = api.store("kept")["id"], api.store("old")["id"]
    assert api.post(f"{BASE}/{archived}/archive").status_code == 200
    assert [s["id"] for s in api.get(BASE).json["data"]] == [kept]
    listed = api.get(BASE, query_string={"include_archived": "true"}).json["data"]
    assert {s["id"] for s in listed} == {kept, archived}
    assert [
        s["id"] for s in api.get(BASE, query_string={"include_archived": "false"}).json["data"]
    ] == [kept]


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    "query",
    [
        {"limit": "0"},
        {"limit": "101"},
        {"limit": "ten"},
        {"limit": "1.5"},
        {"limit": "²"},
        {"limit": "٥٠"},
        {"limit": "-1"},
        {"limit": " 5"},
        {"limit": ""},
        {"limit": "9" * 20},
        {"limit": "9" * 5000},
        {"page": "garbage"},
        {"page": "page_eyJxIjoiYSJ9"},
        {"include_archived": "maybe"},
        {"created_at[gte]": "yesterday"},
        {"created_at[lte]": "2026-13-01T00:00:00Z"},
    ],
)
def test_list_stores_refuses_bad_queries(api: Api, query: dict[str, str]) -> None:
    api.store()
    assert_error(api.get(BASE, query_string=query), 400, "invalid_request_error")


def test_limit_bounds_are_inclusive(api: Api) -> None:
    for limit in ("1", "100"):
        assert api.get(BASE, query_string={"limit": limit}).status_code == 200


def test_retrieve_store_and_not_found(api: Api) -> None:
    store = api.store()
    assert api.get(f"{BASE}/{store['id']}").json == store
    assert_error(api.get(f"{BASE}/memstore_{'0' * 26}"), 404, "not_found_error")
    assert_error(api.get(f"{BASE}/not-an-id"), 404, "not_found_error")
    assert_error(api.get(f"{BASE}/..%2F..%2Fetc"), 404, "not_found_error")


@pytest.mark.tree_only("reads the store's live files")
def test_update_store_patch_semantics(api: Api, clock: FixedClock, app: Flask) -> None:
    store = api.store("Old Name", description="desc", metadata={"a": "1", "b": "2"})
    sid = store["id"]
    clock.advance(minutes=5)
    r = api.post(f"{BASE}/{sid}", json={"metadata": {"a": "9", "b": None, "c": "3"}})
    assert r.status_code == 200
    assert r.json["metadata"] == {"a": "9", "c": "3"}
    assert r.json["name"] == "Old Name" and r.json["description"] == "desc"
    assert r.json["updated_at"] == "2026-01-01T00:05:00.000000Z"
    assert r.json["created_at"] == store["created_at"]
    r = api.post(f"{BASE}/{sid}", json={"description": "", "name": "New Name!"})
    assert r.json["description"] == "" and r.json["name"] == "New Name!"
    # The directory is named by the id: a rename moves nothing on disk.
    assert store_dir(app, sid).is_dir()
    # A no-op (and nulls, which mean "leave as is") does not advance updated_at.
    clock.advance(minutes=5)
    before = api.get(f"{BASE}/{sid}").json
    r = api.post(f"{BASE}/{sid}", json={"name": "New Name!", "description": None, "metadata": {}})
    assert r.status_code == 200 and r.json == before


def test_memory_writes_do_not_advance_store_updated_at(api: Api, clock: FixedClock) -> None:
    store = api.store()
    clock.advance(minutes=1)
    api.memory(store["id"], "/a.md")
    assert api.get(f"{BASE}/{store['id']}").json["updated_at"] == store["updated_at"]


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    "body",
    [
        {"name": ""},
        {"name": 1},
        {"description": "x" * 1025},
        {"metadata": {str(i): "v" for i in range(17)}},
        {"metadata": {"k": 5}},
        {"metadata": "nope"},
        {"color": "red"},
    ],
)
def test_update_store_refuses_bad_bodies(api: Api, body: dict[str, Any]) -> None:
    sid = api.store(metadata={"a": "1"})["id"]
    assert_error(api.post(f"{BASE}/{sid}", json=body), 400, "invalid_request_error")
    assert api.get(f"{BASE}/{sid}").json["metadata"] == {"a": "1"}


def test_update_store_metadata_patch_cannot_exceed_16_keys(api: Api) -> None:
    sid = api.store(metadata={str(i): "v" for i in range(16)})["id"]
    assert_error(
        api.post(f"{BASE}/{sid}", json={"metadata": {"new": "v"}}), 400, "invalid_request_error"
    )
    r = api.post(f"{BASE}/{sid}", json={"metadata": {"0": None, "new": "v"}})
    assert r.status_code == 200 and len(r.json["metadata"]) == 16


def test_delete_store_removes_everything(api: Api, app: Flask) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/a/b.md", "hello")
    directory = store_dir(app, sid)
    r = api.delete(f"{BASE}/{sid}")
    assert r.status_code == 200 and r.json == {"id": sid, "type": "memory_store_deleted"}
    assert not directory.exists()
    assert_error(api.get(f"{BASE}/{sid}"), 404, "not_found_error")
    assert_error(api.get(f"{BASE}/{sid}/memories/{mem['id']}"), 404, "not_found_error")
    assert_error(api.get(f"{BASE}/{sid}/memory_versions"), 404, "not_found_error")
    assert_error(api.delete(f"{BASE}/{sid}"), 404, "not_found_error")
    trash = Path(app.config["STORAGE_ROOT"]) / ".trash"
    assert not trash.exists() or not any(trash.iterdir())


def test_archive_is_one_way_and_makes_the_store_read_only(api: Api, clock: FixedClock) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/keep.md", "v1")
    clock.advance(minutes=1)
    r = api.post(f"{BASE}/{sid}/archive")
    assert r.status_code == 200
    archived_at = r.json["archived_at"]
    assert archived_at == "2026-01-01T00:01:00.000000Z"
    clock.advance(minutes=1)
    again = api.post(f"{BASE}/{sid}/archive", json={})
    assert again.status_code == 200 and again.json["archived_at"] == archived_at
    assert api.get(f"{BASE}/{sid}").json["archived_at"] == archived_at
    for r in (
        api.post(f"{BASE}/{sid}/memories", json={"path": "/new.md", "content": ""}),
        api.post(f"{BASE}/{sid}/memories/{mem['id']}", json={"content": "v2"}),
        api.post(f"{BASE}/{sid}/memories/{mem['id']}", json={"path": "/moved.md"}),
    ):
        assert_error(r, 409, "conflict_error")
    # Reads still work and nothing changed.
    assert api.get(f"{BASE}/{sid}/memories/{mem['id']}").json["content"] == "v1"
    assert len(api.versions(sid)) == 1
    # Deleting an archived store is allowed.
    assert api.delete(f"{BASE}/{sid}").status_code == 200


def test_an_archived_store_as_the_sdk_documents_it(api: Api, clock: FixedClock) -> None:
    """Archiving is a change of the store (updated_at moves); the archived store's own fields
    never change again (400, as for any invalid request); its memories can still be deleted,
    each with its ``deleted`` version."""
    sid = api.store("kept", description="d", metadata={"k": "v"})["id"]
    mem = api.memory(sid, "/secret.md", "v1")
    clock.advance(minutes=1)
    archived = api.post(f"{BASE}/{sid}/archive").json
    assert archived["archived_at"] == archived["updated_at"] == "2026-01-01T00:01:00.000000Z"
    assert api.get(f"{BASE}/{sid}").json["updated_at"] == archived["archived_at"]
    clock.advance(minutes=1)
    for body in (
        {"name": "renamed"},
        {"description": ""},
        {"metadata": {"k": None}},
        {"name": "kept"},  # a change that changes nothing is refused alike
    ):
        error = assert_error(api.post(f"{BASE}/{sid}", json=body), 400, "invalid_request_error")
        assert "archived" in error["error"]["message"]
    assert api.get(f"{BASE}/{sid}").json == archived
    gone = api.delete(f"{BASE}/{sid}/memories/{mem['id']}")
    assert gone.status_code == 200, gone.json
    assert gone.json == {"id": mem["id"], "type": "memory_deleted"}
    assert_error(api.get(f"{BASE}/{sid}/memories/{mem['id']}"), 404, "not_found_error")
    assert [v["operation"] for v in api.versions(sid)] == ["deleted", "created"]
    assert api.get(f"{BASE}/{sid}/memories").json["data"] == []
    # Deleting a memory does not change the store itself.
    assert api.get(f"{BASE}/{sid}").json == archived


def test_archive_refuses_a_body_with_fields(api: Api) -> None:
    sid = api.store()["id"]
    assert_error(api.post(f"{BASE}/{sid}/archive", json={"x": 1}), 400, "invalid_request_error")
    assert api.get(f"{BASE}/{sid}").json["archived_at"] is None


# -- memories: create --------------------------------------------------------------------------
def test_create_memory_shape(api: Api, tokens: Tokens) -> None:
    sid = api.store()["id"]
    content = "Prefer tabs. Ünïcödé ✓"
    mem = api.memory(sid, "/preferences/formatting.md", content)
    assert re.fullmatch(f"mem_{ULID_TAIL}", mem["id"])
    assert re.fullmatch(f"memver_{ULID_TAIL}", mem["memory_version_id"])
    assert mem["type"] == "memory" and mem["memory_store_id"] == sid
    assert mem["path"] == "/preferences/formatting.md"
    assert mem["content"] is None  # create defaults to view=basic
    assert mem["content_size_bytes"] == len(content.encode("utf-8"))
    assert mem["content_sha256"] == sha(content)
    assert mem["created_at"] == mem["updated_at"]
    (version,) = api.versions(sid)
    assert version["operation"] == "created"
    assert version["id"] == mem["memory_version_id"]
    assert version["created_by"] == {"type": "api_actor", "api_key_id": tokens.ids["writer"]}
    full = api.post(
        f"{BASE}/{sid}/memories", query_string={"view": "full"}, json={"path": "/b", "content": ""}
    )
    assert full.json["content"] == "" and full.json["content_size_bytes"] == 0
    assert full.json["content_sha256"] == sha("")


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    "path",
    [
        "",
        "/",
        "a",
        "a/b",
        "//x",
        "/a//b",
        "/a/",
        "/./a",
        "/a/.",
        "/a/../b",
        "/..",
        "/a\x00b",
        "/a\nb",
        "/a\x7fb",
        "/a\u200bb",  # zero-width space (Cf)
        "/a\u202eb",  # right-to-left override (Cf)
        "/a\u2028b",
        "/a\u2029b",
        "/e\u0301",  # NFD: must be NFC
        "/" + "a" * 1024,  # 1,025 bytes
        "/" + "a" * 256,  # one segment longer than a file name may be
        "/" + "é" * 128,  # 256 bytes of UTF-8 in one segment
        "/" + "/".join("a" * 21),  # 21 segments
        "/.~tmp-abc",  # the server's temp-file prefix
        "/dir/.~tmp-1/x",
    ],
)
def test_create_memory_refuses_invalid_paths(api: Api, path: str) -> None:
    sid = api.store()["id"]
    r = api.post(f"{BASE}/{sid}/memories", json={"path": path, "content": "x"})
    assert_error(r, 400, "invalid_request_error")
    assert api.versions(sid) == []


@pytest.mark.tree_only("reads the store's live files")
def test_valid_path_edges(api: Api, app: Flask) -> None:
    sid = api.store()["id"]
    long_path = "/" + "/".join(["a" * 254] * 4) + "/" + "b" * 3  # 1,024 bytes exactly
    assert len(long_path.encode()) == 1024
    api.memory(sid, long_path)
    api.memory(sid, "/" + "é" * 127)  # 254-byte segment
    api.memory(sid, "/" + "/".join("abcdefghijklmnopqrst"))  # 20 segments
    api.memory(sid, "/Case.md")
    api.memory(sid, "/case.md")  # case-sensitive: a different memory
    api.memory(sid, "/é/ü.md")  # NFC
    api.memory(sid, "/.hidden/...dots/a b")
    paths = [
        m["path"]
        for m in api.get(f"{BASE}/{sid}/memories", query_string={"limit": 100}).json["data"]
    ]
    assert "/Case.md" in paths and "/case.md" in paths and len(paths) == 7
    assert (store_dir(app, sid) / "memories" / "é" / "ü.md").read_text() == "x"


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    "body",
    [
        {"path": "/a"},
        {"content": "x"},
        {"path": "/a", "content": None},
        {"path": "/a", "content": 5},
        {"path": 5, "content": "x"},
        {"path": ["/a"], "content": "x"},
        {"path": "/a", "content": "x", "extra": True},
    ],
)
def test_create_memory_refuses_bad_bodies(api: Api, body: dict[str, Any]) -> None:
    sid = api.store()["id"]
    assert_error(api.post(f"{BASE}/{sid}/memories", json=body), 400, "invalid_request_error")


def test_content_limit_is_102400_bytes_of_utf8(api: Api) -> None:
    sid = api.store()["id"]
    api.memory(sid, "/ascii", "a" * 102_400)
    api.memory(sid, "/utf8", "é" * 51_200)
    for path, content in (("/over", "a" * 102_401), ("/over8", "é" * 51_200 + "a")):
        r = api.post(f"{BASE}/{sid}/memories", json={"path": path, "content": content})
        assert_error(r, 400, "invalid_request_error")
    r = api.post(f"{BASE}/{sid}/memories", json={"path": "/huge", "content": "a" * (5 << 20)})
    assert r.status_code == 413
    assert r.json["type"] == "error"
    assert len(api.versions(sid)) == 2


def test_create_never_overwrites_and_reports_the_conflict(api: Api) -> None:
    sid = api.store()["id"]
    held = api.memory(sid, "/projects/foo/notes.md", "original")
    cases = [
        ("/projects/foo/notes.md", held),  # occupied
        ("/projects/foo", held),  # ancestor of an existing memory
        ("/projects", held),
        ("/projects/foo/notes.md/deeper", held),  # descendant of an existing memory
    ]
    for path, owner in cases:
        r = api.post(f"{BASE}/{sid}/memories", json={"path": path, "content": "new"})
        body = assert_error(r, 409, "memory_path_conflict_error")
        assert body["error"]["conflicting_memory_id"] == owner["id"]
        assert body["error"]["conflicting_path"] == owner["path"]
        assert r.headers["x-should-retry"] == "false"
    api.memory(sid, "/projects/foo/other.md")  # a sibling is fine
    api.memory(sid, "/projects-archive/notes.md")  # so is a name that only shares a prefix
    got = api.get(f"{BASE}/{sid}/memories/{held['id']}").json
    assert got["content"] == "original" and got["memory_version_id"] == held["memory_version_id"]


def test_store_memory_cap(api: Api, app: Flask) -> None:
    app.extensions["storage"].stores.max_memories = 2
    sid = api.store()["id"]
    first = api.memory(sid, "/1")
    api.memory(sid, "/2")
    r = api.post(f"{BASE}/{sid}/memories", json={"path": "/3", "content": "x"})
    assert_error(r, 400, "invalid_request_error")
    # Existing memories stay readable and editable; a delete frees a slot.
    assert (
        api.post(f"{BASE}/{sid}/memories/{first['id']}", json={"content": "y"}).status_code == 200
    )
    assert api.delete(f"{BASE}/{sid}/memories/{first['id']}").status_code == 200
    api.memory(sid, "/3")


# -- memories: list -----------------------------------------------------------------------------
def _all(api: Api, sid: str, **query: Any) -> list[dict[str, Any]]:
    items, page = [], None
    for _ in range(1000):
        q = {**query, **({"page": page} if page else {})}
        r = api.get(f"{BASE}/{sid}/memories", query_string=q)
        assert r.status_code == 200, r.json
        items += r.json["data"]
        page = r.json["next_page"]
        if page is None:
            return items
    raise AssertionError("pagination did not end")


def test_list_memories_path_order_prefix_and_depth(api: Api) -> None:
    sid = api.store()["id"]
    for path in [
        "/notes/todo.md",
        "/notes-archive/todo.md",
        "/notes/deep/er/x.md",
        "/notes/a.md",
        "/zeta.md",
        "/Alpha.md",
        "/notes/deep/y.md",
    ]:
        api.memory(sid, path)
    everything = _all(api, sid)
    paths = [m["path"] for m in everything]
    assert paths == sorted(paths)
    assert len(paths) == 7 and all(m["content"] is None for m in everything)
    under = [m["path"] for m in _all(api, sid, path_prefix="/notes/")]
    assert under == ["/notes/a.md", "/notes/deep/er/x.md", "/notes/deep/y.md", "/notes/todo.md"]
    top = _all(api, sid, depth=1)
    assert [(i["type"], i["path"]) for i in top] == [
        ("memory", "/Alpha.md"),
        ("memory_prefix", "/notes-archive/"),
        ("memory_prefix", "/notes/"),
        ("memory", "/zeta.md"),
    ]
    assert top[1] == {"type": "memory_prefix", "path": "/notes-archive/"}
    level = _all(api, sid, path_prefix="/notes/", depth=1, limit=1)  # prefixes count toward limit
    assert [(i["type"], i["path"]) for i in level] == [
        ("memory", "/notes/a.md"),
        ("memory_prefix", "/notes/deep/"),
        ("memory", "/notes/todo.md"),
    ]
    assert _all(api, sid, path_prefix="/nothing/") == []
    assert [m["path"] for m in _all(api, sid, depth=0, path_prefix="/")] == paths


def test_list_memories_view_full_and_limit_clamp(api: Api) -> None:
    sid = api.store()["id"]
    for i in range(25):
        api.memory(sid, f"/m/{i:02d}", f"content {i}")
    r = api.get(f"{BASE}/{sid}/memories", query_string={"view": "full", "limit": 100})
    assert r.status_code == 200 and len(r.json["data"]) == 20  # clamped, not refused
    assert r.json["data"][3]["content"] == "content 3"
    assert r.json["next_page"]
    r = api.get(f"{BASE}/{sid}/memories", query_string={"limit": 100})
    assert len(r.json["data"]) == 25 and r.json["next_page"] is None
    assert len(api.get(f"{BASE}/{sid}/memories").json["data"]) == 20  # default limit
    full = _all(api, sid, view="full", limit=7)
    assert [m["content"] for m in full] == [f"content {i}" for i in range(25)]


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    "query",
    [
        {"depth": "2"},
        {"depth": "-1"},
        {"depth": "one"},
        {"path_prefix": "/notes"},
        {"path_prefix": "notes/"},
        {"path_prefix": "//"},
        {"path_prefix": "/a/../"},
        {"view": "everything"},
        {"limit": "0"},
        {"limit": "101"},
        {"page": "page_bad"},
    ],
)
def test_list_memories_refuses_bad_queries(api: Api, query: dict[str, str]) -> None:
    sid = api.store()["id"]
    api.memory(sid, "/a")
    assert_error(
        api.get(f"{BASE}/{sid}/memories", query_string=query), 400, "invalid_request_error"
    )


def test_cursor_is_tied_to_its_list(api: Api) -> None:
    sid = api.store()["id"]
    for i in range(3):
        api.memory(sid, f"/d/{i}")
    page = api.get(f"{BASE}/{sid}/memories", query_string={"limit": 1}).json["next_page"]
    r = api.get(
        f"{BASE}/{sid}/memories", query_string={"limit": 1, "page": page, "path_prefix": "/d/"}
    )
    assert_error(r, 400, "invalid_request_error")
    r = api.get(f"{BASE}/{sid}/memory_versions", query_string={"page": page})
    assert_error(r, 400, "invalid_request_error")
    other = api.store()["id"]
    assert_error(
        api.get(f"{BASE}/{other}/memories", query_string={"page": page}),
        400,
        "invalid_request_error",
    )


def test_paging_does_not_repeat_a_memory_renamed_past_the_cursor(api: Api) -> None:
    sid = api.store()["id"]
    mems = [api.memory(sid, f"/{c}") for c in "abcd"]
    r = api.get(f"{BASE}/{sid}/memories", query_string={"limit": 2})
    first = [m["id"] for m in r.json["data"]]
    assert first == [mems[0]["id"], mems[1]["id"]]
    # /a moves past the cursor, /e is created: neither shows up again on later pages.
    api.post(f"{BASE}/{sid}/memories/{mems[0]['id']}", json={"path": "/z"})
    api.memory(sid, "/e")
    r2 = api.get(f"{BASE}/{sid}/memories", query_string={"limit": 2, "page": r.json["next_page"]})
    rest = [m["id"] for m in r2.json["data"]]
    assert rest == [mems[2]["id"], mems[3]["id"]]
    assert r2.json["next_page"] is None
    # A fresh listing sees the new state.
    assert [m["path"] for m in _all(api, sid)] == ["/b", "/c", "/d", "/e", "/z"]


# -- memories: retrieve / update / delete ----------------------------------------------------------
def test_retrieve_memory_views(api: Api) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/a.md", "body")
    full = api.get(f"{BASE}/{sid}/memories/{mem['id']}")
    assert full.json == {**mem, "content": "body"}  # retrieve defaults to view=full
    basic = api.get(f"{BASE}/{sid}/memories/{mem['id']}", query_string={"view": "basic"})
    assert basic.json == mem
    assert_error(
        api.get(f"{BASE}/{sid}/memories/{mem['id']}", query_string={"view": "x"}),
        400,
        "invalid_request_error",
    )
    assert_error(api.get(f"{BASE}/{sid}/memories/mem_{'0' * 26}"), 404, "not_found_error")
    assert_error(api.get(f"{BASE}/{sid}/memories/nope"), 404, "not_found_error")
    other = api.store()["id"]
    assert_error(api.get(f"{BASE}/{other}/memories/{mem['id']}"), 404, "not_found_error")


@pytest.mark.tree_only("reads the store's live files")
def test_update_content_and_rename(api: Api, app: Flask, clock: FixedClock) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/prefs/format.md", "v1")
    clock.advance(seconds=3)
    r = api.post(f"{BASE}/{sid}/memories/{mem['id']}", json={"content": "v2"})
    assert r.status_code == 200
    assert r.json["content"] is None  # update defaults to view=basic
    assert r.json["content_sha256"] == sha("v2")
    assert r.json["memory_version_id"] != mem["memory_version_id"]
    assert r.json["updated_at"] == "2026-01-01T00:00:03.000000Z"
    assert r.json["created_at"] == mem["created_at"]
    r = api.post(
        f"{BASE}/{sid}/memories/{mem['id']}",
        query_string={"view": "full"},
        json={"path": "/archive/2026/format.md"},
    )
    assert r.status_code == 200 and r.json["id"] == mem["id"] and r.json["content"] == "v2"
    tree = store_dir(app, sid) / "memories"
    assert (tree / "archive" / "2026" / "format.md").read_text() == "v2"
    assert not (tree / "prefs").exists()  # empty parents go with the old file
    ops = [v["operation"] for v in api.versions(sid, memory_id=mem["id"])]
    assert ops == ["modified", "modified", "created"]
    # Content and path at once; PATCH is an alias.
    r = api.patch(f"{BASE}/{sid}/memories/{mem['id']}", json={"content": "v3", "path": "/x.md"})
    assert r.status_code == 200 and r.json["path"] == "/x.md"
    assert (tree / "x.md").read_text() == "v3" and not (tree / "archive").exists()
    assert len(api.versions(sid, memory_id=mem["id"])) == 4


@pytest.mark.tree_only("reads the store's live files")
def test_rename_into_own_subtree_and_back(api: Api, app: Flask) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/a/b", "data")
    r = api.post(f"{BASE}/{sid}/memories/{mem['id']}", json={"path": "/a/b/c"})
    assert r.status_code == 200
    assert (store_dir(app, sid) / "memories" / "a" / "b" / "c").read_text() == "data"
    r = api.post(f"{BASE}/{sid}/memories/{mem['id']}", json={"path": "/a"})
    assert r.status_code == 200
    assert (store_dir(app, sid) / "memories" / "a").read_text() == "data"


def test_rename_conflicts(api: Api) -> None:
    sid = api.store()["id"]
    mover = api.memory(sid, "/mover")
    taken = api.memory(sid, "/dir/taken")
    for target in ("/dir/taken", "/dir", "/dir/taken/sub"):
        r = api.post(f"{BASE}/{sid}/memories/{mover['id']}", json={"path": target})
        body = assert_error(r, 409, "memory_path_conflict_error")
        assert body["error"]["conflicting_memory_id"] == taken["id"]
        assert body["error"]["conflicting_path"] == "/dir/taken"
    assert api.get(f"{BASE}/{sid}/memories/{mover['id']}").json["path"] == "/mover"
    assert len(api.versions(sid)) == 2


def test_update_no_op_writes_no_version(api: Api, clock: FixedClock) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/a", "same")
    clock.advance(minutes=1)
    for body in ({"content": "same"}, {"path": "/a"}, {"content": "same", "path": "/a"}):
        r = api.post(f"{BASE}/{sid}/memories/{mem['id']}", json=body)
        assert r.status_code == 200 and r.json == mem
    assert len(api.versions(sid)) == 1


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    "body",
    [
        {},
        {"content": None, "path": None},
        {"content": 1},
        {"path": "relative"},
        {"path": "/a/../b"},
        {"content": "a" * 102_401},
        {"content": "x", "precondition": {"type": "etag", "content_sha256": "0" * 64}},
        {"content": "x", "precondition": {"type": "content_sha256", "content_sha256": "ABC"}},
        {"content": "x", "precondition": {"type": "content_sha256", "content_sha256": "A" * 64}},
        {"content": "x", "precondition": {"type": "content_sha256"}},
        {"content": "x", "precondition": "sha"},
        {
            "content": "x",
            "precondition": {"type": "content_sha256", "content_sha256": "0" * 64, "x": 1},
        },
        {"content": "x", "memory_id": "mem_x"},
    ],
)
def test_update_refuses_bad_bodies(api: Api, body: dict[str, Any]) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/a", "v1")
    r = api.post(f"{BASE}/{sid}/memories/{mem['id']}", json=body)
    assert_error(r, 400, "invalid_request_error")
    assert len(api.versions(sid)) == 1


def test_update_precondition(api: Api) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/a", "v1")
    url = f"{BASE}/{sid}/memories/{mem['id']}"

    def pre(value: str) -> dict[str, str]:
        return {"type": "content_sha256", "content_sha256": value}

    r = api.post(url, json={"content": "v2", "precondition": pre(sha("v1"))})
    assert r.status_code == 200 and r.json["content_sha256"] == sha("v2")
    # Stale hash: 409 and nothing changes.
    r = api.post(url, json={"content": "v3", "precondition": pre(sha("v1"))})
    assert_error(r, 409, "memory_precondition_failed_error")
    assert r.headers["x-should-retry"] == "false"
    r = api.post(url, json={"path": "/moved", "precondition": pre(sha("v1"))})
    assert_error(r, 409, "memory_precondition_failed_error")
    assert api.get(url).json["content"] == "v2" and api.get(url).json["path"] == "/a"
    # Stale hash, but the stored state already is what was asked: 200, no version.
    r = api.post(url, json={"content": "v2", "precondition": pre(sha("v1"))})
    assert r.status_code == 200 and r.json["content_sha256"] == sha("v2")
    # A rename's precondition refers to the current content.
    r = api.post(url, json={"path": "/moved", "precondition": pre(sha("v2"))})
    assert r.status_code == 200 and r.json["path"] == "/moved"
    assert [v["operation"] for v in api.versions(sid)] == ["modified", "modified", "created"]


def test_update_unknown_memory(api: Api) -> None:
    sid = api.store()["id"]
    r = api.post(f"{BASE}/{sid}/memories/mem_{'0' * 26}", json={"content": "x"})
    assert_error(r, 404, "not_found_error")


@pytest.mark.tree_only("reads the store's live files")
def test_delete_memory(api: Api, app: Flask) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/deep/er/file.md", "bye")
    keep = api.memory(sid, "/deep/other.md", "stay")
    url = f"{BASE}/{sid}/memories/{mem['id']}"
    r = api.delete(url, query_string={"expected_content_sha256": sha("other")})
    assert_error(r, 409, "memory_precondition_failed_error")
    assert api.get(url).status_code == 200
    assert_error(
        api.delete(url, query_string={"expected_content_sha256": "xyz"}),
        400,
        "invalid_request_error",
    )
    r = api.delete(url, query_string={"expected_content_sha256": sha("bye")})
    assert r.status_code == 200 and r.json == {"id": mem["id"], "type": "memory_deleted"}
    assert_error(api.get(url), 404, "not_found_error")
    assert_error(api.delete(url), 404, "not_found_error")
    tree = store_dir(app, sid) / "memories"
    assert not (tree / "deep" / "er").exists()
    assert (tree / "deep" / "other.md").read_text() == "stay"
    history = api.versions(sid, memory_id=mem["id"])
    assert [v["operation"] for v in history] == ["deleted", "created"]
    deleted = history[0]
    assert deleted["path"] == "/deep/er/file.md"
    assert deleted["content_sha256"] is None and deleted["content_size_bytes"] is None
    assert history[1]["content_sha256"] == sha("bye")
    # The path is free again: create a new memory there (a new id).
    again = api.memory(sid, "/deep/er/file.md", "back")
    assert again["id"] != mem["id"]
    assert api.delete(f"{BASE}/{sid}/memories/{keep['id']}").status_code == 200


# -- versions --------------------------------------------------------------------------------------
def test_version_list_filters_and_views(api: Api, tokens: Tokens, clock: FixedClock) -> None:
    sid = api.store()["id"]
    a = api.memory(sid, "/a", "a1")
    clock.advance(minutes=1)
    b = api.as_("writer2").memory(sid, "/b", "b1")
    clock.advance(minutes=1)
    api.post(f"{BASE}/{sid}/memories/{a['id']}", json={"content": "a2"})
    clock.advance(minutes=1)
    api.delete(f"{BASE}/{sid}/memories/{b['id']}")
    everything = api.versions(sid)
    assert [(v["memory_id"], v["operation"]) for v in everything] == [
        (b["id"], "deleted"),
        (a["id"], "modified"),
        (b["id"], "created"),
        (a["id"], "created"),
    ]
    assert all(v["content"] is None for v in everything)
    assert everything[1]["content_sha256"] == sha("a2") and everything[1]["path"] == "/a"
    assert [v["operation"] for v in api.versions(sid, memory_id=a["id"])] == ["modified", "created"]
    assert [v["memory_id"] for v in api.versions(sid, operation="created")] == [b["id"], a["id"]]
    by_key = api.versions(sid, api_key_id=tokens.ids["writer2"])
    assert [v["operation"] for v in by_key] == ["created"]
    assert api.versions(sid, session_id="sesn_x") == []
    assert api.versions(sid, service_account_id="svac_x") == []
    window = api.versions(
        sid,
        **{"created_at[gte]": "2026-01-01T00:01:00Z", "created_at[lte]": "2026-01-01T00:02:00Z"},
    )
    assert [v["operation"] for v in window] == ["modified", "created"]
    full = api.versions(sid, view="full")
    assert [v["content"] for v in full] == [None, "a2", "b1", "a1"]
    paged, page = [], None
    while True:
        q = {"limit": 1, **({"page": page} if page else {})}
        r = api.get(f"{BASE}/{sid}/memory_versions", query_string=q)
        paged += [v["id"] for v in r.json["data"]]
        page = r.json["next_page"]
        if not page:
            break
    assert paged == [v["id"] for v in everything]
    assert_error(
        api.get(f"{BASE}/{sid}/memory_versions", query_string={"operation": "renamed"}),
        400,
        "invalid_request_error",
    )
    r = api.get(f"{BASE}/{sid}/memory_versions", query_string={"view": "full", "limit": 100})
    assert r.status_code == 200


def test_versions_tie_break_by_id_when_the_clock_stands_still(api: Api) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/a", "0")
    for i in range(1, 6):
        api.post(f"{BASE}/{sid}/memories/{mem['id']}", json={"content": str(i)})
    versions = api.versions(sid, view="full")
    assert [v["content"] for v in versions] == ["5", "4", "3", "2", "1", "0"]
    assert [v["id"] for v in versions] == sorted((v["id"] for v in versions), reverse=True)
    assert len({v["created_at"] for v in versions}) == 1


def test_retrieve_version(api: Api) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/a", "text")
    url = f"{BASE}/{sid}/memory_versions/{mem['memory_version_id']}"
    full = api.get(url).json
    assert full["content"] == "text" and full["type"] == "memory_version"
    assert full["memory_store_id"] == sid and full["memory_id"] == mem["id"]
    assert full["redacted_at"] is None and full["redacted_by"] is None
    assert api.get(url, query_string={"view": "basic"}).json["content"] is None
    assert_error(api.get(f"{BASE}/{sid}/memory_versions/memver_{'0' * 26}"), 404, "not_found_error")
    assert_error(api.get(f"{BASE}/{sid}/memory_versions/x"), 404, "not_found_error")


def test_redact(api: Api, tokens: Tokens, app: Flask) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/secret.md", "api key: hunter2")
    old = mem["memory_version_id"]
    head_url = f"{BASE}/{sid}/memory_versions/{old}/redact"
    admin = api.as_("project_admin")
    # The head of a live memory cannot be redacted.
    assert_error(admin.post(head_url), 409, "conflict_error")
    api.post(f"{BASE}/{sid}/memories/{mem['id']}", json={"content": "api key: <removed>"})
    r = admin.post(head_url, json={})
    assert r.status_code == 200
    red = r.json
    assert red["redacted_at"] is not None
    assert red["redacted_by"] == {"type": "api_actor", "api_key_id": tokens.ids["project_admin"]}
    assert red["created_by"] == {"type": "api_actor", "api_key_id": tokens.ids["writer"]}
    for field in ("content", "path", "content_sha256", "content_size_bytes"):
        assert red[field] is None
    got = api.get(f"{BASE}/{sid}/memory_versions/{old}")
    assert got.status_code == 200 and got.json == red
    # Idempotent.
    assert admin.post(head_url).json == red
    listed = {v["id"]: v for v in api.versions(sid, view="full")}
    assert listed[old]["path"] is None and listed[old]["content"] is None
    # The secret is gone from disk.
    files = list((store_dir(app, sid)).rglob("*"))
    assert not any(
        b"hunter2" in f.read_bytes() for f in files if f.is_file() and "sqlite" not in f.name
    )
    # After a delete, the last content version and the deleted row can both be redacted.
    head = api.get(f"{BASE}/{sid}/memories/{mem['id']}").json["memory_version_id"]
    api.delete(f"{BASE}/{sid}/memories/{mem['id']}")
    assert admin.post(f"{BASE}/{sid}/memory_versions/{head}/redact").status_code == 200
    deleted = api.versions(sid, operation="deleted")[0]
    assert admin.post(f"{BASE}/{sid}/memory_versions/{deleted['id']}/redact").status_code == 200
    assert_error(
        admin.post(f"{BASE}/{sid}/memory_versions/memver_{'0' * 26}/redact"),
        404,
        "not_found_error",
    )
    assert_error(admin.post(head_url, json={"reason": "x"}), 400, "invalid_request_error")


# -- credentials, scope, headers ------------------------------------------------------------------
def _routes(sid: str, mid: str, vid: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("POST", BASE, {"name": "n"}),
        ("GET", BASE, None),
        ("GET", f"{BASE}/{sid}", None),
        ("POST", f"{BASE}/{sid}", {"name": "n2"}),
        ("POST", f"{BASE}/{sid}/archive", None),
        ("POST", f"{BASE}/{sid}/memories", {"path": "/new", "content": ""}),
        ("GET", f"{BASE}/{sid}/memories", None),
        ("GET", f"{BASE}/{sid}/memories/{mid}", None),
        ("POST", f"{BASE}/{sid}/memories/{mid}", {"content": "changed"}),
        ("PATCH", f"{BASE}/{sid}/memories/{mid}", {"content": "changed"}),
        ("DELETE", f"{BASE}/{sid}/memories/{mid}", None),
        ("GET", f"{BASE}/{sid}/memory_versions", None),
        ("GET", f"{BASE}/{sid}/memory_versions/{vid}", None),
        ("POST", f"{BASE}/{sid}/memory_versions/{vid}/redact", None),
        ("DELETE", f"{BASE}/{sid}", None),
    ]


def test_route_table_covers_the_blueprint(app: Flask) -> None:
    rules = {
        (m, r.rule)
        for r in app.url_map.iter_rules()
        if r.rule.startswith(BASE) and r.endpoint.startswith("memory_stores.")
        for m in (r.methods or set()) - {"HEAD", "OPTIONS"}
    }
    sample = _routes("<memory_store_id>", "<memory_id>", "<memory_version_id>")
    assert rules == {(m, u) for m, u, _ in sample}
    assert len(rules) == 15  # 14 endpoints + the PATCH alias


def test_credentials_roles_and_scope(api: Api, tokens: Tokens, client: FlaskClient) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/a", "x")
    vid = mem["memory_version_id"]
    for method, url, body in _routes(sid, mem["id"], vid):
        r = client.open(url, method=method, json=body)
        assert_error(r, 401, "authentication_error")
        r = client.open(url, method=method, json=body, headers={"x-api-key": "wrong"})
        assert_error(r, 401, "authentication_error")
        reader = api.as_("reader").call(method, url, json=body)
        if method == "GET":
            assert reader.status_code == 200, (url, reader.json)
        else:
            assert_error(reader, 403, "permission_error")
        if url != BASE:
            for outsider in ("other_project", "other_tenant"):
                r = api.as_(outsider).call(method, url, json=body)
                if url.endswith("/redact"):
                    # The role rule comes first: a writer may redact nothing, anywhere.
                    assert_error(r, 403, "permission_error")
                else:
                    assert_error(r, 404, "not_found_error")
    # Other workspaces' lists are empty, not shared.
    assert api.as_("other_project").get(BASE).json == {"data": [], "next_page": None}
    assert len(api.versions(sid)) == 1  # nothing was written by anyone refused


def test_x_api_key_beta_headers_and_beta_query_are_accepted(
    api: Api, tokens: Tokens, client: FlaskClient
) -> None:
    headers = {
        "x-api-key": tokens.secrets["writer"],
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "agent-memory-2026-07-22",
    }
    r = client.post(f"{BASE}?beta=true", json={"name": "n"}, headers=headers)
    assert r.status_code == 200
    sid = r.json["id"]
    headers["anthropic-beta"] = "managed-agents-2026-04-01"
    r = client.get(f"{BASE}/{sid}/memories?beta=true", headers=headers)
    assert r.status_code == 200 and r.json == {"data": [], "next_page": None}


def test_unknown_routes_and_methods_use_the_envelope(api: Api) -> None:
    sid = api.store()["id"]
    assert_error(api.get(f"{BASE}/{sid}/nothing"), 404, "not_found_error")
    assert_error(api.call("PUT", f"{BASE}/{sid}"), 405, "invalid_request_error")


# -- the tree on disk ---------------------------------------------------------------------------
@pytest.mark.tree_only("reads the store's live files")
def test_tree_on_disk_matches_the_api_byte_for_byte(api: Api, app: Flask) -> None:
    sid = api.store("Scripted Session")["id"]
    a = api.memory(sid, "/prefs/format.md", "Use tabs.\n")
    b = api.memory(sid, "/prefs/lang.md", "Python 3.11 ✓\n")
    c = api.memory(sid, "/projects/foo/notes.md", "")
    d = api.memory(sid, "/ünï/cödé.txt", "\x00binary-ish\r\n")
    api.post(f"{BASE}/{sid}/memories/{a['id']}", json={"content": "Use spaces.\n"})
    api.post(f"{BASE}/{sid}/memories/{b['id']}", json={"path": "/archive/lang.md"})
    api.post(f"{BASE}/{sid}/memories/{c['id']}", json={"path": "/projects/foo", "content": "flat"})
    api.delete(f"{BASE}/{sid}/memories/{d['id']}")
    api.memory(sid, "/projects/bar/x/y/z.md", "deep")
    listed = _all(api, sid, view="full")
    expected = {m["path"]: m["content"].encode("utf-8") for m in listed}
    for m in listed:
        assert hashlib.sha256(expected[m["path"]]).hexdigest() == m["content_sha256"]
    tree = store_dir(app, sid) / "memories"
    on_disk = {
        "/" + p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*") if p.is_file()
    }
    assert on_disk == expected
    dirs = {p for p in tree.rglob("*") if p.is_dir()}
    assert all(any(dirs_child.iterdir()) for dirs_child in dirs)  # no empty directories left
    assert store_dir(app, sid).name == sid


STORE_CHANGES = {
    "update": ("POST", "", {"description": "changed"}),
    "archive": ("POST", "/archive", None),
    "delete": ("DELETE", "", None),
}


@pytest.mark.parametrize("change", sorted(STORE_CHANGES))
@pytest.mark.parametrize(
    ("who", "allowed"),
    [
        ("writer", True),  # the store's creator
        ("writer2", False),  # another writer of the same project
        ("reader", False),
        ("project_admin", True),
        ("tenant_admin", True),
        ("admin", True),
    ],
)
def test_store_changes_are_the_creators_or_a_project_admins(
    api: Api, tokens: Tokens, who: str, allowed: bool, change: str
) -> None:
    sid = api.store()["id"]
    method, suffix, body = STORE_CHANGES[change]
    headers = {"X-Sandbox-Tenant-Id": "acme", "X-Sandbox-Project-Id": "web"}
    r = api.as_(who).call(method, f"{BASE}/{sid}{suffix}", json=body, headers=headers)
    if allowed:
        assert r.status_code == 200, r.json
    else:
        assert_error(r, 403, "permission_error")
        store = api.get(f"{BASE}/{sid}").json
        assert store["archived_at"] is None and store["description"] == ""


@pytest.mark.parametrize(
    ("who", "allowed"),
    [
        ("writer", False),  # even the memory's own author
        ("writer2", False),
        ("reader", False),
        ("project_admin", True),
        ("tenant_admin", True),
        ("admin", True),
    ],
)
def test_redacting_a_version_is_a_project_admins(
    api: Api, tokens: Tokens, who: str, allowed: bool
) -> None:
    sid = api.store()["id"]
    mem = api.memory(sid, "/a", "secret")
    api.post(f"{BASE}/{sid}/memories/{mem['id']}", json={"content": "fine"})
    url = f"{BASE}/{sid}/memory_versions/{mem['memory_version_id']}/redact"
    headers = {"X-Sandbox-Tenant-Id": "acme", "X-Sandbox-Project-Id": "web"}
    r = api.as_(who).call("POST", url, headers=headers)
    if allowed:
        assert r.status_code == 200 and r.json["redacted_at"] is not None, r.json
    else:
        assert_error(r, 403, "permission_error")
        assert (
            api.get(f"{BASE}/{sid}/memory_versions/{mem['memory_version_id']}").json["content"]
            == "secret"
        )


def test_creating_stores_and_writing_memories_is_any_writers(api: Api) -> None:
    sid = api.store()["id"]
    other = api.as_("writer2")
    assert other.post(BASE, json={"name": "mine"}).status_code == 200
    r = other.post(f"{BASE}/{sid}/memories", json={"path": "/x", "content": "y"})
    assert r.status_code == 200
    r = other.post(f"{BASE}/{sid}/memories/{r.json['id']}", json={"content": "z"})
    assert r.status_code == 200
    assert other.delete(f"{BASE}/{sid}/memories/{r.json['id']}").status_code == 200
