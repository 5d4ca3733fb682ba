"""record_turn's and read_artifact's artifacts: the argument's checks and decoding (its
schema is app/schemas/mcp.py's Artifact), and reading a stored artifact a part at a time.

The rules are the REST API's: the artifact-name pattern, the Content-Type rule, at most
MAX_ARTIFACTS_PER_WRITE in one write; and one of MCP's own, MCP_ARTIFACT_BYTES in one call.
A fault is an :class:`ArtifactFault` whose message is the model's to read.
"""

from __future__ import annotations

import base64
import binascii
import io
import mimetypes
from dataclasses import dataclass
from typing import IO

from app.schemas.mcp import BASE64, MCP_ARTIFACT_BYTES, TEXT, UPLOAD_HINT, Artifact
from app.services.framing import neutral
from app.storage.core.errors import InvalidName
from app.storage.core.models import ArtifactUpload
from app.storage.core.names import validate_artifact_name
from app.storage.core.task_rules import MAX_ARTIFACTS_PER_WRITE, check_content_type

SKIP_CHUNK = 256 * 1024
# C0 controls that text (a log with colours, a form feed) may hold; any other, or a NUL,
# makes bytes binary.
_TEXT_CONTROLS = frozenset(b"\t\n\r\x0b\x0c\x1b")
_BINARY_BYTES = frozenset(range(32)) - _TEXT_CONTROLS


class ArtifactFault(ValueError):
    """An artifact argument that cannot be stored as given; the message says why."""


ARTIFACT_KEYS = tuple(Artifact().fields)  # what one artifact argument may hold


@dataclass(frozen=True, slots=True)
class ArtifactFile:
    """An artifact of a record_turn call, decoded and checked."""

    name: str
    content_type: str
    data: bytes


def decode_artifacts(value: object) -> list[ArtifactFile]:
    """record_turn's ``artifacts``, checked by the REST API's rules and bounded in all by
    MCP_ARTIFACT_BYTES; every fault is an ArtifactFault, before anything is written."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ArtifactFault("artifacts must be an array of {name, content} objects.")
    if len(value) > MAX_ARTIFACTS_PER_WRITE:
        raise ArtifactFault(
            f"artifacts: at most {MAX_ARTIFACTS_PER_WRITE} in one call (got {len(value)})."
        )
    files: list[ArtifactFile] = []
    total = 0
    for i, item in enumerate(value):
        where = f"artifacts[{i}]"
        file = _artifact(where, item)
        if any(f.name == file.name for f in files):
            raise ArtifactFault(f"{where}.name: {file.name!r} is named twice in this call.")
        total += len(file.data)
        if total > MCP_ARTIFACT_BYTES:
            raise ArtifactFault(
                f"artifacts: more than {MCP_ARTIFACT_BYTES} bytes (1 MiB) in one call, counted"
                f" after decoding (at {where}); nothing was recorded. Record the turn with"
                f" smaller artifacts, or without them: {UPLOAD_HINT}."
            )
        files.append(file)
    return files


def _artifact(where: str, item: object) -> ArtifactFile:
    if not isinstance(item, dict):
        raise ArtifactFault(f"{where} must be an object with name and content.")
    unknown = sorted(str(k) for k in item if k not in ARTIFACT_KEYS)
    if unknown:
        raise ArtifactFault(
            f"{where}: unknown key(s) {', '.join(unknown)}; it takes {', '.join(ARTIFACT_KEYS)}."
        )
    name, content = item.get("name"), item.get("content")
    encoding = item.get("encoding", TEXT)
    try:
        validate_artifact_name(name)
    except InvalidName as exc:
        shown = name[:200] if isinstance(name, str) else name
        raise ArtifactFault(f"{where}.name: {exc.message} (got {shown!r}).") from None
    assert isinstance(name, str)
    if not isinstance(content, str):
        raise ArtifactFault(f"{where}.content must be a string.")
    if encoding == TEXT:
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise ArtifactFault(f"{where}.content is not valid Unicode text.") from None
    elif encoding == BASE64:
        if len(content) > MCP_ARTIFACT_BYTES * 2:  # never decode what cannot fit
            raise ArtifactFault(f"{where}.content: more than {MCP_ARTIFACT_BYTES} bytes (1 MiB).")
        try:
            data = base64.b64decode("".join(content.split()), validate=True)
        except (binascii.Error, ValueError):
            raise ArtifactFault(f"{where}.content is not valid base64.") from None
    else:
        raise ArtifactFault(f"{where}.encoding must be {TEXT!r} or {BASE64!r}.")
    return ArtifactFile(name, _artifact_type(where, item.get("content_type"), name, encoding), data)


def _artifact_type(where: str, value: object, name: str, encoding: str) -> str:
    """The artifact's Content-Type: as given, else from the name, else by its encoding."""
    if value is not None:
        try:
            return check_content_type(value.strip() if isinstance(value, str) else value)
        except InvalidName as exc:
            raise ArtifactFault(f"{where}.content_type: {exc.message}, e.g. text/plain.") from None
    guessed = mimetypes.guess_type(name, strict=False)[0]
    if encoding == TEXT:
        if guessed is None:
            return "text/plain; charset=utf-8"
        if guessed.startswith("text/"):
            return f"{guessed}; charset=utf-8"
    return guessed or "application/octet-stream"


