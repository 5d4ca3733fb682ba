"""What a coding agent's session starts with: one answer, assembled within a byte budget.

A hook has a few seconds, on a machine that may be busy, to give the model its context; a
round trip per part (the task's index, each turn, the digest) spent most of them. Here the
server assembles it in one request, from the storage interface alone:

* the task's last turns, newest first, each summary cut at TURN_CHARS, together at most
  half of the budget;
* the newest sections of project.md, whole sections only, in what the other two leave;
* other turns and memories that mention the task (a search for its id as a phrase), at
  most a quarter of the budget.

Every stored text is framed (app/services/framing.py), and the whole is at most
``max_bytes`` bytes of UTF-8 however large the project is: the digest is read from its head,
no more sections than could fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.services.framing import NOTE, frame, neutral
from app.services.mcp.text import SECTION_MIN, read_digest_head, search_snippet
from app.storage.core.errors import (
    InvalidName,
    NotFound,
    NotSupported,
    SearchRebuilding,
    SearchTimeout,
)
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend

DEFAULT_BYTES = 9_000  # the turns' 3,000 and the digest's 6,000; under Codex's 10,000 characters
MIN_BYTES = 500
MAX_BYTES = 100_000
DEFAULT_TURNS = 3
MAX_TURNS = 20
TURN_CHARS = 1_000  # of each turn's summary
HIT_LIMIT = 5
HIT_SHARE = 4  # hits take at most 1/HIT_SHARE of the budget
TITLE = "# Project memory"


@dataclass(frozen=True, slots=True)
class SessionContext:
    task_id: str
    context: str
    bytes: int
    turns: list[int]
    sections: int
    hits: int


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _whole_sections(text: str, limit: int) -> str:
    """The head of a digest, whole sections only, within ``limit`` bytes ("" when not even
    the first fits)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    cut = data.rfind(b"\n## ", 0, limit)
    first = data.find(b"\n## ")
    if cut <= first:
        return ""
    return data[:cut].decode("utf-8").rstrip("\n") + "\n"


def assemble(
    storage: StorageBackend,
    scope: Scope,
    task_id: str,
    *,
    max_bytes: int = DEFAULT_BYTES,
    turns: int = DEFAULT_TURNS,
) -> SessionContext:
    """The context for a session working on ``task_id``, at most ``max_bytes`` bytes."""
    head = f"{TITLE}\n\n{NOTE}\n"
    budget = max_bytes - _size(head)
    turn_part, shown = _turns(storage, scope, task_id, turns, budget // 2)
    budget -= _size(turn_part)
    hit_part, hits = _hits(storage, scope, task_id, budget // HIT_SHARE)
    budget -= _size(hit_part)
    digest_part, sections = _digest(storage, scope, budget)
    context = head + turn_part + digest_part + hit_part
    return SessionContext(task_id, context, _size(context), shown, sections, hits)


def _turns(
    storage: StorageBackend, scope: Scope, task_id: str, wanted: int, room: int
) -> tuple[str, list[int]]:
    try:
        index = storage.tasks.get_task(scope, task_id)
    except NotFound:
        index = None
    if index is None or not index.turns or not wanted:
        note = f"\nTask `{task_id}` has no turns yet.\n" if wanted else ""
        return (note if _size(note) <= room else ""), []
    out = f"\n## Task `{task_id}`: its last turns, newest first\n"
    shown: list[int] = []
    for entry in list(reversed(index.turns))[:wanted]:
        try:
            record = storage.tasks.get_turn(scope, task_id, entry.turn)
        except NotFound:
            continue  # deleted or expired since the index was read
        who = ", ".join(str(record.meta[k]) for k in ("agent_id", "model") if record.meta.get(k))
        source = f"turn {entry.turn} of task {task_id}" + (f" ({who})" if who else "")
        part = (
            f"\n### Turn {entry.turn}, updated {record.updated_at}\n\n"
            + frame(_cut(record.summary_md.strip(), TURN_CHARS), source)
            + "\n"
        )
        if _size(out + part) > room:
            break
        out += part
        shown.append(entry.turn)
    return (out if shown else ""), shown


def _hits(storage: StorageBackend, scope: Scope, task_id: str, room: int) -> tuple[str, int]:
    """Other turns and memories that name the task; nothing when search cannot answer now."""
    try:
        # Where the task id is written: a keyword search (by meaning, every text is near).
        page = storage.search(scope, f'"{task_id}"', limit=HIT_LIMIT + 3, mode="keyword")
    except (InvalidName, NotSupported, SearchTimeout, SearchRebuilding):
        return "", 0
    out = f"\n## Elsewhere in this project's memory, `{task_id}` is mentioned in\n\n"
    count = 0
    for hit in page.hits:
        if hit.kind == "turn" and hit.task_id == task_id:
            continue  # its own turns are above
        if hit.kind == "turn":
            where = f"turn {hit.turn} of task {hit.task_id}"
        else:
            path = " ".join(neutral(hit.path or "").split())  # a path is stored text too
            where = f"memory /memories{path} of store {hit.memory_store_id}"
        line = f"- {where}: {frame(search_snippet(hit), where, inline=True)}\n"
        if _size(out + line) > room or count == HIT_LIMIT:
            break
        out += line
        count += 1
    return (out if count else ""), count


def _digest(storage: StorageBackend, scope: Scope, room: int) -> tuple[str, int]:
    intro = "\n## The newest sections of project.md, the digest of every task\n\n"
    source = "project.md"
    room -= _size(intro) + _size(frame("", source)) + 1
    if room < SECTION_MIN:
        return "", 0
    text, _ = read_digest_head(storage, scope, room)
    text = _whole_sections(text, room)
    if "\n## " not in text:
        return "", 0
    return intro + frame(text, source) + "\n", text.count("\n## ")
