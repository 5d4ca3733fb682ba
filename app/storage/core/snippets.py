"""Snippets: a short fragment of a hit's text with the words the query matched marked.

Both backends cut them here from the stored text, so a hit reads the same on each: the first
of a hit's sources (a turn's summary, meta values, task id; a memory's content, path) in which
a term occurs, :data:`SNIPPET_TOKENS` words around the most terms, each occurrence marked.
A word is compared as the indexes compare it: without case or diacritics, ASCII punctuation
splitting it (``fix-login`` is two words).

**Bounded per hit, whatever the text.** Only a window of at most :data:`SCAN_CHARS`
characters is split into words: the start of the text when a term occurs there; else the
stretch around the first place further on where a term's first word is written as in the
query (up to :data:`MAX_CANDIDATES` places are tried), found by one regular-expression scan
at C speed. Within the window the fragment with the most terms is found in one pass. So a
megabyte of matching words costs what a page of them does; the price is that an occurrence
past the window that differs from the query by its diacritics only is not looked for (the
snippet then shows the start of the text, unmarked).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from app.storage.core.query import SNIPPET_TOKENS, QueryTerm, Sentinels

SCAN_CHARS = 16 * 1024
MAX_CANDIDATES = 8
# A word: letters and digits, with the combining marks of its letters; anything else (ASCII
# punctuation above all) splits words, as in both indexes.
_MARKS = r"\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
_WORD = re.compile(rf"(?:[^\W_]|[{_MARKS}])+")
_NOT_WORD = re.compile(rf"(?:[^\w{_MARKS}]|_)+")
# Letters the indexes fold that have no decomposition to strip a mark from.
_LETTERS = str.maketrans(
    {"ø": "o", "æ": "ae", "œ": "oe", "đ": "d", "ð": "d", "ł": "l", "ħ": "h", "ı": "i", "þ": "th"}
)


def fold(word: str) -> str:
    """A word as the indexes compare it: without diacritics, in lower case."""
    if word.isascii():
        return word.lower()
    bare = "".join(c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c))
    return bare.casefold().translate(_LETTERS)


@dataclass(frozen=True, slots=True)
class Term:
    """A query term as a snippet looks for it: its words in order, the last one a prefix or
    not, and its first word as the query wrote it (what the scan past the window finds)."""

    words: tuple[str, ...]
    prefix: bool
    written: str

    @staticmethod
    def of(term: QueryTerm) -> Term:
        found = [m.group() for m in _WORD.finditer(term.text)]
        return Term(tuple(fold(w) for w in found), term.prefix, found[0] if found else "")

    def at(self, words: Sequence[str], i: int) -> bool:
        n = len(self.words)
        if i + n > len(words) or list(words[i : i + n - 1]) != list(self.words[:-1]):
            return False
        last = words[i + n - 1]
        return last.startswith(self.words[-1]) if self.prefix else last == self.words[-1]


def terms_of(query: Sequence[QueryTerm]) -> list[Term]:
    return [Term.of(t) for t in query]


def snippet(sources: Sequence[str], terms: Sequence[Term]) -> str:
    """A fragment of the first of ``sources`` in which a term occurs (else of the last one),
    every occurrence in it marked."""
    scan = _scanner(terms)
    for n, text in enumerate(sources):
        window = _window(text, terms, scan)
        if window is not None:
            return _fragment(text, *window)
        if n == len(sources) - 1:
            return _fragment(text, _spans(text, 0, min(len(text), SCAN_CHARS)), [])
    return ""


# -- the window ------------------------------------------------------------------------------
Spans = list[tuple[int, int]]
Found = list[tuple[int, int, int]]  # (first word, last word, term), indexes into the spans


def _spans(text: str, start: int, end: int) -> Spans:
    return [(m.start(), m.end()) for m in _WORD.finditer(text, start, end)]


def _matches(text: str, spans: Spans, terms: Sequence[Term]) -> Found:
    """(first word, last word, term) of every occurrence of a term among ``spans``."""
    words = [fold(text[a:b]) for a, b in spans]
    where: dict[str, list[int]] = {}
    for i, word in enumerate(words):
        where.setdefault(word, []).append(i)
    found: Found = []
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


def _scanner(terms: Sequence[Term]) -> re.Pattern[str] | None:
    """Where a term's first word may start, as written in the query or folded."""
    options = set()
    for term in terms:
        if not term.words:
            continue
        tail = "" if term.prefix and len(term.words) == 1 else rf"(?![^\W_]|[{_MARKS}])"
        for word in {term.written, term.words[0]}:
            options.add(re.escape(word) + tail)
    if not options:
        return None
    return re.compile(rf"(?<![^\W_])(?:{'|'.join(sorted(options))})", re.IGNORECASE)