def uploads(files: list[ArtifactFile]) -> list[ArtifactUpload]:
    """put_turn's ``artifacts`` for ``files``, each a fresh stream of its own."""
    return [ArtifactUpload(f.name, f.content_type, io.BytesIO(f.data)) for f in files]


def size_of(files: list[ArtifactFile]) -> int | None:
    """put_turn's ``size``: the bytes of ``files`` in all, admitted before any is read (None:
    no artifact)."""
    return sum(len(f.data) for f in files) if files else None


@dataclass(frozen=True, slots=True)
class Part:
    """A part of an artifact as a result shows it: ``shown`` holds its first ``size`` bytes,
    as text or in base64."""

    shown: str
    is_text: bool
    size: int


def read_part(file: IO[bytes], offset: int, total: int, text_bytes: int, binary_bytes: int) -> Part:
    """The part of ``file`` (``total`` bytes) from ``offset``: up to ``text_bytes`` as text
    when they are text (and hold no stored-text tag), else up to ``binary_bytes`` in base64."""
    _skip(file, offset)
    chunk = _read_up_to(file, text_bytes)
    text = _as_text(chunk, at_end=offset + len(chunk) >= total)
    # Text that holds a stored-text tag goes in base64: exact, and unable to close the
    # frame the result puts text in (app/services/framing.py).
    if text is not None and neutral(text) == text:
        return Part(text, True, len(text.encode("utf-8")))
    used = min(len(chunk), binary_bytes)
    return Part(base64.b64encode(chunk[:used]).decode("ascii"), False, used)


def _skip(file: IO[bytes], offset: int) -> None:
    """Move ``file`` ``offset`` bytes on: a seek when it can, else reads of bounded size."""
    if not offset:
        return
    seekable = getattr(file, "seekable", None)
    if seekable is not None and seekable():
        file.seek(offset)
        return
    left = offset
    while left:
        chunk = file.read(min(left, SKIP_CHUNK))
        if not chunk:
            return
        left -= len(chunk)


def _read_up_to(file: IO[bytes], limit: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = file.read(limit - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _as_text(chunk: bytes, *, at_end: bool) -> str | None:
    """``chunk`` as text when it is UTF-8 without the controls binary data holds (a
    character cut by the read's end is left for the next read); None otherwise."""
    if _BINARY_BYTES.intersection(chunk):
        return None
    try:
        return chunk.decode("utf-8")
    except UnicodeDecodeError as exc:
        cut_char = exc.reason == "unexpected end of data" and exc.start >= len(chunk) - 3
        if at_end or not cut_char or exc.start == 0:
            return None
        return chunk[: exc.start].decode("utf-8")
