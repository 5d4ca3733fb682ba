"""Full-text search over one project on PostgreSQL (PgStorage.search), as docs/search.md says.

The words live in generated columns (schema migration 4): ``turns.search`` (task id, meta
values, summary, weighted A, B, C) and ``versions.search`` (path A, content C; a memory's
words are its head version's), each with a GIN index. The database computes them in the
statement that writes the row, so no write path knows of them and no index can lag.

A search is one read-only snapshot:

1. **terms**: each term of app.storage.query's syntax becomes a ``tsquery`` made by the same
   text search configuration as the columns (``phraseto_tsquery`` over the term's words, its
   last word ``:*`` for a prefix); the query is all of them (``&``), or any one of them
   (``|``) for a recall;
2. **hits**: the project's live turns and its memories, each table's best ``limit + 1`` after
   the cursor by ``ts_rank`` with the column weights, merged by (score, turns before memories,
   stable ids). The cursor is the last hit's position, so each table resumes after it;
3. **snippets**: only for the hits on the page, cut from the stored text by
   app/storage/core/snippets.py, as the tree's are (a bounded window of each text).

Unlike the tree's, a search is one statement per table whatever the number of stores: every
store of the project is searched and none is skipped.
"""

# ruff: noqa: S608 - SQL text is fixed fragments; every value is bound.

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors

from app.embeddings.base import EmbedderUnavailable
from app.embeddings.fusion import rrf
from app.storage.core import resident, snippets, vectors as vec
from app.storage.core.cursor import CursorCodec
from app.storage.core.errors import InvalidName
from app.storage.core.models import SearchHit, SearchPage
from app.storage.core.names import Scope
from app.storage.core.query import (
    DEFAULT_SEARCH_TIMEOUT,
    SEARCH_WAIT_SECONDS,
    QueryTerm,
    SearchBudget,
    SearchQuery,
    SearchSlots,
    check_limit,
    decode_cursor,
    encode_cursor,
    meta_text,
    parse_query,
)
from app.storage.core.resident import ResidentVectors
from app.storage.pg.db import Database
from app.storage.pg.vectors import PgChanges

if TYPE_CHECKING:
    from app.storage.pg.vectors import PgEmbedding

NO_EMBEDDER = "no embedder is configured (MEMORY_EMBEDDER=off): keyword results only"
# Every vector of a project is one resident matrix (pg/vectors.py PgChanges).
_INDEX = "pg"
TURNS = "0"  # turns sort before every store ("1:<store id>") at an equal score
# ts_rank's weights of D, C, B, A: task id and path 3, meta values 2, summary and content 1,
# as the tree's bm25 column weights. Normalization 1 divides by 1 + log(the text's length).
_WEIGHTS = "'{0.1, 0.333333, 0.666667, 1.0}'"


def _rank(column: str) -> str:
    return f"ts_rank({_WEIGHTS}, {column}, %(q)s::tsquery, 1)::float8"


