"""The search query syntax, shared by every backend: plain words, quoted phrases, ``word*``.

A query is a list of terms and a hit must match every one of them (AND):

* ``login bug``      two words;
* ``"session ttl"``  a phrase: its words next to each other, in this order;
* ``migrat*``        a prefix: any word starting with ``migrat`` (at least 2 letters or digits).

A recall (app/services/recall.py: a prompt made into words) asks for any of its terms
instead (``any_term``: OR), ranked as usual, so that a hit matching more of them ranks higher.

Words are compared case-insensitively and without diacritics (``Café`` finds ``cafe``).
Punctuation inside a word splits it into a phrase, as in the text it is compared with:
``fix-login`` is the phrase "fix login", ``summary:login`` the phrase "summary login".
Nothing else is syntax: FTS5's operators (``OR``, ``NOT``, ``NEAR``, ``AND`` in capitals) and
a ``*`` anywhere but at the end of a word are refused with a message (InvalidName on ``q``, a
422), so a query never means something other than what it looks like.

:class:`SearchQuery` is what a backend searches for; :func:`fts5_match` renders it as an
SQLite FTS5 MATCH expression in which every term is a quoted string, so no character a
person typed is ever read as FTS5 syntax. A PostgreSQL backend renders the same terms as a
tsquery.

Snippets mark each matched word with :data:`MARK_START` ... :data:`MARK_END` (STX / ETX),
plain text otherwise: those two characters never occur in a snippet except as markers.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

from app.storage.core.errors import InvalidName, SearchTimeout
from app.storage.core.models import SearchPage
from app.storage.core.patterns import char_class
from app.storage.core.task_rules import scope_tag

if TYPE_CHECKING:
    from app.storage.core.cursor import CursorCodec
    from app.storage.core.names import Scope

T = TypeVar("T")
#: The most hits one page of a search holds.
MAX_LIMIT = 100
CURSOR_VERSION = 1

MAX_QUERY_CHARS = 256
MAX_TERMS = 16
MIN_PREFIX_CHARS = 2
MARK_START = "\x02"
MARK_END = "\x03"
# FTS5 reads these (in capitals, unquoted) as operators; this syntax does not have them.
OPERATORS = frozenset({"AND", "OR", "NOT", "NEAR"})
FIELD = "q"


@dataclass(frozen=True, slots=True)
class QueryTerm:
    """One term: ``text`` as typed (no quotes, no ``*``), a ``phrase`` if it was quoted."""

    text: str
    phrase: bool = False
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class SearchQuery:
    terms: tuple[QueryTerm, ...]
    any_term: bool = False  # a hit matches at least one term (OR), not every one (AND)

    def fingerprint(self) -> str:
        """Identifies the query in a cursor: a page cursor only continues the same query."""
        body = "\x00".join(f"{t.phrase:d}{t.prefix:d}{t.text}" for t in self.terms)
        if self.any_term:
            body = "any\x00" + body
        return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]

    def matches(self, counts: tuple[int, ...] | list[int]) -> bool:
        """Whether an index in which each term matches ``counts[i]`` rows can hold a hit."""
        return any(counts) if self.any_term else all(counts)


def is_refused_control(ch: str) -> bool:
    """A control character no query may hold (tab, newline and carriage return are spaces)."""
    return ord(ch) < 0x20 and ch not in "\t\n\r" or ord(ch) == 0x7F


def _is_space(ch: str) -> bool:
    return ch.isspace() and not is_refused_control(ch)


def _in_word(ch: str) -> bool:
    """A character a word may hold before its end: not a space, not syntax."""
    return not (ch.isspace() or ch in '"*' or is_refused_control(ch))


def _in_phrase(ch: str) -> bool:
    return ch != '"' and not is_refused_control(ch)


def is_content(ch: str) -> bool:
    """A character that makes a word or phrase a term of the query: an ASCII letter or digit,
    or any character beyond ASCII that is not a space. (Punctuation of ASCII alone makes no
    term: ``- &`` asks for nothing.) Among them only letters and digits are searched for (the
    text's words are made of those): a term without one finds nothing by itself and is left
    out of the search, so a query of such terms alone finds nothing."""
    if ord(ch) < 0x80:
        return ch.isalnum()
    return not ch.isspace()


def _count(text: str, test: Callable[[str], bool]) -> int:
    return sum(1 for ch in text if test(ch))


@lru_cache(maxsize=1)
def query_pattern() -> str:
    """The syntax :func:`parse_query` accepts, as one regular expression (anchored; its length,
    at most MAX_QUERY_CHARS, is the OpenAPI document's maxLength). Built from the same
    character tests and constants as the parser (tests/storage/core/test_query_pattern.py
    pins the two to each other): 1 to MAX_TERMS terms, each a word with a character of
    content (:func:`is_content`; not an operator), a prefix (at least MIN_PREFIX_CHARS of them,
    then ``*``) or a quoted phrase with one, and words of ASCII punctuation in between. Every
    class in it is small, or the complement of a small one: generators of matching text
    (schemathesis, hypothesis) spell out each code point a class lists, and draw past a
    lookahead (then filter), so the one left (the operators) rarely refuses a draw."""
    space = char_class(_is_space)
    char = char_class(_in_word)
    content = char_class(lambda ch: _in_word(ch) and is_content(ch))
    inner = char_class(_in_phrase)
    operators = "|".join(sorted(OPERATORS))
    word = f"(?!(?:{operators})(?:{space}|$)){char}*{content}{char}*"
    prefix = f"{char}*" + f"{content}{char}*" * MIN_PREFIX_CHARS + r"\*"
    phrase = f'"{inner}*{content}{inner}*"'
    term = f"(?:{phrase}|{prefix}|{word})"
    skip = char_class(lambda ch: _in_word(ch) and not is_content(ch)) + "+"
    return (
        f"^{space}*(?:{skip}{space}+)*{term}"
        f"(?:{space}+(?:{skip}{space}+)*{term}){{0,{MAX_TERMS - 1}}}"
        f"(?:{space}+{skip})*{space}*$"
    )


def _refuse(text: str, message: str) -> InvalidName:
    return InvalidName(FIELD, text, message)


def _words(text: str) -> int:
    """Letters and digits in ``text`` (what the tokenizer keeps)."""
    return sum(ch.isalnum() for ch in text)


def parse_query(text: object, *, any_term: bool = False) -> SearchQuery:
    """Parse ``text`` in the syntax above, or raise InvalidName (field ``q``) saying why;
    ``any_term``: a hit needs one of the terms, not all of them."""
    if not isinstance(text, str):
        raise InvalidName(FIELD, text, "must be a string")
    if len(text) > MAX_QUERY_CHARS:
        raise _refuse(text, f"is longer than {MAX_QUERY_CHARS} characters")
    if any(is_refused_control(ch) for ch in text):
        raise _refuse(text, "contains control characters")
    terms: list[QueryTerm] = []
    counted = 0  # terms of the syntax, those left out (nothing to search for) included
    i, end = 0, len(text)
    while i < end:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if ch == '"':
            close = text.find('"', i + 1)
            if close < 0:
                raise _refuse(text, 'has a " that starts a phrase but none that ends it')
            inner = text[i + 1 : close]
            i = close + 1
            if i < end and text[i] == "*":
                raise _refuse(text, "a * (prefix) ends one word, not a quoted phrase")
            if i < end and not text[i].isspace():
                raise _refuse(text, 'needs a space after the " that ends a phrase')
            if not _count(inner, is_content):
                raise _refuse(text, "has a quoted phrase without any word in it")
            counted += 1
            if _words(inner):
                terms.append(QueryTerm(" ".join(inner.split()), phrase=True))
            continue
        start = i
        while i < end and not text[i].isspace() and text[i] != '"':
            i += 1
        word = text[start:i]
        if i < end and text[i] == '"':
            raise _refuse(text, 'a " may only start or end a phrase, not sit inside a word')
        if word in OPERATORS:
            raise _refuse(
                text,
                f"{word} is not an operator here: every word must match; to search for the"
                f' word itself write it in lower case or in quotes ("{word}")',
            )
        prefix = word.endswith("*")
        core = word[:-1] if prefix else word
        if "*" in core:
            raise _refuse(text, "a * may only end a word (a prefix search: migrat*)")
        if prefix and _count(core, is_content) < MIN_PREFIX_CHARS:
            raise _refuse(
                text, f"a prefix needs at least {MIN_PREFIX_CHARS} letters or digits before *"
            )
        if not _count(core, is_content):
            continue  # punctuation alone ("-", "&"): nothing to look for
        counted += 1
        if _words(core):
            # A prefix counts only the letters and digits it is searched by: 'a«*' is the word
            # a, since a one-letter prefix would read half the index.
            terms.append(QueryTerm(core, prefix=prefix and _words(core) >= MIN_PREFIX_CHARS))
    if not counted:
        raise _refuse(text, "has no word to search for")
    if counted > MAX_TERMS:
        raise _refuse(text, f"has more than {MAX_TERMS} terms")
    # Empty when every term lacks a letter or digit: such a query finds nothing (backends
    # answer it without searching).
    return SearchQuery(tuple(terms), any_term)


def nothing_to_find(query: object, limit: object) -> SearchPage | None:
    """The answer to a query none of whose terms holds a letter or digit (``"🚀"``): no
    hits, without searching (an empty page whatever the cursor); None for any other query.
    Both backends ask this first, so their engines only ever get terms to look for."""
    check_limit(limit)
    if parse_query(query).terms:
        return None
    return SearchPage(hits=(), next_cursor=None)


def fts5_term(term: QueryTerm) -> str:
    """One term as an FTS5 string (its words become a phrase), ``*`` for a prefix."""
    quoted = '"' + term.text.replace('"', '""') + '"'
    return f"{quoted} *" if term.prefix else quoted


def fts5_match(query: SearchQuery) -> str:
    """The whole query as an FTS5 MATCH expression: every term, all of them required (any
    one of them, for an ``any_term`` query)."""
    return (" OR " if query.any_term else " AND ").join(fts5_term(t) for t in query.terms)


# -- what every backend's search shares besides the syntax ---------------------------------
def check_limit(limit: object) -> None:
    """A page size of 1..MAX_LIMIT, else InvalidName on ``limit``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidName("limit", limit, f"must be between 1 and {MAX_LIMIT}")


def encode_cursor(
    cursors: CursorCodec, kind: str, scope: Scope, query: SearchQuery, position: dict[str, Any]
) -> str:
    """A signed cursor of one search: ``kind`` (the backend's), the project, the query and
    where the page ended (``position``, the backend's own fields)."""
    return cursors.encode(
        {
            "l": kind,
            "v": CURSOR_VERSION,
            "s": scope_tag(scope),
            "q": query.fingerprint(),
            **position,
        }
    )


def decode_cursor(
    cursors: CursorCodec,
    kind: str,
    scope: Scope,
    query: SearchQuery,
    cursor: str,
    position: Callable[[Mapping[str, Any]], T],
) -> T:
    """What ``position`` reads from a cursor :func:`encode_cursor` made for this very search;
    InvalidName on ``cursor`` for any other (another kind, project or query, or fields
    ``position`` refuses with ValueError, KeyError or TypeError)."""
    body = cursors.decode(cursor, "cursor")
    try:
        if (
            body["l"] != kind
            or body["v"] != CURSOR_VERSION
            or body["s"] != scope_tag(scope)
            or body["q"] != query.fingerprint()
        ):
            raise ValueError("issued for another search")
        return position(body)
    except (ValueError, KeyError, TypeError):
        raise InvalidName(
            "cursor", cursor, "is not a cursor this server issued for this search"
        ) from None


SNIPPET_TOKENS = 16
# Seconds one search may take before it answers 503 (MEMORY_SEARCH_TIMEOUT).
DEFAULT_SEARCH_TIMEOUT = 5.0


# The longest a search waits for a slot before it answers 503 (at most its own budget).
SEARCH_WAIT_SECONDS = 2.0


class SearchSlots:
    """How many searches one process runs at once, and how the others wait.

    ``slots`` searches run; up to ``waiting`` more wait, in a short bounded queue, for one to
    end (``wait_seconds`` at most); beyond that, or past the wait, a search answers 503 with
    Retry-After. Searches are short (tens of milliseconds), so a burst queues instead of
    being refused, and the slots keep a flood of costly ones from taking every core.

    Per project: while several slots exist, one project's searches run in all but one of
    them, so another project's search is never queued behind a single busy project. (Its
    waiting searches are not capped apart: a project alone on the server may fill the
    queue.)
    """

    def __init__(self, slots: int, *, waiting: int = 0, wait_seconds: float = 0.0) -> None:
        self.slots = max(1, slots)
        self.waiting = max(0, waiting)
        self.wait_seconds = max(0.0, wait_seconds)
        self._share = self.slots - 1 if self.slots > 1 else 1
        self._turn = threading.Condition()
        self._running = 0
        self._queued = 0
        self._by_project: dict[Hashable, int] = {}

    def _may_run(self, project: Hashable) -> bool:
        return self._running < self.slots and self._by_project.get(project, 0) < self._share

    @contextlib.contextmanager
    def taken(self, project: Hashable = None) -> Iterator[None]:
        deadline = time.monotonic() + self.wait_seconds
        with self._turn:
            if not self._may_run(project):
                if self._queued >= self.waiting:
                    raise SearchTimeout(
                        f"{self._running} searches are running on this worker and"
                        f" {self._queued} waiting already; retry shortly"
                    )
                self._queued += 1
                try:
                    while not self._may_run(project):
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise SearchTimeout(
                                f"no search slot came free on this worker within"
                                f" {self.wait_seconds:g} s; retry shortly"
                            )
                        self._turn.wait(left)
                finally:
                    self._queued -= 1
            self._running += 1
            self._by_project[project] = self._by_project.get(project, 0) + 1
        try:
            yield
        finally:
            with self._turn:
                self._running -= 1
                left_running = self._by_project[project] - 1
                if left_running:
                    self._by_project[project] = left_running
                else:
                    del self._by_project[project]
                self._turn.notify_all()


class SearchBudget:
    """The time one search may take: each step checks it, the database's own statements
    are stopped by it (the tree's SQLite progress handler, PostgreSQL's statement_timeout).
    What a search cannot finish in time answers 503, so no worker thread stays stuck."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def check(self) -> None:
        if self.expired():
            raise self.timeout()

    def timeout(self) -> SearchTimeout:
        return SearchTimeout(
            f"the search took longer than its {self.seconds:g} s budget; narrow it"
            " (more words, a phrase) or retry"
        )


class Sentinels:
    """Per-query snippet markers no stored text contains; :meth:`marked` turns them into
    the public markers after taking those out of the text itself."""

    def __init__(self) -> None:
        token = secrets.token_hex(8)
        self.start = f"\ue000{token}\ue001"
        self.end = f"\ue002{token}\ue003"

    def marked(self, raw: str) -> str:
        text = raw.replace(MARK_START, "\ufffd").replace(MARK_END, "\ufffd")
        text = " ".join(text.split())
        return text.replace(self.start, MARK_START).replace(self.end, MARK_END)


def _flatten(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        out.append(str(value))
    elif isinstance(value, dict):
        for item in value.values():
            _flatten(item, out)
    elif isinstance(value, list):
        for item in value:
            _flatten(item, out)


def meta_text(meta: dict[str, Any]) -> str:
    """The values of a turn's meta (strings and numbers, nested ones too), one a line; keys
    are left out, they name the same fields in every turn."""
    out: list[str] = []
    _flatten(meta, out)
    return "\n".join(out)
