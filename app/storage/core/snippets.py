"""Snippets: a short fragment of a hit's text with the words the query matched marked.

Both backends cut them here from the stored text, so a hit reads the same on each: the first
of a hit's sources (a turn's summary, meta values, task id; a memory's content, path) in which
a term occurs, :data:`SNIPPET_TOKENS` words around the most terms, each occurrence marked.
A word is compared as the indexes compare it: without case or diacritics, ASCII punctuation
splitting it (``fix-login`` is two words).

**Bounded per hit, whatever the text.** A snippet looks at a window of at most
:data:`SCAN_CHARS` characters: the start of the text when a term occurs there; else the
stretch around the first place from the window's last words on (a phrase may cross its end)
where a term's first word is written as in the query (up to :data:`MAX_CANDIDATES` places
are tried). The price is that an occurrence past the window that differs from the query by
its diacritics only is not looked for (the snippet then shows the start of the text,
unmarked).

**Only the words near a match are split and folded.** Within the window the places where a
term may start are found at C speed: a find of the query's folded words in the lower-cased
window, which finds every word written in ASCII that folds to one; and the words with a
non-ASCII letter, the only ones the find can miss, folded one by one. Each place is checked
as the indexes compare words (a one-word term's find, by the characters around it alone);
the words between two occurrences are counted by a regular expression, up to
:data:`SNIPPET_TOKENS` (no fragment spans more); and only the chosen fragment's words are
split. So a snippet costs the occurrences in its window, not its words, and the fragment is
the one a split of the whole window gives.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice

from app.storage.core.query import SNIPPET_TOKENS, QueryTerm, Sentinels

SCAN_CHARS = 16 * 1024
MAX_CANDIDATES = 8
# A word: letters and digits, with the combining marks of its letters; anything else (ASCII
# punctuation above all) splits words, as in both indexes.
_MARKS = r"\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
# (ASCII letters and digits first, in runs: the same words, split at twice the speed.)
_LETTER = rf"[a-zA-Z0-9]+|[^\W_]|[{_MARKS}]"
_WORD = re.compile(rf"(?:{_LETTER})+")
_NOT_WORD = re.compile(rf"(?:[^\w{_MARKS}]|_)+")
# SNIPPET_TOKENS words, each followed by what splits words (possessive: no backtracking).
_WORDS = re.compile(rf"(?:(?:{_LETTER})++(?:[^\w{_MARKS}]|_)++){{{SNIPPET_TOKENS}}}")
# A gap between two occurrences this short (characters) is counted in one pass.
_SHORT_GAP = 16 * SNIPPET_TOKENS
# Where a letter, digit or mark outside ASCII may be: a word holding one may fold to letters
# it does not spell (``Café`` to ``cafe``), so the query's own spelling can miss it. General
# punctuation (dashes, quotes, ellipsis) holds none.
_FOREIGN = re.compile(r"[^\x00-\x7f\u2000-\u206f]")
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

    def starts(self, word: str) -> bool:
        """Whether an occurrence may start with ``word`` (folded)."""
        if not self.words:
            return False
        if self.prefix and len(self.words) == 1:
            return word.startswith(self.words[0])
        return word == self.words[0]

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
    plan = _plan(tuple(terms))
    for n, text in enumerate(sources):
        cut = _cut(text, terms, plan)
        if cut is not None:
            return cut
        if n == len(sources) - 1:
            # Its first words, and whether more follow.
            first = islice(_words(text, 0, min(len(text), SCAN_CHARS)), SNIPPET_TOKENS + 1)
            return _fragment(text, [m.span() for m in first], [])
    return ""


# -- the window ------------------------------------------------------------------------------
Spans = list[tuple[int, int]]
Found = list[tuple[int, int, int]]  # (first word, last word, term), indexes into the spans


def _words(text: str, start: int, end: int) -> Iterator[re.Match[str]]:
    return _WORD.finditer(text, start, end)


@lru_cache(maxsize=256)
def _scanner(terms: tuple[Term, ...]) -> re.Pattern[str] | None:
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


def _cut(text: str, terms: Sequence[Term], plan: _Plan) -> str | None:
    """The fragment of ``text`` around the most terms, marked; None when no term occurs (as
    far as the scan looks)."""
    scan = plan.scan
    if scan is None:
        return None
    head = min(len(text), SCAN_CHARS)
    end = _word_end(text, head)
    cut = _cut_window(text, 0, end, terms, plan)
    if cut is not None or head == len(text):
        return cut
    # From the window's last words on: a phrase may start in it and end past it.
    last = _before(text, 0, end, max(len(t.words) for t in terms) - 1)
    at = last[0][0] if last else head
    for _ in range(MAX_CANDIDATES):
        hit = scan.search(text, at)
        if hit is None:
            return None
        start = _word_start(text, max(0, hit.start() - SCAN_CHARS // 4))
        end = _word_end(text, min(len(text), start + SCAN_CHARS))
        cut = _cut_window(text, start, end, terms, plan)
        if cut is not None:
            return cut
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


@dataclass(frozen=True, slots=True)
class _Plan:
    """How a query's terms are looked for: ``firsts`` (their first words folded, the ASCII
    ones) by a plain find in the lower-cased window; ``scan`` past the window. ``words``:
    every term is one word spelled in ASCII, so a find that is a whole word (or starts
    one, for a prefix) is an occurrence as it is."""

    firsts: tuple[str, ...]
    scan: re.Pattern[str] | None
    words: bool


@lru_cache(maxsize=256)
def _plan(terms: tuple[Term, ...]) -> _Plan:
    firsts = {t.words[0] for t in terms if t.words and t.words[0].isascii()}
    words = all(len(t.words) == 1 and t.words[0].isascii() for t in terms)
    return _Plan(tuple(sorted(firsts)), _scanner(terms), words)


def _in_word(text: str, at: int) -> bool:
    """Whether the character at ``at`` belongs to a word."""
    c = text[at]
    return c.isalnum() if c.isascii() else _WORD.match(c) is not None


def _finds(window: str, word: str) -> Iterator[int]:
    """Where ``window`` holds ``word``."""
    at = window.find(word)
    while at >= 0:
        yield at
        at = window.find(word, at + len(word))


def _foreign(text: str, start: int, end: int) -> list[int]:
    """Where each word of ``text[start:end]`` with a non-ASCII letter starts."""
    out = []
    at = start
    while (letter := _FOREIGN.search(text, at, end)) is not None:
        first = letter.start()
        rest = _WORD.match(text, first, end)
        if rest is None:  # punctuation, a symbol
            at = first + 1
            continue
        while first > start and _WORD.match(text, first - 1, first):
            first -= 1
        out.append(first)
        at = rest.end()
    return out


def _occurrences(
    text: str, start: int, end: int, terms: Sequence[Term], plan: _Plan
) -> list[tuple[int, int, int]]:
    """(where, words, term) of each occurrence of a term in ``text[start:end]``, in the order
    of a split of it into words: by where it starts, then by its length, then by term.

    Where a term may start: where the lower-cased window spells its first word (every word
    written in ASCII that folds to it), and every word with a non-ASCII letter (the only
    ones whose folded form the find can miss). Each is checked as the indexes compare words;
    a find of a one-word term, by the characters around it alone."""
    window = text[start:end].lower()
    found: set[tuple[int, int, int]] = set()
    places: set[int] = set()
    # Lower-casing kept every offset (it lengthens a few letters, such as İ); else the scan.
    kept = len(window) == end - start
    if kept and plan.words:
        for t, term in enumerate(terms):
            size = len(term.words[0])
            for at in _finds(window, term.words[0]):
                place, after = start + at, start + at + size
                if place > start and _in_word(text, place - 1):
                    continue  # inside a word
                if term.prefix or after >= end or not _in_word(text, after):
                    found.add((place, 1, t))
    elif kept:
        places.update(start + at for word in plan.firsts for at in _finds(window, word))
    elif plan.scan is not None:
        places.update(m.start() for m in plan.scan.finditer(text, start, end))
    if not text.isascii():
        places.update(_foreign(text, start, end))
    for place in places:
        if place > start and _in_word(text, place - 1):
            continue  # inside a word
        first = _WORD.match(text, place, end)
        if first is None:
            continue
        head = fold(first.group())
        starting = [t for t, term in enumerate(terms) if term.starts(head)]
        if not starting:
            continue
        words = [head]
        need = max(len(terms[t].words) for t in starting)
        if need > 1:
            more = _words(text, first.end(), end)
            words += [fold(m.group()) for _, m in zip(range(need - 1), more, strict=False)]
        found.update((place, len(terms[t].words), t) for t in starting if terms[t].at(words, 0))
    return sorted(found)


def _cut_window(text: str, start: int, end: int, terms: Sequence[Term], plan: _Plan) -> str | None:
    """The fragment of ``text[start:end]`` around the most terms, marked; None when no term
    occurs in it."""
    occurrences = _occurrences(text, start, end, terms, plan)
    if not occurrences:
        return None
    # Each occurrence's word index, counted from the first one. A gap of SNIPPET_TOKENS words
    # or more is counted as that many: no stretch of the fragment's size spans it either way.
    found: Found = []
    index, previous = 0, occurrences[0][0]
    for place, n, t in occurrences:
        if place != previous:
            # One pass: a short gap counted, a long one matched against SNIPPET_TOKENS words.
            if place - previous <= _SHORT_GAP or not _WORDS.match(text, previous, place):
                index += min(SNIPPET_TOKENS, len(_WORD.findall(text, previous, place)))
            else:
                index += SNIPPET_TOKENS
            previous = place
        found.append((index, index + n - 1, t))
    at, high = _best(found)
    low = found[at][0]
    # The fragment's words around the chosen occurrences, split as a split of the whole
    # window would give them: the occurrences centred (``pad`` words before them), or
    # moved back from the window's end to keep SNIPPET_TOKENS words.
    size = SNIPPET_TOKENS
    place = occurrences[at][0]
    pad = max(0, (size - (high - low + 1)) // 2)
    before = _before(text, start, place, pad)
    after = [m.span() for m in islice(_words(text, place, end), size - len(before))]
    if len(before) + len(after) < size:
        before = _before(text, start, place, size - len(after))
    spans = before + after
    word = {a: i for i, (a, _) in enumerate(spans)}
    near = [(word[p], word[p] + n - 1, t) for p, n, t in occurrences if p in word]
    chosen = (word[place], word[place] + high - low)
    return _fragment(text, spans, [f for f in near if f[1] < len(spans)], chosen)


def _before(text: str, start: int, at: int, count: int) -> Spans:
    """The last ``count`` words of ``text[start:at]`` (all of them when it has fewer)."""
    if count <= 0:
        return []
    reach = 8 * count
    while True:
        low = max(start, at - reach)
        spans = [m.span() for m in _words(text, low, at)]
        # Past ``start`` the first word split may be the tail of one: keep it out.
        if low == start or len(spans) > count:
            return spans[-count:]
        reach *= 4


# -- the fragment ----------------------------------------------------------------------------
def _best(found: Found) -> tuple[int, int]:
    """The first of the :data:`SNIPPET_TOKENS`-word stretches that hold the most terms (then
    the most occurrences), starting at an occurrence: that occurrence's position in
    ``found``, and the last word of the occurrences in the stretch; one pass over ``found``
    (not empty)."""
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
    # A phrase longer than the fragment fits in no stretch: the fragment starts at it.
    ends = [f[1] for f in found[best_at:] if f[0] < start + size and f[1] < start + size]
    return best_at, max(ends, default=start + size - 1)


def _fragment(text: str, spans: Spans, found: Found, chosen: tuple[int, int] | None = None) -> str:
    """:data:`SNIPPET_TOKENS` words of ``spans`` around ``chosen`` (the first and last word of
    the occurrences to show; else the first words), the occurrences among them marked."""
    size = SNIPPET_TOKENS
    total = len(spans)
    first, last = 0, min(total, size) - 1
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
