"""The web console: server-rendered pages over the same storage calls as the APIs.

Every page reads through the engines' indexes (the task listing, a task's index.json, a
turn's record, a store's index), never a walk of the tree. Authentication is a signed
session cookie (app/console/session.py) checked on the blueprint, so a new route cannot
forget it; the unauthenticated answer is a redirect to the sign-in page. Only the sign-in
page and the static assets are public.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from markupsafe import Markup
from werkzeug.exceptions import Forbidden, HTTPException, NotFound
from werkzeug.wrappers import Response
from werkzeug.wsgi import wrap_file

from app.console import admin, audit, base, charts, render, session as sessions
from app.services.access import (
    Principal,
    covers,
    may_delete_task,
    may_manage,
    may_redact,
    may_write,
    only_owner,
)
from app.services.usage_report import projects_overview
from app.storage import Corrupt, InvalidName, Scope, StorageError, TaskSummary
from app.storage.core.clock import parse_iso
from app.storage.core.names import validate_id
from app.storage.core.store_models import Memory, MemoryPrefix, VersionFilter
from app.storage.core.tokens import Token
from app.storage.interface import TaskBackend
from app.web import ratelimit
from app.web.artifacts import ARTIFACT_SECURITY_HEADERS, DIGEST_CHUNK
from app.web.errors import ApiError, RequestValidationError, from_storage

log = logging.getLogger("app.console")

bp = base.bp

# The routes that answer without a session: the sign-in form and the assets it needs, and
# "/" (a redirect to /console/).
PUBLIC_ENDPOINTS = frozenset(
    {"console.signin", "console.signin_post", "console.static", "console_root"}
)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self';"
    " object-src 'none'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
TASKS_PER_PAGE = 50
TURNS_PER_PAGE = 20
STORES_PER_PAGE = 50
MEMORIES_PER_PAGE = 100
VERSIONS_PER_PAGE = 50
HITS_PER_PAGE = 20
TIMELINE_SUMMARY_CHARS = 16_000  # per turn on a task's timeline; its turn page shows it all
DIGEST_RENDER_BYTES = 256 * 1024  # of project.md; the rest is a download
EXPIRING_SOON = timedelta(days=3)
SPARK_DAYS = 14


def init_app(app: Flask) -> None:
    sessions.init_app(app)
    app.register_blueprint(bp)
    app.add_url_rule("/", "console_root", lambda: redirect("/console/", code=302))


# -- storage and request context ------------------------------------------------------------
_storage = base.storage
_tasks = base.tasks
_stores = base.stores
_registry = base.registry
_principal = base.principal
_scope = base.scope
_actor = base.actor
_purl = base.purl
_redirect = base.see_other
_arg = base.arg


def _signed_in_token() -> Token | None:
    current = g.console_session
    if current is None or current.token_id is None:
        return None
    token = _registry().get(current.token_id)
    if token is None or not token.usable(_registry().clock()):
        return None
    if sessions.ended_by_sign_out(current, token):
        return None
    return token


def _safe_next(target: str | None) -> str | None:
    """A path inside the console to return to after sign-in; anything else is dropped."""
    if not target or len(target) > 2048 or "\\" in target:
        return None
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in target):
        return None  # whitespace and controls: browsers strip some, headers refuse others
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/console/"):
        return None
    if target.startswith("//") or "/../" in parts.path or parts.path.endswith("/.."):
        return None
    return target


@bp.before_request
def _guard() -> ResponseReturnValue | None:
    g.console_session = sessions.load()
    g.console_token = None
    if request.method == "POST" and not sessions.same_origin():
        raise Forbidden("this form was posted from another site")
    if request.endpoint in PUBLIC_ENDPOINTS:
        if request.method == "POST" and not sessions.csrf_ok(g.console_session):
            raise Forbidden("the form expired or did not come from this console; try again")
        return None
    token = _signed_in_token()
    if token is None:
        ended = g.console_session is not None and g.console_session.token_id is not None
        target = request.full_path if request.method == "GET" else None
        args: dict[str, Any] = {}
        if ended:
            args["ended"] = "1"
        if target and _safe_next(target.rstrip("?")):
            args["next"] = target.rstrip("?")
        response = _redirect(url_for("console.signin", **args))
        if ended:
            sessions.clear(response)
        return response
    g.token_id = token.id  # for the request log line
    g.console_token = token
    if request.method == "POST" and not sessions.csrf_ok(g.console_session):
        raise Forbidden("the form expired or did not come from this console; try again")
    view_args = request.view_args or {}
    if "project" in view_args:
        try:
            scope = Scope(view_args["tenant"], view_args["project"])
        except InvalidName:
            raise NotFound("no such project") from None
        if not covers(token, scope):
            raise Forbidden(f"this token may not act in {scope.tenant}/{scope.project}")
        g.principal = Principal(token, scope)
        g.tenant, g.project = scope.tenant, scope.project
        if request.method == "POST" and not may_write(g.principal):
            raise Forbidden(f"role {token.role} may only read")
        # The API's budgets, the same buckets: a page costs what an API request costs.
        if not _limits_page_of(token, scope.tenant):
            ratelimit.check_request()
        return None
    tenant = view_args.get("tenant")
    if tenant is not None:
        # A tenant's own pages (its tokens, its limits): tenant_admin and admin tokens.
        try:
            validate_id("tenant", tenant)
        except InvalidName:
            raise NotFound("no such tenant") from None
        if not base.covers_tenant(token, tenant):
            raise Forbidden(f"this token may not manage tenant {tenant}")
        g.tenant = tenant
    # A page in no project costs the token's budget alone.
    if tenant is None or not _limits_page_of(token, tenant):
        ratelimit.check_token_request(token.id, token.role, tenant or token.tenant)
    return None


def _limits_page_of(token: Token, tenant: str) -> bool:
    """Whether this request is to a limits page of ``tenant`` by a token that may change its
    limits: those are never rate limited, so that a rate set too low (a project's or the
    tenant's) cannot lock out the one who may clear it."""
    return request.endpoint in admin.LIMITS_ENDPOINTS and base.covers_tenant(token, tenant)


@bp.after_request
def _headers(response: Response) -> Response:
    headers = response.headers
    # An artifact brings its own, stricter policy (sandbox); every page gets ours.
    headers.setdefault("Content-Security-Policy", CSP)
    headers["X-Frame-Options"] = "DENY"
    headers["Referrer-Policy"] = "no-referrer"
    headers["X-Content-Type-Options"] = "nosniff"
    if request.endpoint != "console.static":
        # Pages show private data: a shared machine's back button must not bring them back.
        headers["Cache-Control"] = "no-store"
    fresh = g.get("console_new_session")
    if fresh is not None:
        sessions.save(response, fresh)
    return response


@bp.context_processor
def _template_context() -> dict[str, Any]:
    current = g.get("console_new_session") or g.get("console_session")
    principal = g.get("principal")
    return {
        "csrf": current.csrf if current is not None else "",
        "me": g.get("console_token"),
        "scope": principal.scope if principal is not None else None,
        "can_write": principal is not None and may_write(principal),
        "can_admin": principal is not None and may_manage(principal),
        "tenant_page": g.get("tenant") if principal is None else None,
        "manages_tenant": _manages_tenant(g.get("console_token")),
        "many_projects": _covers_many(g.get("console_token")),
        "ts": render.time_tag,
        "size": render.size,
        "short": render.short,
        "snippet": render.snippet,
        "token_label": _token_label,
        "purl": _purl,
    }


def _manages_tenant(token: Token | None) -> bool:
    return (
        token is not None and token.tenant is not None and base.covers_tenant(token, token.tenant)
    )


def _covers_many(token: Token | None) -> bool:
    return token is not None and (token.role == "admin" or token.project is None)


def _token_label(token_id: Any) -> Markup:
    """A token by its name, its id on hover (the id alone when it has no name)."""
    if not isinstance(token_id, str) or not token_id:
        return Markup("<span>unknown</span>")
    # A page names the same few tokens many times (a list of 50 tasks): look each up once.
    seen: dict[str, Token | None] = g.setdefault("console_tokens", {})
    if token_id not in seen:
        seen[token_id] = _registry().get(token_id)
    token = seen[token_id]
    if token is None or not token.name:
        return Markup("<span>{}</span>").format(token_id)
    return Markup('<span title="{}">{}</span>').format(token_id, token.name)


# -- errors: HTML pages for the console's own routes ---------------------------------------
def _error_page(code: int, message: str, headers: dict[str, str] | None = None) -> Response:
    titles = {
        400: "Bad request",
        403: "Not allowed",
        404: "Not found",
        409: "Conflict",
        412: "Changed meanwhile",
        413: "Too large",
        422: "Not valid",
        503: "Busy",
        507: "Disk full",
    }
    body = render_template(
        "console/error.html", code=code, title=titles.get(code, "Error"), message=message
    )
    response = Response(body, status=code, mimetype="text/html")
    if headers:
        response.headers.update(headers)
    return response


def _http_message(exc: HTTPException) -> str:
    if isinstance(exc, ApiError):
        return exc.message
    if isinstance(exc, RequestValidationError):
        return "; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in exc.errors)
    return exc.description or exc.name


_ADDRESS_FIELDS = frozenset({"task_id", "turn", "name", "tenant", "project"})


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException) -> ResponseReturnValue:
    if exc.code is not None and exc.code < 400:
        return exc
    # Retry-After and the RateLimit fields of a 429, as the API sends them.
    headers: dict[str, str] | None = getattr(exc, "extra_headers", None)
    return _error_page(exc.code or 500, _http_message(exc), headers)


