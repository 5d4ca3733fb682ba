"""Full-text search over a project's turns and memories (StorageBackend.search): ranking,
snippets, paging, scope, liveness on every backend; on the tree, the text of deleted and
expired turns and memories leaving the database files, and fsck of its indexes."""

from __future__ import annotations

import io
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.storage.backends import open_backend
from app.storage.core.errors import InvalidName
from app.storage.core.models import SearchHit
from app.storage.core.names import Scope
from app.storage.core.query import MARK_END, MARK_START
from app.storage.interface import StorageBackend
from app.storage.tree.backend import TreeStorage
from app.storage.tree.fsck import fsck
from app.storage.tree.search import TreeSearch
from app.storage.tree.sqlite.store_index import StoreIndex
from tests.conftest import FixedClock
from tests.storage._embedders import HashEmbedder
from tests.storage._helpers import embedded_now, open_fds, upkeep_done, vectors_of

pytestmark = pytest.mark.all_backends
SCOPE = Scope("acme", "web")
# Words no other text here contains, so a byte search of a file finds exactly them.
SECRET = "Qqzxsecretwordalpha"
MEMORY_SECRET = "Qqzxmemorysecretbeta"


@pytest.fixture
def storage(
    backend_kind: str, backend_settings: dict[str, Any], tmp_path: Path, clock: FixedClock
) -> Iterator[Any]:
    """The backend under test (the tree's tests below read its files: typed TreeStorage)."""
    if backend_kind == "tree":
        yield TreeStorage(tmp_path / "root", clock=clock, lock_timeout=5.0)
        return
    backend = open_backend(backend_settings)
    yield backend
    backend.close()


@pytest.fixture
def embedded(tmp_path: Path, clock: FixedClock) -> TreeStorage:
    """A tree with an embedder: its vectors must leave the files with the text."""
    return TreeStorage(tmp_path / "root", clock=clock, lock_timeout=5.0, embedder=HashEmbedder())


def root_holds(storage: TreeStorage, blobs: list[bytes]) -> bool:
    files = [p for p in storage.layout.root.rglob("*") if p.is_file()]
    return any(blob in p.read_bytes() for p in files for blob in blobs)


def turn(
    storage: StorageBackend, task: str, n: int, summary: str, scope: Scope = SCOPE, **meta: object
) -> None:
    storage.tasks.put_turn(scope, task, n, meta=dict(meta), summary_md=summary, actor="tok")


def store_with(storage: StorageBackend, scope: Scope, name: str, memories: dict[str, str]) -> str:
    store_id = storage.stores.create_store(scope, name=name).id
    for path, content in memories.items():
        storage.stores.create_memory(scope, store_id, path=path, content=content, actor=None)
    return store_id


def found(storage: StorageBackend, query: str, scope: Scope = SCOPE) -> list[tuple[str, str]]:
    """(kind, where) of every hit, best first, all pages."""
    out, cursor = [], None
    while True:
        page = storage.search(scope, query, limit=3, cursor=cursor, mode="keyword")
        out += [where(h) for h in page.hits]
        cursor = page.next_cursor
        if cursor is None:
            return out


def where(hit: SearchHit) -> tuple[str, str]:
    return (hit.kind, f"{hit.task_id}/{hit.turn}" if hit.kind == "turn" else str(hit.path))


def marked(snippet: str) -> list[str]:
    """The marked words of a snippet."""
    return [part.split(MARK_END)[0] for part in snippet.split(MARK_START)[1:]]


# -- ranking, snippets, paging ----------------------------------------------------------------
def test_hits_are_ranked_by_bm25_and_the_matched_words_are_marked(storage: StorageBackend) -> None:
    turn(storage, "fix-login", 0, "The login bug: login fails after 30 minutes. Login again.")
    turn(storage, "upload", 0, "Streaming the upload body. The login page was not touched.")
    for i in range(6):
        turn(storage, f"noise-{i}", 0, f"Unrelated refactoring of module {i}.")
    page = storage.search(SCOPE, "login")
    assert [where(h) for h in page.hits] == [("turn", "fix-login/0"), ("turn", "upload/0")]
    first, second = page.hits
    assert first.score > second.score > 0
    assert marked(first.snippet) and {w.lower() for w in marked(first.snippet)} == {"login"}
    assert MARK_START not in first.snippet.split(MARK_END)[-1]  # balanced markers
    # A phrase marks the whole phrase, a prefix the words it matched.
    (hit,) = storage.search(SCOPE, '"login page"').hits
    assert marked(hit.snippet) == ["login page"]
    assert {w.lower() for w in marked(storage.search(SCOPE, "stream*").hits[0].snippet)} == {
        "streaming"
    }


