"""Full-text search over one project: its turns and the memories of its stores (tree backend).

Each project has one turn index (in its listing database, tree/sqlite/turn_search.py) and
each store its own memory index (in the store's index database, tree/sqlite/store_index.py), so a
search asks the turn index and each store's index and merges their hits by rank:

1. **one read of each index**: how many rows it has and how many each term matches, and its
   best ``limit + 1`` rows by FTS5's bm25 (none when a term occurs in no row of it);
2. **ranking**: bm25 weighs a term by its inverse document frequency within its own index,
   which would bury a memory of a three-memory store under any turn, so each index's bm25 is
   scaled to the project's frequencies (all indexes together, with Lucene's idf, which stays
   positive for common words): exact for a one-term query, the ratio of the summed weights
   for several terms. Within an index the order stays bm25's. A first page scales the keys
   once every index has answered; its cursor carries the project's statistics, so later
   pages scale inside SQLite with the same weights (the same product, to the bit);
3. **merge**: the best ``limit`` of all hits, ordered by (scaled key, index, row); the page
   cursor is the last hit's position, so each index resumes after it by itself;
4. **snippets**: only for the hits on the page.

The number of stores is what a search costs beyond the turns (one SQLite open and one or two
statements per store): at most
:data:`MAX_STORES` stores are searched per request, the newest first, and the page says how
many were left out.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from app.embeddings.base import EmbedderUnavailable
from app.embeddings.fusion import rrf
from app.storage.core import resident, snippets, vectors as vec
from app.storage.core.errors import (
    InvalidName,
    NotFound,
    SearchRebuilding,
    SearchTimeout,
    StorageError,
)
from app.storage.core.models import SearchHit, SearchPage
from app.storage.core.names import STORE_ID_RE, Scope
from app.storage.core.query import (
    DEFAULT_SEARCH_TIMEOUT,
    SEARCH_WAIT_SECONDS,
    SearchBudget,
    SearchQuery,
    SearchSlots,
    check_limit,
    decode_cursor,
    encode_cursor,
    fts5_match,
    fts5_term,
    parse_query,
)
from app.storage.core.resident import ResidentVectors
from app.storage.tree.sqlite import fts, turn_search, vectors
from app.storage.tree.sqlite.store_index import IndexReader
from app.storage.tree.stores.engine import MemoryStoreEngine
from app.storage.tree.tasks import TaskStore

if TYPE_CHECKING:
    from app.storage.tree.embedding import Embedding

log = logging.getLogger("app.storage.search")

MAX_STORES = 64
# Bytes of resident vector matrices a process keeps (MEMORY_VECTOR_CACHE_MB).
DEFAULT_RESIDENT_BYTES = 256 << 20
NO_EMBEDDER = "no embedder is configured (MEMORY_EMBEDDER=off): keyword results only"
TURNS = "0"  # the turn index sorts before every store ("1:<store id>")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Hit:
    key: float
    source: str
    doc: int
    fields: tuple[str, Any]  # (task_id, turn) or (memory_id, path)


@dataclass(frozen=True, slots=True)
class _Stats:
    """Rows of an index (or of the project), and how many of them each term matches."""

    rows: int
    counts: tuple[int, ...]

    def weight(self, idf: Callable[[int, int], float], terms: list[int]) -> float:
        return sum(idf(self.rows, self.counts[i]) for i in terms)


@dataclass(frozen=True, slots=True)
class _After:
    """Where the previous page ended, and the project statistics its keys were scaled with."""

    key: float
    source: str
    doc: int
    project: _Stats

    def mode(self, source: str) -> int:
        """fts.ranked_sql's ``:after`` for the rows of ``source``."""
        return 1 if source < self.source else 2 if source == self.source else 3


@dataclass(frozen=True, slots=True)
class _Ask:
    """What one search asks every index: its statistics, then its best ``want`` rows."""

    terms: list[str]
    match: str
    want: int
    after: _After | None
    budget: SearchBudget
    query: SearchQuery

    def params(self, source: str, own: _Stats) -> dict[str, object]:
        """fts.ranked_sql's parameters but ``:limit``: keys unscaled on a first page (the
        project's statistics are not known yet), scaled with the cursor's afterwards."""
        after = self.after
        if after is None:
            return {"match": self.match, "scale": 1.0, "after": 0, "key": 0.0, "doc": 0}
        return {
            "match": self.match,
            "scale": scale(after.project, own),
            "after": after.mode(source),
            "key": after.key,
            "doc": after.doc,
        }


