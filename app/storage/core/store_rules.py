"""Name, path and value rules of the memory-stores API, and the ids it hands out.

Every value that reaches the filesystem passes through here first: memory paths become
file paths under a store's ``memories/`` directory, so the rules include the filesystem's
own (a name component is at most 255 bytes on ext4) and our reserved temp-file prefix.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any

from app.storage.core.errors import InvalidName
from app.storage.core.names import (
    STORE_ID_RE,
    TMP_PREFIX,
)
from app.storage.core.patterns import char_class

MAX_PATH_BYTES = 1024
MAX_PATH_SEGMENTS = 20
MAX_SEGMENT_BYTES = 255  # NAME_MAX of ext4, xfs, btrfs
MAX_CONTENT_BYTES = 102_400
MAX_NAME_CHARS = 255
MAX_DESCRIPTION_CHARS = 1024
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512

SHA256_PATTERN = "[0-9a-f]{64}"
_SHA256_RE = re.compile(SHA256_PATTERN)
_SLUG_RUN = re.compile(r"[^a-z0-9]+")
_SEPARATORS = {"\u2028", "\u2029"}


def _text(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidName(field, value, "must be a string")
    return value


def _bad_char(ch: str) -> bool:
    # Cc: control, Cf: format (bidi overrides, zero-width), Cs: lone surrogates, which
    # cannot be written as UTF-8; U+2028/U+2029 are forbidden by the newer spec.
    return unicodedata.category(ch) in ("Cc", "Cf", "Cs") or ch in _SEPARATORS


def _segment_char(ch: str) -> bool:
    """A character a path segment may hold: not '/', not refused, and NFC on its own (a
    character NFC always replaces, such as U+212B ANGSTROM SIGN, is in no NFC path)."""
    return ch != "/" and not _bad_char(ch) and unicodedata.is_normalized("NFC", ch)


@lru_cache(maxsize=1)
def memory_path_pattern() -> str:
    """The path rules as one regular expression (unanchored), built from the same checks as
    :func:`validate_memory_path`: '/' then 1 to MAX_PATH_SEGMENTS segments, none empty, '.' or
    '..', none starting with the temp prefix, of characters a path may hold. What no regular
    expression states: the byte limits (the OpenAPI document gives MAX_PATH_BYTES as
    maxLength, in characters) and NFC across characters (a letter then a combining mark NFC
    composes)."""
    char = char_class(_segment_char)
    segment = rf"(?!\.\.?(?:/|$))(?!{re.escape(TMP_PREFIX)}){char}{{1,{MAX_SEGMENT_BYTES}}}"
    return f"(?:/{segment}){{1,{MAX_PATH_SEGMENTS}}}"


def _name_char(ch: str) -> bool:
    return unicodedata.category(ch) not in ("Cc", "Cs")


@lru_cache(maxsize=1)
def store_name_pattern() -> str:
    """:func:`validate_name`'s characters as a regular expression (anchored; the length,
    1 to MAX_NAME_CHARS, is the OpenAPI document's minLength and maxLength)."""
    return f"^{char_class(_name_char)}*$"


def validate_memory_path(value: object, field: str = "path") -> str:
    """Return ``value`` if it is a valid memory path, else raise InvalidName."""
    text = _text(field, value)
    if not text.startswith("/"):
        raise InvalidName(field, value, "must start with '/'")
    if any(_bad_char(ch) for ch in text):
        raise InvalidName(field, value, "must not contain control or format characters")
    if len(text.encode("utf-8")) > MAX_PATH_BYTES:
        raise InvalidName(field, value, f"must be at most {MAX_PATH_BYTES} bytes of UTF-8")
    if not unicodedata.is_normalized("NFC", text):
        raise InvalidName(field, value, "must be NFC-normalized")
    segments = text[1:].split("/")
    if len(segments) > MAX_PATH_SEGMENTS:
        raise InvalidName(field, value, f"must have at most {MAX_PATH_SEGMENTS} segments")
    for segment in segments:
        if segment == "":
            raise InvalidName(field, value, "must not contain empty segments")
        if segment in (".", ".."):
            raise InvalidName(field, value, "must not contain '.' or '..' segments")
        if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
            # Each segment is a file or directory name on disk.
            raise InvalidName(
                field, value, f"each segment must be at most {MAX_SEGMENT_BYTES} bytes of UTF-8"
            )
        if segment.startswith(TMP_PREFIX):
            raise InvalidName(
                field, value, f"segments starting with {TMP_PREFIX!r} are reserved by the server"
            )
    return text


