"""What a project holds, read through the storage interface: two reads compare equal exactly
when nothing the console can change has changed (on either backend).

Tasks with every turn record and artifact, stores (archived too) with their memories and
every version, the token registry and the limits document. Traffic counters are left out:
every request adds to them, refused or not.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flask import Flask

from app.storage.core.names import Scope
from app.storage.core.store_models import VersionFilter


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _all_pages(fetch: Any) -> list[Any]:
    out: list[Any] = []
    page = None
    while True:
        found = fetch(page)
        out += [_plain(item) for item in found.data]
        page = found.next_page
        if page is None:
            return out


def project_state(app: Flask, scope: Scope) -> dict[str, Any]:
    storage = app.extensions["storage"]
    tasks = storage.tasks
    stores = storage.stores
    state: dict[str, Any] = {"tasks": {}, "stores": {}}
    for summary in tasks.list_tasks(scope, limit=1000).tasks:
        index = tasks.get_task(scope, summary.task_id)
        turns = []
        for entry in index.turns:
            record = tasks.get_turn(scope, summary.task_id, entry.turn)
            artifacts = {}
            for info in record.artifacts:
                opened = tasks.open_artifact(scope, summary.task_id, entry.turn, info.name)
                with opened.file:
                    artifacts[info.name] = opened.file.read()
            turns.append((_plain(record), artifacts))
        state["tasks"][summary.task_id] = (_plain(index), turns)
    for found in _all_pages(
        lambda page: stores.list_stores(scope, limit=100, page=page, include_archived=True)
    ):
        sid = found["id"]
        state["stores"][sid] = {
            "store": found,
            "memories": _all_pages(
                lambda page, sid=sid: stores.list_memories(
                    scope, sid, path_prefix="/", depth=0, limit=100, page=page, full=True
                )
            ),
            "versions": _all_pages(
                lambda page, sid=sid: stores.list_versions(
                    scope, sid, filters=VersionFilter(), limit=100, page=page, full=True
                )
            ),
        }
    file, _ = tasks.open_digest(scope)
    with file:
        state["digest"] = file.read()
    state["usage"] = _plain(storage.usage(scope))
    state["tokens"] = sorted(
        (_plain(t) for t in app.extensions["token_registry"].all()), key=lambda t: t["id"]
    )
    state["limits"] = storage.limits().document()
    return state