@bp.errorhandler(StorageError)
def _storage_error(exc: StorageError) -> ResponseReturnValue:
    mapped = from_storage(exc)
    code = mapped.code or 500
    if isinstance(exc, InvalidName) and exc.field in _ADDRESS_FIELDS:
        code = 404  # a malformed id in a URL names nothing
    retry = getattr(mapped, "extra_headers", {}).get("Retry-After")
    return _error_page(code, _http_message(mapped), {"Retry-After": retry} if retry else None)


@bp.errorhandler(Exception)
def _unexpected(exc: Exception) -> ResponseReturnValue:
    log.exception("console: unhandled error")
    return _error_page(500, "internal error")


# -- sign-in -------------------------------------------------------------------------------
@bp.get("/signin")
def signin() -> ResponseReturnValue:
    """Sign in with a token."""
    if _signed_in_token() is not None:
        return _redirect(url_for("console.index"))
    if g.console_session is None:
        g.console_new_session = sessions.new(None)
    notice = None
    if request.args.get("ended"):
        notice = "Your session ended: the token was revoked or has expired. Sign in again."
    elif request.args.get("out"):
        notice = "Signed out."
    return render_template(
        "console/signin.html", notice=notice, error=None, next=_safe_next(request.args.get("next"))
    )


@bp.post("/signin")
def signin_post() -> ResponseReturnValue:
    secret = request.form.get("token", "").strip()
    token = _registry().authenticate(secret)
    target = _safe_next(request.form.get("next"))
    if token is None:
        g.console_new_session = sessions.new(None)
        body = render_template(
            "console/signin.html",
            notice=None,
            error="That token is not valid (wrong, expired or revoked).",
            next=target,
        )
        return Response(body, status=403, mimetype="text/html")
    g.console_new_session = sessions.new(token.id)
    g.token_id, g.tenant, g.console_token = token.id, token.tenant, token
    audit.record("session", "signed_in", token.id, project=token.project)
    return _redirect(target or url_for("console.index"))