_TERMS = (
    "SELECT phraseto_tsquery('search_text', search_words(t))::text"
    " FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n"
)
_TURN_HITS = (
    "SELECT r, task_id, turn, NULL FROM ("
    f" SELECT {_rank('search')} AS r, task_id, turn FROM turns"
    " WHERE tenant = %(tenant)s AND project = %(project)s AND retain_until_us > %(now)s"
    " AND search @@ %(q)s::tsquery) AS hit"
    " WHERE {after} ORDER BY r DESC, task_id, turn LIMIT %(limit)s"
)
_MEMORY_HITS = (
    "SELECT r, store_id, id, path FROM ("
    f" SELECT {_rank('v.search')} AS r, m.store_id, m.id, m.path"
    " FROM stores s JOIN memories m ON m.store_id = s.id"
    " JOIN versions v ON v.store_id = m.store_id AND v.id = m.head"
    " WHERE s.tenant = %(tenant)s AND s.project = %(project)s"
    " AND v.search @@ %(q)s::tsquery) AS hit"
    " WHERE {after} ORDER BY r DESC, store_id, id LIMIT %(limit)s"
)
# Where each table resumes, by where the previous page ended (a turn or a memory).
_AFTER = {
    (TURNS, TURNS): "(r < %(k)s OR (r = %(k)s AND (task_id, turn) > (%(a)s, %(b)s)))",
    (TURNS, "1"): "r < %(k)s",
    ("1", TURNS): "r <= %(k)s",
    ("1", "1"): "(r < %(k)s OR (r = %(k)s AND (store_id, id) > (%(store)s, %(a)s)))",
}
_TURN_TEXTS = (
    "SELECT t.task_id, t.turn, t.meta, t.summary FROM turns t"
    " JOIN unnest(%(tasks)s::text[], %(turns)s::int[]) AS p(task_id, turn)"
    " ON p.task_id = t.task_id AND p.turn = t.turn"
    " WHERE t.tenant = %(tenant)s AND t.project = %(project)s"
)
_MEMORY_TEXTS = (
    "SELECT m.store_id, m.id, v.content FROM memories m"
    " JOIN unnest(%(stores)s::text[], %(memories)s::text[]) AS p(store_id, id)"
    " ON p.store_id = m.store_id AND p.id = m.id"
    " JOIN versions v ON v.store_id = m.store_id AND v.id = m.head"
)
_STORES = "SELECT id, record FROM stores WHERE tenant = %s AND project = %s"
# The owners of embeddings ranked by cosine that are live: a turn within its retention, a
# memory whose head the embedding is of.
_VECTOR_TURNS = (
    "SELECT DISTINCT v.id, v.task_id, v.turn FROM turn_vectors v JOIN turns t"
    " USING (tenant, project, task_id, turn) WHERE v.tenant = %(tenant)s"
    " AND v.project = %(project)s AND v.id = ANY(%(ids)s) AND t.retain_until_us > %(now)s"
)
_VECTOR_MEMORIES = (
    "SELECT DISTINCT v.id, m.store_id, m.id, m.path FROM memory_vectors v JOIN memories m"
    " ON m.store_id = v.store_id AND m.head = v.version_id WHERE v.tenant = %(tenant)s"
    " AND v.project = %(project)s AND v.id = ANY(%(ids)s)"
)


@dataclass(frozen=True, slots=True)
class _Hit:
    score: float
    source: str  # TURNS, or "1:<store id>"
    name: str  # the task id, or the memory id
    turn: int
    path: str | None

    def order(self) -> tuple[float, str, str, int]:
        return (-self.score, self.source, self.name, self.turn)