def test_meta_values_and_the_task_id_are_searched(storage: StorageBackend) -> None:
    turn(storage, "fix-login", 0, "Done.", model="claude-opus", ticket="WEB-17", tokens={"n": 1234})
    turn(storage, "other", 0, "Nothing about it.", model="haiku")
    assert found(storage, "WEB-17") == [("turn", "fix-login/0")]
    assert found(storage, "1234") == [("turn", "fix-login/0")]
    assert found(storage, "fix-login") == [("turn", "fix-login/0")]
    assert found(storage, "ticket") == []  # meta keys are not text


def test_a_memory_of_a_small_store_ranks_with_the_turns(storage: StorageBackend) -> None:
    """bm25 inside a three-memory store gives a word almost no weight; scaled to the project's
    frequencies, a memory about the query ranks by what it says, not by its store's size."""
    for i in range(30):
        turn(storage, f"t{i}", 0, f"Routine work on part {i}.")
    turn(storage, "weak", 0, "A long summary of many things. " * 20 + "It touched the session ttl.")
    store_with(
        storage,
        SCOPE,
        "Team prefs",
        {"/bugs/login.md": "Session TTL: 30 minutes.", "/a.md": "x", "/b.md": "y"},
    )
    hits = storage.search(SCOPE, "ttl").hits
    assert [where(h) for h in hits] == [("memory", "/bugs/login.md"), ("turn", "weak/0")]
    memory = hits[0]
    assert memory.store_name == "Team prefs" and memory.memory_id and memory.memory_store_id
    assert marked(memory.snippet) == ["TTL"]


def test_pages_follow_the_cursor_without_repeats_or_gaps(storage: StorageBackend) -> None:
    for i in range(7):
        turn(storage, f"task-{i}", 0, "deploy " * (i + 1) + "done")
    store_with(storage, SCOPE, "Ops", {f"/m{i}.md": "deploy " * (i + 1) for i in range(4)})
    everything = [where(h) for h in storage.search(SCOPE, "deploy", limit=100).hits]
    assert len(everything) == 11 and len(set(everything)) == 11
    assert found(storage, "deploy") == everything  # three a page, in the same order
    page = storage.search(SCOPE, "deploy", limit=3)
    # A cursor continues only the search it came from.
    for other_query, other_scope in (("deploy done", SCOPE), ("deploy", Scope("acme", "mobile"))):
        with pytest.raises(InvalidName) as exc:
            storage.search(other_scope, other_query, cursor=page.next_cursor)
        assert exc.value.field == "cursor"
    task_cursor = storage.tasks.list_tasks(SCOPE, limit=1).next_cursor
    with pytest.raises(InvalidName):
        storage.search(SCOPE, "deploy", cursor=task_cursor)
    with pytest.raises(InvalidName):
        storage.tasks.list_tasks(SCOPE, cursor=page.next_cursor)


def test_equal_scores_page_in_a_stable_order(storage: StorageBackend) -> None:
    for i in range(9):
        turn(storage, f"same-{i}", 0, "identical text")
    hits = found(storage, "identical")
    assert sorted(hits) == sorted(("turn", f"same-{i}/0") for i in range(9))
    assert len(set(hits)) == 9


@pytest.mark.tree_only("TreeSearch bounds the stores it opens")
def test_more_stores_than_a_search_covers_are_counted(storage: TreeStorage) -> None:
    ids = [store_with(storage, SCOPE, f"s{i}", {"/n.md": "needle"}) for i in range(4)]
    page = TreeSearch(storage.tasks, storage.stores, max_stores=3).search(SCOPE, "needle")
    assert (page.stores_searched, page.stores_skipped) == (3, 1)
    assert {h.memory_store_id for h in page.hits} == set(ids[1:])  # the newest three