@bp.post("/signout")
def signout() -> ResponseReturnValue:
    """Sign out: this session, and any copy of its cookie, end here."""
    current = g.console_session
    if current is not None and current.token_id is not None:
        with contextlib.suppress(StorageError):  # a token removed since: nothing to end
            _registry().end_console_sessions(current.token_id)
        token = g.console_token
        g.tenant = token.tenant
        audit.record("session", "signed_out", token.id, project=token.project)
    response = _redirect(url_for("console.signin", out="1"))
    sessions.clear(response)
    return response


# -- choosing a project --------------------------------------------------------------------
@bp.get("/")
def index() -> ResponseReturnValue:
    """Home: the token's project, or the project menu when it covers several."""
    token: Token = g.console_token
    if not _covers_many(token) and token.tenant and token.project:
        return _redirect(url_for("console.tasks", tenant=token.tenant, project=token.project))
    return _redirect(url_for("console.projects"))


@bp.get("/projects")
def projects() -> ResponseReturnValue:
    """Projects this token covers."""
    token: Token = g.console_token
    tenants = None if token.role == "admin" else [token.tenant or ""]
    found = [s for s in _storage().projects(tenants) if covers(token, s)]
    if token.tenant and token.project:
        own = Scope(token.tenant, token.project)
        if own not in found:
            found.insert(0, own)
    rows = projects_overview(_storage(), found, days=SPARK_DAYS)
    return render_template(
        "console/projects.html",
        rows=rows,
        spark=lambda row: charts.sparkline(
            [d.label for d in row.days],
            [d.requests for d in row.days],
            name="requests",
            title=f"Requests per day, last {SPARK_DAYS} days",
            label=lambda n: f"{n:,} request{'' if n == 1 else 's'}",
        ),
    )


@bp.get("/p/<tenant>/<project>/")
def project_home(tenant: str, project: str) -> ResponseReturnValue:
    return _redirect(_purl("tasks"))