class PgSearch:
    """Search a project of the PostgreSQL backend."""

    def __init__(
        self,
        db: Database,
        cursors: CursorCodec,
        now_us: Callable[[], int],
        *,
        timeout: float = DEFAULT_SEARCH_TIMEOUT,
        slots: int = 4,
        waiting: int = 0,
        embedding: PgEmbedding | None = None,
        resident_bytes: int = 256 << 20,
    ) -> None:
        self.db = db
        self.embedding = embedding
        # The stored vectors kept in memory between queries (core/resident.py).
        self.resident = ResidentVectors(resident_bytes)
        # The query's embedding, within its share of the budget (core/vectors.py).
        self.query_embedding = vec.QueryEmbedding(slots)
        self.cursors = cursors
        self.now_us = now_us
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
                return replace(self._search(scope, parsed, limit, cursor), fallback=NO_EMBEDDER)
            return self._fused(scope, query, parsed, limit, cursor, run)

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
        """A hybrid search (keyword and vector rankings fused by RRF) or a semantic one, as
        the tree's (tree/search.py): at most vec.FUSE_DEPTH hits paged by an offset. When
        the embedder cannot answer, the keyword hits and the reason."""
        assert self.embedding is not None
        embedding = self.embedding
        offset = self._decode_offset(scope, parsed, mode, cursor) if cursor else 0
        budget = SearchBudget(self.timeout)
        depth = min(vec.FUSE_DEPTH, offset + limit + 1)
        fallback: str | None = None
        try:
            query_vector = self.query_embedding.embed(
                embedding.embedder, query, budget.left() * vec.QUERY_SHARE
            )
        except EmbedderUnavailable as exc:
            fallback = f"the embedder is unavailable ({exc}): keyword results only"
        budget.check()
        model = embedding.embedder.model
        with self.db.snapshot("search") as conn, _bounded(conn, budget):
            stores = {
                str(i): _store_name(record)
                for i, record in conn.execute(_STORES, (scope.tenant, scope.project))
            }
            params: dict[str, Any] = {
                "tenant": scope.tenant,
                "project": scope.project,
                "now": self.now_us(),
                "limit": depth,
            }
            keyword: list[_Hit] = []
            if mode == "hybrid" or fallback is not None:
                tsquery = _tsquery(conn, parsed)
                if tsquery is not None:
                    params["q"] = tsquery
                    keyword = _hits(conn, _TURN_HITS, TURNS, None, params)
                    if stores:
                        keyword += _hits(conn, _MEMORY_HITS, "1", None, params)
                    keyword.sort(key=_Hit.order)
                    keyword = keyword[:depth]
            found = {_key(h): h for h in keyword}
            rankings = [[_key(h) for h in keyword]]
            cosine: dict[tuple[str, str, int], float] = {}
            semantic: list[tuple[str, str, int]] = []
            if fallback is None:
                snap = self.resident.snapshot(
                    scope, _INDEX, model.key(), model.dims, PgChanges(conn, scope)
                )
                want = depth
                while True:
                    best = resident.best(query_vector, snap, want, vec.MAX_RANKED_CHUNKS)
                    owners = _owners(conn, params, [i for i, _ in best])
                    semantic = []
                    for ident, score in best:
                        hit = owners.get(ident)
                        if hit is not None and _key(hit) not in cosine:
                            cosine[_key(hit)] = score
                            semantic.append(_key(hit))
                            found.setdefault(_key(hit), replace(hit, score=score))
                    if len(semantic) >= depth or len(best) < want:
                        break
                    want *= 4
                semantic = semantic[:depth]
                rankings = [*rankings, semantic] if mode == "hybrid" else [semantic]
                if queued_rows(conn, scope):
                    embedding.later(scope)  # rows a killed process left queued, say
            if fallback is None and mode == "semantic":
                fused = [(k, cosine[k]) for k in semantic]
            else:
                fused = rrf([r for r in rankings if r])
            page_keys = fused[offset : offset + limit]
            page = [replace(found[k], score=score) for k, score in page_keys]
            texts = _texts(conn, scope, page)
        by_vector = {k for k, _ in page_keys} - {_key(h) for h in keyword}
        words = snippets.terms_of(parsed.terms)
        out = []
        for hit in page:
            budget.check()
            if _key(hit) in by_vector:
                # Found by meaning alone: the start of its text, unmarked.
                filled = [t for t in texts.get(_key(hit), ()) if t]
                texts[_key(hit)] = (*filled, filled[0]) if filled else ()
            out.append(_public(hit, texts, stores, words))
        more = len(fused) > offset + limit and offset + limit < vec.FUSE_DEPTH
        modes = (
            ("keyword",)
            if fallback
            else (("keyword", "semantic") if mode == "hybrid" else ("semantic",))
        )
        return SearchPage(
            hits=tuple(out),
            next_cursor=self._encode_offset(scope, parsed, mode, offset + limit) if more else None,
            stores_searched=len(stores),
            stores_skipped=0,
            modes=modes,
            fallback=fallback,
        )

    def _encode_offset(self, scope: Scope, query: SearchQuery, mode: str, offset: int) -> str:
        return encode_cursor(self.cursors, "search-fused", scope, query, {"m": mode, "o": offset})

    def _decode_offset(self, scope: Scope, query: SearchQuery, mode: str, cursor: str) -> int:
        def position(body: Mapping[str, Any]) -> int:
            offset = body["o"]
            if body["m"] != mode or not isinstance(offset, int) or isinstance(offset, bool):
                raise ValueError("position")
            if not 0 < offset < vec.FUSE_DEPTH:
                raise ValueError("position")
            return int(offset)

        return decode_cursor(self.cursors, "search-fused", scope, query, cursor, position)

    def _search(
        self, scope: Scope, parsed: SearchQuery, limit: int, cursor: str | None
    ) -> SearchPage:
        after = self._decode(scope, parsed, cursor) if cursor else None
        budget = SearchBudget(self.timeout)
        with self.db.snapshot("search") as conn, _bounded(conn, budget):
            stores = {
                str(i): _store_name(record)
                for i, record in conn.execute(_STORES, (scope.tenant, scope.project))
            }
            tsquery = _tsquery(conn, parsed)
            hits: list[_Hit] = []
            if tsquery is not None:
                params: dict[str, Any] = {
                    "q": tsquery,
                    "tenant": scope.tenant,
                    "project": scope.project,
                    "now": self.now_us(),
                    "limit": limit + 1,
                }
                if after is not None:
                    params.update(k=after.score, a=after.name, b=after.turn, store=after.source[2:])
                hits = _hits(conn, _TURN_HITS, TURNS, after, params)
                if stores:
                    hits += _hits(conn, _MEMORY_HITS, "1", after, params)
            hits.sort(key=_Hit.order)
            page, more = hits[:limit], len(hits) > limit
            texts = _texts(conn, scope, page)
        words = snippets.terms_of(parsed.terms)
        out = []
        for hit in page:
            budget.check()  # each snippet costs a bounded window of its text
            out.append(_public(hit, texts, stores, words))
        return SearchPage(
            hits=tuple(out),
            next_cursor=self._encode(scope, parsed, page[-1]) if more else None,
            stores_searched=len(stores),
            stores_skipped=0,
        )

    # -- cursors ---------------------------------------------------------------------------
    def _encode(self, scope: Scope, query: SearchQuery, last: _Hit) -> str:
        position = {"k": last.score, "src": last.source, "a": last.name, "b": last.turn}
        return encode_cursor(self.cursors, "search-pg", scope, query, position)

    def _decode(self, scope: Scope, query: SearchQuery, cursor: str) -> _Hit:
        def position(body: Mapping[str, Any]) -> _Hit:
            score, source, name, turn = (body[f] for f in ("k", "src", "a", "b"))
            if not isinstance(score, float | int) or isinstance(score, bool):
                raise ValueError("score")
            if not isinstance(source, str) or not (source == TURNS or source.startswith("1:")):
                raise ValueError("source")
            if not isinstance(name, str) or not isinstance(turn, int) or isinstance(turn, bool):
                raise ValueError("position")
            return _Hit(float(score), source, name, turn, None)

        return decode_cursor(self.cursors, "search-pg", scope, query, cursor, position)


