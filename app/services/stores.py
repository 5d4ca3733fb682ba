"""The changes to a project's memory stores, whichever door they come by (the REST API, the
memory-tool endpoint, the console, the MCP tools): each checks access, makes one storage call
and records one audit event. Reads need no use case.
"""

from __future__ import annotations

from typing import Any, cast

from app.services import access, audit, secrets
from app.services.access import Principal
from app.services.memory_tool import AUDITED, MemoryTool, ToolResult, audit_of
from app.services.secrets import Screen, ScreenedStores
from app.storage.core.errors import Forbidden, SecretsRefused
from app.storage.core.store_models import Deleted, Memory, MemoryStore, MemoryVersion
from app.storage.interface import StorageBackend, StoreBackend


class _Screened(ScreenedStores):
    """The store engine as the use cases write through it: a write refused for its secrets
    is audited before its SecretsRefused goes on to the door."""

    def __init__(
        self, storage: StorageBackend, principal: Principal, screen: Screen, subject: str
    ) -> None:
        super().__init__(storage.stores, screen)
        self.storage = storage
        self.principal = principal
        self.subject = subject

    def text(self, value: object, where: str) -> Any:
        """A store's name or description as it may be stored (None stays None)."""
        return self._screened(value, where)

    def _screened(self, value: object, where: str) -> object:
        try:
            return super()._screened(value, where)
        except SecretsRefused as exc:
            secrets.refused(self.storage, self.principal, exc, self.subject)
            raise


def _screened(
    storage: StorageBackend, principal: Principal, screen: Screen, subject: str
) -> _Screened:
    return _Screened(storage, principal, screen, subject)


def _store_event(
    storage: StorageBackend, principal: Principal, action: str, store: MemoryStore | str
) -> None:
    store_id = store if isinstance(store, str) else store.id
    detail = None if isinstance(store, str) or action == "archived" else {"name": store.name}
    audit.event(storage, principal, "store", action, store_id, detail, store_id=store_id)


def _memory_event(
    storage: StorageBackend,
    principal: Principal,
    action: str,
    subject: str,
    store_id: str,
    detail: dict[str, Any] | None = None,
) -> None:
    audit.event(storage, principal, "memory", action, subject, detail, store_id=store_id)


def _version_detail(memory: Memory) -> dict[str, Any]:
    return {"path": memory.path, "version_id": memory.memory_version_id}


# -- stores ----------------------------------------------------------------------------------
def create_store(
    storage: StorageBackend,
    principal: Principal,
    *,
    name: object,
    description: object = "",
    metadata: object = None,
    screen: Screen | None = None,
) -> MemoryStore:
    """A new store, created by this principal (who may then manage it); secrets in its name
    and description as in a memory's content (services/secrets.py)."""
    access.require_write(principal)
    screen = screen or Screen.of(storage, principal)
    stores = _screened(storage, principal, screen, "(new store)")
    store = storage.stores.create_store(
        principal.scope,
        name=stores.text(name, "name"),
        description=stores.text(description, "description"),
        metadata=metadata,
        creator=principal.actor,
    )
    _store_event(storage, principal, "created", store)
    screen.record(storage, principal, store.id, store_id=store.id)
    return store


def update_store(
    storage: StorageBackend,
    principal: Principal,
    store_id: str,
    *,
    name: object = None,
    description: object = None,
    metadata: object = None,
    screen: Screen | None = None,
) -> MemoryStore:
    """A patch of the store's name, description or metadata: its creator, or a manager."""
    access.require_write(principal)
    screen = screen or Screen.of(storage, principal)
    stores = _screened(storage, principal, screen, store_id)
    store = storage.stores.update_store(
        principal.scope,
        store_id,
        name=stores.text(name, "name"),
        description=stores.text(description, "description"),
        metadata=metadata,
        only_creator=access.only_owner(principal),
    )
    _store_event(storage, principal, "modified", store)
    screen.record(storage, principal, store_id, store_id=store_id)
    return store


def archive_store(storage: StorageBackend, principal: Principal, store_id: str) -> MemoryStore:
    """Archive the store (one-way; it becomes read-only): its creator, or a manager."""
    access.require_write(principal)
    store = storage.stores.archive_store(
        principal.scope, store_id, only_creator=access.only_owner(principal)
    )
    _store_event(storage, principal, "archived", store)
    return store


def delete_store(storage: StorageBackend, principal: Principal, store_id: str) -> Deleted:
    """Delete the store with its memories and versions: its creator, or a manager."""
    access.require_write(principal)
    deleted = storage.stores.delete_store(
        principal.scope, store_id, only_creator=access.only_owner(principal)
    )
    _store_event(storage, principal, "deleted", store_id)
    return deleted


# -- memories --------------------------------------------------------------------------------
def create_memory(
    storage: StorageBackend,
    principal: Principal,
    store_id: str,
    *,
    path: object,
    content: object,
    full: bool = False,
    screen: Screen | None = None,
) -> Memory:
    access.require_write(principal)
    screen = screen or Screen.of(storage, principal)
    memory = _screened(storage, principal, screen, store_id).create_memory(
        principal.scope,
        store_id,
        path=path,
        content=content,
        actor=principal.store_actor,
        full=full,
    )
    _memory_event(storage, principal, "created", memory.id, store_id, _version_detail(memory))
    screen.record(storage, principal, memory.id, store_id=store_id)
    return memory


