"""What the CLI prints for people, made safe to show on a terminal.

Stored text (summaries, meta values, search snippets, project.md, store names) and a server's
error messages are written by others. A terminal obeys the control characters in them: an
escape sequence can clear the screen, retitle the window, rewrite what was printed before,
or set the clipboard (OSC 52); a bidi override can make text read other than it runs. So
everything the CLI writes for people goes through :func:`show` (or :func:`show_stream` for
bytes), and on a terminal each such character is shown instead of obeyed, as ``cat -v`` and
``less`` show them:

* C0 controls and ESC: caret notation (``^[`` for ESC, ``^G`` for BEL, ``^M`` for a carriage
  return), and DEL as ``^?``. Newline and tab are kept, and so is a carriage return right
  before a newline (a CRLF line end);
* C1 controls (U+0080-U+009F; a terminal may read U+009B as the start of a sequence), the
  bidi controls (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069) and lone surrogates
  (which no encoding can write): ``<U+009B>``.

What is not a terminal (a pipe, a file) gets the text as it is, so that ``digest > file``
keeps the bytes; only lone surrogates are shown there too, being unwritable. ``--json``
output does not come through here: JSON escapes what it must.
"""

from __future__ import annotations

import codecs
import functools
import re
from collections.abc import Iterable
from typing import TextIO

# The patterns are compiled on first use: most runs (an agent's hooks, a pipe) need neither.


@functools.cache
def lone_surrogate() -> re.Pattern[str]:
    return re.compile("[\ud800-\udfff]")


@functools.cache
def _hidden() -> re.Pattern[str]:
    """Every character the rule makes visible; a carriage return only when no newline
    follows."""
    return re.compile(
        "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
        "\u2066-\u2069\ud800-\udfff]|\r(?!\n)"
    )


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    return f"<U+{code:04X}>"


def visible(text: str) -> str:
    """``text`` with every control character it holds shown, not obeyed (the module's rule)."""
    return _hidden().sub(_shown, text)


def writable(text: str) -> str:
    """``text`` with its lone surrogates shown: what any stream can be given."""
    if is_utf8(text):
        return text
    return lone_surrogate().sub(_shown, text)


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (it holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stream-like object
        return False


def shown_on(stream: TextIO, text: str) -> str:
    """``text`` as :func:`show` writes it to ``stream``."""
    return visible(text) if is_terminal(stream) else writable(text)


def show(stream: TextIO, text: str) -> None:
    """Write ``text`` for a person to ``stream``: made visible on a terminal."""
    stream.write(shown_on(stream, text))
    stream.flush()


def show_stream(stream: TextIO, blocks: Iterable[bytes]) -> int:
    """Write UTF-8 ``blocks`` to ``stream`` as they come, made visible on a terminal and
    passed through byte for byte anywhere else; the number of bytes read."""
    size = 0
    if not is_terminal(stream):
        out = stream.buffer
        stream.flush()
        for block in blocks:
            out.write(block)
            size += len(block)
        out.flush()
        return size
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    held = ""  # a carriage return at a block's end: its newline may open the next block
    for block in blocks:
        size += len(block)
        text = held + decoder.decode(block)
        held = "\r" if text.endswith("\r") else ""
        stream.write(visible(text[: len(text) - len(held)]))
    stream.write(visible(held + decoder.decode(b"", final=True)))
    stream.flush()
    return size