@contextlib.contextmanager
def _bounded(conn: psycopg.Connection[Any], budget: SearchBudget) -> Iterator[None]:
    """Stop the search's statements once ``budget`` ran out (SearchTimeout, a 503): the
    database cancels a statement past its statement_timeout, this transaction's only."""
    conn.execute(f"SET LOCAL statement_timeout = {max(1, int(budget.left() * 1000))}")
    try:
        yield
    except pg_errors.QueryCanceled:
        raise budget.timeout() from None


def _store_name(record: str) -> str | None:
    try:
        return str(json.loads(record)["name"])
    except (ValueError, KeyError, TypeError):
        return None


def _tsquery(conn: psycopg.Connection[Any], query: SearchQuery) -> str | None:
    """The query as tsquery text: every term, all of them required (any one of them, for an
    ``any_term`` query). None when nothing can match: a term required has no word the index
    could hold, or (any_term) no term has one."""
    terms: Sequence[QueryTerm] = query.terms
    rows = conn.execute(_TERMS, ([t.text for t in terms],)).fetchall()
    parts = []
    for term, (text,) in zip(terms, rows, strict=True):
        if not text:
            if query.any_term:
                continue
            return None
        parts.append(f"({text}{':*' if term.prefix else ''})")
    if not parts:
        return None
    return (" | " if query.any_term else " & ").join(parts)