# -- query syntax -----------------------------------------------------------------------------
@pytest.mark.shared_rule
@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("", "no word"),
        ("   ", "no word"),
        ("- & !", "no word"),
        ('"session ttl', "none that ends it"),
        ('"session"x', "needs a space"),
        ('ses"sion', "only start or end a phrase"),
        ('"ttl"*', "not a quoted phrase"),
        ("*login", "may only end a word"),
        ("lo*gin", "may only end a word"),
        ("l*", "at least 2"),
        ("login OR bug", "OR is not an operator"),
        ("NOT bug", "NOT is not an operator"),
        ("a NEAR b", "NEAR is not an operator"),
        ("login AND bug", "AND is not an operator"),
        ('""', "without any word"),
        ("x" * 257, "longer than 256"),
        ("login\x00", "control characters"),
        (" ".join(["w"] * 17), "more than 16"),
    ],
)
def test_queries_outside_the_syntax_are_refused_with_a_reason(
    storage: StorageBackend, query: str, says: str
) -> None:
    with pytest.raises(InvalidName) as exc:
        storage.search(SCOPE, query)
    assert exc.value.field == "q"
    assert says in exc.value.message


@pytest.mark.parametrize(
    "query",
    [
        "summary:login",
        "task_id:fix",
        "(login)",
        "login^",
        "{summary}: login",
        "+login",
        "or not near and",
        '"OR"',
        "-login",
        "'login'",
        "login;DROP TABLE turns",
        "café",
        "x" * 256,
    ],
)
def test_fts5_syntax_in_a_query_is_searched_as_text_never_an_error(
    storage: StorageBackend, query: str
) -> None:
    turn(storage, "t", 0, "summary: login. Cafe. or not near and")
    page = storage.search(SCOPE, query)  # never an sqlite3 error
    assert all(h.kind == "turn" for h in page.hits)


def test_words_match_without_case_or_diacritics(storage: StorageBackend) -> None:
    turn(storage, "t", 0, "Le Café est fermé.")
    assert found(storage, "cafe") == found(storage, "CAFÉ") == [("turn", "t/0")]
    assert found(storage, '"cafe est"') == [("turn", "t/0")]
    assert found(storage, '"est cafe"') == []


def test_every_word_must_match(storage: StorageBackend) -> None:
    turn(storage, "a", 0, "login bug")
    turn(storage, "b", 0, "login only")
    assert found(storage, "login bug") == [("turn", "a/0")]
    assert sorted(found(storage, "login")) == [("turn", "a/0"), ("turn", "b/0")]


def test_any_term_finds_a_text_with_one_word_and_ranks_more_words_higher(
    storage: StorageBackend,
) -> None:
    """A recall's search (any_term): one term is enough, a text with more of them ranks
    higher, in turns and memories alike; a term no text has does not stop the others."""
    turn(storage, "both", 0, "The deploy key rotates weekly.")
    turn(storage, "one", 0, "The deploy pipeline is green.")
    turn(storage, "none", 0, "Nothing relevant.")
    for i in range(5):
        turn(storage, f"noise-{i}", 0, f"Unrelated refactoring of module {i}.")
    store_with(storage, SCOPE, "Ops", {"/keys.md": "Rotat* of every key, weekly.", "/x.md": "x"})
    page = storage.search(SCOPE, "deploy key rotat* zzabsentword", any_term=True)
    hits = [where(h) for h in page.hits]
    assert hits[0] == ("turn", "both/0") and set(hits) == {
        ("turn", "both/0"),
        ("turn", "one/0"),
        ("memory", "/keys.md"),
    }
    assert [h.score for h in page.hits] == sorted((h.score for h in page.hits), reverse=True)
    assert hits.index(("memory", "/keys.md")) < hits.index(("turn", "one/0"))  # 2 words, 1
    assert {w.lower() for w in marked(page.hits[0].snippet)} == {"deploy", "key", "rotates"}
    # The same query needing every term finds nothing; with no term found, nothing either.
    assert storage.search(SCOPE, "deploy key rotat* zzabsentword").hits == ()
    assert storage.search(SCOPE, "zzabsentword qqnothing", any_term=True).hits == ()


