"""Error statuses a client can meet besides validation: 503, 507, 500, and never a traceback."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.names import Scope
from app.storage.tree.fs import sync
from app.storage.tree.fs.locks import locked
from app.storage.tree.fs.txn import Key
from tests.conftest import Tokens

BASE = "/sandbox/memory/v1"


def test_busy_lock_is_503_with_retry_after(app: Flask, client: FlaskClient, tokens: Tokens) -> None:
    store = app.extensions["storage"].tasks
    store.lock_timeout = 0.2
    client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": "before"}, headers=tokens.headers("writer")
    )
    with locked(store.txns.lock_path(Key(Scope("acme", "web"), "t")), timeout=1):
        resp = client.put(
            f"{BASE}/tasks/t/turns/0",
            json={"summary_md": "after"},
            headers=tokens.headers("writer"),
        )
        assert resp.status_code == 503
        assert resp.headers["Retry-After"] == "1"
        assert isinstance(resp.get_json()["detail"], str)
        # Readers never take the lock.
        assert (
            client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).status_code
            == 200
        )
    assert (
        client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).get_json()[
            "summary_md"
        ]
        == "before"
    )


def test_full_disk_is_507_and_keeps_the_old_turn(
    client: FlaskClient, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": "before"}, headers=tokens.headers("writer")
    )
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    resp = client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": "after"}, headers=tokens.headers("writer")
    )
    monkeypatch.setattr(os, "write", real_write)
    assert resp.status_code == 507
    assert resp.get_json() == {"detail": "insufficient storage: the server's disk is full"}
    assert (
        client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).get_json()[
            "summary_md"
        ]
        == "before"
    )
    assert (
        client.put(
            f"{BASE}/tasks/t/turns/0",
            json={"summary_md": "after"},
            headers=tokens.headers("writer"),
        ).status_code
        == 200
    )


@pytest.mark.parametrize("mode", ["fsync", "group"])
def test_io_error_is_500_without_internals(
    app: Flask, client: FlaskClient, tokens: Tokens, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    store = app.extensions["storage"].tasks
    store.txns.group_commit = mode == "group"
    if mode == "group" and sync._flusher_for(store.layout.root) is None:
        pytest.skip("the test's filesystem has no group commit")
    client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": "before"}, headers=tokens.headers("writer")
    )

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    # The file's fsync fails before its rename; the shared flush fails after it.
    monkeypatch.setattr(os, "fsync", broken)
    monkeypatch.setattr(sync, "_syncfs_error", broken)
    resp = client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": "after"}, headers=tokens.headers("writer")
    )
    monkeypatch.undo()
    assert resp.status_code == 500
    body = resp.get_data(as_text=True)
    assert "Traceback" not in body and str(app.config["STORAGE_ROOT"]) not in body
    # An error past the rename leaves the write visible: its outcome is unknown to the client.
    expected = "before" if mode == "fsync" else "after"
    assert (
        client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).get_json()[
            "summary_md"
        ]
        == expected
    )


def test_corrupt_record_is_500_without_its_path(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    client.put(f"{BASE}/tasks/t/turns/0", json={}, headers=tokens.headers("writer"))
    meta = Path(app.config["STORAGE_ROOT"]) / "acme" / "web" / "t" / "0000-turn" / "meta.json"
    meta.write_text('{"torn": ')
    resp = client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader"))
    assert resp.status_code == 500
    detail = resp.get_json()["detail"]
    assert "damaged" in detail and "fsck --repair" in detail
    assert str(meta.parent) not in detail and "0000-turn" not in detail


def test_symlink_planted_in_the_tree_is_never_followed(
    app: Flask, client: FlaskClient, tokens: Tokens, tmp_path: Path
) -> None:
    client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": "mine"}, headers=tokens.headers("writer")
    )
    project = Path(app.config["STORAGE_ROOT"]) / "acme" / "web"
    outside = tmp_path / "outside"
    (outside / "0000-turn").mkdir(parents=True)
    (outside / "0000-turn" / "meta.json").write_text('{"secret": "OUTSIDE"}')
    os.symlink(outside, project / "evil")
    for method, url in [
        ("GET", f"{BASE}/tasks/evil"),
        ("GET", f"{BASE}/tasks/evil/turns/0"),
        ("PUT", f"{BASE}/tasks/evil/turns/1"),
    ]:
        resp = client.open(url, method=method, json={}, headers=tokens.headers("writer"))
        assert resp.status_code == 404, (method, url, resp.status_code)
        assert b"OUTSIDE" not in resp.data
    assert sorted(p.name for p in outside.iterdir()) == ["0000-turn"]


@pytest.mark.parametrize("text", ['{"torn": ', "{}", '{"turns": 7}', "[]", None])
def test_a_removed_torn_or_hand_edited_task_index_is_answered_from_the_records_and_healed(
    app: Flask, client: FlaskClient, tokens: Tokens, text: str | None
) -> None:
    client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": "zero"}, headers=tokens.headers("writer")
    )
    index = Path(app.config["STORAGE_ROOT"]) / "acme" / "web" / "t" / "index.json"

    def damage() -> None:
        if text is None:
            index.unlink()
        else:
            index.write_text(text)

    damage()
    resp = client.get(f"{BASE}/tasks/t", headers=tokens.headers("reader"))
    assert resp.status_code == 200 and [t["turn"] for t in resp.get_json()["turns"]] == [0]
    resp = client.put(
        f"{BASE}/tasks/t/turns/1", json={"summary_md": "one"}, headers=tokens.headers("writer")
    )
    assert resp.status_code == 200
    body = client.get(f"{BASE}/tasks/t", headers=tokens.headers("reader")).get_json()
    assert [t["turn"] for t in body["turns"]] == [0, 1]
    damage()
    resp = client.delete(f"{BASE}/tasks/t", headers=tokens.headers("writer"))
    assert resp.status_code == 204
    assert client.get(f"{BASE}/tasks/t", headers=tokens.headers("reader")).status_code == 404


def test_a_record_larger_than_any_the_service_writes_is_damaged_and_never_read(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    client.put(f"{BASE}/tasks/t/turns/0", json={}, headers=tokens.headers("writer"))
    meta = Path(app.config["STORAGE_ROOT"]) / "acme" / "web" / "t" / "0000-turn" / "meta.json"
    with open(meta, "r+b") as fh:
        fh.truncate(1 << 30)  # sparse: a gibibyte no one wrote, that a read would allocate
    resp = client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader"))
    assert resp.status_code == 500 and "damaged" in resp.get_json()["detail"]


def test_an_integer_too_long_to_parse_is_named_without_python_internals(
    client: FlaskClient, tokens: Tokens
) -> None:
    body = b'{"meta": {"n": ' + b"9" * 5000 + b"}}"
    resp = client.put(
        f"{BASE}/tasks/t/turns/0",
        data=body,
        headers=tokens.headers("writer", **{"Content-Type": "application/json"}),
    )
    assert resp.status_code == 422
    (error,) = resp.get_json()["detail"]
    assert "more than 4300 digits" in error["msg"] and "sys." not in error["msg"]
