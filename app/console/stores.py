"""A project's memory stores in the console: the list, a store's memories as folders, a
memory with its version history, one version, and the difference between two. The forms that
change them are memories.py's.
"""

from __future__ import annotations

from flask import render_template, request
from flask.typing import ResponseReturnValue

from app.console import base, render
from app.services.access import may_redact
from app.storage.core.errors import StorageError
from app.storage.core.store_models import Memory, MemoryPrefix, VersionFilter
from app.web.errors import ApiError

bp = base.bp

STORES_PER_PAGE = 50
MEMORIES_PER_PAGE = 100
VERSIONS_PER_PAGE = 50

_stores = base.stores
_principal = base.principal
_scope = base.scope
_purl = base.purl


@bp.get("/p/<tenant>/<project>/stores")
def stores(tenant: str, project: str) -> ResponseReturnValue:
    """The project's memory stores, newest first."""
    archived = request.args.get("archived") == "1"
    cursor = request.args.get("page") or None
    page = _stores().list_stores(
        _scope(), limit=STORES_PER_PAGE, page=cursor, include_archived=archived
    )
    args = {"archived": "1"} if archived else {}
    return render_template(
        "console/stores.html",
        page=page,
        archived=archived,
        next_url=_purl("stores", page=page.next_page, **args) if page.next_page else None,
        first_url=_purl("stores", **args) if cursor else None,
    )


def _crumbs(path: str) -> list[tuple[str, str]]:
    """(label, prefix) for each folder from the root down to ``path``."""
    crumbs = [("/", "/")]
    prefix = "/"
    for part in [p for p in path.split("/") if p]:
        prefix += part + "/"
        crumbs.append((part, prefix))
    return crumbs


@bp.get("/p/<tenant>/<project>/stores/<store_id>")
def store(tenant: str, project: str, store_id: str) -> ResponseReturnValue:
    """A store's memories as folders, one level at a time."""
    engine = _stores()
    found = engine.get_store(_scope(), store_id)
    path = request.args.get("path", "/")[:2048] or "/"
    cursor = request.args.get("page") or None
    page = engine.list_memories(
        _scope(), store_id, path_prefix=path, depth=1, limit=MEMORIES_PER_PAGE, page=cursor
    )
    folders = [i for i in page.data if isinstance(i, MemoryPrefix)]
    memories = [i for i in page.data if isinstance(i, Memory)]
    return render_template(
        "console/store.html",
        store=found,
        path=path,
        crumbs=_crumbs(path),
        folders=folders,
        memories=memories,
        next_url=_purl("store", store_id=store_id, path=path, page=page.next_page)
        if page.next_page
        else None,
    )


@bp.get("/p/<tenant>/<project>/stores/<store_id>/memories/<memory_id>")
def memory(tenant: str, project: str, store_id: str, memory_id: str) -> ResponseReturnValue:
    """A memory: its content and its version history."""
    engine = _stores()
    found = engine.get_store(_scope(), store_id)
    item = engine.get_memory(_scope(), store_id, memory_id, full=True)
    cursor = request.args.get("page") or None
    versions = engine.list_versions(
        _scope(),
        store_id,
        filters=VersionFilter(memory_id=memory_id),
        limit=VERSIONS_PER_PAGE,
        page=cursor,
    )
    next_url = None
    if versions.next_page:
        next_url = _purl("memory", store_id=store_id, memory_id=memory_id, page=versions.next_page)
    return render_template(
        "console/memory.html",
        store=found,
        memory=item,
        crumbs=_crumbs(item.path.rsplit("/", 1)[0] + "/"),
        versions=versions.data,
        next_url=next_url,
    )


@bp.get("/p/<tenant>/<project>/stores/<store_id>/versions/<version_id>")
def version(tenant: str, project: str, store_id: str, version_id: str) -> ResponseReturnValue:
    """One memory version with its content."""
    engine = _stores()
    found = engine.get_store(_scope(), store_id)
    item = engine.get_version(_scope(), store_id, version_id, full=True)
    # The head of a live memory can be neither redacted (409) nor restored (it is the
    # content already): no link that always fails.
    try:
        live = engine.get_memory(_scope(), store_id, item.memory_id, full=False)
    except StorageError:
        live = None
    is_head = live is not None and live.memory_version_id == item.id
    return render_template(
        "console/version.html",
        store=found,
        version=item,
        may_redact=may_redact(_principal()) and not is_head,
        is_head=is_head,
    )


@bp.get("/p/<tenant>/<project>/stores/<store_id>/diff")
def diff(tenant: str, project: str, store_id: str) -> ResponseReturnValue:
    """The difference between two memory versions of a store."""
    engine = _stores()
    found = engine.get_store(_scope(), store_id)
    old_id, new_id = request.args.get("a", ""), request.args.get("b", "")
    if not old_id or not new_id:
        raise ApiError(400, "choose two versions to compare (a and b)")
    old = engine.get_version(_scope(), store_id, old_id, full=True)
    new = engine.get_version(_scope(), store_id, new_id, full=True)
    lines = list(
        render.diff_lines(
            old.content or "",
            new.content or "",
            f"{old.path or '(redacted)'} @ {old.id}",
            f"{new.path or '(redacted)'} @ {new.id}",
        )
    )
    return render_template("console/diff.html", store=found, old=old, new=new, lines=lines)