def test_any_term_pages_follow_their_own_cursor(storage: StorageBackend) -> None:
    for i in range(6):
        turn(storage, f"task-{i}", 0, "alpha " * (i + 1) + ("beta" if i % 2 else "done"))
    store_with(storage, SCOPE, "Ops", {f"/m{i}.md": "beta " * (i + 1) for i in range(3)})
    everything = [
        where(h) for h in storage.search(SCOPE, "alpha beta", limit=100, any_term=True).hits
    ]
    assert len(everything) == len(set(everything)) == 9
    out, cursor = [], None
    while True:
        page = storage.search(SCOPE, "alpha beta", limit=2, cursor=cursor, any_term=True)
        out += [where(h) for h in page.hits]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert out == everything
    # An OR search's cursor does not continue the AND search of the same words, nor back.
    first = storage.search(SCOPE, "alpha beta", limit=1, any_term=True).next_cursor
    with pytest.raises(InvalidName):
        storage.search(SCOPE, "alpha beta", cursor=first)
    both = storage.search(SCOPE, "alpha beta", limit=1).next_cursor
    with pytest.raises(InvalidName):
        storage.search(SCOPE, "alpha beta", cursor=both, any_term=True)


def test_limit_outside_1_to_100_is_refused(storage: StorageBackend) -> None:
    for limit in (0, 101, True):
        with pytest.raises(InvalidName) as exc:
            storage.search(SCOPE, "x", limit=limit)
        assert exc.value.field == "limit"


# -- scope -------------------------------------------------------------------------------------
def test_another_projects_or_tenants_text_is_never_found(storage: StorageBackend) -> None:
    mobile, other = Scope("acme", "mobile"), Scope("globex", "web")
    turn(storage, "mine", 0, "zebra in web")
    for scope in (mobile, other):
        turn(storage, "theirs", 0, f"zebra in {scope.tenant}/{scope.project}", scope=scope)
        store_with(storage, scope, "theirs", {"/z.md": "zebra of theirs"})
    assert found(storage, "zebra") == [("turn", "mine/0")]
    assert sorted(found(storage, "zebra", mobile)) == [("memory", "/z.md"), ("turn", "theirs/0")]
    assert storage.search(Scope("acme", "empty"), "zebra").hits == ()


# -- only live text ----------------------------------------------------------------------------
def test_deleted_replaced_and_expired_text_is_not_found(
    storage: StorageBackend, clock: FixedClock
) -> None:
    turn(storage, "old", 0, "walrus")
    clock.advance(days=20)
    turn(storage, "old", 1, "later turn")
    turn(storage, "gone", 0, "walrus")
    turn(storage, "changed", 0, "walrus")
    store_id = store_with(storage, SCOPE, "s", {"/w.md": "walrus", "/d.md": "walrus"})
    assert len(found(storage, "walrus")) == 5
    storage.tasks.delete_task(SCOPE, "gone")
    turn(storage, "changed", 0, "seal")
    page = storage.stores.list_memories(SCOPE, store_id)
    ids = {m.path: m.id for m in page.data}
    storage.stores.delete_memory(SCOPE, store_id, ids["/d.md"], actor=None)
    storage.stores.update_memory(SCOPE, store_id, ids["/w.md"], content="otter", actor=None)
    assert sorted(found(storage, "walrus")) == [("turn", "old/0")]
    assert found(storage, "seal") == [("turn", "changed/0")]
    assert found(storage, "otter") == [("memory", "/w.md")]
    storage.stores.update_memory(SCOPE, store_id, ids["/w.md"], path="/renamed.md", actor=None)
    assert found(storage, "renamed") == [("memory", "/renamed.md")]
    assert found(storage, "w") == []
    clock.advance(days=11)  # turn 0 of "old" is past its 30 days, not swept yet
    assert found(storage, "walrus") == []
    assert found(storage, "later") == [("turn", "old/1")]


def test_an_archived_stores_memories_are_found_a_deleted_stores_are_not(
    storage: StorageBackend,
) -> None:
    archived = store_with(storage, SCOPE, "old", {"/a.md": "heron"})
    deleted = store_with(storage, SCOPE, "gone", {"/d.md": "heron"})
    storage.stores.archive_store(SCOPE, archived)
    storage.stores.delete_store(SCOPE, deleted)
    page = storage.search(SCOPE, "heron")
    assert [where(h) for h in page.hits] == [("memory", "/a.md")]
    assert (page.stores_searched, page.stores_skipped) == (1, 0)