def scale(project: _Stats, own: _Stats) -> float:
    """What turns an index's bm25 into one scaled to the project's frequencies: over the
    terms the index holds (every term, for a query that needs them all; a term no row of it
    has adds nothing to its bm25, in a query that needs any one)."""
    held = [i for i, count in enumerate(own.counts) if count]
    return project.weight(fts.project_idf, held) / own.weight(fts.idf, held)


Answer = tuple[_Stats, list[_Hit]] | None


class _Turns:
    source = TURNS

    def __init__(self, tasks: TaskStore, scope: Scope) -> None:
        self.tasks = tasks
        self.scope = scope
        self.listing = tasks.listing(scope)
        self.now_us = tasks.now_us()

    def ask(self, ask: _Ask) -> Answer:
        try:
            return self._ask(ask)
        except sqlite3.DatabaseError as exc:
            if not fts.index_error(exc):
                raise
            # An index no write has found damaged yet: the upkeep checks it and rebuilds it.
            log.warning("search of %s/%s: %s", self.scope.tenant, self.scope.project, exc)
            raise self._rebuilding() from None

    def _rebuilding(self) -> SearchRebuilding:
        self.tasks.removals.purge_later(self.scope)
        return SearchRebuilding(
            "the project's search index is being rebuilt from the records; retry shortly"
        )

    def _ask(self, ask: _Ask) -> Answer:
        with self.listing.search_read() as conn, fts.bounded(conn, ask.budget):
            found = fts.stats(conn, ask.terms)
            if found is None:
                # Damaged, or being filled from the records: it cannot answer for every turn.
                raise self._rebuilding()
            own = _Stats(*_pair(found))
            if not ask.query.matches(own.counts):
                return own, []  # a term no row has: nothing matches all of them
            params = {**ask.params(self.source, own), "now": self.now_us}
            inner = ask.want
            while True:
                rows = turn_search.hits(conn, {**params, "limit": inner})
                if len(rows) >= ask.want:
                    break
                # Turns past their retention (not swept yet) were left out after ranking:
                # rank more, until every match was ranked.
                (matched,) = conn.execute(
                    f"SELECT count(*) FROM {fts.TEXT} WHERE {fts.TEXT} MATCH ?",  # noqa: S608
                    (ask.match,),
                ).fetchone()
                if inner >= matched:
                    break
                inner *= 4
        hits = [_Hit(k, TURNS, doc, (task_id, turn)) for k, doc, task_id, turn in rows]
        return own, hits[: ask.want]

    def snippets(
        self,
        terms: list[snippets.Term],
        docs: list[int],
        budget: SearchBudget,
        start: frozenset[int] = frozenset(),
    ) -> dict[int, str]:
        with self.listing.search_read() as conn, fts.bounded(conn, budget):
            found = fts.texts(conn, docs, turn_search.SNIPPET_COLUMNS)
        return _cut(found, terms, budget, start)

    def rank(self, ask: _Near) -> _Ranked:
        """The best live turns by cosine (over at most ``ask.room`` chunks, the newest
        turns'), and how many rows wait to be embedded."""
        with self.listing.search_read() as conn, fts.bounded(conn, ask.budget):
            snap = ask.resident.snapshot(
                self.scope, self.source, ask.model, ask.dims, vectors.LogChanges(conn)
            )
            want = ask.want
            while True:
                best = resident.best(ask.query, snap, want, ask.room)
                # Turns past their retention (not swept yet) are left out after ranking.
                live = turn_search.live(conn, [doc for doc, _ in best], self.now_us)
                found = [(doc, score) for doc, score in best if doc in live]
                if len(found) >= ask.want or len(best) < want:
                    break
                want *= 4
            return _Ranked(found[: ask.want], min(len(snap), ask.room), vectors.queued(conn))

    def fields(self, docs: list[int], budget: SearchBudget) -> dict[int, tuple[str, Any]]:
        with self.listing.search_read() as conn, fts.bounded(conn, budget):
            return turn_search.fields(conn, docs)


