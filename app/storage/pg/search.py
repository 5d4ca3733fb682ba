"""Full-text search over one project on PostgreSQL (PgStorage.search), as docs/search.md says.

The words live in generated columns (schema migration 4): ``turns.search`` (task id, meta
values, summary, weighted A, B, C) and ``versions.search`` (path A, content C; a memory's
words are its head version's), each with a GIN index. The database computes them in the
statement that writes the row, so no write path knows of them and no index can lag.

A search is one read-only snapshot:

1. **terms**: each term of app.storage.query's syntax becomes a ``tsquery`` made by the same
   text search configuration as the columns (``phraseto_tsquery`` over the term's words, its
   last word ``:*`` for a prefix); the query is all of them (``&``);
2. **hits**: the project's live turns and its memories, each table's best ``limit + 1`` after
   the cursor by ``ts_rank`` with the column weights, merged by (score, turns before memories,
   stable ids). The cursor is the last hit's position, so each table resumes after it;
3. **snippets**: only for the hits on the page, cut here from the stored text (a fragment of
   :data:`SNIPPET_WORDS` words around the most terms), each matched word marked. A word is
   compared as the index compares it: without case or diacritics, punctuation splitting it.

Unlike the tree's, a search is one statement per table whatever the number of stores: every
store of the project is searched and none is skipped.
"""

# ruff: noqa: S608 - SQL text is fixed fragments; every value is bound.

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from app.storage.core.cursor import CursorCodec
from app.storage.core.models import SearchHit, SearchPage
from app.storage.core.names import Scope
from app.storage.core.query import (
    SNIPPET_TOKENS,
    QueryTerm,
    SearchQuery,
    Sentinels,
    check_limit,
    decode_cursor,
    encode_cursor,
    meta_text,
    parse_query,
)
from app.storage.pg.db import Database

SNIPPET_WORDS = SNIPPET_TOKENS
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

    def __init__(self, db: Database, cursors: CursorCodec, now_us: Callable[[], int]) -> None:
        self.db = db
        self.cursors = cursors
        self.now_us = now_us

    def search(
        self, scope: Scope, query: str, *, limit: int = 20, cursor: str | None = None
    ) -> SearchPage:
        check_limit(limit)
        parsed = parse_query(query)
        after = self._decode(scope, parsed, cursor) if cursor else None
        with self.db.snapshot("search") as conn:
            stores = {
                str(i): _store_name(record)
                for i, record in conn.execute(_STORES, (scope.tenant, scope.project))
            }
            tsquery = _tsquery(conn, parsed.terms)
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
        words = [_Words.of(t) for t in parsed.terms]
        out = tuple(_public(hit, texts, stores, words) for hit in page)
        return SearchPage(
            hits=out,
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


def _store_name(record: str) -> str | None:
    try:
        return str(json.loads(record)["name"])
    except (ValueError, KeyError, TypeError):
        return None


def _tsquery(conn: psycopg.Connection[Any], terms: Sequence[QueryTerm]) -> str | None:
    """The query as tsquery text: every term, all of them required. None when a term has no
    word the index could hold (nothing can match it)."""
    rows = conn.execute(_TERMS, ([t.text for t in terms],)).fetchall()
    parts = []
    for term, (text,) in zip(terms, rows, strict=True):
        if not text:
            return None
        parts.append(f"({text}{':*' if term.prefix else ''})")
    return " & ".join(parts)


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
    hit: _Hit, texts: _Texts, stores: dict[str, str | None], words: list[_Words]
) -> SearchHit:
    snippet = _snippet(texts.get((hit.source, hit.name, hit.turn), ()), words)
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


# -- snippets --------------------------------------------------------------------------------
# A word: letters and digits, with the combining marks of its letters; anything else (ASCII
# punctuation above all: search_words in the schema) splits words, as in the index.
_WORD = re.compile(
    r"(?:[^\W_]|[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f])+"
)
# Letters unaccent folds that have no decomposition to strip a mark from.
_LETTERS = str.maketrans(
    {"ø": "o", "æ": "ae", "œ": "oe", "đ": "d", "ð": "d", "ł": "l", "ħ": "h", "ı": "i", "þ": "th"}
)