# -- removed text leaves the files ---------------------------------------------------------------
def db_bytes(db: Path) -> bytes:
    """The database file and its WAL (and shared-memory index), as they are on disk."""
    return b"".join(
        p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists()
    )


def holds(data: bytes, word: str) -> bool:
    """Whether ``data`` holds ``word`` as written or as FTS5 stores it (lower case, maybe
    after a prefix shared with the term before it: its tail is searched too)."""
    return any(w.encode() in data for w in (word, word.lower(), word.lower()[-10:]))


@pytest.mark.tree_only("reads the listing's bytes")
def test_a_deleted_tasks_text_leaves_the_listing_file_and_its_wal(
    embedded: TreeStorage,
) -> None:
    storage = embedded
    for i in range(30):
        turn(storage, f"keep-{i}", 0, f"Ordinary summary number {i} about the upload.")
    turn(storage, "leak", 0, f"The token is {SECRET} do not keep.", note=SECRET)
    embedded_now(storage)
    listing = storage.tasks.layout.listing(SCOPE)
    assert holds(db_bytes(listing), SECRET)  # the check below can fail
    leaked = vectors_of(listing, "d.task_id = 'leak'")
    assert root_holds(storage, leaked)
    storage.tasks.delete_task(SCOPE, "leak")
    assert not found(storage, SECRET)  # at once
    upkeep_done(storage.tasks)  # the file's purge runs right after the answer
    assert not holds(db_bytes(listing), SECRET)
    assert found(storage, "ordinary") and not found(storage, SECRET)
    assert not any(
        holds(p.read_bytes(), SECRET) for p in storage.layout.root.rglob("*") if p.is_file()
    )
    assert not root_holds(storage, leaked)  # its vectors, WAL included


@pytest.mark.tree_only("reads the listing's bytes")
def test_a_deleted_turns_and_artifacts_vectors_leave_the_files(embedded: TreeStorage) -> None:
    storage = embedded
    for i in range(10):
        turn(storage, f"keep-{i}", 0, f"Ordinary summary number {i}.")
    turn(storage, "t", 0, "The turn that stays.")
    turn(storage, "t", 1, f"The token is {SECRET}.")
    embedded_now(storage)
    listing = storage.tasks.layout.listing(SCOPE)
    leaked = vectors_of(listing, "d.task_id = 't' AND d.turn = 1")
    kept = vectors_of(listing, "d.task_id = 't' AND d.turn = 0")
    storage.tasks.delete_turn(SCOPE, "t", 1)
    upkeep_done(storage.tasks)
    assert not root_holds(storage, leaked) and root_holds(storage, kept)
    # An artifact's delete rewrites its turn, whose text (and vectors) stay as they were.
    storage.tasks.put_artifact(
        SCOPE, "t", 0, "env.txt", io.BytesIO(b"TOKEN=x"), content_type="text/plain"
    )
    storage.tasks.delete_artifact(SCOPE, "t", 0, "env.txt")
    embedded_now(storage)
    assert root_holds(storage, kept) and not root_holds(storage, leaked)


@pytest.mark.tree_only("reads the listing's bytes")
def test_an_expired_turns_text_leaves_the_files_at_the_sweep(
    embedded: TreeStorage, clock: FixedClock
) -> None:
    storage = embedded
    turn(storage, "t", 0, f"First turn with {SECRET}.")
    embedded_now(storage)
    listing = storage.tasks.layout.listing(SCOPE)
    leaked = vectors_of(listing, "d.task_id = 't' AND d.turn = 0")
    clock.advance(days=20)
    for i in range(10):
        turn(storage, f"other-{i}", 0, "Other text.")
    turn(storage, "t", 1, "Second turn, still live.")
    clock.advance(days=11)
    assert found(storage, SECRET) == [] and holds(db_bytes(listing), SECRET)
    assert root_holds(storage, leaked)
    report = storage.sweep(now=clock())
    assert report.tasks.turns == 1 and not report.errors
    embedded_now(storage)
    assert not holds(db_bytes(listing), SECRET)
    assert not any(
        holds(p.read_bytes(), SECRET) for p in storage.layout.root.rglob("*") if p.is_file()
    )
    assert not root_holds(storage, leaked)
    assert found(storage, "second") == [("turn", "t/1")]


