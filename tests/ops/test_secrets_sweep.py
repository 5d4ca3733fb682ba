"""`flask --app wsgi secrets scan|purge`: the secrets stored before a project masked them
(written under `allow`), found in old turns, text artifacts, store descriptions and old
memory versions, reported without their values, then masked in place: afterwards no byte of
them is left in any file under the root (or any row and object on PostgreSQL), and the rest
of every record reads as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.api.test_secrets_writes import _pg_bytes, _root_bytes
from tests.conftest import Tokens
from tests.secrets_corpus import Planted, corpus

pytestmark = pytest.mark.all_backends

PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"


def _cli(app: Flask, *args: str) -> tuple[int, list[dict[str, Any]]]:
    result = app.test_cli_runner().invoke(args=["secrets", *args])
    lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    return result.exit_code, lines


def _ok(r: Any) -> bool:
    assert r.status_code == 200, r.get_data(as_text=True)
    return True


def _plant(client: FlaskClient, tokens: Tokens, secrets: list[Planted]) -> dict[str, str]:
    """Secrets stored as given (policy allow) in every kind of record; the ids made."""
    admin, h = tokens.headers("project_admin"), tokens.headers("writer")
    assert _ok(client.put(f"{PM}/secrets/policy", json={"policy": "allow"}, headers=admin))
    a, b, c, d = secrets[:4]
    assert _ok(
        client.put(
            f"{PM}/tasks/old/turns/0",
            json={"meta": {"note": f"env {a.text}"}, "summary_md": f"Deployed. {b.text} Done."},
            headers=h,
        )
    )
    assert _ok(
        client.put(
            f"{PM}/tasks/old/turns/0/artifacts/log.txt",
            data=f"line one\n{c.text}\nline three\n".encode(),
            headers={**h, "Content-Type": "text/plain"},
        )
    )
    assert _ok(
        client.put(
            f"{PM}/tasks/old/turns/0/artifacts/image.png",
            data=b"\x89PNG\r\n\x1a\n\x00\x00binary",
            headers={**h, "Content-Type": "image/png"},
        )
    )
    assert _ok(
        client.put(f"{PM}/tasks/clean/turns/0", json={"summary_md": "nothing here"}, headers=h)
    )
    store = client.post(MS, json={"name": "notes", "description": f"keys: {d.text}"}, headers=h)
    store_id = store.get_json()["id"]
    memory = client.post(
        f"{MS}/{store_id}/memories", json={"path": "/m.md", "content": f"v1 {a.text}"}, headers=h
    ).get_json()
    # The secret stays in the old version; the head holds another.
    assert _ok(
        client.post(
            f"{MS}/{store_id}/memories/{memory['id']}", json={"content": f"v2 {b.text}"}, headers=h
        )
    )
    assert _ok(client.put(f"{PM}/secrets/policy", json={"policy": "mask"}, headers=admin))
    return {"store": store_id, "memory": memory["id"]}


def test_scan_finds_and_purge_masks_what_is_stored(
    app: Flask, client: FlaskClient, tokens: Tokens, backend_kind: str, tmp_path: Path
) -> None:
    picked: dict[str, Planted] = {}
    for item in corpus(seed=21, per_kind=1):
        picked.setdefault(item.kind, item)
    secrets = [picked[k] for k in ("github-token", "aws-access-key", "jwt", "slack-token")]
    ids = _plant(client, tokens, secrets)
    stored = _root_bytes(app) if backend_kind == "tree" else _pg_bytes(app)
    missing = [s.kind for s in secrets if s.value.encode() not in stored]
    assert not missing, missing  # the scan below has work to do

    code, lines = _cli(app, "scan", "--tenant", "acme", "--project", "web")
    assert code == 0, lines
    *findings, summary = lines
    assert summary["summary"]["found"] == len(findings) >= 6
    assert summary["summary"]["purged"] == 0
    places = {f["where"].split(" ", 1)[1] for f in findings}
    assert "task old turn 0 summary_md" in places and "task old turn 0 meta.note" in places
    assert "task old turn 0 artifact log.txt" in places
    assert any("version" in p and p.endswith("content") for p in places)
    assert any(p.endswith("description") for p in places)
    text = json.dumps(lines)
    assert not any(s.value in text for s in secrets)

    state = tmp_path / "purge-state.json"
    code, lines = _cli(app, "purge", "--tenant", "acme", "--project", "web", "--state", str(state))
    assert code == 0, lines
    assert lines[-1]["summary"]["purged"] >= 4 and lines[-1]["summary"]["skipped"] == []
    stored = _root_bytes(app) if backend_kind == "tree" else _pg_bytes(app)
    for s in secrets:
        assert s.value.encode() not in stored, s
    # Every other byte of the records reads as before.
    h = tokens.headers("writer")
    turn = client.get(f"{PM}/tasks/old/turns/0", headers=h).get_json()
    assert turn["summary_md"].startswith("Deployed. ") and turn["summary_md"].endswith(" Done.")
    assert "[secret:" in turn["summary_md"] and turn["meta"]["note"].startswith("env ")
    log = client.get(f"{PM}/tasks/old/turns/0/artifacts/log.txt", headers=h).get_data(as_text=True)
    assert log.startswith("line one\n[secret:") and log.endswith("\nline three\n")
    png = client.get(f"{PM}/tasks/old/turns/0/artifacts/image.png", headers=h).data
    assert png == b"\x89PNG\r\n\x1a\n\x00\x00binary"
    assert client.get(f"{PM}/tasks/clean/turns/0", headers=h).get_json()["summary_md"] == (
        "nothing here"
    )
    memory = client.get(f"{MS}/{ids['store']}/memories/{ids['memory']}", headers=h).get_json()
    assert memory["content"].startswith("v2 [secret:")
    # Run again, it finds nothing left; the state file makes a finished run a no-op.
    code, lines = _cli(app, "scan", "--tenant", "acme", "--project", "web")
    assert code == 0 and lines[-1]["summary"]["found"] == 0
    code, lines = _cli(app, "purge", "--tenant", "acme", "--project", "web", "--state", str(state))
    assert code == 0 and lines[-1]["summary"]["turns"] == 0
