"""The few server rules the client applies itself, restated so it imports nothing of the server.

tests/client/test_rules.py checks each against the server's own on many generated inputs,
so the two cannot drift apart.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# The prefix of the server's temp files; it also refuses memory path segments that start
# with it. The mount skips local files named so, and writes its own temp files with it.
TMP_PREFIX = ".~tmp-"

# An artifact: its name (the API's pattern; never "." or "..", never ending in "."), the
# most bytes it may hold (the API's documented limit; a server set lower refuses with 413),
# how many one turn's write takes, and a Content-Type the server keeps (RFC 9110's
# type/subtype, then parameters of printable ASCII).
ARTIFACT_NAME_PATTERN = r"[A-Za-z0-9._-]{1,128}"
MAX_ARTIFACT_BYTES = 50 * 1024 * 1024
MAX_ARTIFACTS_PER_WRITE = 32
MAX_CONTENT_TYPE_CHARS = 255
_ARTIFACT_NAME_RE = re.compile(ARTIFACT_NAME_PATTERN)
_CONTENT_TYPE_RE = re.compile(
    r"[A-Za-z0-9!#$&^_.+-]{1,127}/[A-Za-z0-9!#$&^_.+-]{1,127}(\s*;[ -~]*)?", re.ASCII
)

# The files agents upload most, which Python's mimetypes names application/octet-stream or
# not at all: a text type, so that the console shows them rather than offering a download.
TEXT_TYPES = {
    ".log": "text/plain; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
    ".diff": "text/x-diff; charset=utf-8",
    ".patch": "text/x-diff; charset=utf-8",
    ".json": "application/json",
}
TEXT_TYPES_HELP = ", ".join(TEXT_TYPES)  # ".log, .txt, .md, .diff, .patch, .json"


def guess_content_type(name: str) -> str:
    """An artifact's Content-Type from its name: TEXT_TYPES, else what mimetypes says, else
    ``application/octet-stream``."""
    dot = name.rfind(".")
    found = TEXT_TYPES.get(name[dot:].lower()) if dot > 0 else None
    if found is not None:
        return found
    import mimetypes

    return mimetypes.guess_type(name)[0] or "application/octet-stream"


_ULID = r"[0-9A-HJKMNP-TV-Z]{26}"
_STORE_ID_RE = re.compile(rf"memstore_{_ULID}")
_SLUG_RUN = re.compile(r"[^a-z0-9]+")


def is_store_id(value: Any) -> bool:
    return isinstance(value, str) and _STORE_ID_RE.fullmatch(value) is not None


def slugify(name: str) -> str:
    """The mount slug: lowercased, runs of anything but ASCII letters/digits → one hyphen."""
    return _SLUG_RUN.sub("-", name.lower()).strip("-")


def artifact_name_fault(name: str) -> str | None:
    """Why the server would refuse ``name`` as an artifact's name; None when it would not."""
    if not name.isascii() or not _ARTIFACT_NAME_RE.fullmatch(name):
        return f"must match {ARTIFACT_NAME_PATTERN}"
    if name in (".", ".."):
        return "'.' and '..' are not artifact names"
    return None


def is_content_type(value: str) -> bool:
    """Whether the server keeps ``value`` as an artifact's Content-Type."""
    return len(value) <= MAX_CONTENT_TYPE_CHARS and _CONTENT_TYPE_RE.fullmatch(value) is not None


# A memory of a store: the most bytes of UTF-8 its content may hold, and the rules of its
# path (the memory-stores API's, and the server's own: a segment is a file name on disk).
MAX_MEMORY_CONTENT_BYTES = 102_400
MAX_MEMORY_PATH_BYTES = 1024
MAX_MEMORY_PATH_SEGMENTS = 20
MAX_MEMORY_SEGMENT_BYTES = 255


def _refused_char(ch: str) -> bool:
    # Control and format characters, lone surrogates, and the line and paragraph separators.
    return unicodedata.category(ch) in ("Cc", "Cf", "Cs") or ch in "\u2028\u2029"


def memory_path_fault(path: str) -> str | None:
    """Why the server would refuse ``path`` as a memory's path; None when it would not."""
    if not path.startswith("/"):
        return "it does not start with /"
    if any(_refused_char(ch) for ch in path):
        return "it contains a control or format character"
    if len(path.encode("utf-8")) > MAX_MEMORY_PATH_BYTES:
        return f"it is longer than {MAX_MEMORY_PATH_BYTES} bytes"
    if not unicodedata.is_normalized("NFC", path):
        return "it is not NFC-normalized"
    segments = path[1:].split("/")
    if len(segments) > MAX_MEMORY_PATH_SEGMENTS:
        return f"it has more than {MAX_MEMORY_PATH_SEGMENTS} segments"
    for segment in segments:
        if segment in ("", ".", ".."):
            return "it has an empty, . or .. segment"
        if len(segment.encode("utf-8")) > MAX_MEMORY_SEGMENT_BYTES:
            return f"a name in it is longer than {MAX_MEMORY_SEGMENT_BYTES} bytes"
        if segment.startswith(TMP_PREFIX):
            return f"a name in it starts with {TMP_PREFIX!r}, which the server reserves"
    return None