# -- tasks ---------------------------------------------------------------------------------
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
    _tasks().delete_task(_scope(), task_id, only_owner=only_owner(_principal()))
    audit.record("task", "deleted", task_id)
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
        may_delete=may_delete_task(_principal(), summary.owner if summary else None),
    )


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
    store = _tasks()
    store.delete_turn(
        _scope(),
        task_id,
        turn,
        only_owner=only_owner(_principal()),
        if_match=request.form.get("if_match") or None,
    )
    audit.record("turn", "deleted", task_id, {"turn": turn})
    if _summary_or_none(store, task_id) is None:  # its last turn: the task went too
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
    _tasks().delete_artifact(
        _scope(),
        task_id,
        turn,
        name,
        only_owner=only_owner(_principal()),
        if_match=request.form.get("if_match") or None,
    )
    audit.record("artifact", "deleted", task_id, {"turn": turn, "name": name})
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


# -- search --------------------------------------------------------------------------------
@bp.get("/p/<tenant>/<project>/search")
def search(tenant: str, project: str) -> ResponseReturnValue:
    """Search the project's turns and memories."""
    query = request.args.get("q", "")
    cursor = request.args.get("cursor") or None
    page, error = None, None
    if query.strip():
        try:
            page = _storage().search(_scope(), query, limit=HITS_PER_PAGE, cursor=cursor)
        except InvalidName as exc:
            # A query outside the syntax, or a cursor of another search: say so on the page.
            error = exc.message if exc.field == "q" else f"{exc.field}: {exc.message}"
    next_url = None
    if page is not None and page.next_cursor:
        next_url = _purl("search", q=query, cursor=page.next_cursor)
    return render_template(
        "console/search.html",
        query=query,
        page=page,
        error=error,
        first_url=_purl("search", q=query) if cursor else None,
        next_url=next_url,
    )


# -- project.md ----------------------------------------------------------------------------
@bp.get("/p/<tenant>/<project>/project.md")
def project_md(tenant: str, project: str) -> ResponseReturnValue:
    """The project digest, rendered."""
    file, total = _tasks().open_digest(_scope())
    with file:
        head = file.read(DIGEST_RENDER_BYTES + 1)
    cut = len(head) > DIGEST_RENDER_BYTES
    if cut:
        # At a line end, so a Markdown block is never split inside a line.
        head = head[: head.rfind(b"\n", 0, DIGEST_RENDER_BYTES) + 1 or DIGEST_RENDER_BYTES]
    text = head.decode("utf-8", errors="replace")
    return render_template(
        "console/project_md.html", html=render.markdown(text), cut=cut, shown=len(head), total=total
    )


@bp.get("/p/<tenant>/<project>/project.md/raw")
def project_md_raw(tenant: str, project: str) -> ResponseReturnValue:
    """The project digest as a file."""
    file, total = _tasks().open_digest(_scope())
    response = Response(
        wrap_file(request.environ, file, DIGEST_CHUNK),
        mimetype="text/markdown",
        direct_passthrough=True,
    )
    response.content_length = total
    response.headers.set("Content-Disposition", "attachment", filename="project.md")
    response.headers.update(ARTIFACT_SECURITY_HEADERS)
    return response


# -- memory stores -------------------------------------------------------------------------
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


@bp.get("/p/<tenant>/<project>/stores/<store_id>/versions/<version_id>/redact")
def confirm_redact_version(
    tenant: str, project: str, store_id: str, version_id: str
) -> ResponseReturnValue:
    """The confirmation of a memory version's redaction (project_admin and above)."""
    if not may_redact(_principal()):
        raise Forbidden("only a project_admin may redact a memory version")
    engine = _stores()
    found = engine.get_store(_scope(), store_id)
    item = engine.get_version(_scope(), store_id, version_id, full=False)
    return render_template("console/redact.html", store=found, version=item)


@bp.post("/p/<tenant>/<project>/stores/<store_id>/versions/<version_id>/redact")
def redact_version(
    tenant: str, project: str, store_id: str, version_id: str
) -> ResponseReturnValue:
    """Redact a memory version (project_admin and above)."""
    if not may_redact(_principal()):
        raise Forbidden("only a project_admin may redact a memory version")
    done = _stores().redact_version(_scope(), store_id, version_id, actor=_actor())
    audit.record(
        "memory", "redacted", done.memory_id, {"version_id": version_id}, store_id=store_id
    )
    return _redirect(_purl("version", store_id=store_id, version_id=version_id))


# Anything else under /console/ is an HTML 404 behind the session, not the API's JSON one.
@bp.get("/<path:rest>")
def missing(rest: str) -> ResponseReturnValue:
    raise NotFound("no such page")