class _Store:
    def __init__(self, engine: MemoryStoreEngine, scope: Scope, store_id: str) -> None:
        self.engine = engine
        self.scope = scope
        self.store_id = store_id
        self.source = f"1:{store_id}"

    def _read(self, fn: Callable[[IndexReader], T | None], budget: SearchBudget) -> T | None:
        """``fn`` over the store's index; None when the store went away meanwhile, or its
        index cannot be read for a reason of the store's own (fsck reports it; the other
        indexes still answer). An index that is damaged or being rebuilt: SearchRebuilding."""

        def read(store_dir: Any) -> T | None:
            with (
                self.engine.index(store_dir).search_read() as reader,
                fts.bounded(reader.conn, budget),
            ):
                return fn(reader)

        budget.check()
        try:
            return self.engine.read(self.scope, self.store_id, read)
        except (SearchTimeout, SearchRebuilding):
            raise
        except NotFound:
            return None
        except sqlite3.DatabaseError as exc:
            if not fts.index_error(exc):
                log.warning("search skipped store %s: %s", self.store_id, exc)
                return None
            # An index no write has found damaged yet: the rebuild checks it first.
            log.warning("search of store %s: %s", self.store_id, exc)
            raise self._rebuilding() from None
        except StorageError as exc:
            log.warning("search skipped store %s: %s", self.store_id, exc)
            return None

    def _rebuilding(self) -> SearchRebuilding:
        self.engine.rebuild_search_later(self.scope, self.store_id)
        return SearchRebuilding(
            f"the search index of memory store {self.store_id} is being rebuilt from its"
            " records; retry shortly"
        )

    def ask(self, ask: _Ask) -> Answer:
        def run(reader: IndexReader) -> tuple[_Stats, list[_Hit]] | None:
            found = reader.search_stats(ask.terms)
            if found is None:
                # Damaged, or being filled from the records: it cannot answer for every memory.
                raise self._rebuilding()
            own = _Stats(*_pair(found))
            if not ask.query.matches(own.counts):
                return own, []
            rows = reader.search_hits({**ask.params(self.source, own), "limit": ask.want})
            return own, [
                _Hit(k, self.source, doc, (memory_id, path)) for k, doc, memory_id, path in rows
            ]

        return self._read(run, ask.budget)

    def snippets(
        self,
        terms: list[snippets.Term],
        docs: list[int],
        budget: SearchBudget,
        start: frozenset[int] = frozenset(),
    ) -> dict[int, str]:
        found = self._read(lambda r: r.search_texts(docs), budget) or {}
        return _cut(found, terms, budget, start)

    def rank(self, ask: _Near) -> _Ranked:
        """The best live memories of the store by cosine (over at most ``ask.room`` chunks)."""

        def run(reader: IndexReader) -> _Ranked:
            conn = reader.conn
            snap = ask.resident.snapshot(
                self.scope, self.source, ask.model, ask.dims, vectors.LogChanges(conn)
            )
            best = resident.best(ask.query, snap, ask.want, ask.room)
            return _Ranked(best, min(len(snap), ask.room), vectors.queued(conn))

        return self._read(run, ask.budget) or _Ranked([], 0, 0)

    def fields(self, docs: list[int], budget: SearchBudget) -> dict[int, tuple[str, Any]]:
        return self._read(lambda r: r.search_fields(docs), budget) or {}


@dataclass(frozen=True, slots=True)
class _Near:
    """What a semantic search asks every index: its ``want`` best rows by cosine with
    ``query``, over at most ``room`` chunks of ``model``."""

    query: Any
    model: str
    dims: int
    want: int
    room: int
    budget: SearchBudget
    resident: ResidentVectors


@dataclass(frozen=True, slots=True)
class _Ranked:
    best: list[tuple[int, float]]  # (doc, cosine), best first
    chunks: int  # chunks ranked
    queued: int


def _cut(
    found: dict[int, tuple[str, ...]],
    terms: list[snippets.Term],
    budget: SearchBudget,
    start: frozenset[int] = frozenset(),
) -> dict[int, str]:
    """The snippet of each row (each costs a bounded window of its text: core/snippets.py);
    a row of ``start`` (found by its vectors alone) without a term in it gets the start of
    its first text that is not empty (a turn's summary, else its meta values)."""
    out = {}
    for doc, text in found.items():
        budget.check()
        if doc in start:
            filled = [t for t in text if t]
            text = (*filled, filled[0]) if filled else text
        out[doc] = snippets.snippet(text, terms)
    return out


