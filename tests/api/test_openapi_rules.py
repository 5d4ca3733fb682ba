"""The OpenAPI document states the rules the server enforces, and means them: each parameter
and body field takes exactly what the server's own check takes, read by jsonschema_rs (the
validator schemathesis judges with, an ECMA-262/Rust regex engine), for any text at all and
for text drawn from the pattern itself."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any

import jsonschema_rs
import pytest
import yaml
from flask.testing import FlaskClient
from hypothesis import HealthCheck, example, given, settings, strategies as st

from app.storage.core import store_rules
from app.storage.core.clock import EPOCH_SECONDS_PATTERN, is_time
from app.storage.core.errors import InvalidName
from app.storage.core.names import validate_artifact_name, validate_id

PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    from app import create_app

    app = create_app({"TESTING": True, "STORAGE_ROOT": "/nonexistent", "TOKENS_FILE": "/x"})
    with app.test_client() as client:
        loaded: dict[str, Any] = yaml.safe_load(client.get(f"{PM}/openapi.yaml").data)
    return loaded


def param(spec: dict[str, Any], path: str, method: str, name: str) -> dict[str, Any]:
    for found in spec["paths"][path][method]["parameters"]:
        if found["name"] == name:
            schema: dict[str, Any] = found["schema"]
            return schema
    raise AssertionError(f"{method} {path} has no parameter {name}")


def field(spec: dict[str, Any], component: str, name: str) -> dict[str, Any]:
    schema: dict[str, Any] = spec["components"]["schemas"][component]["properties"][name]
    return schema


def takes(check: Callable[[str], object], value: str) -> bool:
    try:
        check(value)
    except InvalidName:
        return False
    return True


# -- what the document says ------------------------------------------------------------------
def test_the_document_states_each_rule(spec: dict[str, Any]) -> None:
    turn = f"{PM}/tasks/{{task_id}}/turns/{{turn}}"
    for header in ("X-Sandbox-Tenant-Id", "X-Sandbox-Project-Id"):
        assert param(spec, f"{PM}/tasks", "get", header)["pattern"].startswith("^[A-Za-z0-9]")
    assert "pattern" in param(spec, f"{PM}/search", "get", "q")
    assert "pattern" in param(spec, f"{PM}/project.md", "get", "since")
    assert param(spec, f"{PM}/usage", "get", "hours")["maximum"] == 720
    assert "pattern" in param(spec, f"{MS}/{{memory_store_id}}/memories", "get", "path_prefix")
    assert "pattern" in field(spec, "MemoryCreateRequest", "path")
    assert "pattern" in field(spec, "MemoryUpdateRequest", "path")
    name = field(spec, "MemoryStoreCreateRequest", "name")
    assert (name["minLength"], name["maxLength"]) == (1, 255) and "pattern" in name
    assert field(spec, "MemoryPrecondition", "content_sha256")["pattern"] == "^[0-9a-f]{64}$"
    update = spec["components"]["schemas"]["MemoryUpdateRequest"]
    assert [branch["required"] for branch in update["anyOf"]] == [["content"], ["path"]]
    for path in (turn, f"{turn}/artifacts/{{name}}"):
        assert "400" in spec["paths"][path]["put"]["responses"]  # If-None-Match other than *
    put_links = spec["paths"][turn]["put"]["responses"]["200"]["links"]
    assert put_links["get_turn"]["parameters"] == {
        "task_id": "$response.body#/task_id",
        "turn": "$response.body#/turn",
    }


def test_the_usage_hours_follow_the_retention(client: FlaskClient) -> None:
    from app import create_app

    app = create_app(
        {"TESTING": True, "STORAGE_ROOT": "/nonexistent", "TOKENS_FILE": "/x", "RETENTION_DAYS": 2}
    )
    with app.test_client() as other:
        spec = yaml.safe_load(other.get(f"{PM}/openapi.yaml").data)
    assert param(spec, f"{PM}/usage", "get", "hours")["maximum"] == 48


# -- what it means: the same answer as the server's check ------------------------------------
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
ANY_TEXT = st.text(max_size=40) | st.text(st.characters(max_codepoint=0x7F), max_size=40)


def drawn(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    """Text drawn from ``schema``'s pattern, and any text."""
    return st.from_regex(re.compile(schema["pattern"]), fullmatch=True) | ANY_TEXT


def agrees(schema: dict[str, Any], value: str, server: bool) -> None:
    by_document = jsonschema_rs.validator_for({"type": "string", **schema}).is_valid(value)
    assert by_document == server, (value, by_document, server)


