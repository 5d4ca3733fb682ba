"""Render the project digest, ``project.md``: one section per live task, newest first."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .layout import Scope
from .listing import DigestRow
from .models import TurnRecord


def title(scope: Scope) -> bytes:
    return f"# Project memory: {scope.tenant}/{scope.project}\n".encode()


def render(
    scope: Scope,
    rows: list[DigestRow],
    read_turn: Callable[[str, int], TurnRecord | None],
) -> Iterator[bytes]:
    """Yield the digest in chunks, one task section at a time (memory stays flat).

    ``read_turn`` returns None for a turn deleted since the listing snapshot; its section
    is skipped and the bumped generation makes the next read render again.
    """
    yield title(scope)
    if not rows:
        yield b"\nNo tasks yet.\n"
        return
    for row in rows:
        record = read_turn(row.task_id, row.latest_turn)
        if record is None:
            continue
        summary = record.summary_md
        if summary and not summary.endswith("\n"):
            summary += "\n"
        head = f"\n## {row.task_id}\n\nLatest turn: {record.turn}, updated {record.updated_at}\n\n"
        yield (head + summary).encode("utf-8")