@pytest.mark.tree_only("reads the listing's bytes")
def test_a_replaced_summary_leaves_the_listing_file_at_the_next_sweep(
    embedded: TreeStorage, clock: FixedClock
) -> None:
    storage = embedded
    turn(storage, "t", 0, f"Draft with {SECRET}.")
    embedded_now(storage)
    listing = storage.tasks.layout.listing(SCOPE)
    leaked = vectors_of(listing, "d.task_id = 't'")
    turn(storage, "t", 0, "Final text.")
    assert found(storage, SECRET) == []
    storage.sweep(now=clock())
    embedded_now(storage)
    assert not holds(db_bytes(listing), SECRET)
    assert not root_holds(storage, leaked)


@pytest.mark.tree_only("reads the store index's bytes")
def test_a_deleted_memorys_text_leaves_the_store_index_and_redaction_the_store(
    embedded: TreeStorage, clock: FixedClock
) -> None:
    storage = embedded
    store_id = store_with(storage, SCOPE, "s", {f"/n{i}.md": f"note {i}" for i in range(20)})
    memory = storage.stores.create_memory(
        SCOPE, store_id, path="/secret.md", content=f"key {MEMORY_SECRET}", actor=None
    )
    embedded_now(storage)
    store_dir = storage.stores.layout.store_dir(SCOPE, store_id)
    index = storage.stores.layout.store_index(store_dir)
    assert holds(db_bytes(index), MEMORY_SECRET)
    leaked = vectors_of(index, f"d.memory_id = '{memory.id}'")
    storage.stores.delete_memory(SCOPE, store_id, memory.id, actor=None)
    assert found(storage, MEMORY_SECRET) == [] and found(storage, "note") != []
    embedded_now(storage)
    assert not holds(db_bytes(index), MEMORY_SECRET)
    assert not root_holds(storage, leaked)
    # The version records keep it (history) until redaction removes it from them too.
    storage.stores.redact_version(SCOPE, store_id, memory.memory_version_id, actor=None)
    assert not any(
        holds(p.read_bytes(), MEMORY_SECRET) for p in store_dir.rglob("*") if p.is_file()
    )
    assert not root_holds(storage, leaked)


@pytest.mark.tree_only("reads the store index's bytes")
def test_a_replaced_memory_content_leaves_the_index_at_the_version_sweep(
    embedded: TreeStorage, clock: FixedClock
) -> None:
    storage = embedded
    store_id = store_with(storage, SCOPE, "s", {"/a.md": "a"})
    memory = storage.stores.create_memory(
        SCOPE, store_id, path="/k.md", content=f"key {MEMORY_SECRET}", actor=None
    )
    embedded_now(storage)
    index = storage.stores.layout.store_index(storage.stores.layout.store_dir(SCOPE, store_id))
    leaked = vectors_of(index, f"d.memory_id = '{memory.id}'")
    storage.stores.update_memory(SCOPE, store_id, memory.id, content="rotated", actor=None)
    assert found(storage, MEMORY_SECRET) == []
    storage.sweep(now=clock())
    embedded_now(storage)
    assert not holds(db_bytes(index), MEMORY_SECRET)
    assert not root_holds(storage, leaked)


# -- fsck --------------------------------------------------------------------------------------
def _listing_sql(storage: TreeStorage, sql: str) -> None:
    conn = sqlite3.connect(storage.tasks.layout.listing(SCOPE))
    conn.executescript(sql)
    conn.close()


TURN_DAMAGE = {
    "a search row deleted": (
        "DELETE FROM search_text WHERE rowid = (SELECT doc FROM search_docs WHERE task_id = 'b')",
        "search rows of task b differ",
    ),
    "a search row's text changed": (
        "UPDATE search_text SET summary = 'forged' WHERE rowid = "
        "(SELECT doc FROM search_docs WHERE task_id = 'b')",
        "search rows of task b differ",
    ),
    "index segments lost": (
        "DELETE FROM search_text_data WHERE id > 10",
        "search index damaged",
    ),
    "stored text lost under the index": (
        "DELETE FROM search_text_content WHERE id = (SELECT doc FROM search_docs WHERE task_id = 'b')",
        "search index damaged",
    ),
    "a row for a task that does not exist": (
        "INSERT INTO search_docs (doc, task_id, turn) VALUES (99, 'ghost', 0);"
        " INSERT INTO search_text (rowid, task_id, meta, summary) VALUES (99, 'ghost', '', 'penguin')",
        "search rows of task ghost differ",
    ),
    "an index row no turn owns": (
        "INSERT INTO search_text (rowid, task_id, meta, summary) VALUES (99, 'x', '', 'penguin')",
        "1 search row(s) belong to no turn",
    ),
    "a turn's row without its text": (
        "INSERT INTO search_docs (task_id, turn) VALUES ('ghost', 0)",
        "1 search row(s) belong to no turn",
    ),
}


