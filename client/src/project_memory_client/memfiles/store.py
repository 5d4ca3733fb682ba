"""The store side of an import: find (or create) the store, plan each path, write.

A path whose content already has the store's ``content_sha256`` is unchanged: a second import
of the same files writes nothing. A new path is a create; a changed one an update on the
``content_sha256`` the listing gave, so an edit made on the server since then is a conflict,
reported and left as it is, never overwritten. Import never deletes a memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..commands import CommandError, UsageError
from ..mount.http import ApiError, StoreClient, TransportError
from ..rules import is_store_id
from .sources import Found

ACTIONS = ("create", "update", "unchanged", "conflict", "refused", "stale")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def unreachable(exc: TransportError) -> CommandError:
    return CommandError(f"cannot reach the server: {exc}", exit_code=3, kind="unreachable")


def refused(exc: ApiError, what: str) -> CommandError:
    return CommandError(f"{what}: {exc}", exit_code=1, kind="api")


@dataclass
class Store:
    id: str | None  # None: to be created (a dry run does not create it)
    name: str
    archived: bool
    created: bool

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "created": self.created}


def find_store(client: StoreClient, named: str, *, create: bool, dry_run: bool = False) -> Store:
    """The store ``named`` (an id, or the name of one store that is not archived); when no
    store has that name and ``create``, a new one of that name (none in a dry run)."""
    try:
        if is_store_id(named):
            try:
                found = client.get_store(named)
            except ApiError as exc:
                if exc.status == 404:
                    raise CommandError(
                        f"no memory store {named}", exit_code=1, kind="api"
                    ) from None
                raise
            return Store(found["id"], found["name"], bool(found.get("archived_at")), False)
        matches = [s for s in client.list_stores() if s.get("name") == named]
        if len(matches) > 1:
            ids = ", ".join(s["id"] for s in matches)
            raise UsageError(
                f"{len(matches)} memory stores are named {named!r} ({ids}): give an id"
            )
        if matches:
            return Store(matches[0]["id"], named, False, False)
        if not create:
            raise CommandError(f"no memory store named {named!r}", exit_code=1, kind="api")
        if dry_run:
            return Store(None, named, False, True)
        made = client.create_store(named)
        return Store(made["id"], made["name"], False, True)
    except TransportError as exc:
        raise unreachable(exc) from None
    except ApiError as exc:
        raise refused(exc, "the memory store") from None


@dataclass
class Step:
    """One path of the plan, and then what became of it."""

    found: Found | None  # None for a stale memory (on the server only)
    path: str
    action: str
    memory_id: str | None = None
    remote_sha256: str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        found = self.found
        return {
            "path": self.path,
            "action": self.action,
            "kind": found.kind if found else None,
            "source": found.source if found else None,
            "bytes": len(found.content.encode("utf-8")) if found else None,
            "sha256": sha256(found.content) if found else self.remote_sha256,
            "message": self.message,
        }


def plan(
    client: StoreClient, store: Store, found: Iterable[Found], graph_folders: Iterable[str] = ()
) -> list[Step]:
    """Each path's action, against the store's listing; memories of an imported graph's
    folder that no entity of it gives any more are listed as ``stale`` (left in place)."""
    remote: dict[str, dict[str, Any]] = {}
    if store.id is not None:
        try:
            remote = {m["path"]: m for m in client.list_memories(store.id)}
        except TransportError as exc:
            raise unreachable(exc) from None
        except ApiError as exc:
            raise refused(exc, "listing the store") from None
    steps = []
    for item in found:
        there = remote.get(item.path)
        if there is None:
            steps.append(Step(item, item.path, "create"))
        elif there.get("content_sha256") == sha256(item.content):
            steps.append(Step(item, item.path, "unchanged", there["id"], there["content_sha256"]))
        else:
            steps.append(Step(item, item.path, "update", there["id"], there["content_sha256"]))
    planned = {s.path for s in steps}
    for folder in graph_folders:
        for path in sorted(remote):
            if path.startswith(folder + "/") and path not in planned:
                stale = Step(
                    None, path, "stale", remote[path]["id"], remote[path]["content_sha256"]
                )
                stale.message = (
                    "no longer in the file; export still writes it: delete it if it should go"
                )
                steps.append(stale)
    return sorted(steps, key=lambda s: s.path)


def apply(client: StoreClient, store_id: str, steps: list[Step]) -> None:
    """Write the creates and updates; a step the store does not take becomes ``conflict``
    (someone else's write won) or ``refused`` (the store will not hold it), with its message."""
    for step in steps:
        if step.found is None or step.action not in ("create", "update"):
            continue
        try:
            if step.action == "create":
                client.create_memory(store_id, step.path, step.found.content)
            else:
                assert step.memory_id is not None and step.remote_sha256 is not None
                client.update_memory(
                    store_id, step.memory_id, step.found.content, step.remote_sha256
                )
        except TransportError as exc:
            raise unreachable(exc) from None
        except ApiError as exc:
            was = step.action
            if exc.status == 409:
                step.action = "conflict"
                step.message = (
                    f"changed on the server since it was read; left as it is ({exc.message})"
                    if was == "update"
                    else f"the path is taken on the server ({exc.message})"
                )
            elif exc.status == 404 and was == "update":
                step.action = "conflict"
                step.message = "deleted on the server since it was read; not written again"
            elif exc.status in (400, 413):
                step.action = "refused"
                step.message = f"the store refused it: {exc.message}"
            else:
                raise refused(exc, step.path) from None