def update_memory(
    storage: StorageBackend,
    principal: Principal,
    store_id: str,
    memory_id: str,
    *,
    content: object = None,
    path: object = None,
    precondition_sha256: object = None,
    full: bool = False,
    screen: Screen | None = None,
) -> Memory:
    access.require_write(principal)
    screen = screen or Screen.of(storage, principal)
    memory = _screened(storage, principal, screen, memory_id).update_memory(
        principal.scope,
        store_id,
        memory_id,
        content=content,
        path=path,
        precondition_sha256=precondition_sha256,
        actor=principal.store_actor,
        full=full,
    )
    _memory_event(storage, principal, "modified", memory.id, store_id, _version_detail(memory))
    screen.record(storage, principal, memory.id, store_id=store_id)
    return memory


def delete_memory(
    storage: StorageBackend,
    principal: Principal,
    store_id: str,
    memory_id: str,
    *,
    expected_sha256: object = None,
) -> Deleted:
    """Delete a memory (its versions stay, subject to retention)."""
    access.require_write(principal)
    deleted = storage.stores.delete_memory(
        principal.scope,
        store_id,
        memory_id,
        expected_sha256=expected_sha256,
        actor=principal.store_actor,
    )
    _memory_event(storage, principal, "deleted", memory_id, store_id)
    return deleted


def rename_memory(
    storage: StorageBackend,
    principal: Principal,
    store_id: str,
    memory_id: str,
    *,
    path: object,
    precondition_sha256: object = None,
) -> Memory:
    """Move a memory to another path, its content unchanged: recorded as a rename, so the
    audit log tells a move from an edit."""
    access.require_write(principal)
    screen = Screen.of(storage, principal)
    memory = _screened(storage, principal, screen, memory_id).update_memory(
        principal.scope,
        store_id,
        memory_id,
        path=path,
        precondition_sha256=precondition_sha256,
        actor=principal.store_actor,
    )
    _memory_event(storage, principal, "renamed", memory.id, store_id, _version_detail(memory))
    screen.record(storage, principal, memory.id, store_id=store_id)
    return memory


def restore_version(
    storage: StorageBackend,
    principal: Principal,
    store_id: str,
    version_id: str,
    *,
    precondition_sha256: str | None = None,
) -> Memory:
    """Write an old version's content back as a new version: over its memory while that is
    still at ``precondition_sha256``, or, with none, as the memory again at the version's
    path (it was deleted). Forbidden for a redacted or deleted version: it has no content.

    The version is read first: a restore writes what it holds, so one storage read comes
    before the one write.
    """
    access.require_write(principal)
    old = storage.stores.get_version(principal.scope, store_id, version_id, full=True)
    if old.content is None or old.path is None:
        raise Forbidden("a redacted or deleted version has no content to restore")
    screen = Screen.of(storage, principal)
    stores = _screened(storage, principal, screen, version_id)
    if precondition_sha256:
        memory = stores.update_memory(
            principal.scope,
            store_id,
            old.memory_id,
            content=old.content,
            precondition_sha256=precondition_sha256,
            actor=principal.store_actor,
        )
    else:
        memory = stores.create_memory(
            principal.scope,
            store_id,
            path=old.path,
            content=old.content,
            actor=principal.store_actor,
        )
    _memory_event(storage, principal, "restored", memory.id, store_id, _version_detail(memory))
    screen.record(storage, principal, memory.id, store_id=store_id)
    return memory


def redact_version(
    storage: StorageBackend, principal: Principal, store_id: str, version_id: str
) -> MemoryVersion:
    """Redact a version (never the head of a live memory): a project_admin and above."""
    access.require_redact(principal)
    version = storage.stores.redact_version(
        principal.scope, store_id, version_id, actor=principal.store_actor
    )
    _memory_event(
        storage, principal, "redacted", version.memory_id, store_id, {"version_id": version_id}
    )
    return version


def run_memory_tool(
    storage: StorageBackend,
    principal: Principal,
    store_id: str,
    command_input: object,
    *,
    tool: MemoryTool | None = None,
) -> ToolResult:
    """Run one memory-tool command (a view, or a change) against a store.

    A reader may only view: a command that changes the store is refused (Forbidden) before
    it runs. A change
    that succeeded is recorded with the command and its path. ``tool``: one built with other
    view limits (the MCP tool's), for this principal and store.
    """
    command = command_input.get("command") if isinstance(command_input, dict) else None
    if command in AUDITED:
        access.require_write(principal)
    screen = Screen.of(storage, principal)
    engine = _screened(storage, principal, screen, store_id)
    if tool is None:
        tool = MemoryTool(
            cast(StoreBackend, engine), principal.scope, store_id, actor=principal.store_actor
        )
    else:
        tool.engine = cast(StoreBackend, engine)
    result = tool.run(command_input)
    change = audit_of(command_input, result)
    if change is not None:
        _memory_event(storage, principal, change[0], store_id, store_id, change[1])
        screen.record(storage, principal, store_id, store_id=store_id)
    return result