@pytest.mark.parametrize("damage", list(TURN_DAMAGE))
@pytest.mark.tree_only("damages the listing's FTS5 tables")
def test_fsck_reports_and_repairs_a_damaged_turn_search_index(
    storage: TreeStorage, damage: str
) -> None:
    for task in ("a", "b", "c"):
        turn(storage, task, 0, f"penguin {task}")
    sql, says = TURN_DAMAGE[damage]
    _listing_sql(storage, sql)
    report = fsck(storage.tasks)
    assert any(says in p for p in report.problems), report.problems
    repaired = fsck(storage.tasks, repair=True)
    assert repaired.unrepairable == [] and repaired.repaired
    assert fsck(storage.tasks).problems == []
    assert sorted(found(storage, "penguin")) == [("turn", "a/0"), ("turn", "b/0"), ("turn", "c/0")]


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM search_text",
        "UPDATE search_text SET content = 'forged'",
        "DELETE FROM search_text_data WHERE id > 10",
        "INSERT INTO search_docs (memory_id) VALUES ('mem_ghost')",
    ],
)
@pytest.mark.tree_only("damages a store's FTS5 tables")
def test_fsck_reports_and_repairs_a_damaged_store_search_index(
    storage: TreeStorage, sql: str
) -> None:
    store_id = store_with(storage, SCOPE, "s", {"/p.md": "penguin", "/q.md": "penguin too"})
    index = storage.stores.layout.store_index(storage.stores.layout.store_dir(SCOPE, store_id))
    conn = sqlite3.connect(index)
    with conn:
        conn.execute(sql)
    conn.close()
    report = storage.fsck()
    assert any("search" in p for p in report.problems), report.problems
    assert storage.fsck(repair=True).unrepairable == []
    assert storage.fsck().problems == []
    assert sorted(found(storage, "penguin")) == [("memory", "/p.md"), ("memory", "/q.md")]


def test_a_restored_backup_is_searchable(
    storage: StorageBackend,
    backend_kind: str,
    backend_settings: dict[str, Any],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    clock: FixedClock,
) -> None:
    turn(storage, "fix-login", 0, "The login bug, fixed.")
    store_with(storage, SCOPE, "notes", {"/login.md": "Login notes."})
    archive = tmp_path / "backup.tar.gz"
    storage.export(archive, tenant=SCOPE.tenant, project=SCOPE.project)
    restored: StorageBackend
    if backend_kind == "tree":
        restored = TreeStorage(tmp_path / "restored", clock=clock, lock_timeout=5.0)
    else:  # a deployment of its own: another schema and key prefix
        services = request.getfixturevalue("services")
        restored = open_backend({**backend_settings, **services.settings()})
    with archive.open("rb") as fh:
        restored.import_(fh)
    assert sorted(found(restored, "login")) == [("memory", "/login.md"), ("turn", "fix-login/0")]
    assert restored.fsck().problems == []
    restored.close()


@pytest.mark.tree_only("counts the store indexes' open descriptors")
def test_searches_read_the_stores_through_kept_connections(storage: TreeStorage) -> None:
    for n in range(3):
        store_with(storage, SCOPE, f"s{n}", {"/a.md": "kept connection words"})
    StoreIndex._pool.forget(lambda _path: True)
    assert found(storage, "kept connection")

    def opened() -> set[tuple[str, str]]:
        return open_fds(storage.layout.root, "index.sqlite3")

    held = opened()
    assert len(held) == 3
    for _ in range(10):
        assert len(found(storage, "kept connection")) == 3
    # Each search reads every store: through the connections already open, none made anew.
    assert opened() == held
