"""The web console: server-rendered pages over the same storage calls as the APIs.

Every page reads through the engines' indexes (the task listing, a task's index.json, a
turn's record, a store's index), never a walk of the tree. Authentication is a signed
session cookie (app/console/session.py) checked on the blueprint, so a new route cannot
forget it; the unauthenticated answer is a redirect to the sign-in page. Only the sign-in
page and the static assets are public.

This module holds what every page passes through (the guard, the headers, the template
context, the error pages) and the pages of no subject of their own: the project menu,
search, project.md. The others register their routes on the same blueprint (base.py):
signin.py, tasks.py, stores.py, memories.py, admin.py, usage.py, audit.py, ledger.py (the
ledger and the timeline), compare.py.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from markupsafe import Markup
from werkzeug.exceptions import Forbidden, HTTPException, NotFound
from werkzeug.wrappers import Response
from werkzeug.wsgi import wrap_file

from app.console import admin, base, charts, people, render, session as sessions
from app.console.signin import safe_next, signed_in_token
from app.services import users as users_service
from app.services.access import (
    Principal,
    covers,
    manages_tenant,
    may_manage,
    may_manage_user,
    may_write,
    sees_everything,
)
from app.services.usage_report import projects_overview
from app.storage.core.errors import InvalidName, StorageError
from app.storage.core.names import Scope, validate_id
from app.storage.core.tokens import Token
from app.web import ratelimit
from app.web.artifacts import ARTIFACT_SECURITY_HEADERS, DIGEST_CHUNK
from app.web.errors import ApiError, RequestValidationError, from_storage

log = logging.getLogger("app.console")

bp = base.bp

# The routes that answer without a session: the sign-in form and the assets it needs, and
# "/" (a redirect to /console/).
PUBLIC_ENDPOINTS = frozenset(
    {
        "console.signin",
        "console.signin_post",
        "console.static",
        "console_root",
        "console.oidc_start",
        "console.oidc_callback",
    }
)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self';"
    " object-src 'none'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
HITS_PER_PAGE = 20
DIGEST_RENDER_BYTES = 256 * 1024  # of project.md; the rest is a download
SPARK_DAYS = 14


def init_app(app: Flask) -> None:
    sessions.init_app(app)
    app.register_blueprint(bp)
    app.add_url_rule("/", "console_root", lambda: redirect("/console/", code=302))


# -- storage and request context ------------------------------------------------------------
_storage = base.storage
_tasks = base.tasks
_registry = base.registry
_scope = base.scope
_purl = base.purl
_redirect = base.see_other


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
    token = people.proxy_sign_in(signed_in_token())
    if token is None:
        ended = g.console_session is not None and g.console_session.token_id is not None
        target = request.full_path if request.method == "GET" else None
        args: dict[str, Any] = {}
        if ended:
            args["ended"] = "1"
        if target and safe_next(target.rstrip("?")):
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
            if scope.owner is not None:
                # Another user's private space answers as a project that does not exist.
                raise NotFound("no such project")
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
        if not manages_tenant(token, tenant):
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
    return request.endpoint in admin.LIMITS_ENDPOINTS and manages_tenant(token, tenant)


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
        "manages_users": _manages_users(g.get("console_token")),
        "many_projects": _covers_many(g.get("console_token")),
        "ts": render.time_tag,
        "size": render.size,
        "short": render.short,
        "snippet": render.snippet,
        "token_label": _token_label,
        "purl": _purl,
    }


def _manages_tenant(token: Token | None) -> bool:
    return token is not None and token.tenant is not None and manages_tenant(token, token.tenant)


def _manages_users(token: Token | None) -> bool:
    return token is not None and may_manage_user(token, token.tenant)


def _covers_many(token: Token | None) -> bool:
    return token is not None and (sees_everything(token) or token.project is None)


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
    # A person's token is named with them: "ana via laptop".
    name = users_service.label(_storage(), token) if token.user else token.name
    return Markup('<span title="{}">{}</span>').format(token_id, name)


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
    every_tenant = sees_everything(token)
    tenants = None if every_tenant else [token.tenant or ""]
    found = [s for s in _storage().projects(tenants) if covers(token, s)]
    if token.tenant and token.project:
        own = Scope(token.tenant, token.project)
        if own not in found:
            found.insert(0, own)
    rows = projects_overview(_storage(), found, days=SPARK_DAYS)
    return render_template(
        "console/projects.html",
        rows=rows,
        every_tenant=every_tenant,
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


# -- search --------------------------------------------------------------------------------
@bp.get("/p/<tenant>/<project>/search")
def search(tenant: str, project: str) -> ResponseReturnValue:
    """Search the project's turns and memories."""
    query = request.args.get("q", "")
    cursor = request.args.get("cursor") or None
    modes = _storage().search_modes()
    # An unknown mode is the server's default: a link from an older page still searches.
    mode = request.args.get("mode") if request.args.get("mode") in modes else modes[0]
    page, error = None, None
    if query.strip():
        try:
            page = _storage().search(_scope(), query, limit=HITS_PER_PAGE, cursor=cursor, mode=mode)
        except InvalidName as exc:
            # A query outside the syntax, or a cursor of another search: say so on the page.
            error = exc.message if exc.field == "q" else f"{exc.field}: {exc.message}"
    next_url = None
    if page is not None and page.next_cursor:
        next_url = _purl("search", q=query, mode=mode, cursor=page.next_cursor)
    return render_template(
        "console/search.html",
        query=query,
        mode=mode,
        modes=modes,
        page=page,
        error=error,
        first_url=_purl("search", q=query, mode=mode) if cursor else None,
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


# Anything else under /console/ is an HTML 404 behind the session, not the API's JSON one.
@bp.get("/<path:rest>")
def missing(rest: str) -> ResponseReturnValue:
    raise NotFound("no such page")
