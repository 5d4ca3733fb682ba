"""Search on PostgreSQL: the generated search columns of a database upgraded from before
search, text the database cannot index as written, snippets cut from the stored text, ties
across turns and memories, redaction (the behaviour both backends share:
tests/storage/tree/test_search.py and tests/api/test_search_api.py, on every backend)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from app.storage.backends import open_backend
from app.storage.core.models import SearchHit
from app.storage.core.names import Scope
from app.storage.core.query import MARK_END, MARK_START
from app.storage.core.recovery import Plan
from app.storage.interface import StorageBackend
from app.storage.pg import schema

pytestmark = pytest.mark.all_backends
SCOPE = Scope("acme", "web")


def sql(pg_settings: dict[str, Any], statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_settings["DATABASE_URL"], autocommit=True) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description else []


def turn(pg_storage: StorageBackend, task: str, n: int, summary: str, **meta: object) -> None:
    pg_storage.tasks.put_turn(SCOPE, task, n, meta=dict(meta), summary_md=summary)


def memory(pg_storage: StorageBackend, store_id: str, path: str, content: str) -> str:
    return pg_storage.stores.create_memory(
        SCOPE, store_id, path=path, content=content, actor=None
    ).id


def where(hit: SearchHit) -> str:
    return f"{hit.task_id}/{hit.turn}" if hit.kind == "turn" else str(hit.path)


def everything(pg_storage: StorageBackend, query: str, limit: int) -> list[SearchHit]:
    out: list[SearchHit] = []
    cursor = None
    while True:
        page = pg_storage.search(SCOPE, query, limit=limit, cursor=cursor)
        out += page.hits
        cursor = page.next_cursor
        if cursor is None:
            return out


def test_an_upgraded_database_finds_the_rows_it_held_before_search(
    pg_settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every migration but the search's: the code that writes these rows needs the others.
    without_search = tuple(m for m in schema.MIGRATIONS if m[0] != 4)
    monkeypatch.setattr(schema, "MIGRATIONS", without_search)
    before = open_backend(pg_settings)
    turn(before, "fix-login", 0, "The login bug: sessions expire.", ticket="WEB-17")
    store_id = before.stores.create_store(SCOPE, name="notes").id
    memory(before, store_id, "/bugs/login.md", "Raise the session TTL.")
    before.close()
    assert sql(pg_settings, "SELECT count(*) FROM schema_migrations WHERE version = 4") == [(0,)]
    monkeypatch.undo()
    after = open_backend(pg_settings)
    try:
        lines = after.recover(Plan(clean=True, full=False)).lines()
        assert any("migration 4 applied" in line for line in lines), lines
        hits = after.search(SCOPE, "login").hits
        assert sorted(where(h) for h in hits) == ["/bugs/login.md", "fix-login/0"]
        assert [where(h) for h in after.search(SCOPE, "web 17").hits] == ["fix-login/0"]
        # Rows written after the upgrade are found the same way.
        turn(after, "later", 0, "Another login.")
        assert len(after.search(SCOPE, "login").hits) == 3
    finally:
        after.close()


def test_text_postgresql_cannot_hold_as_written_is_stored_and_found(
    pg_storage: StorageBackend,
) -> None:
    # NUL in a summary (bytea) and in meta (JSON text "\u0000", which jsonb refuses).
    turn(pg_storage, "nul", 0, "before\x00after", note="x\x00y wombat")
    assert [where(h) for h in pg_storage.search(SCOPE, "after").hits] == ["nul/0"]
    assert [where(h) for h in pg_storage.search(SCOPE, "wombat").hits] == ["nul/0"]
    # More distinct words than one tsvector may hold (1 MiB of them): the write succeeds and
    # the words of the first part of each text are found.
    meta_words = " ".join(f"m{i:06d}x" for i in range(80_000))
    summary = " ".join(f"s{i:06d}x" for i in range(80_000))
    turn(pg_storage, "huge", 0, summary, note=meta_words)
    for word in ("m000001x", "s000001x", "huge"):
        assert [where(h) for h in pg_storage.search(SCOPE, word).hits] == ["huge/0"], word


def test_snippets_come_from_the_stored_text_with_each_match_marked(
    pg_storage: StorageBackend,
) -> None:
    turn(pg_storage, "ctl", 0, f"a {MARK_START}marker{MARK_END} in the text and the word beacon")
    (hit,) = pg_storage.search(SCOPE, "beacon").hits
    assert (
        hit.snippet == f"a \ufffdmarker\ufffd in the text and the word {MARK_START}beacon{MARK_END}"
    )
    # From the meta values when the summary does not match, else the task id.
    turn(pg_storage, "quokka-task", 0, "Nothing here.", model="quokka-large")
    (hit,) = pg_storage.search(SCOPE, "large").hits
    assert hit.snippet == f"quokka-{MARK_START}large{MARK_END}"
    (hit,) = pg_storage.search(SCOPE, "task").hits
    assert hit.snippet == f"quokka-{MARK_START}task{MARK_END}"
    # A long text: a fragment of 16 words around the match, an ellipsis where it was cut.
    words = [f"word{i}" for i in range(60)]
    words[30] = "Pangolin"
    turn(pg_storage, "long", 0, " ".join(words))
    (hit,) = pg_storage.search(SCOPE, "pangolin").hits
    assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
    assert f"{MARK_START}Pangolin{MARK_END}" in hit.snippet
    assert len(hit.snippet.split()) == 16
    # Case and diacritics are folded in the marks too; the text keeps them.
    turn(pg_storage, "cafe", 0, "Le CAFÉ est fermé.")
    (hit,) = pg_storage.search(SCOPE, "café").hits
    assert hit.snippet == f"Le {MARK_START}CAFÉ{MARK_END} est fermé."


def test_a_memory_is_found_by_the_words_of_its_path_and_its_path_weighs_more(
    pg_storage: StorageBackend,
) -> None:
    store_id = pg_storage.stores.create_store(SCOPE, name="notes").id
    memory(pg_storage, store_id, "/deploy/rollback.md", "Steps to follow.")
    memory(pg_storage, store_id, "/notes.md", "How to rollback a deploy.")
    hits = pg_storage.search(SCOPE, "rollback").hits
    assert [where(h) for h in hits] == ["/deploy/rollback.md", "/notes.md"]
    assert hits[0].snippet == f"/deploy/{MARK_START}rollback{MARK_END}.md"
    assert hits[1].snippet == f"How to {MARK_START}rollback{MARK_END} a deploy."
    assert hits[0].store_name == "notes"


def test_equal_scores_across_turns_and_stores_page_in_a_stable_order(
    pg_storage: StorageBackend,
) -> None:
    for i in (3, 1, 2):
        turn(pg_storage, f"t{i}", 0, "identical words")
    stores = [pg_storage.stores.create_store(SCOPE, name=f"s{i}").id for i in range(2)]
    for store_id in reversed(stores):
        for i in range(2):
            memory(pg_storage, store_id, f"/m{i}.md", "identical words")
    whole = pg_storage.search(SCOPE, "identical", limit=100).hits
    assert len({h.score for h in whole}) <= 2  # the turns tie, and so do the memories
    want = [("turn", f"t{i}/0") for i in (1, 2, 3)]
    memories = sorted((h.memory_store_id or "", h.memory_id or "") for h in whole[3:])
    assert [(h.kind, where(h)) for h in whole[:3]] == want
    assert [(h.memory_store_id, h.memory_id) for h in whole[3:]] == memories
    for limit in (1, 2, 3):
        paged = everything(pg_storage, "identical", limit)
        assert [(h.kind, h.task_id, h.memory_id) for h in paged] == [
            (h.kind, h.task_id, h.memory_id) for h in whole
        ]


def test_old_and_redacted_versions_are_never_found(
    pg_storage: StorageBackend, pg_settings: dict[str, Any]
) -> None:
    store_id = pg_storage.stores.create_store(SCOPE, name="s").id
    memory_id = memory(pg_storage, store_id, "/k.md", "the key is armadillo")
    first = pg_storage.stores.get_memory(SCOPE, store_id, memory_id, full=True)
    pg_storage.stores.update_memory(SCOPE, store_id, memory_id, content="rotated", actor=None)
    assert pg_storage.search(SCOPE, "armadillo").hits == ()
    held = "SELECT count(*) FROM versions WHERE search @@ 'armadillo'::tsquery"
    assert sql(pg_settings, held) == [(1,)]  # the old version, which no memory names
    pg_storage.stores.redact_version(SCOPE, store_id, first.memory_version_id, actor=None)
    assert sql(pg_settings, held) == [(0,)]  # its words went with its content
    assert pg_storage.search(SCOPE, "armadillo").hits == ()
    assert [where(h) for h in pg_storage.search(SCOPE, "rotated").hits] == ["/k.md"]
