"""A project's tasks in the console: the list (filtered, sorted, paged both ways), a task's
turns as a timeline, one turn, one artifact (a preview, a download), and the deletes of each,
every delete behind a confirmation that shows what goes.

A delete is offered to who may make it (the task's owner, or a project_admin and above); the
storage checks the owner again under the task's lock, so a page read before a change of owner
cannot delete what is no longer its reader's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from flask import render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import Forbidden, NotFound
from werkzeug.wrappers import Response
from werkzeug.wsgi import wrap_file

from app.console import base, render
from app.services import tasks as task_service
from app.services.access import may_delete_task
from app.storage.core import ledger as lg
from app.storage.core.clock import parse_iso
from app.storage.core.errors import Corrupt, InvalidName, StorageError
from app.storage.core.models import TaskSummary
from app.storage.interface import TaskBackend
from app.web.artifacts import ARTIFACT_SECURITY_HEADERS

bp = base.bp

TASKS_PER_PAGE = 50
TURNS_PER_PAGE = 20
TIMELINE_SUMMARY_CHARS = 16_000  # per turn on a task's timeline; its turn page shows it all
EXPIRING_SOON = timedelta(days=3)
TURN_PREVIEWS = 5  # text artifacts previewed on a turn's page
TURN_PREVIEW_BYTES = 4096  # of each

_tasks = base.tasks
_principal = base.principal
_scope = base.scope
_purl = base.purl
_redirect = base.see_other
_arg = base.arg

SORTS = {"updated": "Last update", "task_id": "Task id", "size": "Size", "turns": "Turns"}
# The natural direction of each order: newest, largest and longest first; ids A to Z.
ASCENDING_FIRST = frozenset({"task_id"})
PAGE_SIZES = (20, 50, 100, 200)


@dataclass(frozen=True, slots=True)
class _Filters:
    prefix: str
    model: str
    agent: str
    failed: bool

    def args(self) -> dict[str, str]:
        found = {"q": self.prefix, "model": self.model, "agent": self.agent}
        if self.failed:
            found["failed"] = "1"
        return {k: v for k, v in found.items() if v}


@dataclass(frozen=True, slots=True)
class _Order:
    sort: str
    descending: bool
    per_page: int

    @classmethod
    def of_request(cls) -> _Order:
        sort = _arg("sort", 16)
        sort = sort if sort in SORTS else "updated"
        direction = _arg("dir", 8)
        natural = sort not in ASCENDING_FIRST
        descending = natural if direction not in ("asc", "desc") else direction == "desc"
        per_page = base.int_arg("per_page", TASKS_PER_PAGE, highest=PAGE_SIZES[-1])
        return cls(sort, descending, per_page)

    def args(self) -> dict[str, str | int]:
        found: dict[str, str | int] = {}
        if self.sort != "updated":
            found["sort"] = self.sort
        if self.descending != (self.sort not in ASCENDING_FIRST):
            found["dir"] = "desc" if self.descending else "asc"
        if self.per_page != TASKS_PER_PAGE:
            found["per_page"] = self.per_page
        return found


def _deleted_notice(store: TaskBackend) -> str | None:
    """The task a delete just redirected here with (?deleted=), only if that is a task id
    and no such task exists: a link cannot make the page announce what it likes."""
    task_id = request.args.get("deleted", "")
    if not task_id:
        return None
    try:
        store.get_task(_scope(), task_id)
    except InvalidName:
        return None
    except StorageError:
        return task_id  # gone: the delete happened
    return None


@bp.get("/p/<tenant>/<project>/tasks")
def tasks(tenant: str, project: str) -> ResponseReturnValue:
    """Tasks, most recently updated first (or by id, size or turn count)."""
    filters = _Filters(_arg("q", 128), _arg("model"), _arg("agent"), _arg("failed") == "1")
    order = _Order.of_request()
    # "cursor": what the "next page" links said before they could also go back.
    after = request.args.get("after") or request.args.get("cursor") or None
    before = request.args.get("before") or None
    store = _tasks()
    error = None
    try:
        page = store.list_tasks(
            _scope(),
            limit=order.per_page,
            cursor=before or after,
            backward=before is not None,
            prefix=filters.prefix or None,
            model=filters.model or None,
            agent_id=filters.agent or None,
            failed=filters.failed,
            sort=order.sort,
            descending=order.descending,
        )
    except InvalidName as exc:
        # A prefix no task id can start with, or a cursor from elsewhere: say so on the page.
        error = f"{exc.field}: {exc.message}"
        page = None
    soon = store.clock() + EXPIRING_SOON
    rows = [
        {"task": t, "soon": parse_iso(t.retain_until) <= soon} for t in (page.tasks if page else ())
    ]
    keep = {**filters.args(), **order.args()}
    return render_template(
        "console/tasks.html",
        rows=rows,
        page=page,
        filters=filters,
        order=order,
        sorts=SORTS,
        page_sizes=PAGE_SIZES,
        keep=keep,
        first_url=_purl("tasks", **keep) if (after or before) else None,
        next_url=_purl("tasks", after=page.next_cursor, **keep)
        if page and page.next_cursor
        else None,
        prev_url=_purl("tasks", before=page.prev_cursor, **keep)
        if page and page.prev_cursor
        else None,
        error=error,
        deleted=_deleted_notice(store),
    )


def _turn_view(record: Any, *, timeline: bool) -> dict[str, Any]:
    summary = record.summary_md
    cut = timeline and len(summary) > TIMELINE_SUMMARY_CHARS
    return {
        "record": record,
        "meta": render.meta_rows(record.meta),
        "summary": render.markdown(summary[:TIMELINE_SUMMARY_CHARS] if cut else summary),
        "cut": cut,
    }


@bp.get("/p/<tenant>/<project>/tasks/<task_id>")
def task(tenant: str, project: str, task_id: str) -> ResponseReturnValue:
    """A task's turns as a timeline, newest first."""
    store = _tasks()
    index = store.get_task(_scope(), task_id)
    entries = list(reversed(index.turns))
    pages = max(1, -(-len(entries) // TURNS_PER_PAGE))
    number = min(max(1, _int_arg("page", 1)), pages)
    shown = entries[(number - 1) * TURNS_PER_PAGE : number * TURNS_PER_PAGE]
    turns = []
    for entry in shown:
        try:
            record = store.get_turn(_scope(), task_id, entry.turn)
        except Corrupt:
            turns.append({"damaged": entry.turn})
            continue
        except StorageError:
            continue  # expired or deleted since the index was read
        turns.append(_turn_view(record, timeline=True))
    return render_template(
        "console/task.html",
        index=index,
        summary=_summary_or_none(store, task_id),
        artifacts=sum(len(entry.artifacts) for entry in index.turns),
        turns=turns,
        page=number,
        pages=pages,
        may_delete=may_delete_task(_principal(), index.owner),
    )


def _summary_or_none(store: TaskBackend, task_id: str) -> TaskSummary | None:
    # The listing row can lag the index by a write in flight: the page shows it without.
    try:
        return store.task_summary(_scope(), task_id)
    except StorageError:
        return None


def _int_arg(name: str, default: int) -> int:
    raw = request.args.get(name, "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 7 else default


@bp.get("/p/<tenant>/<project>/tasks/<task_id>/delete")
def confirm_delete_task(tenant: str, project: str, task_id: str) -> ResponseReturnValue:
    """The confirmation of a task's delete (its owner, or project_admin and above)."""
    index = _tasks().get_task(_scope(), task_id)
    if not may_delete_task(_principal(), index.owner):
        raise Forbidden("only the task's owner or a project_admin may delete it")
    return render_template("console/delete_task.html", index=index)


@bp.post("/p/<tenant>/<project>/tasks/<task_id>/delete")
def delete_task(tenant: str, project: str, task_id: str) -> ResponseReturnValue:
    """Delete a task: its owner, or project_admin and above (the storage checks the owner
    under the task's lock)."""
    task_service.delete_task(base.storage(), _principal(), task_id)
    return _redirect(_purl("tasks", deleted=task_id))


@bp.get("/p/<tenant>/<project>/tasks/<task_id>/turns/<int:turn>")
def turn(tenant: str, project: str, task_id: str, turn: int) -> ResponseReturnValue:
    """One turn: all its meta, its summary and its artifacts."""
    store = _tasks()
    record = store.get_turn(_scope(), task_id, turn)
    summary = _summary_or_none(store, task_id)
    return render_template(
        "console/turn.html",
        turn=_turn_view(record, timeline=False),
        facts=lg.entry_of(record),
        previews=_previews(store, record),
        may_delete=may_delete_task(_principal(), summary.owner if summary else None),
    )


@dataclass(frozen=True, slots=True)
class Preview:
    text: str
    shown: int  # bytes of the artifact the text is made of


def _previews(store: Any, record: Any) -> dict[str, Preview]:
    """The start of the turn's first few text artifacts, by name: a turn of many large logs
    costs a bounded read (TURN_PREVIEWS of TURN_PREVIEW_BYTES), the rest is a click away."""
    found: dict[str, Preview] = {}
    for info in record.artifacts:
        if len(found) >= TURN_PREVIEWS:
            break
        if render.artifact_kind(info.content_type) != "text" or info.size == 0:
            continue
        opened = store.open_artifact(_scope(), record.task_id, record.turn, info.name)
        with opened.file:
            head = opened.file.read(TURN_PREVIEW_BYTES)
        text = render.text_preview(head)
        if text is not None:
            found[info.name] = Preview(text, len(head))
    return found


def _deletable_turn(task_id: str, turn: int) -> Any:
    """The turn, for a confirmation its reader may act on (its owner, or project_admin)."""
    store = _tasks()
    record = store.get_turn(_scope(), task_id, turn)
    summary = _summary_or_none(store, task_id)
    if not may_delete_task(_principal(), summary.owner if summary else None):
        raise Forbidden("only the task's owner or a project_admin may delete it")
    return record


@bp.get("/p/<tenant>/<project>/tasks/<task_id>/turns/<int:turn>/delete")
def confirm_delete_turn(tenant: str, project: str, task_id: str, turn: int) -> ResponseReturnValue:
    """The confirmation of one turn's delete."""
    record = _deletable_turn(task_id, turn)
    count = len(record.artifacts)
    return render_template(
        "console/confirm.html",
        title=f"Delete turn {turn} of {task_id}?",
        text=f"Its meta, its summary and its {count} artifact{'' if count == 1 else 's'} are"
        " removed for good, from every file the server keeps (the search index and"
        " project.md too). If it is the task's last turn, the task goes with it. This"
        " cannot be undone.",
        action=_purl("delete_turn", task_id=task_id, turn=turn),
        button="Delete turn",
        danger=True,
        back=_purl("turn", task_id=task_id, turn=turn),
        fields={"if_match": record.etag},
    )


@bp.post("/p/<tenant>/<project>/tasks/<task_id>/turns/<int:turn>/delete")
def delete_turn(tenant: str, project: str, task_id: str, turn: int) -> ResponseReturnValue:
    """Delete one turn, if it is still the version the confirmation showed (its ETag)."""
    task_service.delete_turn(
        base.storage(),
        _principal(),
        task_id,
        turn,
        if_match=request.form.get("if_match") or None,
    )
    if _summary_or_none(_tasks(), task_id) is None:  # its last turn: the task went too
        return _redirect(_purl("tasks", deleted=task_id))
    return _redirect(_purl("task", task_id=task_id))


@bp.get("/p/<tenant>/<project>/tasks/<task_id>/turns/<int:turn>/artifacts/<name>")
def artifact(tenant: str, project: str, task_id: str, turn: int, name: str) -> ResponseReturnValue:
    """An artifact: a preview for text and raster images, a download for everything."""
    store = _tasks()
    record = store.get_turn(_scope(), task_id, turn)
    info = next((a for a in record.artifacts if a.name == name), None)
    if info is None:
        raise NotFound(f"artifact {name} of turn {turn} of task {task_id} not found")
    kind = render.artifact_kind(info.content_type)
    text = None
    shown = 0
    if kind == "text":
        opened = store.open_artifact(_scope(), task_id, turn, name)
        with opened.file:
            head = opened.file.read(render.TEXT_PREVIEW_BYTES)
        shown = len(head)
        text = render.text_preview(head)
        if text is None:
            kind = "download"  # declared as text, holds binary
    summary = _summary_or_none(store, task_id)
    return render_template(
        "console/artifact.html",
        record=record,
        info=info,
        kind=kind,
        text=text,
        shown=shown,
        may_delete=may_delete_task(_principal(), summary.owner if summary else None),
    )


@bp.get("/p/<tenant>/<project>/tasks/<task_id>/turns/<int:turn>/artifacts/<name>/delete")
def confirm_delete_artifact(
    tenant: str, project: str, task_id: str, turn: int, name: str
) -> ResponseReturnValue:
    """The confirmation of one artifact's delete."""
    record = _deletable_turn(task_id, turn)
    info = next((a for a in record.artifacts if a.name == name), None)
    if info is None:
        raise NotFound(f"artifact {name} of turn {turn} of task {task_id} not found")
    return render_template(
        "console/confirm.html",
        title=f"Delete {name}?",
        text=f"The {render.size(info.size)} of {name} (turn {turn} of {task_id}) are removed for"
        " good; the turn stays, without it. This cannot be undone.",
        action=_purl("delete_artifact", task_id=task_id, turn=turn, name=name),
        button="Delete artifact",
        danger=True,
        back=_purl("artifact", task_id=task_id, turn=turn, name=name),
        fields={"if_match": info.etag},
    )


@bp.post("/p/<tenant>/<project>/tasks/<task_id>/turns/<int:turn>/artifacts/<name>/delete")
def delete_artifact(
    tenant: str, project: str, task_id: str, turn: int, name: str
) -> ResponseReturnValue:
    """Delete one artifact, if it is still the one the confirmation showed (its ETag)."""
    task_service.delete_artifact(
        base.storage(),
        _principal(),
        task_id,
        turn,
        name,
        if_match=request.form.get("if_match") or None,
    )
    return _redirect(_purl("turn", task_id=task_id, turn=turn))


@bp.get("/p/<tenant>/<project>/tasks/<task_id>/turns/<int:turn>/artifacts/<name>/raw")
def artifact_raw(
    tenant: str, project: str, task_id: str, turn: int, name: str
) -> ResponseReturnValue:
    """The artifact's bytes: inline for raster images asked for inline, else a download."""
    opened = _tasks().open_artifact(_scope(), task_id, turn, name)
    kind = render.base_type(opened.info.content_type)
    inline = request.args.get("inline") == "1" and kind in render.RASTER_TYPES
    response = Response(
        wrap_file(request.environ, opened.file),
        content_type=kind if inline else opened.info.content_type,
        direct_passthrough=True,
    )
    response.content_length = opened.size
    response.set_etag(opened.info.sha256)
    response.headers.update(ARTIFACT_SECURITY_HEADERS)
    response.headers.set(
        "Content-Disposition", "inline" if inline else "attachment", filename=opened.info.name
    )
    return response.make_conditional(
        request.environ, accept_ranges=True, complete_length=opened.size
    )