def _window(
    text: str, terms: Sequence[Term], scan: re.Pattern[str] | None
) -> tuple[Spans, Found] | None:
    """The words of a bounded stretch of ``text`` and the occurrences among them; None when
    no term occurs (as far as the scan looks)."""
    head = min(len(text), SCAN_CHARS)
    spans = _spans(text, 0, _word_end(text, head))
    found = _matches(text, spans, terms)
    if found or head == len(text) or scan is None:
        return (spans, found) if found else None
    at = head
    for _ in range(MAX_CANDIDATES):
        hit = scan.search(text, at)
        if hit is None:
            return None
        start = _word_start(text, max(0, hit.start() - SCAN_CHARS // 4))
        end = _word_end(text, min(len(text), start + SCAN_CHARS))
        spans = _spans(text, start, end)
        found = _matches(text, spans, terms)
        if found:
            return spans, found
        at = hit.end()
    return None


def _word_start(text: str, at: int) -> int:
    """``at``, moved forward past a word it falls inside (a window never starts mid-word)."""
    if at == 0:
        return 0
    gap = _NOT_WORD.search(text, at)
    return len(text) if gap is None else gap.end() if gap.start() == at else gap.start()


def _word_end(text: str, at: int) -> int:
    """``at``, moved back to before a word it falls inside."""
    if at >= len(text):
        return len(text)
    while at > 0 and _WORD.match(text, at - 1, at + 1) and _WORD.match(text, at, at + 1):
        at -= 1
    return at


# -- the fragment ----------------------------------------------------------------------------
def _best(found: Found) -> tuple[int, int] | None:
    """(first, last) word of the :data:`SNIPPET_TOKENS`-word stretch that holds the most
    terms (then the most occurrences), the first such; one pass over the occurrences."""
    if not found:
        return None
    size = SNIPPET_TOKENS
    by_end = sorted(range(len(found)), key=lambda k: found[k][1])
    added = [False] * len(found)
    gone = [False] * len(found)
    counts: dict[int, int] = {}
    inside = 0
    add = drop = 0
    best: tuple[int, int] = (-1, 0)
    best_at = 0
    for i, (start, _, _) in enumerate(found):
        while drop < len(found) and found[drop][0] < start:
            if added[drop] and not gone[drop]:
                t = found[drop][2]
                counts[t] -= 1
                inside -= 1
                if not counts[t]:
                    del counts[t]
            gone[drop] = True
            drop += 1
        while add < len(by_end) and found[by_end[add]][1] < start + size:
            k = by_end[add]
            if not gone[k]:
                added[k] = True
                counts[found[k][2]] = counts.get(found[k][2], 0) + 1
                inside += 1
            add += 1
        score = (len(counts), inside)
        if score > best:
            best, best_at = score, i
    start = found[best_at][0]
    members = [f for f in found[best_at:] if f[0] < start + size and f[1] < start + size]
    return members[0][0], max(f[1] for f in members)


def _fragment(text: str, spans: Spans, found: Found) -> str:
    """:data:`SNIPPET_TOKENS` words of ``spans`` around the most terms, marked."""
    size = SNIPPET_TOKENS
    total = len(spans)
    first, last = 0, min(total, size) - 1
    chosen = _best(found)
    if chosen is not None:
        low, high = chosen
        # Centre the occurrences in the fragment, which stays inside the window.
        first = max(0, min(low - (size - (high - low + 1)) // 2, total - size))
        last = min(total, first + size) - 1
    marks = Sentinels()
    # The text's own start and end when the fragment reaches them (its punctuation kept).
    at_start = not spans or (first == 0 and spans[0][0] == _first_word(text))
    at_end = not spans or (last >= total - 1 and _WORD.search(text, spans[-1][1]) is None)
    begin = 0 if at_start else spans[first][0]
    end = len(text) if at_end else spans[last][1]
    out, at = [], begin
    for lo, hi in _merged([(a, b) for a, b, _ in found if a >= first and b <= last]):
        out += [text[at : spans[lo][0]], marks.start, text[spans[lo][0] : spans[hi][1]]]
        out.append(marks.end)
        at = spans[hi][1]
    out.append(text[at:end])
    raw = ("…" if begin > 0 else "") + "".join(out) + ("…" if end < len(text) else "")
    return marks.marked(raw)


def _first_word(text: str) -> int:
    """Where the text's first word starts (-1: it has none)."""
    first = _WORD.search(text)
    return -1 if first is None else first.start()


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Word ranges, overlapping ones made one (a phrase is marked whole)."""
    out: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out
