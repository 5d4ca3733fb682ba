"""Full-text search over one project: its turns and the memories of its stores (tree backend).

Each project has one turn index (in its listing database, app/storage/turn_search.py) and
each store its own memory index (in the store's index database, memstores/index.py), so a
search asks the turn index and each store's index and merges their hits by rank:

1. **statistics**: each index tells its number of rows and how many rows each term matches;
2. **ranking**: each index ranks its matches by FTS5's bm25, scaled so that scores from
   different indexes compare. bm25 weighs a term by its inverse document frequency within
   its own index, which would bury a memory of a three-memory store under any turn; the
   scale replaces each index's frequencies by the project's (all indexes together, with
   Lucene's idf, which stays positive for common words): exact for a one-term query, the
   ratio of the summed weights for several terms. Within an index the order stays bm25's;
3. **merge**: the best ``limit`` of all hits, ordered by (scaled key, index, row); the page
   cursor is the last hit's position, so each index resumes after it by itself;
4. **snippets**: only for the hits on the page.

The number of stores is what a search costs beyond the turns (a few SQLite queries per store,
about a third of a millisecond for a small one): at most :data:`MAX_STORES` stores are searched
per request, the newest first, and the page says how many were left out.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from . import fts, turn_search
from .errors import InvalidName, NotFound, StorageError
from .layout import STORE_ID_RE, Scope
from .listing import Listing
from .memstores.engine import MemoryStoreEngine
from .memstores.index import IndexReader
from .models import SearchHit, SearchPage
from .query import SearchQuery, fts5_match, fts5_term, parse_query
from .tasks import TaskStore

log = logging.getLogger("app.storage.search")

MAX_LIMIT = 100
MAX_STORES = 64
CURSOR_VERSION = 1
TURNS = "0"  # the turn index sorts before every store ("1:<store id>")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Hit:
    key: float
    source: str
    doc: int
    fields: tuple[str, Any]  # (task_id, turn) or (memory_id, path)


@dataclass(frozen=True, slots=True)
class _After:
    key: float
    source: str
    doc: int

    def mode(self, source: str) -> int:
        """fts.ranked_sql's ``:after`` for the rows of ``source``."""
        return 1 if source < self.source else 2 if source == self.source else 3


class _Turns:
    source = TURNS

    def __init__(self, listing: Listing, now_us: int) -> None:
        self.listing = listing
        self.now_us = now_us

    def stats(self, terms: list[str]) -> tuple[int, list[int]] | None:
        with self.listing.search_read() as conn:
            return fts.stats(conn, terms)

    def hits(self, params: dict[str, object], want: int) -> list[_Hit]:
        params = {**params, "now": self.now_us}
        inner = want
        with self.listing.search_read() as conn:
            while True:
                rows = turn_search.hits(conn, {**params, "limit": inner})
                if len(rows) >= want:
                    break
                # Turns past their retention (not swept yet) were left out after ranking:
                # rank more, until every match was ranked.
                (matched,) = conn.execute(
                    f"SELECT count(*) FROM {fts.TEXT} WHERE {fts.TEXT} MATCH ?",  # noqa: S608
                    (params["match"],),
                ).fetchone()
                if inner >= matched:
                    break
                inner *= 4
        return [_Hit(k, TURNS, doc, (task_id, turn)) for k, doc, task_id, turn in rows[:want]]

    def snippets(self, match: str, docs: list[int], marks: fts.Sentinels) -> dict[int, str]:
        with self.listing.search_read() as conn:
            return {
                doc: fts.snippet(conn, match, doc, marks, turn_search.SNIPPET_COLUMNS)
                for doc in docs
            }


class _Store:
    def __init__(self, engine: MemoryStoreEngine, scope: Scope, store_id: str) -> None:
        self.engine = engine
        self.scope = scope
        self.store_id = store_id
        self.source = f"1:{store_id}"

    def _read(self, fn: Callable[[IndexReader], T]) -> T | None:
        """``fn`` over the store's index; None when the store went away meanwhile, or its
        index cannot be searched (fsck reports it; the other indexes still answer)."""

        def read(store_dir: Any) -> T | None:
            with self.engine.index(store_dir).read() as reader:
                return fn(reader) if reader.search_ready() else None

        try:
            return self.engine.read(self.scope, self.store_id, read)
        except NotFound:
            return None
        except (sqlite3.Error, StorageError) as exc:
            log.warning("search skipped store %s: %s", self.store_id, exc)
            return None

    def stats(self, terms: list[str]) -> tuple[int, list[int]] | None:
        return self._read(lambda r: r.search_stats(terms))

    def hits(self, params: dict[str, object], want: int) -> list[_Hit]:
        rows = self._read(lambda r: r.search_hits({**params, "limit": want})) or []
        return [_Hit(k, self.source, doc, (memory_id, path)) for k, doc, memory_id, path in rows]

    def snippets(self, match: str, docs: list[int], marks: fts.Sentinels) -> dict[int, str]:
        found = self._read(lambda r: {doc: r.search_snippet(match, doc, marks) for doc in docs})
        return found or {}


