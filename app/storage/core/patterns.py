"""Regular expressions spelled from the predicates the rules check characters with.

A rule that refuses characters by a Python predicate (a Unicode category, ``str.isspace``,
NFC) is stated for the OpenAPI document as a character class listing exactly the code points
the predicate picks, computed here from the predicate itself: the class and the check cannot
drift apart, and the class means the same under Python's ``re`` and ECMA-262/Rust regexes
(ranges of code points written as characters; no ``\\p{...}``, whose tables follow each
engine's own Unicode version). Surrogates are never listed: no JSON text carries a lone one.
"""

from __future__ import annotations

import itertools
import sys
import unicodedata
from collections.abc import Callable
from functools import lru_cache

# Characters that mean something inside a character class, and the ASCII controls, are
# written as escapes; every other character as itself.
_CLASS_SPECIAL = frozenset("\\]^-[")


def _char(code: int) -> str:
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    ch = chr(code)
    return f"\\{ch}" if ch in _CLASS_SPECIAL else ch


@lru_cache(maxsize=1)
def _category_runs() -> tuple[tuple[int, int, str], ...]:
    """The code space as runs (first, last, category) of one Unicode category each."""
    categories = map(unicodedata.category, map(chr, range(sys.maxunicode + 1)))
    runs: list[tuple[int, int, str]] = []
    first = 0
    for category, run in itertools.groupby(categories):
        last = first + len(list(run)) - 1
        runs.append((first, last, category))
        first = last + 1
    return tuple(runs)


# Code points with no character of their own, each of which has every property of the others
# of its category: a predicate on properties answers alike for all of them.
_ALIKE = frozenset({"Cn", "Co"})


@lru_cache(maxsize=32)
def char_class(predicate: Callable[[str], bool], *, negate: bool = False) -> str:
    """``[...]`` of every code point ``predicate`` holds for (``[^...]`` with ``negate``),
    surrogates left out. ``predicate`` must depend on a character's Unicode properties
    only: it is asked once for each run of unassigned or private-use code points (four fifths
    of the code space), which keeps building a class to a fraction of a second."""
    ranges: list[tuple[int, int]] = []

    def add(low: int, high: int) -> None:
        if ranges and ranges[-1][1] == low - 1:
            ranges[-1] = (ranges[-1][0], high)
        else:
            ranges.append((low, high))

    for first, last, category in _category_runs():
        if category == "Cs":
            continue
        if category in _ALIKE:
            if predicate(chr(first)):
                add(first, last)
            continue
        for code in range(first, last + 1):
            if predicate(chr(code)):
                add(code, code)
    if negate:
        return _written(_complement(ranges), negate=False)
    return _written(ranges, negate=False)


# Every code point but the surrogates.
_SCALARS = sys.maxunicode + 1 - 0x800


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    start = 0
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= sys.maxunicode:
        out.append((start, sys.maxunicode))
    # The surrogates are in no class: take them out of what the complement lists.
    return [piece for low, high in out for piece in _without_surrogates(low, high)]


def _without_surrogates(low: int, high: int) -> list[tuple[int, int]]:
    pieces = []
    if low < 0xD800:
        pieces.append((low, min(high, 0xD7FF)))
    if high > 0xDFFF:
        pieces.append((max(low, 0xE000), high))
    return pieces


def _written(ranges: list[tuple[int, int]], *, negate: bool) -> str:
    """The class of ``ranges`` (or of all but them), written the shorter way to enumerate: a
    generator of matching strings (hypothesis) lists every code point a class names, so a
    class of most of the code space is written as ``[^...]`` of what it leaves out."""
    size = sum(high - low + 1 for low, high in ranges)
    if size > _SCALARS // 2:
        ranges, negate = _complement(ranges), not negate
    body = "".join(
        _char(low) if low == high else f"{_char(low)}-{_char(high)}" for low, high in ranges
    )
    return f"[{'^' if negate else ''}{body}]"