def _pair(found: tuple[int, list[int]]) -> tuple[int, tuple[int, ...]]:
    return found[0], tuple(found[1])


_Source = _Turns | _Store


class TreeSearch:
    """Search a project of the tree backend (TreeStorage.search)."""

    def __init__(
        self,
        tasks: TaskStore,
        stores: MemoryStoreEngine,
        *,
        max_stores: int = MAX_STORES,
        timeout: float = DEFAULT_SEARCH_TIMEOUT,
        slots: int = 4,
        waiting: int = 0,
        embedding: Embedding | None = None,
        resident_bytes: int = DEFAULT_RESIDENT_BYTES,
    ) -> None:
        self.tasks = tasks
        # The stored vectors kept in memory between queries (core/resident.py).
        self.resident = ResidentVectors(resident_bytes)
        # The query's embedding, within its share of the budget (core/vectors.py).
        self.query_embedding = vec.QueryEmbedding(slots)
        self.stores = stores
        self.embedding = embedding
        self.max_stores = max_stores
        self.timeout = timeout
        self.slots = SearchSlots(
            slots, waiting=waiting, wait_seconds=min(SEARCH_WAIT_SECONDS, timeout)
        )

    def search(
        self,
        scope: Scope,
        query: str,
        *,
        limit: int = 20,
        cursor: str | None = None,
        any_term: bool = False,
        mode: str | None = None,
    ) -> SearchPage:
        check_limit(limit)
        parsed = parse_query(query, any_term=any_term)
        embedder = self.embedding.embedder if self.embedding is not None else None
        try:
            run = vec.resolve_mode(mode, embedder)
        except ValueError as exc:
            raise InvalidName("mode", mode, str(exc)) from None
        with self.slots.taken(scope):
            if run == "keyword":
                return self._search(scope, parsed, limit, cursor)
            if self.embedding is None:
                page = self._search(scope, parsed, limit, cursor)
                return replace(page, fallback=NO_EMBEDDER)
            return self._fused(scope, query, parsed, limit, cursor, run)

    def _search(
        self, scope: Scope, parsed: SearchQuery, limit: int, cursor: str | None
    ) -> SearchPage:
        after = self._decode(scope, parsed, cursor) if cursor else None
        budget = SearchBudget(self.timeout)
        sources, skipped = self._sources(scope)
        hits, project, answers = self._keyword(sources, parsed, limit + 1, after, budget)
        page, more = hits[:limit], len(hits) > limit
        return SearchPage(
            hits=self._hits(scope, sources, page, snippets.terms_of(parsed.terms), budget),
            next_cursor=self._encode(scope, parsed, page[-1], project) if more else None,
            stores_searched=sum(s.source in answers for s in sources if isinstance(s, _Store)),
            stores_skipped=skipped,
        )

    def _keyword(
        self,
        sources: list[_Source],
        parsed: SearchQuery,
        want: int,
        after: _After | None,
        budget: SearchBudget,
    ) -> tuple[list[_Hit], _Stats, dict[str, tuple[_Stats, list[_Hit]]]]:
        """The best ``want`` keyword hits of ``sources`` after ``after``, best first."""
        terms = [fts5_term(t) for t in parsed.terms]
        ask = _Ask(terms, fts5_match(parsed), want, after, budget, parsed)
        # One read of each index: its statistics and its best rows after the cursor.
        answers = {s.source: found for s in sources if (found := s.ask(ask)) is not None}
        if after is not None:
            project = after.project  # the first page's: every page ranks with the same weights
            hits = [h for _, found in answers.values() for h in found]
        else:
            project = _Stats(
                sum(own.rows for own, _ in answers.values()),
                tuple(sum(own.counts[i] for own, _ in answers.values()) for i in range(len(terms))),
            )
            # First page: the rows came unscaled. The same product SQLite computes for the
            # cursor's pages, so the keys of both agree to the bit.
            hits = [
                _Hit(h.key * scale(project, own), h.source, h.doc, h.fields)
                for own, found in answers.values()
                for h in found
            ]
        hits.sort(key=lambda h: (h.key, h.source, h.doc))
        return hits, project, answers

    # -- hybrid and semantic ---------------------------------------------------------------
    def _fused(
        self,
        scope: Scope,
        query: str,
        parsed: SearchQuery,
        limit: int,
        cursor: str | None,
        mode: vec.Mode,
    ) -> SearchPage:
        """A hybrid search (keyword and vector rankings fused by RRF) or a semantic one: a
        list of at most vec.FUSE_DEPTH hits, paged by an offset into it. When the embedder
        cannot answer, the same list of keyword hits, and the reason."""
        offset = self._decode_offset(scope, parsed, mode, cursor) if cursor else 0
        budget = SearchBudget(self.timeout)
        sources, skipped = self._sources(scope)
        depth = min(vec.FUSE_DEPTH, offset + limit + 1)
        assert self.embedding is not None
        embedding = self.embedding
        fallback: str | None = None
        try:
            query_vector = self.query_embedding.embed(
                embedding.embedder, query, budget.left() * vec.QUERY_SHARE
            )
        except EmbedderUnavailable as exc:
            fallback = f"the embedder is unavailable ({exc}): keyword results only"
        budget.check()
        keyword: list[_Hit] = []
        searched: set[str] = set()
        if mode == "hybrid" or fallback is not None:
            keyword, _, answers = self._keyword(sources, parsed, depth, None, budget)
            searched.update(answers)
        found: dict[tuple[str, int], _Hit] = {(h.source, h.doc): h for h in keyword}
        rankings = [[(h.source, h.doc) for h in keyword]]
        semantic: list[tuple[str, int]] = []
        cosine: dict[tuple[str, int], float] = {}
        if fallback is None:
            semantic, cosine, queued = self._semantic(sources, query_vector, depth, budget)
            searched.update(s for s, _ in semantic)
            rankings = [*rankings, semantic] if mode == "hybrid" else [semantic]
            if queued:
                embedding.later(scope)  # rows a killed process left queued, say
        modes = (
            ("keyword",)
            if fallback
            else (("keyword", "semantic") if mode == "hybrid" else ("semantic",))
        )
        if fallback is None and mode == "semantic":
            fused = [(key, cosine[key]) for key in semantic]
        else:
            fused = rrf([r for r in rankings if r])
        page_keys = fused[offset : offset + limit]
        missing = [key for key, _ in page_keys if key not in found]
        for source in sources:
            docs = [doc for s, doc in missing if s == source.source]
            if docs:
                for doc, fields in source.fields(docs, budget).items():
                    found[(source.source, doc)] = _Hit(0.0, source.source, doc, fields)
        page = [
            _Hit(-score, key[0], key[1], found[key].fields)
            for key, score in page_keys
            if key in found  # removed since it was ranked
        ]
        by_vector = {key for key, _ in page_keys} - {(h.source, h.doc) for h in keyword}
        more = len(fused) > offset + limit and offset + limit < vec.FUSE_DEPTH
        return SearchPage(
            hits=self._hits(
                scope, sources, page, snippets.terms_of(parsed.terms), budget, by_vector
            ),
            next_cursor=self._encode_offset(scope, parsed, mode, offset + limit) if more else None,
            stores_searched=sum(s.source in searched for s in sources if isinstance(s, _Store)),
            stores_skipped=skipped,
            modes=modes,
            fallback=fallback,
        )

    def _semantic(
        self, sources: list[_Source], query: Any, want: int, budget: SearchBudget
    ) -> tuple[list[tuple[str, int]], dict[tuple[str, int], float], int]:
        """The ``want`` best rows by cosine over at most vec.MAX_RANKED_CHUNKS chunks of the
        current model (turns first, then the newest stores), their cosines, and how many rows
        wait to be embedded."""
        assert self.embedding is not None
        model = self.embedding.embedder.model
        found: list[tuple[float, str, int]] = []
        queued = 0
        room = vec.MAX_RANKED_CHUNKS
        for source in sources:
            if room <= 0:
                break
            ranked = source.rank(
                _Near(query, model.key(), model.dims, want, room, budget, self.resident)
            )
            room -= ranked.chunks
            queued += ranked.queued
            found += [(score, source.source, doc) for doc, score in ranked.best]
        budget.check()
        found.sort(key=lambda f: (-f[0], f[1], f[2]))
        best = [((source, doc), score) for score, source, doc in found[:want]]
        return [key for key, _ in best], dict(best), queued

    def _encode_offset(self, scope: Scope, query: SearchQuery, mode: str, offset: int) -> str:
        return encode_cursor(
            self.tasks.cursors, "search-fused", scope, query, {"m": mode, "o": offset}
        )

    def _decode_offset(self, scope: Scope, query: SearchQuery, mode: str, cursor: str) -> int:
        def position(body: Mapping[str, Any]) -> int:
            offset = body["o"]
            if body["m"] != mode or not _is_int(offset) or not 0 < offset < vec.FUSE_DEPTH:
                raise ValueError("position")
            return int(offset)

        return decode_cursor(self.tasks.cursors, "search-fused", scope, query, cursor, position)

    def _sources(self, scope: Scope) -> tuple[list[_Source], int]:
        sources: list[_Source] = []
        listing_path = self.tasks.layout.listing(scope)
        if self.tasks.layout.tree.lstat(listing_path) is not None:
            sources.append(_Turns(self.tasks, scope))
        entries = self.stores.tree.entries(self.stores.layout.stores_dir(scope))
        ids = sorted(e.name for e in entries if e.is_dir and STORE_ID_RE.fullmatch(e.name))
        ids.reverse()  # ULIDs: newest first
        sources += [_Store(self.stores, scope, i) for i in ids[: self.max_stores]]
        return sources, max(0, len(ids) - self.max_stores)

    def _hits(
        self,
        scope: Scope,
        sources: list[_Source],
        page: list[_Hit],
        terms: list[snippets.Term],
        budget: SearchBudget,
        by_vector: set[tuple[str, int]] | None = None,
    ) -> tuple[SearchHit, ...]:
        snippets: dict[tuple[str, int], str] = {}
        names: dict[str, str | None] = {}
        for source in sources:
            docs = [h.doc for h in page if h.source == source.source]
            if not docs:
                continue
            start = frozenset(d for s, d in by_vector or () if s == source.source)
            for doc, text in source.snippets(terms, docs, budget, start).items():
                snippets[(source.source, doc)] = text
            if isinstance(source, _Store):
                try:
                    names[source.store_id] = self.stores.get_store(scope, source.store_id).name
                except StorageError:
                    names[source.store_id] = None  # deleted since its hits were read
        out = []
        for hit in page:
            text = snippets.get((hit.source, hit.doc), "")
            if hit.source == TURNS:
                task_id, turn = hit.fields
                out.append(SearchHit("turn", -hit.key, text, task_id=task_id, turn=int(turn)))
            else:
                store_id = hit.source[2:]
                memory_id, path = hit.fields
                out.append(
                    SearchHit(
                        "memory",
                        -hit.key,
                        text,
                        memory_store_id=store_id,
                        store_name=names.get(store_id),
                        memory_id=memory_id,
                        path=path,
                    )
                )
        return tuple(out)

    # -- cursors ---------------------------------------------------------------------------
    def _encode(self, scope: Scope, query: SearchQuery, last: _Hit, project: _Stats) -> str:
        position = {
            "k": last.key,
            "src": last.source,
            "d": last.doc,
            "n": project.rows,
            "c": list(project.counts),
        }
        return encode_cursor(self.tasks.cursors, "search", scope, query, position)

    def _decode(self, scope: Scope, query: SearchQuery, cursor: str) -> _After:
        def position(body: Mapping[str, Any]) -> _After:
            key, source, doc, rows, counts = (body[f] for f in ("k", "src", "d", "n", "c"))
            if not isinstance(key, float | int) or isinstance(key, bool):
                raise ValueError("key")
            if not isinstance(source, str) or not _is_int(doc) or not _is_int(rows):
                raise ValueError("position")
            if not isinstance(counts, list) or len(counts) != len(query.terms):
                raise ValueError("statistics")
            # Every term matched a row of the project, or (any_term) one of them did.
            if not all(_is_int(c) and 0 <= c <= rows for c in counts):
                raise ValueError("statistics")
            if not query.matches(counts):
                raise ValueError("statistics")
            return _After(float(key), source, doc, _Stats(rows, tuple(counts)))

        return decode_cursor(self.tasks.cursors, "search", scope, query, cursor, position)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
