"""Chunks: the pieces of a turn or memory that are embedded, one vector each.

Text is cut at Markdown section headings (a line starting with ``#``), and a section longer
than the cap at paragraph breaks, then at line breaks, then at spaces, then anywhere: no chunk
is longer than ``max_chars``. A chunk keeps the heading of its section, so "## Decision" stays
with what was decided. Empty chunks are dropped. The cut depends on the text alone, so the
same text always gives the same chunks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CHARS = 1200
# Chunks per source at most: a 1 MiB document is embedded by its first MAX_CHUNKS pieces.
MAX_CHUNKS = 64
_HEADING = re.compile(r"^#{1,6}[ \t]", re.MULTILINE)
_BREAKS = ("\n\n", "\n", " ")


@dataclass(frozen=True)
class Chunk:
    """A piece of a text: its ordinal and the text embedded for it."""

    ordinal: int
    text: str


def split(text: str, *, max_chars: int = MAX_CHARS, max_chunks: int = MAX_CHUNKS) -> list[Chunk]:
    """Cut ``text`` into at most ``max_chunks`` chunks of at most ``max_chars`` characters."""
    pieces: list[str] = []
    for section in _sections(text):
        heading = section.split("\n", 1)[0] if _HEADING.match(section) else ""
        for i, piece in enumerate(_cap(section, max_chars)):
            if i and heading and len(heading) + 1 + len(piece) <= max_chars:
                piece = f"{heading}\n{piece}"
            if piece.strip():
                pieces.append(piece.strip())
            if len(pieces) >= max_chunks:
                return [Chunk(n, p) for n, p in enumerate(pieces)]
    return [Chunk(n, p) for n, p in enumerate(pieces)]


def _sections(text: str) -> list[str]:
    starts = [m.start() for m in _HEADING.finditer(text)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def _cap(text: str, max_chars: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_chars``, at the widest break that fits."""
    out: list[str] = []
    while len(text) > max_chars:
        window = text[: max_chars + 1]
        cut = -1
        for sep in _BREAKS:
            cut = window.rfind(sep, max_chars // 3)
            if cut > 0:
                break
        if cut <= 0:
            cut = max_chars
        out.append(text[:cut])
        text = text[cut:].lstrip("\n ")
    out.append(text)
    return out
