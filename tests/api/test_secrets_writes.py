"""Secrets in what the APIs are asked to store: masked (the default), refused or kept, by the
project's policy, on every write path of the REST APIs; the policy's own endpoints.

The secrets are made up with real shapes and checksums (tests/secrets_corpus.py), one of each
kind per write, and looked for afterwards in the answers, in every read, and (on the tree) in
every byte of every file under the storage root, write-ahead logs included.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import Tokens
from tests.secrets_corpus import Planted, corpus

pytestmark = pytest.mark.all_backends

PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"
BOUNDARY = "pm-secrets-test"


@pytest.fixture(scope="module")
def planted() -> list[Planted]:
    """The corpus: 15 made-up secrets of each of its 21 kinds (330)."""
    found = corpus(seed=11)
    assert len(found) >= 300 and len({p.kind for p in found}) >= 20
    return found


def _text(planted: list[Planted]) -> str:
    lines = ["# Session notes", "", "Pasted while debugging:"]
    lines += [f"- {p.text}" for p in planted]
    lines += [
        "",
        "Commit 3f9c2d1e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e, run 01M90Z2SX887QTNYQAT9H3D3S2.",
    ]
    return "\n".join(lines)


def _form(turn: dict[str, Any], artifacts: dict[str, tuple[bytes, str]]) -> bytes:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="turn"\r\n'
        f"Content-Type: application/json\r\n\r\n".encode()
        + json.dumps(turn).encode()
        + b"\r\n"
    ]
    for name, (data, kind) in artifacts.items():
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="artifact"; filename="{name}"'
            f"\r\nContent-Type: {kind}\r\n\r\n".encode()
            + data
            + b"\r\n"
        )
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def _root_bytes(app: Flask) -> bytes:
    """Every byte of every file under the storage root (the tree's), links not followed."""
    root = Path(app.config["STORAGE_ROOT"])
    return b"".join(
        p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()
    )


def _pg_bytes(app: Flask) -> bytes:
    """Every row of every table of the test's schema as text, and every object under its
    key prefix: what a PostgreSQL + S3 deployment holds."""
    import boto3
    import psycopg
    from psycopg import sql

    url = app.config["DATABASE_URL"]
    schema = url.rsplit("search_path%3D", 1)[1]
    out: list[bytes] = []
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
        for (table,) in tables:
            name = sql.Identifier(schema, table)
            for row in conn.execute(sql.SQL("SELECT * FROM {}").format(name)):
                for value in row:  # bytea as its bytes, the rest as its text
                    if isinstance(value, bytes | memoryview):
                        out.append(bytes(value))
                    else:
                        out.append(json.dumps(value, default=str, ensure_ascii=False).encode())
    bucket, _, prefix = app.config["BLOB_URL"].removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", endpoint_url=app.config["S3_ENDPOINT_URL"])
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            out.append(s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
    return b"\n".join(out)


def _set_policy(client: FlaskClient, tokens: Tokens, **body: Any) -> dict[str, Any]:
    r = client.put(f"{PM}/secrets/policy", json=body, headers=tokens.headers("project_admin"))
    assert r.status_code == 200, r.data
    got: dict[str, Any] = r.get_json()
    return got


def _write_everything(client: FlaskClient, tokens: Tokens, text: str) -> list[Any]:
    """Every REST write path with ``text`` in it; the responses."""
    h = tokens.headers("writer")
    blob = text.encode()
    answers = [
        # the seed's two requests: the turn (summary and meta), then a text artifact
        client.put(
            f"{PM}/tasks/t1/turns/0",
            json={"meta": {"model": "m", "note": text, "list": [text]}, "summary_md": text},
            headers=h,
        ),
        client.put(
            f"{PM}/tasks/t1/turns/0/artifacts/notes.md",
            data=blob,
            headers={**h, "Content-Type": "text/markdown"},
        ),
        # an artifact sent as octet-stream is sniffed as text
        client.put(
            f"{PM}/tasks/t1/turns/0/artifacts/out.log",
            data=blob,
            headers={**h, "Content-Type": "application/octet-stream"},
        ),
        # the one-request record
        client.put(
            f"{PM}/tasks/t2/turns/0",
            data=_form(
                {"meta": {"x": text}, "summary_md": text},
                {
                    "transcript.jsonl": (
                        json.dumps({"content": text}).encode(),
                        "application/x-ndjson",
                    )
                },
            ),
            headers={**h, "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
        ),
    ]
    short = " ".join(line for line in text.splitlines() if 0 < len(line) < 120)[:1000]
    r = client.post(MS, json={"name": "notes", "description": short}, headers=h)
    answers.append(r)
    store_id = r.get_json().get("id") if r.status_code == 200 else None
    if store_id is not None:
        r = client.post(
            f"{MS}/{store_id}/memories", json={"path": "/a.md", "content": text}, headers=h
        )
        answers.append(r)
        memory_id = r.get_json().get("id") if r.status_code == 200 else None
        r = client.post(
            f"{MS}/{store_id}/memories", json={"path": "/b.md", "content": "plain"}, headers=h
        )
        answers.append(r)
        other = r.get_json()["id"]
        answers.append(
            client.post(
                f"{MS}/{store_id}/memories/{other}", json={"content": text + "\nmore"}, headers=h
            )
        )
        if memory_id is not None:
            answers.append(client.get(f"{MS}/{store_id}/memories/{memory_id}", headers=h))
    return answers


def test_masking_is_the_default_and_no_secret_comes_to_rest(
    app: Flask,
    client: FlaskClient,
    tokens: Tokens,
    planted: list[Planted],
    backend_kind: str,
    tmp_path: Path,
) -> None:
    text = _text(planted)
    answers = _write_everything(client, tokens, text)
    for r in answers:
        assert r.status_code == 200, r.data
        body = r.get_data(as_text=True)
        for p in planted:
            assert p.value not in body, p
    # Each write says what it masked, by kind and count.
    masked = answers[0].headers["Memory-Secrets-Masked"]
    counts = dict(item.split("=") for item in masked.split(", "))
    assert set(counts) >= {p.kind for p in planted}
    # What is read back holds markers, and the ordinary text around them.
    h = tokens.headers("writer")
    turn = client.get(f"{PM}/tasks/t1/turns/0", headers=h).get_json()
    assert "[secret:github-token]" in turn["summary_md"]
    assert "3f9c2d1e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e" in turn["summary_md"]  # a commit is no secret
    assert "01M90Z2SX887QTNYQAT9H3D3S2" in turn["summary_md"]
    reads = [
        client.get(f"{PM}/tasks/t1/turns/0/artifacts/notes.md", headers=h).data,
        client.get(f"{PM}/tasks/t1/turns/0/artifacts/out.log", headers=h).data,
        client.get(f"{PM}/tasks/t2/turns/0/artifacts/transcript.jsonl", headers=h).data,
        client.get(f"{PM}/project.md", headers=h).data,
        client.get(f"{PM}/search?q=pasted", headers=h).data,
    ]
    for data in reads:
        for p in planted:
            assert p.value.encode() not in data, p
    # The audit log has each masking (kinds and counts, never a value).
    events = client.get(f"{PM}/audit?kind=secrets", headers=tokens.headers("project_admin"))
    if events.status_code == 200:
        assert all(p.value not in events.get_data(as_text=True) for p in planted)
    counted = client.get(f"{PM}/usage", headers=h).get_json()["secrets"]
    assert counted["masked"] >= len(planted) and not counted["truncated"]
    # A backup of the project holds none of them either.
    backup = tmp_path / "backup.pmx"
    result = app.test_cli_runner().invoke(
        args=["export", "--tenant", "acme", "--project", "web", str(backup)]
    )
    assert result.exit_code == 0, result.output
    exported = backup.read_bytes()
    if exported[:2] == b"\x1f\x8b":  # gzip: its members' bytes as stored
        exported = gzip.decompress(exported)
    assert b"[secret:github-token]" in exported
    for p in planted:
        assert p.value.encode() not in exported, p
    assert counted["masked_by_kind"]["github-token"] >= 1 and counted["refused_writes"] == 0
    stored = _root_bytes(app) if backend_kind == "tree" else _pg_bytes(app)
    assert b"[secret:github-token]" in stored  # the scan reads what was stored
    for p in planted:
        assert p.value.encode() not in stored, p


def test_reject_refuses_every_path_with_the_kind_and_stores_nothing(
    client: FlaskClient, tokens: Tokens, planted: list[Planted]
) -> None:
    assert _set_policy(client, tokens, policy="reject")["policy"] == "reject"
    secret = next(p for p in planted if p.kind == "github-token")
    text = f"before {secret.text} after"
    h = tokens.headers("writer")
    # A turn without secrets is stored; its artifacts with one are not.
    assert (
        client.put(f"{PM}/tasks/t0/turns/0", json={"summary_md": "ok"}, headers=h).status_code
        == 200
    )
    for name, kind in (("notes.md", "text/markdown"), ("out.log", "application/octet-stream")):
        r = client.put(
            f"{PM}/tasks/t0/turns/0/artifacts/{name}",
            data=("x" * 300_000 + text).encode(),  # found past the first piece read
            headers={**h, "Content-Type": kind},
        )
        assert r.status_code == 422, r.data
        assert client.get(f"{PM}/tasks/t0/turns/0/artifacts/{name}", headers=h).status_code == 404
    assert client.get(f"{PM}/tasks/t0/turns/0", headers=h).get_json()["artifacts"] == []
    answers = _write_everything(client, tokens, text)
    refused = [answers[0], answers[3], answers[4]]  # turn, one-request record, store
    for r in refused:
        assert r.status_code == 422, r.data
        body = r.get_data(as_text=True)
        assert "github-token" in body and secret.value not in body
    detail = answers[0].get_json()["detail"]
    assert detail[0]["type"] == "secret_found"
    assert detail[0]["ctx"]["kind"] == "github-token"
    assert detail[0]["loc"][:2] == ["body", "meta"]
    store_error = answers[4].get_json()["error"]
    assert store_error["secrets"][0]["kind"] == "github-token"
    assert client.get(f"{PM}/tasks/t1", headers=h).status_code == 404
    assert client.get(f"{PM}/tasks/t2", headers=h).status_code == 404
    assert client.get(MS, headers=h).get_json()["data"] == []
    # Memories: a create and an update with a secret are refused, the memory unchanged.
    store_id = client.post(MS, json={"name": "clean"}, headers=h).get_json()["id"]
    memories = f"{MS}/{store_id}/memories"
    r = client.post(memories, json={"path": "/a.md", "content": text}, headers=h)
    assert r.status_code == 422 and secret.value not in r.get_data(as_text=True)
    memory = client.post(memories, json={"path": "/a.md", "content": "clean"}, headers=h).get_json()
    r = client.post(f"{memories}/{memory['id']}", json={"content": text}, headers=h)
    assert r.status_code == 422
    r = client.post(f"{memories}/{memory['id']}", json={"path": f"/{secret.value}.md"}, headers=h)
    assert r.status_code == 422
    assert client.get(f"{memories}/{memory['id']}", headers=h).get_json()["content"] == "clean"
    counted = client.get(f"{PM}/usage", headers=h).get_json()["secrets"]
    assert counted["refused_writes"] >= 8 and counted["masked"] == 0


def test_allow_keeps_what_is_written_and_allowlists_let_values_through(
    client: FlaskClient, tokens: Tokens, planted: list[Planted]
) -> None:
    h = tokens.headers("writer")
    secret = next(p for p in planted if p.kind == "github-token")
    other = next(p for p in planted if p.kind == "aws-access-key")
    fingerprint = hashlib.sha256(secret.value.encode()).hexdigest()
    _set_policy(client, tokens, allow_fingerprints=[fingerprint])
    r = client.put(
        f"{PM}/tasks/t/turns/0",
        json={"meta": {}, "summary_md": f"{secret.text} {other.text}"},
        headers=h,
    )
    assert r.status_code == 200, r.data
    summary = r.get_json()["summary_md"]
    assert secret.value in summary and other.value not in summary
    assert r.headers["Memory-Secrets-Masked"] == "aws-access-key=1"
    _set_policy(client, tokens, policy="allow")
    r = client.put(f"{PM}/tasks/t/turns/1", json={"summary_md": other.text}, headers=h)
    assert r.status_code == 200 and other.value in r.get_json()["summary_md"]
    assert "Memory-Secrets-Masked" not in r.headers


def test_the_policy_is_read_by_any_role_and_set_by_a_project_admin(
    client: FlaskClient, tokens: Tokens
) -> None:
    r = client.get(f"{PM}/secrets/policy", headers=tokens.headers("reader"))
    assert r.status_code == 200
    assert r.get_json() == {"policy": "mask", "allow_patterns": [], "allow_fingerprints": []}
    r = client.put(
        f"{PM}/secrets/policy", json={"policy": "allow"}, headers=tokens.headers("writer")
    )
    assert r.status_code == 403
    for bad in (
        {"policy": "ignore"},
        {"allow_patterns": ["("]},
        {"allow_fingerprints": ["abc"]},
        {"unknown": 1},
    ):
        r = client.put(f"{PM}/secrets/policy", json=bad, headers=tokens.headers("project_admin"))
        assert r.status_code == 422, (bad, r.data)
    # A tenant's policy is inherited by its projects; a project's own wins.
    r = client.put(
        f"{PM}/secrets/policy",
        json={"policy": "reject", "allow_patterns": ["^EXAMPLE"]},
        headers=tokens.headers("project_admin"),
    )
    assert r.get_json() == {
        "policy": "reject",
        "allow_patterns": ["^EXAMPLE"],
        "allow_fingerprints": [],
    }
    rng = random.Random(3)
    assert rng  # the order of the fields given never matters
    r = client.put(
        f"{PM}/secrets/policy", json={"policy": "mask"}, headers=tokens.headers("project_admin")
    )
    assert r.get_json()["allow_patterns"] == ["^EXAMPLE"]  # a field left out stays


def test_the_mcp_tools_mask_and_refuse_as_the_rest_api_does(
    client: FlaskClient, tokens: Tokens, planted: list[Planted]
) -> None:
    from tests.api.test_mcp import Mcp

    mcp = Mcp(client, tokens)
    secret = next(p for p in planted if p.kind == "github-token")
    everything = _text(planted)
    text = mcp.ok(
        "record_turn",
        task_id="via-mcp",
        summary_md=everything,
        meta={"note": secret.text},
    )
    assert "Masked " in text and "github-token 16" in text
    assert secret.value not in text
    h = tokens.headers("writer")
    turn = json.dumps(client.get(f"{PM}/tasks/via-mcp/turns/0", headers=h).get_json())
    assert "[secret:github-token]" in turn
    store = client.post(MS, json={"name": "notes"}, headers=h).get_json()["id"]
    mcp.ok("memory", store=store, command="create", path="/memories/a.md", file_text=everything)
    listed = client.get(f"{MS}/{store}/memories?view=full", headers=h).get_data(as_text=True)
    assert "[secret:github-token]" in listed
    for p in planted:
        assert p.value not in turn and p.value not in listed, p
    _set_policy(client, tokens, policy="reject")
    refused = mcp.err("record_turn", task_id="via-mcp", summary_md=secret.text)
    assert "github-token" in refused and secret.value not in refused
    refused = mcp.err(
        "memory", store=store, command="create", path="/memories/b.md", file_text=secret.text
    )
    assert "github-token" in refused and secret.value not in refused
    assert client.get(f"{PM}/tasks/via-mcp", headers=h).get_json()["turn_count"] == 1


def test_the_deployment_default_applies_where_no_policy_is_set(
    tmp_path: Path, planted: list[Planted]
) -> None:
    from app import create_app
    from app.config import ConfigError

    with pytest.raises(ConfigError, match="SECRETS_POLICY"):
        create_app({"STORAGE_ROOT": str(tmp_path / "x"), "SECRETS_POLICY": "ignore"})
    app = create_app(
        {
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "SECRETS_POLICY": "reject",
        }
    )
    _, secret = app.extensions["token_registry"].create(
        role="project_admin", tenant="acme", project="web"
    )
    client = app.test_client()
    h = {"Authorization": f"Bearer {secret}"}
    text = planted[0].text
    assert client.get(f"{PM}/secrets/policy", headers=h).get_json()["policy"] == "reject"
    r = client.put(f"{PM}/tasks/t/turns/0", json={"summary_md": text}, headers=h)
    assert r.status_code == 422
    client.put(f"{PM}/secrets/policy", json={"policy": "mask"}, headers=h)
    r = client.put(f"{PM}/tasks/t/turns/0", json={"summary_md": text}, headers=h)
    assert r.status_code == 200 and planted[0].value not in r.get_data(as_text=True)
    app.extensions["traffic"].close()
    app.extensions["storage"].close()


def test_an_import_masks_what_the_backup_held_unless_the_project_allows_it(
    app: Flask, client: FlaskClient, tokens: Tokens, planted: list[Planted], tmp_path: Path
) -> None:
    secret = next(p for p in planted if p.kind == "stripe-key")
    _set_policy(client, tokens, policy="allow")
    h = tokens.headers("writer")
    r = client.put(f"{PM}/tasks/kept/turns/0", json={"summary_md": secret.text}, headers=h)
    assert r.status_code == 200 and secret.value in r.get_json()["summary_md"]
    backup = tmp_path / "backup.pmx"
    runner = app.test_cli_runner()
    done = runner.invoke(args=["export", "--tenant", "acme", "--project", "web", str(backup)])
    assert done.exit_code == 0, done.output
    # Into another project whose policy is the default: masked as it is restored.
    done = runner.invoke(args=["import", "--tenant", "acme", "--project", "mobile", str(backup)])
    assert done.exit_code == 0, done.output
    assert "masked 1 secret(s)" in done.output
    other = tokens.headers("other_project")
    summary = client.get(f"{PM}/tasks/kept/turns/0", headers=other).get_json()["summary_md"]
    assert secret.value not in summary and "[secret:stripe-key]" in summary
    # Over the project that allows it: kept as it was.
    done = runner.invoke(
        args=["import", "--tenant", "acme", "--project", "web", "--overwrite", str(backup)]
    )
    assert done.exit_code == 0 and "masked" not in done.output, done.output
    assert secret.value in client.get(f"{PM}/tasks/kept/turns/0", headers=h).get_data(as_text=True)


def test_the_policy_routes_are_in_the_openapi_document_as_beyond_the_seed(
    client: FlaskClient,
) -> None:
    spec = yaml.safe_load(client.get(f"{PM}/openapi.yaml").data)
    route = spec["paths"][f"{PM}/secrets/policy"]
    assert {method: op.get("x-beyond-seed") for method, op in route.items()} == {
        "get": True,
        "put": True,
    }
