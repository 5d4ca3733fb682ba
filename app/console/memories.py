"""Changing memory stores from the console: create, archive and delete a store; create, edit,
rename and delete a memory; restore an old version by writing its content back.

Every change is a POST (the guard in views.py checked its origin, its CSRF token and the
role) that calls the memory-stores API's own use case (app/services/stores.py), with the same
actor and the same preconditions: an edit and a rename carry the ``content_sha256`` the form was shown with, so
a change saved meanwhile by anyone is never overwritten unseen. A refused form comes back
with what was typed still in it (a conflict also shows what was saved meanwhile): nothing
typed is lost. Each form's GET page asks the POST's permission, so no link leads to a form
that can only fail.
"""

from __future__ import annotations

from typing import Any

from flask import render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import Forbidden

from app.console import render
from app.console.base import bp, field, principal, purl, scope, see_other, storage, stores
from app.services import stores as store_service
from app.services.access import may_redact, may_write
from app.storage.core.errors import InvalidName, NotFound, SecretsRefused
from app.storage.core.store_models import (
    ContentPreconditionFailed,
    Memory,
    MemoryStore,
    PathConflict,
    StoreArchived,
)

MAX_FORM_CONTENT = 200_000  # characters kept of a textarea: past any memory's byte limit


def _require_write() -> None:
    if not may_write(principal()):
        raise Forbidden(f"role {principal().token.role} may only read")


def typed(name: str = "content") -> str:
    """A textarea's text as the person sees it: browsers send its line ends as CRLF."""
    return field(name, MAX_FORM_CONTENT).replace("\r\n", "\n")


def _problem(exc: Exception) -> tuple[int, str]:
    """The status and the sentence a refused form shows above what was typed."""
    if isinstance(exc, InvalidName):
        return 422, f"{exc.field}: {exc.message}"
    if isinstance(exc, ContentPreconditionFailed):
        return 409, "This memory was changed by someone else since you opened it."
    if isinstance(exc, PathConflict | StoreArchived):
        return 409, str(exc)
    if isinstance(exc, NotFound):
        return 404, "This memory was deleted meanwhile; you can save your text as a new one."
    if isinstance(exc, SecretsRefused):
        kinds = ", ".join(sorted({str(f["kind"]) for f in exc.findings}))
        return 422, (
            f"This text holds secrets ({kinds}) and this project refuses them: nothing was"
            " saved. Take them out (or ask a project admin to allowlist them) and save again."
        )
    return 400, str(exc)


_FORM_ERRORS = (
    InvalidName,
    ContentPreconditionFailed,
    PathConflict,
    StoreArchived,
    NotFound,
    SecretsRefused,
)


# -- stores --------------------------------------------------------------------------------
@bp.get("/p/<tenant>/<project>/stores/new")
def new_store_form(tenant: str, project: str) -> ResponseReturnValue:
    """The form of a new memory store."""
    _require_write()
    return render_template("console/store_form.html", name="", description="", error=None)


@bp.post("/p/<tenant>/<project>/stores/new")
def create_store(tenant: str, project: str) -> ResponseReturnValue:
    """Create a memory store (writer and above); its creator may archive and delete it."""
    name, description = field("name", 1000), typed("description")
    try:
        made = store_service.create_store(
            storage(), principal(), name=name, description=description
        )
    except InvalidName as exc:
        body = render_template(
            "console/store_form.html",
            name=name,
            description=description,
            error=f"{exc.field}: {exc.message}",
        )
        return body, 422
    return see_other(purl("store", store_id=made.id))


def _confirm(**page: Any) -> str:
    return render_template("console/confirm.html", **page)


@bp.get("/p/<tenant>/<project>/stores/<store_id>/archive")
def confirm_archive_store(tenant: str, project: str, store_id: str) -> ResponseReturnValue:
    """The confirmation of a store's archiving."""
    found = stores().get_store(scope(), store_id)
    _require_write()  # the storage checks the creator, under the store's lock
    return _confirm(
        title=f"Archive {found.name}?",
        text="An archived store is read-only: its memories and versions stay, no one can"
        " change them (a memory may still be deleted). Archiving cannot be undone.",
        action=purl("archive_store", store_id=store_id),
        button="Archive store",
        danger=False,
        back=purl("store", store_id=store_id),
        fields={},
    )


@bp.post("/p/<tenant>/<project>/stores/<store_id>/archive")
def archive_store(tenant: str, project: str, store_id: str) -> ResponseReturnValue:
    """Archive a store: its creator, or project_admin and above."""
    store_service.archive_store(storage(), principal(), store_id)
    return see_other(purl("store", store_id=store_id))


@bp.get("/p/<tenant>/<project>/stores/<store_id>/delete")
def confirm_delete_store(tenant: str, project: str, store_id: str) -> ResponseReturnValue:
    """The confirmation of a store's delete."""
    found = stores().get_store(scope(), store_id)
    _require_write()  # the storage checks the creator, under the store's lock
    return _confirm(
        title=f"Delete {found.name}?",
        text="The store, every memory in it and every version of them are removed for good."
        " This cannot be undone.",
        action=purl("delete_store", store_id=store_id),
        button="Delete store",
        danger=True,
        back=purl("store", store_id=store_id),
        fields={},
    )


