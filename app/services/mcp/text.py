"""What a tool's result shows, bounded: text cut at a line end, as many lines or names as
fit, a search hit's snippet on one line, and the newest sections of project.md. Every bound
says what was left out, so that the model can ask for the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.schemas.mcp import OUTPUT_CHARS
from app.storage.core.models import SearchHit
from app.storage.core.names import Scope
from app.storage.core.query import MARK_END, MARK_START
from app.storage.interface import StorageBackend

# UTF-8 takes at most 4 bytes a character: reading this many bytes of project.md per
# character asked for bounds the read, whatever the digest's size.
UTF8_MAX = 4
# The smallest section project.md can hold ("\n## x\n\nLatest turn: 0, updated <time>\n\n")
# and the most a head gives.
SECTION_MIN = 50
DIGEST_MAX_SECTIONS = 1000
TAIL_ROOM = 300  # kept free for the line that says what was left out


def clip(text: str, limit: int, note: str) -> str:
    """``text`` cut to ``limit`` characters at a line end, with ``note`` saying so."""
    if len(text) <= limit:
        return text
    room = max(0, limit - len(note) - 2)
    cut = text.rfind("\n", 0, room)
    if cut < room // 2:
        cut = room
    return text[:cut].rstrip() + "\n" + note


def fit_lines(head: list[str], items: list[str], tail: Callable[[int], str]) -> tuple[str, int]:
    """``head`` then as many ``items`` as fit in OUTPUT_CHARS, and how many that is; when
    some are left out, ``tail(shown)`` says so."""
    out = "\n".join(head)
    for shown, item in enumerate(items):
        if len(out) + 1 + len(item) + TAIL_ROOM > OUTPUT_CHARS:
            return out + "\n" + tail(shown), shown
        out += "\n" + item
    return out, len(items)


def joined_count(items: list[str], limit: int) -> int:
    """How many of ``items`` :func:`joined` shows."""
    used = 0
    for shown, item in enumerate(items):
        if used + len(item) + 2 > limit:
            return shown
        used += len(item) + 2
    return len(items)


def joined(items: list[str], limit: int) -> str:
    """``items`` joined with commas, as many as fit in about ``limit`` characters, then how
    many were left out."""
    shown = joined_count(items, limit)
    if shown < len(items):
        return ", ".join(items[:shown]) + f" … and {len(items) - shown} more not listed"
    return ", ".join(items)


def compact(value: Any, limit: int) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fit_object(value: dict[str, Any], limit: int) -> tuple[dict[str, Any], int]:
    """The keys of ``value``, in :func:`compact`'s order, whose JSON fits in ``limit``
    characters with them, and how many keys were left out. A structured result cannot cut a
    value in the middle as :func:`compact` cuts text: a key is there whole or not at all."""
    kept: dict[str, Any] = {}
    used = 2  # the braces
    for key in sorted(value):
        # "key": value, its braces standing for the ", " before the next key
        size = len(json.dumps({key: value[key]}, ensure_ascii=False))
        if used + size > limit:
            continue
        kept[key] = value[key]
        used += size
    return kept, len(value) - len(kept)


def search_snippet(hit: SearchHit) -> str:
    """A hit's snippet on one line, its matches in **bold**."""
    return " ".join(hit.snippet.replace(MARK_START, "**").replace(MARK_END, "**").split())


def read_digest_head(storage: StorageBackend, scope: Scope, max_chars: int) -> tuple[str, bool]:
    """The start of ``scope``'s project.md, at most ``max_chars`` characters of whole
    sections (a part of the first when not even that fits), and whether more is left.

    Asks for no more sections than could fit (each is SECTION_MIN bytes at least) and reads
    at most UTF8_MAX bytes a character: a 100 MB digest costs what a small one does.
    """
    sections = min(DIGEST_MAX_SECTIONS, max(1, max_chars // SECTION_MIN))
    file, _ = storage.tasks.open_digest_head(scope, limit=sections)
    want = max_chars * UTF8_MAX
    chunks: list[bytes] = []
    got = 0
    ended = False
    try:
        while got < want:
            chunk = file.read(want - got)
            if not chunk:
                ended = True
                break
            chunks.append(chunk)
            got += len(chunk)
        ended = ended or not file.read(1)
    finally:
        file.close()
    # A cut can split a character: drop the broken tail, not the text.
    text = b"".join(chunks).decode("utf-8", errors="ignore")
    count = text.count("\n## ")
    if ended and len(text) <= max_chars:
        return text, count >= sections  # as many as asked for: there may be more
    text = text[:max_chars]
    first, last = text.find("\n## "), text.rfind("\n## ")
    if last > first >= 0:
        text = text[:last]  # whole sections only, once at least one fits
    return text.rstrip("\n") + "\n", True
