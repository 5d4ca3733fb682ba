"""Bad input never answers 500 and never corrupts stored data; the OpenAPI document covers it."""

from __future__ import annotations

import json
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings, strategies as st
from openapi_spec_validator import validate

from app.api.openapi import build_spec
from app.storage.core.models import FsckReport
from app.storage.tree.stores.fsck import fsck_stores
from tests.conftest import Tokens

BASE = "/v1/memory_stores"

_text = st.text(
    alphabet=st.characters(codec="utf-8", categories=None), max_size=40
) | st.sampled_from(["/", "/a", "/a/../b", "/.~tmp-x", "/a\x00b", "/" + "é" * 200, "", "/ok"])
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_bodies = st.one_of(
    st.fixed_dictionaries(
        {"path": _json, "content": _json},
        optional={"precondition": _json, "extra": _json, "name": _json, "metadata": _json},
    ),
    st.dictionaries(st.sampled_from(["path", "content", "precondition", "name"]), _json),
    _json,
)
_raw = st.binary(max_size=64)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _snapshot(client: FlaskClient, tokens: Tokens, sid: str) -> Any:
    headers = tokens.headers("writer")
    memories = client.get(f"{BASE}/{sid}/memories?view=full&limit=20", headers=headers).json
    versions = client.get(f"{BASE}/{sid}/memory_versions?limit=100", headers=headers).json
    store = client.get(f"{BASE}/{sid}", headers=headers).json
    return memories, versions, store


@SETTINGS
@given(body=_bodies, raw=_raw, use_raw=st.booleans(), target=st.integers(0, 4))
def test_random_bodies_never_500_and_never_corrupt(
    app: Flask,
    client: FlaskClient,
    tokens: Tokens,
    body: Any,
    raw: bytes,
    use_raw: bool,
    target: int,
) -> None:
    headers = {**tokens.headers("writer"), "Content-Type": "application/json"}
    if not hasattr(app, "_fuzz_store"):
        sid = client.post(BASE, json={"name": "fuzz"}, headers=headers).json["id"]
        mem = client.post(
            f"{BASE}/{sid}/memories",
            json={"path": "/keep/me.md", "content": "safe"},
            headers=headers,
        ).json
        app._fuzz_store = (sid, mem)  # type: ignore[attr-defined]
    sid, mem = app._fuzz_store  # type: ignore[attr-defined]
    before = _snapshot(client, tokens, sid)
    # What it holds now: an earlier example may have updated it (target 1) with a valid body.
    kept = client.get(f"{BASE}/{sid}/memories/{mem['id']}", headers=headers).json
    url, method = [
        (f"{BASE}/{sid}/memories", "POST"),
        (f"{BASE}/{sid}/memories/{mem['id']}", "POST"),
        (f"{BASE}", "POST"),
        (f"{BASE}/{sid}", "POST"),
        (f"{BASE}/{sid}/memory_versions/{mem['memory_version_id']}/redact", "POST"),
    ][target]
    data = raw if use_raw else json.dumps(body).encode()
    r = client.open(url, method=method, data=data, headers=headers)
    assert r.status_code < 500, (r.status_code, r.json)
    assert r.json is not None and (r.status_code == 200 or r.json["type"] == "error")
    if r.status_code != 200:
        # A refused request changed nothing.
        assert _snapshot(client, tokens, sid) == before
    # The memory we did not target by id is never damaged.
    got = client.get(f"{BASE}/{sid}/memories/{mem['id']}", headers=headers)
    if target != 1:
        assert got.json == kept
    report = FsckReport()
    fsck_stores(app.extensions["storage"].stores, report)
    assert report.clean, report.problems


@SETTINGS
@given(
    query=st.dictionaries(
        st.sampled_from(
            [
                "limit",
                "page",
                "view",
                "depth",
                "path_prefix",
                "include_archived",
                "created_at[gte]",
                "operation",
                "memory_id",
                "expected_content_sha256",
            ]
        ),
        _text,
        max_size=4,
    ),
    target=st.integers(0, 5),
)
def test_random_queries_never_500(
    app: Flask, client: FlaskClient, tokens: Tokens, query: dict[str, str], target: int
) -> None:
    headers = tokens.headers("writer")
    if not hasattr(app, "_fuzz_q"):
        sid = client.post(BASE, json={"name": "q"}, headers=headers).json["id"]
        mem = client.post(
            f"{BASE}/{sid}/memories", json={"path": "/a/b", "content": "c"}, headers=headers
        ).json
        app._fuzz_q = (sid, mem)  # type: ignore[attr-defined]
    sid, mem = app._fuzz_q  # type: ignore[attr-defined]
    url, method = [
        (BASE, "GET"),
        (f"{BASE}/{sid}/memories", "GET"),
        (f"{BASE}/{sid}/memory_versions", "GET"),
        (f"{BASE}/{sid}/memories/{mem['id']}", "GET"),
        (f"{BASE}/{sid}/memory_versions/{mem['memory_version_id']}", "GET"),
        (f"{BASE}/{sid}/memories/mem_{'0' * 26}", "DELETE"),
    ][target]
    r = client.open(url, method=method, query_string=query, headers=headers)
    assert r.status_code < 500, (r.status_code, r.json)
    assert r.status_code in (200, 400, 404), (r.status_code, r.json)


def test_openapi_documents_every_memory_stores_route(app: Flask) -> None:
    spec = build_spec(app)
    validate(spec)
    ops = {
        (method, path): op
        for path, item in spec["paths"].items()
        if path.startswith(BASE)
        for method, op in item.items()
    }
    assert len(ops) == 16  # 14 endpoints, the PATCH alias, the memory tool
    assert all(op["tags"] == ["memory-stores"] for op in ops.values())
    ids = [op["operationId"] for op in ops.values()]
    assert len(set(ids)) == len(ids)
    create = ops[("post", f"{BASE}/{{memory_store_id}}/memories")]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MemoryCreateRequest"
    }
    assert "409" in create["responses"]
    for name in ("MemoryStore", "Memory", "MemoryVersion", "MemoryStoresError", "MemoryList"):
        assert name in spec["components"]["schemas"]