_Source = _Turns | _Store


class TreeSearch:
    """Search a project of the tree backend (TreeStorage.search)."""

    def __init__(
        self, tasks: TaskStore, stores: MemoryStoreEngine, *, max_stores: int = MAX_STORES
    ) -> None:
        self.tasks = tasks
        self.stores = stores
        self.max_stores = max_stores

    def search(
        self, scope: Scope, query: str, *, limit: int = 20, cursor: str | None = None
    ) -> SearchPage:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidName("limit", limit, f"must be between 1 and {MAX_LIMIT}")
        parsed = parse_query(query)
        after = self._decode(scope, parsed, cursor) if cursor else None
        match = fts5_match(parsed)
        terms = [fts5_term(t) for t in parsed.terms]
        sources, skipped = self._sources(scope)

        stats = {s.source: found for s in sources if (found := s.stats(terms)) is not None}
        rows = sum(n for n, _ in stats.values())
        counts = [sum(c[i] for _, c in stats.values()) for i in range(len(terms))]
        project_weight = sum(fts.project_idf(rows, c) for c in counts)

        hits: list[_Hit] = []
        for source in sources:
            found = stats.get(source.source)
            if found is None or not all(found[1]):
                continue  # a term no row of this index has: nothing can match all of them
            own_weight = sum(fts.idf(found[0], c) for c in found[1])
            params: dict[str, object] = {
                "match": match,
                "scale": project_weight / own_weight,
                "after": 0 if after is None else after.mode(source.source),
                "key": 0.0 if after is None else after.key,
                "doc": 0 if after is None else after.doc,
            }
            hits += source.hits(params, limit + 1)
        hits.sort(key=lambda h: (h.key, h.source, h.doc))
        page, more = hits[:limit], len(hits) > limit
        return SearchPage(
            hits=self._hits(scope, sources, page, match),
            next_cursor=self._encode(scope, parsed, page[-1]) if more else None,
            stores_searched=sum(isinstance(s, _Store) and s.source in stats for s in sources),
            stores_skipped=skipped,
        )

    def _sources(self, scope: Scope) -> tuple[list[_Source], int]:
        sources: list[_Source] = []
        listing_path = self.tasks.layout.listing(scope)
        if self.tasks.layout.tree.lstat(listing_path) is not None:
            sources.append(_Turns(self.tasks.listing(scope), self.tasks.now_us()))
        entries = self.stores.tree.entries(self.stores.layout.stores_dir(scope))
        ids = sorted(e.name for e in entries if e.is_dir and STORE_ID_RE.fullmatch(e.name))
        ids.reverse()  # ULIDs: newest first
        sources += [_Store(self.stores, scope, i) for i in ids[: self.max_stores]]
        return sources, max(0, len(ids) - self.max_stores)

    def _hits(
        self, scope: Scope, sources: list[_Source], page: list[_Hit], match: str
    ) -> tuple[SearchHit, ...]:
        marks = fts.Sentinels()
        snippets: dict[tuple[str, int], str] = {}
        names: dict[str, str | None] = {}
        for source in sources:
            docs = [h.doc for h in page if h.source == source.source]
            if not docs:
                continue
            for doc, text in source.snippets(match, docs, marks).items():
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
    def _tag(self, scope: Scope) -> str:
        return hashlib.sha256(f"{scope.tenant}/{scope.project}".encode()).hexdigest()[:16]

    def _encode(self, scope: Scope, query: SearchQuery, last: _Hit) -> str:
        return self.tasks.cursors.encode(
            {
                "l": "search",
                "v": CURSOR_VERSION,
                "s": self._tag(scope),
                "q": query.fingerprint(),
                "k": last.key,
                "src": last.source,
                "d": last.doc,
            }
        )

    def _decode(self, scope: Scope, query: SearchQuery, cursor: str) -> _After:
        body = self.tasks.cursors.decode(cursor, "cursor")
        try:
            if (
                body["l"] != "search"
                or body["v"] != CURSOR_VERSION
                or body["s"] != self._tag(scope)
                or body["q"] != query.fingerprint()
            ):
                raise ValueError("issued for another search")
            key, source, doc = body["k"], body["src"], body["d"]
            if not isinstance(key, float | int) or isinstance(key, bool):
                raise ValueError("key")
            if not isinstance(source, str) or not isinstance(doc, int) or isinstance(doc, bool):
                raise ValueError("position")
            return _After(float(key), source, doc)
        except (ValueError, KeyError, TypeError):
            raise InvalidName(
                "cursor", cursor, "is not a cursor this server issued for this search"
            ) from None