@bp.post("/p/<tenant>/<project>/stores/<store_id>/delete")
def delete_store(tenant: str, project: str, store_id: str) -> ResponseReturnValue:
    """Delete a store: its creator, or project_admin and above."""
    store_service.delete_store(storage(), principal(), store_id)
    return see_other(purl("stores"))


# -- memories ------------------------------------------------------------------------------
def _form(
    found: MemoryStore,
    *,
    mode: str,
    path: str,
    content: str,
    sha: str = "",
    memory: Memory | None = None,
    theirs: Memory | None = None,
    error: str | None = None,
) -> str:
    lines = None
    if theirs is not None:
        lines = list(
            render.diff_lines(theirs.content or "", content, "saved meanwhile", "your text")
        )
    return render_template(
        "console/memory_form.html",
        store=found,
        mode=mode,
        path=path,
        content=content,
        sha=sha,
        memory=memory,
        theirs=theirs,
        lines=lines,
        error=error,
        has_cr="\r" in content,
    )


@bp.get("/p/<tenant>/<project>/stores/<store_id>/memories/new")
def new_memory_form(tenant: str, project: str, store_id: str) -> ResponseReturnValue:
    """The form of a new memory (``path``: where it starts, a folder of the store)."""
    _require_write()
    found = stores().get_store(scope(), store_id)
    start = request.args.get("path", "/")[:1024] or "/"
    return _form(found, mode="create", path=start, content="")


@bp.post("/p/<tenant>/<project>/stores/<store_id>/memories/new")
def create_memory(tenant: str, project: str, store_id: str) -> ResponseReturnValue:
    """Create a memory (writer and above)."""
    path, content = field("path"), typed()
    try:
        made = store_service.create_memory(
            storage(), principal(), store_id, path=path, content=content
        )
    except _FORM_ERRORS as exc:
        code, message = _problem(exc)
        found = stores().get_store(scope(), store_id)
        return _form(found, mode="create", path=path, content=content, error=message), code
    return see_other(purl("memory", store_id=store_id, memory_id=made.id))


@bp.get("/p/<tenant>/<project>/stores/<store_id>/memories/<memory_id>/edit")
def edit_memory_form(
    tenant: str, project: str, store_id: str, memory_id: str
) -> ResponseReturnValue:
    """A memory's content in a text box, with the version it was read at."""
    _require_write()
    engine = stores()
    found = engine.get_store(scope(), store_id)
    item = engine.get_memory(scope(), store_id, memory_id, full=True)
    return _form(
        found,
        mode="edit",
        path=item.path,
        content=item.content or "",
        sha=item.content_sha256,
        memory=item,
    )


@bp.post("/p/<tenant>/<project>/stores/<store_id>/memories/<memory_id>/edit")
def update_memory(tenant: str, project: str, store_id: str, memory_id: str) -> ResponseReturnValue:
    """Save a memory's new content, if it is still the version the form was shown with."""
    content, sha = typed(), field("content_sha256", 64)
    try:
        store_service.update_memory(
            storage(), principal(), store_id, memory_id, content=content, precondition_sha256=sha
        )
    except _FORM_ERRORS as exc:
        return _refused_edit(store_id, memory_id, content, sha, exc)
    return see_other(purl("memory", store_id=store_id, memory_id=memory_id))


def _refused_edit(
    store_id: str, memory_id: str, content: str, sha: str, exc: Exception
) -> ResponseReturnValue:
    """The edit form again, with the text that was sent; after a conflict, beside what was
    saved meanwhile, with that version's sha256, so that saving again is a choice made
    having seen it. A memory deleted meanwhile becomes the form of a new one at its path."""
    code, message = _problem(exc)
    engine = stores()
    found = engine.get_store(scope(), store_id)
    try:
        current = engine.get_memory(scope(), store_id, memory_id, full=True)
    except NotFound:
        path = request.form.get("path_shown", "")[:1024] or "/"
        return _form(found, mode="create", path=path, content=content, error=message), 404
    theirs = current if isinstance(exc, ContentPreconditionFailed) else None
    return (
        _form(
            found,
            mode="edit",
            path=current.path,
            content=content,
            sha=current.content_sha256 if theirs is not None else sha,
            memory=current,
            theirs=theirs,
            error=message,
        ),
        code,
    )


@bp.get("/p/<tenant>/<project>/stores/<store_id>/memories/<memory_id>/rename")
def rename_memory_form(
    tenant: str, project: str, store_id: str, memory_id: str
) -> ResponseReturnValue:
    """A memory's path, to change."""
    _require_write()
    engine = stores()
    found = engine.get_store(scope(), store_id)
    item = engine.get_memory(scope(), store_id, memory_id, full=False)
    return render_template(
        "console/rename.html", store=found, memory=item, path=item.path, error=None
    )