def validate_path_prefix(value: object) -> str:
    """A list prefix: ``/`` or a valid path followed by ``/`` (segment-aligned)."""
    text = _text("path_prefix", value)
    if text == "/":
        return text
    if not text.endswith("/"):
        raise InvalidName("path_prefix", value, "must end with '/'")
    validate_memory_path(text[:-1], "path_prefix")
    return text


def validate_content(value: object) -> str:
    text = _text("content", value)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidName("content", None, "must be valid UTF-8 text") from None
    if size > MAX_CONTENT_BYTES:
        raise InvalidName("content", None, f"must be at most {MAX_CONTENT_BYTES} bytes of UTF-8")
    return text


def validate_sha256(value: object, field: str) -> str:
    text = _text(field, value)
    if not _SHA256_RE.fullmatch(text):
        raise InvalidName(field, value, "must be 64 lowercase hexadecimal characters")
    return text


def validate_name(value: object) -> str:
    text = _text("name", value)
    if not 1 <= len(text) <= MAX_NAME_CHARS:
        raise InvalidName("name", value, f"must be 1 to {MAX_NAME_CHARS} characters")
    if not all(_name_char(ch) for ch in text):
        raise InvalidName("name", value, "must not contain control characters")
    return text


def validate_description(value: object) -> str:
    text = _text("description", value)
    if len(text) > MAX_DESCRIPTION_CHARS:
        raise InvalidName(
            "description", value, f"must be at most {MAX_DESCRIPTION_CHARS} characters"
        )
    if any(unicodedata.category(ch) == "Cs" for ch in text):
        raise InvalidName("description", None, "must be valid UTF-8 text")
    return text


def _metadata_key(key: object) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_METADATA_KEY_CHARS:
        raise InvalidName(
            "metadata", key, f"keys must be strings of 1 to {MAX_METADATA_KEY_CHARS} characters"
        )
    return key


def _metadata_value(key: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE_CHARS:
        raise InvalidName(
            "metadata",
            key,
            f"values must be strings of at most {MAX_METADATA_VALUE_CHARS} characters",
        )
    return value


def _check_pairs(bag: dict[str, str]) -> dict[str, str]:
    if len(bag) > MAX_METADATA_PAIRS:
        raise InvalidName("metadata", None, f"must hold at most {MAX_METADATA_PAIRS} pairs")
    return bag


def validate_metadata(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidName("metadata", None, "must be an object of strings")
    return _check_pairs({_metadata_key(k): _metadata_value(k, v) for k, v in value.items()})


def patch_metadata(current: dict[str, str], patch: object) -> dict[str, str]:
    """Apply a metadata patch: a string upserts a key, null deletes it, omitted keys stay."""
    if not isinstance(patch, dict):
        raise InvalidName("metadata", None, "must be an object of strings or nulls")
    result = dict(current)
    for key, value in patch.items():
        _metadata_key(key)
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _metadata_value(key, value)
    return _check_pairs(result)


def slugify(name: str) -> str:
    """The mount slug: lowercased, runs of anything but ASCII letters/digits → one hyphen."""
    return _SLUG_RUN.sub("-", name.lower()).strip("-")


def is_store_id(value: Any) -> bool:
    return isinstance(value, str) and STORE_ID_RE.fullmatch(value) is not None


DEFAULT_MAX_MEMORIES = 10_000
DEFAULT_KEEP_RECENT = 3
