"""A multipart/form-data body read part by part, each part's bytes streamed as they arrive.

werkzeug's form parser (``request.files``) spools every file part of more than 500 KB to the
system temp directory and holds the rest in memory, before the view sees any of it: an
artifact of 50 MiB would be copied through /tmp (another filesystem) and could not be
refused part-way. This reads the request stream in chunks through werkzeug's sans-I/O
:class:`~werkzeug.sansio.multipart.MultipartDecoder`, so a part's bytes go to wherever its
reader writes them, one chunk at a time; memory stays at a chunk and a part's headers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

from werkzeug.datastructures import Headers
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

from app.storage.core.task_rules import FORM_PART_OVERHEAD

CHUNK = 64 * 1024
# A part's headers (and the preamble before the first boundary) fit in this; anything longer
# is not a client of this API.
MAX_HEAD_BYTES = FORM_PART_OVERHEAD - 128
MAX_BOUNDARY = 70  # RFC 2046 5.1.1


class MalformedMultipart(ValueError):
    """The body is not the multipart/form-data its Content-Type announces."""


def boundary_of(content_type: str | None) -> bytes | None:
    """The boundary of a ``multipart/form-data`` Content-Type; None for any other type.

    A multipart/form-data type without a usable boundary is MalformedMultipart."""
    if not content_type:
        return None
    kind, options = parse_options_header(content_type)
    if kind != "multipart/form-data":
        return None
    boundary = options.get("boundary", "")
    if not boundary or len(boundary) > MAX_BOUNDARY or not boundary.isascii():
        raise MalformedMultipart(
            f"multipart/form-data needs a boundary of 1 to {MAX_BOUNDARY} ASCII characters"
        )
    return boundary.encode("ascii")


@dataclass
class Part:
    """One part: its form name, filename (None: a plain field), Content-Type, and bytes."""

    name: str
    filename: str | None
    content_type: str | None
    headers: Headers
    _reader: MultipartReader = field(repr=False)
    _pending: bytes = b""
    _done: bool = False

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes of the part (all of it for -1); b"" at its end."""
        chunks = [self._pending] if self._pending else []
        have = len(self._pending)
        while not self._done and (size < 0 or have < size):
            data, more = self._reader._next_data()
            chunks.append(data)
            have += len(data)
            self._done = not more
        out = b"".join(chunks)
        if 0 <= size < len(out):
            out, self._pending = out[:size], out[size:]
        else:
            self._pending = b""
        return out

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


class MultipartReader:
    """The parts of one body in order; each must be read (or is drained) before the next."""

    def __init__(self, stream: IO[bytes], boundary: bytes) -> None:
        self._stream = stream
        # Bounds what the decoder buffers: a chunk of data plus a part's headers.
        self._decoder = MultipartDecoder(boundary, max_form_memory_size=CHUNK + MAX_HEAD_BYTES)
        self._current: Part | None = None
        self._ended = False

    def _event(self) -> object:
        """The decoder's next event, fed from the stream as it needs; malformed → error."""
        try:
            while True:
                event = self._decoder.next_event()
                if not isinstance(event, NeedData):
                    return event
                chunk = self._stream.read(CHUNK)
                self._decoder.receive_data(chunk if chunk else None)
        except RequestEntityTooLarge:
            raise MalformedMultipart(
                f"a part's headers (or the text before the first boundary) exceed"
                f" {MAX_HEAD_BYTES} bytes"
            ) from None
        except ValueError as exc:
            if isinstance(exc, MalformedMultipart):
                raise
            raise MalformedMultipart(f"not well-formed multipart/form-data ({exc})") from None

    def _next_data(self) -> tuple[bytes, bool]:
        event = self._event()
        if not isinstance(event, Data):
            raise MalformedMultipart("a part ended without its boundary")
        return event.data, event.more_data

    def parts(self) -> Iterator[Part]:
        """Every part, then a check that the body ended with the closing boundary."""
        while True:
            if self._current is not None:
                self._current.drain()
                self._current = None
            event = self._event()
            if isinstance(event, Epilogue):
                return
            if isinstance(event, Field | File):
                filename = event.filename if isinstance(event, File) else None
                self._current = Part(
                    name=event.name or "",
                    filename=filename,
                    content_type=event.headers.get("Content-Type"),
                    headers=event.headers,
                    _reader=self,
                )
                yield self._current
                continue
            # Preamble: text before the first boundary, ignored (RFC 2046).