def _hits(
    conn: psycopg.Connection[Any],
    sql: str,
    kind: str,
    after: _Hit | None,
    params: dict[str, Any],
) -> list[_Hit]:
    where = "true" if after is None else _AFTER[(kind, after.source[:1])]
    found = []
    for score, first, second, path in conn.execute(sql.replace("{after}", where), params):
        if kind == TURNS:
            found.append(_Hit(float(score), TURNS, str(first), int(second), None))
        else:
            found.append(_Hit(float(score), f"1:{first}", str(second), 0, str(path)))
    return found


_Texts = dict[tuple[str, str, int], tuple[str, ...]]


def _key(hit: _Hit) -> tuple[str, str, int]:
    return (hit.source, hit.name, hit.turn)


def _owners(
    conn: psycopg.Connection[Any], params: dict[str, Any], ids: list[int]
) -> dict[int, _Hit]:
    """The live turn or memory each embedding id is of (an id of a row gone has none)."""
    if not ids:
        return {}
    args = {**params, "ids": ids}
    out = {
        int(i): _Hit(0.0, TURNS, str(task_id), int(turn), None)
        for i, task_id, turn in conn.execute(_VECTOR_TURNS, args)
    }
    for i, store_id, memory_id, path in conn.execute(_VECTOR_MEMORIES, args):
        out[int(i)] = _Hit(0.0, f"1:{store_id}", str(memory_id), 0, str(path))
    return out


def queued_rows(conn: psycopg.Connection[Any], scope: Scope) -> bool:
    """Whether any text of the project waits to be embedded."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM turn_embeds WHERE tenant = %(t)s AND project = %(p)s"
        " AND queued) OR EXISTS (SELECT 1 FROM memory_embeds WHERE tenant = %(t)s"
        " AND project = %(p)s AND queued)",
        {"t": scope.tenant, "p": scope.project},
    ).fetchone()
    return bool(row and row[0])


def _texts(conn: psycopg.Connection[Any], scope: Scope, page: list[_Hit]) -> _Texts:
    """The snippet sources of each hit, the first one first: a turn's summary, meta values,
    task id; a memory's content, path."""
    turns = [h for h in page if h.source == TURNS]
    memories = [h for h in page if h.source != TURNS]
    out: _Texts = {}
    if turns:
        for task_id, turn, meta, summary in conn.execute(
            _TURN_TEXTS,
            {
                "tasks": [h.name for h in turns],
                "turns": [h.turn for h in turns],
                "tenant": scope.tenant,
                "project": scope.project,
            },
        ):
            summary_md = bytes(summary).decode("utf-8")
            out[(TURNS, task_id, turn)] = (summary_md, meta_text(json.loads(meta)), task_id)
    if memories:
        paths = {(h.source, h.name): str(h.path) for h in memories}
        for store_id, memory_id, content in conn.execute(
            _MEMORY_TEXTS,
            {"stores": [h.source[2:] for h in memories], "memories": [h.name for h in memories]},
        ):
            source = f"1:{store_id}"
            body = "" if content is None else bytes(content).decode("utf-8")
            out[(source, memory_id, 0)] = (body, paths[(source, memory_id)])
    return out


def _public(
    hit: _Hit, texts: _Texts, stores: dict[str, str | None], words: list[snippets.Term]
) -> SearchHit:
    snippet = snippets.snippet(texts.get((hit.source, hit.name, hit.turn), ()), words)
    if hit.source == TURNS:
        return SearchHit("turn", hit.score, snippet, task_id=hit.name, turn=hit.turn)
    store_id = hit.source[2:]
    return SearchHit(
        "memory",
        hit.score,
        snippet,
        memory_store_id=store_id,
        store_name=stores.get(store_id),
        memory_id=hit.name,
        path=hit.path,
    )
