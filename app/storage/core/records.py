"""The turn record as JSON, whichever backend keeps it: what a turn's ``meta.json`` holds in
the tree, what a backup carries (core/archive.py), and what a turn stores (its usage, counted
the same way by every backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.storage.core.clock import parse_iso_us
from app.storage.core.encoding import dumps_compact, whole_number
from app.storage.core.errors import Corrupt
from app.storage.core.models import ArtifactInfo, TurnRecord
from app.storage.core.usage import TurnUsage

FORMAT_VERSION = 1


# -- turn records -------------------------------------------------------------------------
def turn_to_json(record: TurnRecord) -> dict[str, Any]:
    return {
        "version": FORMAT_VERSION,
        "task_id": record.task_id,
        "turn": record.turn,
        "meta": record.meta,
        "summary_md": record.summary_md,
        "artifacts": [
            {
                "name": a.name,
                "content_type": a.content_type,
                "size": a.size,
                "sha256": a.sha256,
                "updated_at": a.updated_at,
            }
            for a in record.artifacts
        ],
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "retain_until": record.retain_until,
        "updated_us": record.updated_us,
    }


def turn_from_json(obj: Any, path: str | Path) -> TurnRecord:
    """The record ``obj`` holds; Corrupt when it is not one (the times it is swept and
    listed by included: a ``retain_until`` that is no time is a record that cannot be kept
    by its rule, found here rather than by every reader that compares it)."""
    try:
        try:
            parse_iso_us(obj["retain_until"])
        except (TypeError, ValueError):
            raise ValueError(f"retain_until {obj['retain_until']!r} is not a time") from None
        return TurnRecord(
            task_id=str(obj["task_id"]),
            turn=whole_number(obj, "turn"),
            meta=dict(obj["meta"]),
            summary_md=str(obj["summary_md"]),
            artifacts=tuple(
                ArtifactInfo(
                    name=str(a["name"]),
                    content_type=str(a["content_type"]),
                    size=whole_number(a, "size"),
                    sha256=str(a["sha256"]),
                    updated_at=str(a["updated_at"]),
                )
                for a in obj["artifacts"]
            ),
            created_at=str(obj["created_at"]),
            updated_at=str(obj["updated_at"]),
            retain_until=str(obj["retain_until"]),
            updated_us=int(obj.get("updated_us") or parse_iso_us(obj["updated_at"])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise Corrupt(f"{path}: not a turn record ({exc!r})") from None


def turn_usage(record: TurnRecord) -> TurnUsage:
    """What a written turn stores (core/usage.py)."""
    return usage_of_turn(record.turn, record.meta, record.summary_md, record.artifacts)


def usage_of_turn(
    turn: int, meta: dict[str, Any], summary_md: str, artifacts: tuple[ArtifactInfo, ...]
) -> TurnUsage:
    """What a turn of this meta, summary and artifacts stores: its artifacts and their bytes,
    and its meta as compact JSON plus its summary, in UTF-8 (the same count on every
    backend)."""
    return TurnUsage(
        turn,
        len(artifacts),
        sum(a.size for a in artifacts),
        len(dumps_compact(meta)) + len(summary_md.encode("utf-8")),
    )