def _fold(word: str) -> str:
    """A word as the index compares it: without diacritics, in lower case."""
    if word.isascii():
        return word.lower()
    bare = "".join(c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c))
    return bare.casefold().translate(_LETTERS)


@dataclass(frozen=True, slots=True)
class _Words:
    """A term as the snippet looks for it: its words in order, the last one a prefix or not."""

    words: tuple[str, ...]
    prefix: bool

    @staticmethod
    def of(term: QueryTerm) -> _Words:
        return _Words(tuple(_fold(m.group()) for m in _WORD.finditer(term.text)), term.prefix)

    def at(self, words: list[str], i: int) -> bool:
        n = len(self.words)
        if i + n > len(words) or words[i : i + n - 1] != list(self.words[:-1]):
            return False
        last = words[i + n - 1]
        return last.startswith(self.words[-1]) if self.prefix else last == self.words[-1]


def _matches(words: list[str], terms: list[_Words]) -> list[tuple[int, int, int]]:
    """(first word, last word, term) of every occurrence of a term in ``words``."""
    where: dict[str, list[int]] = {}
    for i, word in enumerate(words):
        where.setdefault(word, []).append(i)
    found = []
    for t, term in enumerate(terms):
        if not term.words:
            continue
        first = term.words[0]
        if term.prefix and len(term.words) == 1:
            starts = sorted(i for w, at in where.items() if w.startswith(first) for i in at)
        else:
            starts = where.get(first, [])
        found += [(i, i + len(term.words) - 1, t) for i in starts if term.at(words, i)]
    return sorted(found)


def _snippet(columns: tuple[str, ...], terms: list[_Words]) -> str:
    """A fragment of the first of ``columns`` in which a term occurs (else of the last one)
    with every occurrence marked, as FTS5's snippet() gives the tree's."""
    for n, text in enumerate(columns):
        spans = [(m.start(), m.end()) for m in _WORD.finditer(text)]
        found = _matches([_fold(text[a:b]) for a, b in spans], terms)
        if found or n == len(columns) - 1:
            return _fragment(text, spans, found)
    return ""


def _fragment(text: str, spans: list[tuple[int, int]], found: list[tuple[int, int, int]]) -> str:
    """:data:`SNIPPET_WORDS` words of ``text`` around the most terms it holds."""
    total = len(spans)
    first, last = 0, min(total, SNIPPET_WORDS) - 1
    if found:
        best: tuple[int, int] = (-1, 0)
        for start, _, _ in found:
            inside = [f for f in found if start <= f[0] and f[1] < start + SNIPPET_WORDS]
            score = (len({t for _, _, t in inside}), len(inside))
            if score > best:
                best = score
                low, high = inside[0][0], max(f[1] for f in inside)
                # Centre the occurrences in the window, which stays inside the text.
                first = max(
                    0, min(low - (SNIPPET_WORDS - (high - low + 1)) // 2, total - SNIPPET_WORDS)
                )
                last = min(total, first + SNIPPET_WORDS) - 1
    marks = Sentinels()
    begin = 0 if first == 0 or not spans else spans[first][0]
    end = len(text) if last >= total - 1 or not spans else spans[last][1]
    out, at = [], begin
    for low, high in _merged([(a, b) for a, b, _ in found if a >= first and b <= last]):
        out += [text[at : spans[low][0]], marks.start, text[spans[low][0] : spans[high][1]]]
        out.append(marks.end)
        at = spans[high][1]
    out.append(text[at:end])
    raw = ("…" if begin > 0 else "") + "".join(out) + ("…" if end < len(text) else "")
    return marks.marked(raw)


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Word ranges, overlapping ones made one (a phrase is marked whole)."""
    out: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out
