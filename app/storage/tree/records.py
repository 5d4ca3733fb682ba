"""Reading and writing the JSON records of the project-memory tree.

``meta.json`` of a turn is the commit point: it holds the whole TurnRecord (meta, summary,
artifact list, times). ``summary.md``, ``index.json``, the listing and the digest are all
derived from the records and rebuilt from them by fsck.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

from app.storage.core.clock import parse_iso_us
from app.storage.core.encoding import dumps
from app.storage.core.errors import Corrupt, Unreadable, UnsafePath
from app.storage.core.models import (
    TaskIndex,
    TurnEntry,
    TurnRecord,
)
from app.storage.core.names import (
    TASK_INDEX,
    TASK_RECORD,
    TURN_DIR_RE,
    TURN_META,
)
from app.storage.core.records import (
    FORMAT_VERSION,
    turn_from_json,
)
from app.storage.core.task_rules import (
    meta_facts,
)
from app.storage.tree.fs.atomic import write_atomic
from app.storage.tree.fs.noatime import open_noatime, read_all
from app.storage.tree.fs.walk import Tree
from app.storage.tree.sqlite.listing_sql import TurnRow


def read_json(path: str | Path) -> Any | None:
    """Parse ``path``; None when it does not exist. Never follows a symlink."""
    try:
        fd = open_noatime(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{path} is a symlink; the service never follows one") from None
        # EIO, EACCES, EMFILE ...: the file may be whole; it is not damage (Unreadable).
        raise Unreadable.of(exc, path) from None
    return parse_json_fd(fd, path)


def read_json_bytes(data: bytes | None, path: str | Path) -> Any | None:
    """Parse ``data`` read from ``path`` (None: the file was absent)."""
    if data is None:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Corrupt(f"{path}: not valid JSON ({exc})") from None


# More than any JSON file the service writes holds (a turn's record is at most its request
# body): a bigger one is a hand edit or damage, refused before it is read into memory.
MAX_JSON_FILE_BYTES = 64 << 20


def parse_json_fd(fd: int, path: str | Path) -> Any:
    """Read and parse the open file ``fd`` (closed here); ``path`` is for the error only."""
    data = read_all(fd, limit=MAX_JSON_FILE_BYTES, path=path)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Corrupt(f"{path}: not valid JSON ({exc})") from None


def write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    write_atomic(path, dumps(obj), durable=durable)


def read_turn(turn_dir: Path) -> TurnRecord | None:
    path = turn_dir / TURN_META
    obj = read_json(path)
    return None if obj is None else turn_from_json(obj, path)


def turn_row(record: TurnRecord, owner: str | None) -> TurnRow:
    """The listing row of a turn; ``owner`` is its task's (task.json)."""
    return TurnRow(
        record.turn,
        record.updated_us,
        parse_iso_us(record.retain_until),
        _text(owner),
        *meta_facts(record.meta),
    )


def turn_entry(record: TurnRecord) -> TurnEntry:
    return TurnEntry(
        turn=record.turn,
        meta=record.meta,
        artifacts=tuple(a.name for a in record.artifacts),
        created_at=record.created_at,
        updated_at=record.updated_at,
        retain_until=record.retain_until,
    )


# -- task record and index ----------------------------------------------------------------
def read_task_record(task_dir: Path) -> dict[str, Any] | None:
    obj = read_json(task_dir / TASK_RECORD)
    if obj is not None and not isinstance(obj, dict):
        raise Corrupt(f"{task_dir / TASK_RECORD}: not an object")
    return obj


def turn_dirs(tree: Tree, task_dir: Path) -> list[tuple[int, Path]]:
    """The turn directories of a task, in turn order (links are neither listed nor entered)."""
    found = []
    for entry in tree.entries(task_dir):
        match = TURN_DIR_RE.fullmatch(entry.name)
        if match and entry.is_dir:
            found.append((int(match.group(1)), entry.path))
    return found


def entry_to_json(entry: TurnEntry, updated_us: int) -> dict[str, Any]:
    return {
        "turn": entry.turn,
        "meta": entry.meta,
        "artifacts": list(entry.artifacts),
        "created_at": entry.created_at,
        "updated_at": entry.updated_at,
        "retain_until": entry.retain_until,
        "updated_us": updated_us,
    }


