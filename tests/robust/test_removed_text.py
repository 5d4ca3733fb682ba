"""Removed text leaves every file under the root, also when a reader holds an old snapshot of
an index across the removal: a task delete, a turn delete, an artifact delete and a version
redaction, then a grep of every file (records, derived files, the listing and the store
index with their WALs, project.md).

A reader that holds a snapshot stops SQLite's TRUNCATE checkpoint, so the page images with the
removed text stay in the WAL while it reads; the purge stays pending and the next write to
the project, the sweeper, or fsck --repair finishes it once the reader let go. fsck reports
the removed text still on disk meanwhile.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import Tokens
from tests.storage._helpers import embedded_now, vectors_of

pytestmark = pytest.mark.tree_only("greps the tree's files")

PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"
SECRET = "Qqzxremovedsecretdelta"
NOW = "2026-01-01T00:00:00Z"  # the fixed clock's (tests/conftest.py): nothing has expired


def holds(path: Path, word: str) -> bool:
    """Whether the file holds ``word`` as written or as FTS5 keeps it (lower case, maybe only
    its tail after a prefix shared with the term before it)."""
    data = path.read_bytes()
    return any(w.encode() in data for w in (word, word.lower(), word.lower()[-10:]))


def files_with(root: Path, word: str) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and holds(p, word)
    )


@pytest.fixture
def app_overrides() -> dict[str, Any]:
    # The server's default: vectors beside the text, which must leave the files with it.
    return {"EMBEDDER": "bundled"}


def files_with_bytes(root: Path, blobs: list[bytes]) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and any(b in p.read_bytes() for b in blobs)
    )


@pytest.fixture
def root(app: Flask) -> Path:
    return Path(app.config["STORAGE_ROOT"])


class HeldReader:
    """A reader of one SQLite database that holds its snapshot until closed."""

    def __init__(self, path: Path) -> None:
        assert path.exists(), path
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("BEGIN")
        self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()

    def close(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()


@pytest.fixture
def held() -> Iterator[Callable[[Path], HeldReader]]:
    readers: list[HeldReader] = []

    def hold(path: Path) -> HeldReader:
        readers.append(HeldReader(path))
        return readers[-1]

    yield hold
    for reader in readers:
        with contextlib.suppress(sqlite3.ProgrammingError):  # closed by the test
            reader.close()


def write(client: FlaskClient, tokens: Tokens, task: str, turn: int, summary: str) -> None:
    r = client.put(
        f"{PM}/tasks/{task}/turns/{turn}",
        json={"meta": {"note": summary}, "summary_md": summary},
        headers=tokens.headers("writer"),
    )
    assert r.status_code == 200, r.json


def project_with_a_leak(client: FlaskClient, tokens: Tokens) -> None:
    for i in range(20):
        write(client, tokens, f"keep-{i}", 0, f"ordinary summary {i}")
    write(client, tokens, "leak", 0, "an earlier turn")
    write(client, tokens, "leak", 1, f"the key is {SECRET}")
    r = client.put(
        f"{PM}/tasks/leak/turns/1/artifacts/env.txt",
        data=f"TOKEN={SECRET}".encode(),
        headers=tokens.headers("writer", **{"Content-Type": "text/plain"}),
    )
    assert r.status_code == 200
    # project.md's base file now holds the leaked section too.
    assert SECRET in client.get(f"{PM}/project.md", headers=tokens.headers("reader")).get_data(
        as_text=True
    )


REMOVALS: dict[str, Callable[[FlaskClient, Tokens], Any]] = {
    "task": lambda c, t: c.delete(f"{PM}/tasks/leak", headers=t.headers("writer")),
    "turn": lambda c, t: c.delete(f"{PM}/tasks/leak/turns/1", headers=t.headers("writer")),
}


def fsck_output(app: Flask, *args: str) -> tuple[int, str]:
    result = app.test_cli_runner().invoke(args=["fsck", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("removal", sorted(REMOVALS))
@pytest.mark.parametrize("then", ["next write", "sweep", "fsck --repair"])
def test_text_removed_under_a_held_reader_leaves_every_file_afterwards(
    app: Flask,
    client: FlaskClient,
    tokens: Tokens,
    root: Path,
    held: Callable[[Path], HeldReader],
    removal: str,
    then: str,
) -> None:
    project_with_a_leak(client, tokens)
    assert files_with(root, SECRET)  # the grep below can fail
    listing = root / "acme" / "web" / "_listing.sqlite3"
    embedded_now(app.extensions["storage"])
    leaked = vectors_of(listing, "d.task_id = 'leak' AND d.turn = 1")
    assert files_with_bytes(root, leaked)
    reader = held(listing)
    r = REMOVALS[removal](client, tokens)
    assert r.status_code == 204, r.json
    embedded_now(app.extensions["storage"])
    # The answers never show it, at once.
    found = client.get(
        f"{PM}/search",
        headers=tokens.headers("reader"),
        query_string={"q": SECRET, "mode": "keyword"},
    )
    assert found.json["hits"] == []
    # Nor by its vectors: every other turn may be near, the removed one is not there.
    found = client.get(f"{PM}/search", headers=tokens.headers("reader"), query_string={"q": SECRET})
    assert found.json["modes"] == ["keyword", "semantic"]
    assert [h for h in found.json["hits"] if (h["task_id"], h["turn"]) == ("leak", 1)] == []
    assert SECRET not in client.get(f"{PM}/project.md", headers=tokens.headers("reader")).get_data(
        as_text=True
    )
    # While the reader holds its snapshot, the WAL may keep it, and fsck says so.
    if files_with(root, SECRET):
        code, out = fsck_output(app)
        assert code == 1 and "removed text" in out, out
    reader.close()
    if then == "next write":
        write(client, tokens, "later", 0, "an unrelated write")
        embedded_now(app.extensions["storage"])
    elif then == "sweep":
        result = app.test_cli_runner().invoke(args=["sweep", "--now", NOW])
        assert result.exit_code == 0, result.output
    else:
        code, out = fsck_output(app, "--repair")
        assert code in (0, 1), out
    assert files_with(root, SECRET) == []
    assert files_with_bytes(root, leaked) == []  # its vectors, WAL included
    code, out = fsck_output(app)
    assert code == 0, out


def test_an_artifact_delete_leaves_no_copy_of_its_bytes(
    app: Flask, client: FlaskClient, tokens: Tokens, root: Path
) -> None:
    project_with_a_leak(client, tokens)
    # Replace the artifact once: the kept previous copy must not outlive the delete either.
    r = client.put(
        f"{PM}/tasks/leak/turns/1/artifacts/env.txt",
        data=f"TOKEN={SECRET} v2".encode(),
        headers=tokens.headers("writer", **{"Content-Type": "text/plain"}),
    )
    assert r.status_code == 200
    write(client, tokens, "leak", 1, "the summary no longer holds it")
    app.test_cli_runner().invoke(args=["sweep", "--now", NOW])
    assert files_with(root, SECRET) == ["acme/web/leak/0001-turn/artifacts/env.txt"]
    r = client.delete(
        f"{PM}/tasks/leak/turns/1/artifacts/env.txt", headers=tokens.headers("writer")
    )
    assert r.status_code == 204
    embedded_now(app.extensions["storage"])
    assert files_with(root, SECRET) == []


def test_a_redaction_under_a_held_reader_leaves_the_store_index_afterwards(
    app: Flask,
    client: FlaskClient,
    tokens: Tokens,
    root: Path,
    held: Callable[[Path], HeldReader],
) -> None:
    h = tokens.headers("project_admin")
    store = client.post(MS, headers=h, json={"name": "s"}).json["id"]
    for i in range(10):
        client.post(f"{MS}/{store}/memories", headers=h, json={"path": f"/n{i}.md", "content": "x"})
    memory = client.post(
        f"{MS}/{store}/memories", headers=h, json={"path": "/k.md", "content": f"key {SECRET}"}
    ).json
    old_version = memory["memory_version_id"]
    embedded_now(app.extensions["storage"])
    index = next(root.rglob("index.sqlite3"))
    leaked = vectors_of(index, f"d.memory_id = '{memory['id']}'")
    r = client.post(f"{MS}/{store}/memories/{memory['id']}", headers=h, json={"content": "gone"})
    assert r.status_code == 200, r.json
    index = next(root.rglob("index.sqlite3"))
    reader = held(index)
    r = client.post(f"{MS}/{store}/memory_versions/{old_version}/redact", headers=h, json={})
    assert r.status_code == 200, r.json
    embedded_now(app.extensions["storage"])
    if files_with(root, SECRET):
        code, out = fsck_output(app)
        assert code == 1 and "removed text" in out, out
    reader.close()
    client.post(f"{MS}/{store}/memories", headers=h, json={"path": "/z.md", "content": "next"})
    embedded_now(app.extensions["storage"])
    assert files_with(root, SECRET) == []
    assert files_with_bytes(root, leaked) == []