@bp.post("/p/<tenant>/<project>/stores/<store_id>/memories/<memory_id>/rename")
def rename_memory(tenant: str, project: str, store_id: str, memory_id: str) -> ResponseReturnValue:
    """Move a memory to another path, if it is still the version the form was shown with."""
    path, sha = field("path"), field("content_sha256", 64)
    try:
        store_service.rename_memory(
            storage(), principal(), store_id, memory_id, path=path, precondition_sha256=sha
        )
    except _FORM_ERRORS as exc:
        code, message = _problem(exc)
        engine = stores()
        found = engine.get_store(scope(), store_id)
        item = engine.get_memory(scope(), store_id, memory_id, full=False)
        body = render_template(
            "console/rename.html", store=found, memory=item, path=path, error=message
        )
        return body, code
    return see_other(purl("memory", store_id=store_id, memory_id=memory_id))


@bp.get("/p/<tenant>/<project>/stores/<store_id>/memories/<memory_id>/delete")
def confirm_delete_memory(
    tenant: str, project: str, store_id: str, memory_id: str
) -> ResponseReturnValue:
    """The confirmation of a memory's delete."""
    _require_write()
    engine = stores()
    engine.get_store(scope(), store_id)
    item = engine.get_memory(scope(), store_id, memory_id, full=False)
    return _confirm(
        title=f"Delete {item.path}?",
        text="The memory leaves the store; its versions stay in the history, where a"
        " project_admin can redact them and anyone can restore one.",
        action=purl("delete_memory", store_id=store_id, memory_id=memory_id),
        button="Delete memory",
        danger=True,
        back=purl("memory", store_id=store_id, memory_id=memory_id),
        fields={"content_sha256": item.content_sha256},
    )


@bp.post("/p/<tenant>/<project>/stores/<store_id>/memories/<memory_id>/delete")
def delete_memory(tenant: str, project: str, store_id: str, memory_id: str) -> ResponseReturnValue:
    """Delete a memory, if it is still the version the confirmation was shown with."""
    store_service.delete_memory(
        storage(),
        principal(),
        store_id,
        memory_id,
        expected_sha256=field("content_sha256", 64) or None,
    )
    return see_other(purl("store", store_id=store_id))


# -- restoring a version -------------------------------------------------------------------
@bp.get("/p/<tenant>/<project>/stores/<store_id>/versions/<version_id>/restore")
def confirm_restore_version(
    tenant: str, project: str, store_id: str, version_id: str
) -> ResponseReturnValue:
    """The confirmation of writing an old version's content back."""
    _require_write()
    engine = stores()
    engine.get_store(scope(), store_id)
    old = engine.get_version(scope(), store_id, version_id, full=True)
    if old.content is None or old.path is None:
        raise Forbidden("a redacted or deleted version has no content to restore")
    current = _live(store_id, old.memory_id)
    text = (
        f"Its content becomes the content of {current.path} again, as a new version;"
        " the versions since stay in the history."
        if current is not None
        else f"The memory was deleted: it is created again at {old.path} with this content."
    )
    return _confirm(
        title=f"Restore version {old.id}?",
        text=text,
        action=purl("restore_version", store_id=store_id, version_id=version_id),
        button="Restore this version",
        danger=False,
        back=purl("version", store_id=store_id, version_id=version_id),
        fields={"content_sha256": current.content_sha256 if current is not None else ""},
    )


def _live(store_id: str, memory_id: str) -> Memory | None:
    try:
        return stores().get_memory(scope(), store_id, memory_id, full=False)
    except NotFound:
        return None


@bp.post("/p/<tenant>/<project>/stores/<store_id>/versions/<version_id>/restore")
def restore_version(
    tenant: str, project: str, store_id: str, version_id: str
) -> ResponseReturnValue:
    """Write an old version's content back: over its memory if it is still the version the
    confirmation was shown with, or as the memory again at the version's path if it was
    deleted."""
    made = store_service.restore_version(
        storage(),
        principal(),
        store_id,
        version_id,
        precondition_sha256=field("content_sha256", 64) or None,
    )
    return see_other(purl("memory", store_id=store_id, memory_id=made.id))


# -- redacting a version --------------------------------------------------------------------
@bp.get("/p/<tenant>/<project>/stores/<store_id>/versions/<version_id>/redact")
def confirm_redact_version(
    tenant: str, project: str, store_id: str, version_id: str
) -> ResponseReturnValue:
    """The confirmation of a memory version's redaction (project_admin and above)."""
    if not may_redact(principal()):
        raise Forbidden("only a project_admin may redact a memory version")
    engine = stores()
    found = engine.get_store(scope(), store_id)
    item = engine.get_version(scope(), store_id, version_id, full=False)
    return render_template("console/redact.html", store=found, version=item)


@bp.post("/p/<tenant>/<project>/stores/<store_id>/versions/<version_id>/redact")
def redact_version(
    tenant: str, project: str, store_id: str, version_id: str
) -> ResponseReturnValue:
    """Redact a memory version (project_admin and above)."""
    store_service.redact_version(storage(), principal(), store_id, version_id)
    return see_other(purl("version", store_id=store_id, version_id=version_id))