@pytest.mark.parametrize(
    ("where", "check"),
    [
        ((f"{PM}/tasks/{{task_id}}", "get", "task_id"), lambda v: validate_id("task_id", v)),
        ((f"{PM}/tasks", "get", "X-Sandbox-Project-Id"), lambda v: validate_id("project", v)),
        (
            (f"{PM}/tasks/{{task_id}}/turns/{{turn}}/artifacts/{{name}}", "get", "name"),
            validate_artifact_name,
        ),
        (
            (
                f"{MS}/{{memory_store_id}}/memories/{{memory_id}}",
                "delete",
                "expected_content_sha256",
            ),
            lambda v: store_rules.validate_sha256(v, "sha"),
        ),
    ],
    ids=["task_id", "project header", "artifact name", "sha256"],
)
def test_ids_names_and_hashes(
    spec: dict[str, Any], where: tuple[str, str, str], check: Callable[[str], object]
) -> None:
    schema = param(spec, *where)

    @SETTINGS
    @given(drawn(schema))
    @example("a.")
    @example(".")
    @example("..")
    @example("a\n")
    def run(value: str) -> None:
        agrees(schema, value, takes(check, value))

    run()


def test_store_names(spec: dict[str, Any]) -> None:
    schema = field(spec, "MemoryStoreCreateRequest", "name")

    @SETTINGS
    @given(drawn(schema))
    @example("")
    @example("a\x00")
    @example("a\x85")
    @example("x" * 256)
    def run(value: str) -> None:
        agrees(schema, value, takes(store_rules.validate_name, value))

    run()


@pytest.mark.parametrize(
    ("where", "epoch"),
    [
        ((f"{PM}/project.md", "get", "since"), True),
        ((f"{MS}", "get", "created_at[gte]"), False),
    ],
)
def test_times_in_the_query(spec: dict[str, Any], where: tuple[str, str, str], epoch: bool) -> None:
    schema = param(spec, *where)

    def server(value: str) -> bool:
        if epoch and re.fullmatch(EPOCH_SECONDS_PATTERN, value, re.ASCII):
            return True
        return is_time(value, query=True)

    @SETTINGS
    @given(drawn(schema))
    @example("2024-02-29")
    @example("2023-02-29")
    @example("2026-01-01T10:00:00.123456789 01:00")
    @example("0000-01-01")
    @example("1767225600.5")
    def run(value: str) -> None:
        agrees(schema, value, server(value))

    run()


def test_turn_times_in_the_body(spec: dict[str, Any]) -> None:
    schema = field(spec, "TurnMeta", "started_at")

    @SETTINGS
    @given(drawn({"pattern": schema["pattern"]}))
    @example("2026-01-01T10:00:00+01:00")
    @example("2026-01-01T10:00:00 01:00")
    def run(value: str) -> None:
        agrees({"pattern": schema["pattern"]}, value, is_time(value))

    run()


def _nfc_and_bytes(value: str) -> bool:
    """What a memory path's pattern cannot say: NFC across characters and the byte limits."""
    return (
        unicodedata.is_normalized("NFC", value)
        and len(value.encode("utf-8", "surrogatepass")) <= store_rules.MAX_PATH_BYTES
        and all(
            len(s.encode("utf-8", "surrogatepass")) <= store_rules.MAX_SEGMENT_BYTES
            for s in value.split("/")
        )
    )


@pytest.mark.parametrize(
    ("where", "check"),
    [
        (("MemoryCreateRequest", "path"), store_rules.validate_memory_path),
        ((f"{MS}/{{memory_store_id}}/memories", "get", "path_prefix"), None),
    ],
    ids=["path", "path_prefix"],
)
def test_memory_paths(
    spec: dict[str, Any], where: tuple[str, ...], check: Callable[[str], object] | None
) -> None:
    schema = field(spec, *where) if len(where) == 2 else param(spec, *where)
    check = check or store_rules.validate_path_prefix

    @SETTINGS
    @given(drawn(schema) | drawn(schema).map(lambda v: v + "/"))
    @example("/a/./b")
    @example("/.~tmp-x")
    @example("/\u212b")  # ANGSTROM SIGN: NFC makes it another character
    @example("/e\u0301")  # NFC composes the two: the pattern cannot know
    def run(value: str) -> None:
        server = takes(check, value)
        by_document = jsonschema_rs.validator_for({"type": "string", **schema}).is_valid(value)
        if server:
            assert by_document, value
        elif by_document:
            assert not _nfc_and_bytes(value), value

    run()