def build_index(
    task_id: str, task_record: dict[str, Any] | None, turns: list[TurnRecord]
) -> dict[str, Any]:
    """The index.json document for a task, from its records."""
    turns = sorted(turns, key=lambda r: r.turn)
    created = (task_record or {}).get("created_at") or min(
        (r.created_at for r in turns), default=""
    )
    return {
        "version": FORMAT_VERSION,
        "task_id": task_id,
        "owner": (task_record or {}).get("owner"),
        "created_at": created,
        "updated_us": max((r.updated_us for r in turns), default=0),
        "turns": [entry_to_json(turn_entry(r), r.updated_us) for r in turns],
    }


def index_with_turn(
    index: dict[str, Any] | None,
    task_id: str,
    task_record: dict[str, Any] | None,
    record: TurnRecord,
) -> dict[str, Any]:
    """Return ``index`` with ``record``'s entry replaced or inserted (O(turns), no record reads)."""
    if index is None:
        return build_index(task_id, task_record, [record])
    turns = [t for t in index["turns"] if t["turn"] != record.turn]
    turns.append(entry_to_json(turn_entry(record), record.updated_us))
    turns.sort(key=lambda t: t["turn"])
    return {**index, "updated_us": max(index["updated_us"], record.updated_us), "turns": turns}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def index_rows(index: dict[str, Any]) -> list[TurnRow]:
    owner = _text(index.get("owner"))
    return [
        TurnRow(
            t["turn"],
            t["updated_us"],
            parse_iso_us(t["retain_until"]),
            owner,
            *meta_facts(t["meta"]),
        )
        for t in index["turns"]
    ]


def index_from_json(obj: Any, path: Path, now_us: int) -> TaskIndex | None:
    """The task index with expired turns left out; None when no turn is alive."""
    try:
        entries = tuple(
            TurnEntry(
                turn=int(t["turn"]),
                meta=dict(t["meta"]),
                artifacts=tuple(t["artifacts"]),
                created_at=str(t["created_at"]),
                updated_at=str(t["updated_at"]),
                retain_until=str(t["retain_until"]),
            )
            for t in obj["turns"]
            if parse_iso_us(t["retain_until"]) > now_us
        )
        if not entries:
            return None
        return TaskIndex(
            task_id=str(obj["task_id"]),
            owner=obj.get("owner"),
            created_at=str(obj["created_at"]),
            updated_at=max(e.updated_at for e in entries),
            retain_until=max(e.retain_until for e in entries),
            turns=entries,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise Corrupt(f"{path}: not a task index ({exc!r})") from None


def rebuild_index(tree: Tree, task_dir: Path, task_id: str) -> dict[str, Any] | None:
    """Read every record of a task and return its index document (None: no turns).

    A record that does not parse is left out, and left where it is: a write acknowledges a
    record only once it is whole on disk, so a torn one is a write that never got its answer
    (a new file a power cut emptied before its group flush) or a hand edit. fsck reports it
    and moves it to lost+found; until then it is no turn, and a torn task.json names no
    owner. One such file must not stop the repair of everything else the task holds.
    """
    records = read_records(tree, task_dir)
    return index_of(task_dir, task_id, records) if records else None


def read_records(tree: Tree, task_dir: Path) -> list[TurnRecord]:
    """The task's turn records that parse, in turn order (see rebuild_index)."""
    records = []
    for _, turn_dir in turn_dirs(tree, task_dir):
        try:
            record = read_turn(turn_dir)
        except Corrupt:
            continue
        if record is not None:
            records.append(record)
    return records


def index_of(task_dir: Path, task_id: str, records: list[TurnRecord]) -> dict[str, Any]:
    """The index document of a task of ``records`` (not empty); a torn task.json names no
    owner (see rebuild_index)."""
    try:
        task_record = read_task_record(task_dir)
    except Corrupt:
        task_record = None
    return build_index(task_id, task_record, records)


def load_index(tree: Tree, task_dir: Path, task_id: str) -> dict[str, Any] | None:
    """The task's index.json; rebuilt from the records when it is missing, unreadable or not
    an index (it is derived, and people remove and edit files by hand)."""
    path = task_dir / TASK_INDEX
    try:
        index: dict[str, Any] | None = read_json(path)
        if index is not None:
            index_from_json(index, path, 0)
            if not isinstance(index.get("updated_us"), int):
                raise Corrupt(f"{path}: not a task index (no updated_us)")
            return index
    except Corrupt:
        pass
    return rebuild_index(tree, task_dir, task_id)
