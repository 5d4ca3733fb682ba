"""The text of the project digest, ``project.md``: one section per live task, newest first.

A task's section shows its highest live turn; tasks sort by their newest write (of any
turn), then by task id, both descending::

    # Project memory: <tenant>/<project>

    ## <task id>

    Latest turn: <n>, updated <time>

    <the summary, its own headings two levels down>

A project with no live task reads ``No tasks yet.`` after the title. How each backend
serves this without rendering the whole project on a read is tree/sqlite/digestdb.py (the
tree) and pg/digest.py; :func:`render` is the reference both outputs equal.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from app.storage.core.clock import parse_iso_us
from app.storage.core.models import TurnRecord
from app.storage.core.names import Scope

EMPTY = b"\nNo tasks yet.\n"

_HEADING = re.compile(r"^( {0,3})(#{1,6})(?=[ \t\r\n]|$)")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def title(scope: Scope) -> bytes:
    return f"# Project memory: {scope.tenant}/{scope.project}\n".encode()


def nest_headings(markdown: str) -> str:
    """The summary with its ATX headings two levels down (at most ``######``), outside code
    fences: a summary's own ``# heading`` must not read as the digest's title, nor its
    ``## heading`` as another task's section."""
    out = []
    fence: str | None = None
    for line in markdown.splitlines(keepends=True):
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None and _closes(line, fence):
            fence = None
        elif fence is None:
            line = _HEADING.sub(lambda m: m.group(1) + "#" * min(6, len(m.group(2)) + 2), line)
        out.append(line)
    return "".join(out)


def _closes(line: str, fence: str) -> bool:
    """Whether ``line`` closes a code block opened by ``fence`` (CommonMark: the same
    character, at least as many, nothing else on the line)."""
    stripped = line.strip()
    body = line.lstrip(" ")
    return (
        len(line) - len(body) <= 3 and len(stripped) >= len(fence) and set(stripped) == {fence[0]}
    )


@dataclass(frozen=True, slots=True)
class Section:
    """A task's section: the turn it shows, until when that turn lives, and its bytes."""

    turn: int
    valid_until_us: int
    text: bytes


def section_of(task_id: str, record: TurnRecord, valid_until_us: int) -> Section:
    """The section of ``task_id`` showing ``record``, its highest live turn."""
    text = section_text(task_id, record.turn, record.updated_at, record.summary_md)
    return Section(record.turn, valid_until_us, text)


def live_section(
    task_id: str,
    index: Mapping[str, Any],
    now_us: int,
    record_of: Callable[[int], TurnRecord | None],
) -> Section | None:
    """The task's section: its highest live turn per ``index`` (an index.json document),
    whose record ``record_of`` gives (None: no turn lives, or its record is gone)."""
    live = [t["turn"] for t in index["turns"] if parse_iso_us(t["retain_until"]) > now_us]
    record = record_of(max(live)) if live else None
    if record is None:
        return None
    return section_of(task_id, record, parse_iso_us(record.retain_until))


def section_text(task_id: str, turn: int, updated_at: str, summary_md: str) -> bytes:
    """The bytes of the section of ``task_id`` showing ``turn``."""
    summary = nest_headings(summary_md)
    if summary and not summary.endswith("\n"):
        summary += "\n"
    head = f"\n## {task_id}\n\nLatest turn: {turn}, updated {updated_at}\n\n"
    return (head + summary).encode("utf-8")


@dataclass(frozen=True, slots=True)
class DigestRow:
    """A live task as the digest orders it, and the turn its section shows."""

    task_id: str
    updated_us: int
    latest_turn: int


def render(
    scope: Scope,
    rows: Iterable[DigestRow],
    read_turn: Callable[[str, int], TurnRecord | None],
) -> Iterator[bytes]:
    """Yield the whole digest of ``rows`` (already in digest order), one section at a time.

    ``read_turn`` returns None for a turn deleted since ``rows`` were read; its section is
    left out.
    """
    yield title(scope)
    shown = 0
    for row in rows:
        record = read_turn(row.task_id, row.latest_turn)
        if record is None:
            continue
        shown += 1
        yield section_of(row.task_id, record, 0).text
    if not shown:
        yield EMPTY
