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

from flask import Blueprint, Flask, current_app, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from markupsafe import Markup
from werkzeug.exceptions import Forbidden, HTTPException, NotFound
from werkzeug.wrappers import Response
from werkzeug.wsgi import wrap_file

from app.api.project_memory import ARTIFACT_SECURITY_HEADERS, DIGEST_CHUNK
from app.console import render, session as sessions
from app.storage import Corrupt, InvalidName, Scope, StorageError
from app.storage.core.clock import parse_iso
from app.storage.core.store_models import Memory, MemoryPrefix, VersionFilter
from app.storage.core.tokens import Token
from app.storage.interface import StorageBackend, StoreBackend, TaskBackend, TokenStore
from app.web.auth import Principal
from app.web.errors import ApiError, RequestValidationError, from_storage
from app.web.permissions import covers, may_delete_task, may_redact_version, may_write, only_owner

log = logging.getLogger("app.console")

bp = Blueprint(
    "console",
    __name__,
    url_prefix="/console",
    template_folder="templates",
    static_folder="static",
)

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


def init_app(app: Flask) -> None:
    sessions.init_app(app)
    app.register_blueprint(bp)
    app.add_url_rule("/", "console_root", lambda: redirect("/console/", code=302))


# -- storage and request context ------------------------------------------------------------
def _storage() -> StorageBackend:
    found: StorageBackend = current_app.extensions["storage"]
    return found


def _tasks() -> TaskBackend:
    return _storage().tasks


def _stores() -> StoreBackend:
    return _storage().stores


def _registry() -> TokenStore:
    found: TokenStore = current_app.extensions["token_registry"]
    return found


def _principal() -> Principal:
    found: Principal = g.principal
    return found


def _scope() -> Scope:
    return _principal().scope


def _actor() -> dict[str, Any]:
    """Who did it, as the memory-stores API records it: the same audit trail."""
    return {"type": "api_actor", "api_key_id": _principal().token.id}


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


def _redirect(location: str) -> Response:
    # 303: after a POST the browser follows with a GET.
    return redirect(location, code=303)


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
    if "tenant" in view_args:
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
    return None


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
        "many_projects": _covers_many(g.get("console_token")),
        "ts": render.time_tag,
        "size": render.size,
        "short": render.short,
        "snippet": render.snippet,
        "token_label": _token_label,
        "purl": _purl,
    }


def _purl(endpoint: str, **values: Any) -> str:
    """url_for a page of the current project."""
    scope = _scope()
    return url_for(f"console.{endpoint}", tenant=scope.tenant, project=scope.project, **values)


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
    return _error_page(exc.code or 500, _http_message(exc))


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
    g.token_id = token.id
    return _redirect(target or url_for("console.index"))


@bp.post("/signout")
def signout() -> ResponseReturnValue:
    """Sign out: this session, and any copy of its cookie, end here."""
    current = g.console_session
    if current is not None and current.token_id is not None:
        with contextlib.suppress(StorageError):  # a token removed since: nothing to end
            _registry().end_console_sessions(current.token_id)
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
    return render_template("console/projects.html", projects=found)


@bp.get("/p/<tenant>/<project>/")
def project_home(tenant: str, project: str) -> ResponseReturnValue:
    return _redirect(_purl("tasks"))


# -- tasks ---------------------------------------------------------------------------------
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


def _arg(name: str, limit: int = 256) -> str:
    return request.args.get(name, "").strip()[:limit]


@bp.get("/p/<tenant>/<project>/tasks")
def tasks(tenant: str, project: str) -> ResponseReturnValue:
    """Tasks, most recently updated first."""
    filters = _Filters(_arg("q", 128), _arg("model"), _arg("agent"), _arg("failed") == "1")
    cursor = request.args.get("cursor") or None
    store = _tasks()
    error = None
    try:
        page = store.list_tasks(
            _scope(),
            limit=TASKS_PER_PAGE,
            cursor=cursor,
            prefix=filters.prefix or None,
            model=filters.model or None,
            agent_id=filters.agent or None,
            failed=filters.failed,
        )
    except InvalidName as exc:
        # A prefix no task id can start with, or a cursor from elsewhere: say so on the page.
        error = f"{exc.field}: {exc.message}"
        page = None
    soon = store.clock() + EXPIRING_SOON
    rows = [
        {"task": t, "soon": parse_iso(t.retain_until) <= soon} for t in (page.tasks if page else ())
    ]
    next_url = None
    if page is not None and page.next_cursor:
        next_url = _purl("tasks", cursor=page.next_cursor, **filters.args())
    return render_template(
        "console/tasks.html",
        rows=rows,
        total=page.total if page else None,
        filters=filters,
        first_url=_purl("tasks", **filters.args()) if cursor else None,
        next_url=next_url,
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
        turns=turns,
        page=number,
        pages=pages,
        may_delete=may_delete_task(_principal(), index.owner),
    )


def _int_arg(name: str, default: int) -> int:
    raw = request.args.get(name, "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 7 else default


@bp.route("/p/<tenant>/<project>/tasks/<task_id>/delete", methods=["GET", "POST"])
def delete_task(tenant: str, project: str, task_id: str) -> ResponseReturnValue:
    """Delete a task (its owner, or project_admin and above), after a confirmation."""
    store = _tasks()
    index = store.get_task(_scope(), task_id)
    principal = _principal()
    if not may_delete_task(principal, index.owner):
        raise Forbidden("only the task's owner or a project_admin may delete it")
    if request.method == "GET":
        return render_template("console/delete_task.html", index=index)
    store.delete_task(_scope(), task_id, only_owner=only_owner(principal))
    return _redirect(_purl("tasks", deleted=task_id))


@bp.get("/p/<tenant>/<project>/tasks/<task_id>/turns/<int:turn>")
def turn(tenant: str, project: str, task_id: str, turn: int) -> ResponseReturnValue:
    """One turn: all its meta, its summary and its artifacts."""
    record = _tasks().get_turn(_scope(), task_id, turn)
    return render_template("console/turn.html", turn=_turn_view(record, timeline=False))


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
    return render_template(
        "console/artifact.html", record=record, info=info, kind=kind, text=text, shown=shown
    )


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
    may_redact = may_redact_version(_principal())
    if may_redact:
        # The head of a live memory cannot be redacted (409): no link that always fails.
        try:
            live = engine.get_memory(_scope(), store_id, item.memory_id, full=False)
        except StorageError:
            live = None
        may_redact = live is None or live.memory_version_id != item.id
    return render_template(
        "console/version.html",
        store=found,
        version=item,
        may_redact=may_redact,
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


@bp.route(
    "/p/<tenant>/<project>/stores/<store_id>/versions/<version_id>/redact",
    methods=["GET", "POST"],
)
def redact_version(
    tenant: str, project: str, store_id: str, version_id: str
) -> ResponseReturnValue:
    """Redact a memory version (project_admin and above), after a confirmation."""
    if not may_redact_version(_principal()):
        raise Forbidden("only a project_admin may redact a memory version")
    engine = _stores()
    found = engine.get_store(_scope(), store_id)
    item = engine.get_version(_scope(), store_id, version_id, full=False)
    if request.method == "GET":
        return render_template("console/redact.html", store=found, version=item)
    engine.redact_version(_scope(), store_id, version_id, actor=_actor())
    return _redirect(_purl("version", store_id=store_id, version_id=version_id))


# Anything else under /console/ is an HTML 404 behind the session, not the API's JSON one.
@bp.get("/<path:rest>")
def missing(rest: str) -> ResponseReturnValue:
    raise NotFound("no such page")
