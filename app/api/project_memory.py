"""The project-memory API under /sandbox/memory/v1."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flask import Blueprint, Flask, current_app, request
from flask.blueprints import BlueprintSetupState
from flask.typing import ResponseReturnValue
from werkzeug.wrappers import Response

from app.api import turn_form
from app.api.common import (
    body_stream,
    content_type,
    if_match,
    if_none_match_star,
    json_body,
    json_response,
    masked_headers,
    not_modified,
    path_artifact_name,
    path_task_id,
    path_turn,
    storage,
)
from app.api.docs import doc, links
from app.api.downloads import artifact_response, digest_response, not_modified_response
from app.api.params import (
    CONDITIONAL,
    CONDITIONAL_ERRORS,
    ERRORS,
    ETAG_HEADER,
    FULL,
    IF_MATCH,
    NAME,
    TASK_ID,
    TURN,
    WRITE_HEADERS,
    cursor_param,
)
from app.api.query import query_int, query_task_id, query_time_us
from app.schemas import project_memory as s, rules, usage as us
from app.services import recall, secrets, session_context, spaces, tasks, usage_report, users
from app.services.access import sees_everything, sees_tenant
from app.services.secrets import Screen
from app.storage.core.errors import PayloadTooLarge
from app.storage.core.models import ArtifactUpload, TurnRecord
from app.storage.core.names import ID_PATTERN
from app.storage.core.query import MAX_QUERY_CHARS, MAX_TERMS
from app.storage.core.secret_policy import SecretsOverride
from app.storage.core.vectors import MODES as SEARCH_MODES
from app.storage.interface import TaskBackend
from app.web.auth import current_principal, reads, require_principal
from app.web.errors import validation_error

PREFIX = "/sandbox/memory/v1"
DIGEST_MAX_LIMIT = 1000  # sections of a project.md head, as many as a page of tasks

bp = Blueprint("project_memory", __name__, url_prefix=PREFIX)

put_turn_in = s.PutTurnRequest()
turn_out = s.TurnRecord()
task_out = s.TaskIndex()
task_list_out = s.TaskList()
artifact_out = s.ArtifactRecord()
usage_out = us.UsageReport()
search_out = s.SearchResults()
whoami_out = s.WhoAmI()
secret_policy_in = s.SecretPolicyRequest()
secret_policy_out = s.SecretPolicy()
context_out = s.SessionContext()
recall_in = s.RecallRequest()
recall_out = s.Recall()


@bp.record_once
def _register_schemas(state: BlueprintSetupState) -> None:
    state.app.extensions.setdefault("openapi_schemas", []).extend(
        [s.WhoAmI, s.EmptiedSpace, s.SessionContext, s.Recall, s.SecretPolicy]
    )


@bp.before_request
def _authenticate() -> None:
    require_principal()


def store() -> TaskBackend:
    return storage().tasks


def turn_json(record: TurnRecord) -> dict[str, Any]:
    """The TurnRecord body, built by hand in the schema's field order: reading a turn is the
    hottest path, and marshmallow's dump costs more than the rest of its body.
    tests/api/test_list_shape.py pins it to ``turn_out.dump``."""
    return {
        "task_id": record.task_id,
        "turn": record.turn,
        "meta": record.meta,
        "summary_md": record.summary_md,
        "artifacts": [
            {
                "name": a.name,
                "content_type": a.content_type,
                "size": a.size,
                "updated_at": a.updated_at,
            }
            for a in record.artifacts
        ],
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "retain_until": record.retain_until,
    }


@bp.get("/project.md")
@doc(
    params=[
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": "Beyond the seed's API: only the newest `limit` sections (the"
            " title, then the first `limit` sections of the whole body, byte for byte).",
            "schema": {"type": "integer", "minimum": 1, "maximum": DIGEST_MAX_LIMIT},
            "x-beyond-seed": True,
        },
        lambda app: {
            "name": "since",
            "in": "query",
            "required": False,
            "description": "Beyond the seed's API: only the sections of tasks updated at"
            " this time or later: an RFC 3339 time (a date alone, or one without an offset"
            " (UTC), too; an unencoded '+' that arrives as a space is read as '+') or seconds"
            " since the epoch.",
            "schema": {"type": "string", **rules.time(query=True, epoch=True)},
            "x-beyond-seed": True,
        },
    ],
    responses={200: ("text/markdown", {"type": "string"}), **ERRORS},
)
def get_project_md() -> ResponseReturnValue:
    """Project digest: one section per task with its latest summary

    With `limit` or `since` (beyond the seed's API), the start of it: it costs what it
    returns, however many tasks the project has.
    """
    scope = current_principal().scope
    limit = query_int("limit", 0, 1, DIGEST_MAX_LIMIT) if "limit" in request.args else None
    since = query_time_us("since")
    file: Any
    size: int | None
    if limit is None and since is None:
        file, size = store().open_digest(scope)
    else:
        file, size = store().open_digest_head(scope, limit=limit, since_us=since)
    return digest_response(file, size)


@bp.get("/tasks")
@doc(
    params=[
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50},
        },
        cursor_param("next_cursor"),
    ],
    responses={200: s.TaskList, **ERRORS},
    links={200: links("get_task", task_id="/tasks/0/task_id")},
)
def list_tasks() -> ResponseReturnValue:
    """List tasks in project memory (most recently updated first)"""
    limit = query_int("limit", 50, 1, 1000)
    cursor = request.args.get("cursor") or None
    page = store().list_tasks(current_principal().scope, limit=limit, cursor=cursor)
    # Built by hand in TaskList's field order: marshmallow's dump of 50 nested rows is a
    # large share of this view's CPU. tests/api/test_list_shape.py pins the two together.
    return json_response(
        {
            "tasks": [
                {
                    "task_id": t.task_id,
                    "latest_turn": t.latest_turn,
                    "turn_count": t.turn_count,
                    "updated_at": t.updated_at,
                    "retain_until": t.retain_until,
                }
                for t in page.tasks
            ],
            "total": page.total,
            "next_cursor": page.next_cursor,
        }
    )


@bp.delete("/tasks/<task_id>")
@doc(params=[TASK_ID], responses={204: None, 404: "HTTPError", **ERRORS})
def delete_task(task_id: str) -> ResponseReturnValue:
    """Delete a task's memory (owner, or project_admin and above)"""
    task_id = path_task_id(task_id)
    tasks.delete_task(storage(), current_principal(), task_id)
    return Response(status=204)


@bp.delete("/space")
@doc(responses={200: s.EmptiedSpace, **ERRORS}, beyond_seed=True)
def delete_space() -> ResponseReturnValue:
    """Empty a private space: every task and memory store in it

    Beyond the seed's API. Only a private space (?visibility=private): its owner's, or with
    private_to=usr_... another user's, for a tenant_admin's compliance delete. Each task and
    store is deleted and audited as it would be alone. The team's project is never emptied
    (403).
    """
    emptied = spaces.empty_space(storage(), current_principal())
    return json_response({"deleted_tasks": emptied.tasks, "deleted_stores": emptied.stores})


@bp.delete("/tasks/<task_id>/turns/<turn>")
@doc(
    params=[TASK_ID, TURN, IF_MATCH],
    responses={204: None, 404: "HTTPError", 412: "HTTPError", **ERRORS},
    beyond_seed=True,
)
def delete_turn(task_id: str, turn: str) -> ResponseReturnValue:
    """Delete one turn and its artifacts (owner, or project_admin and above)

    The task index, the task list, project.md, search and the usage counters follow; the
    removed text leaves the stored files too. Deleting a task's last turn deletes the task.
    """
    task_id, turn_no = path_task_id(task_id), path_turn(turn)
    tasks.delete_turn(storage(), current_principal(), task_id, turn_no, if_match=if_match())
    return Response(status=204)


@bp.delete("/tasks/<task_id>/turns/<turn>/artifacts/<anyname:name>")
@doc(
    params=[TASK_ID, TURN, NAME, IF_MATCH],
    responses={204: None, 404: "HTTPError", 412: "HTTPError", **ERRORS},
    beyond_seed=True,
)
def delete_artifact(task_id: str, turn: str, name: str) -> ResponseReturnValue:
    """Delete one artifact of a turn (owner, or project_admin and above)

    A write of the turn: its updated_at and ETag change. The bytes leave the store.
    """
    task_id, turn_no, name = path_task_id(task_id), path_turn(turn), path_artifact_name(name)
    tasks.delete_artifact(
        storage(), current_principal(), task_id, turn_no, name, if_match=if_match()
    )
    return Response(status=204)


@bp.get("/tasks/<task_id>")
@doc(params=[TASK_ID], responses={200: s.TaskIndex, 404: "HTTPError", **ERRORS})
def get_task(task_id: str) -> ResponseReturnValue:
    """Task index: turns, meta, artifact names"""
    index = store().get_task(current_principal().scope, path_task_id(task_id))
    payload = task_out.dump(index)
    payload["latest_turn"] = index.latest_turn
    payload["turn_count"] = index.turn_count
    return json_response(payload)


@bp.get("/tasks/<task_id>/turns/<turn>")
@doc(
    params=[TASK_ID, TURN],
    responses={200: s.TurnRecord, 304: None, 404: "HTTPError", **ERRORS},
    headers=ETAG_HEADER,
)
def get_turn(task_id: str, turn: str) -> ResponseReturnValue:
    """One turn: meta, summary, artifact list"""
    record = store().get_turn(current_principal().scope, path_task_id(task_id), path_turn(turn))
    if not_modified(record.etag):
        return not_modified_response(record.etag)
    return json_response(turn_json(record), headers={"ETag": record.etag})


@bp.put("/tasks/<task_id>/turns/<turn>")
@doc(
    params=[TASK_ID, TURN, *CONDITIONAL],
    body=s.PutTurnRequest,
    other_bodies={"multipart/form-data": turn_form.OPENAPI_FORM},
    responses={
        200: s.TurnRecord,
        **CONDITIONAL_ERRORS,
        413: "HTTPError",
        **FULL,
        **ERRORS,
    },
    headers=WRITE_HEADERS,
    links={
        200: {
            **links("get_turn", "delete_turn", task_id="/task_id", turn="/turn"),
            **links("get_task", "delete_task", task_id="/task_id"),
        }
    },
)
def put_turn(task_id: str, turn: str) -> ResponseReturnValue:
    """Upsert one turn's meta + summary; refreshes the task index and project.md

    Beyond the seed: a multipart/form-data body records the turn with its artifacts in one
    request. Its first part, named "turn", holds the PutTurnRequest as JSON; each part after
    it, named "artifact", is one artifact (its name as the part's filename, its Content-Type
    kept, at most 50 MiB), created or replaced. The turn and its artifacts commit together;
    If-Match and If-None-Match apply to the turn.
    """
    task_id, turn_no = path_task_id(task_id), path_turn(turn)
    boundary = turn_form.form_boundary()
    uploads: Iterable[ArtifactUpload] = ()
    if boundary is None:  # the seed's form
        data = json_body(put_turn_in)
    else:
        data, uploads = turn_form.turn_form(boundary, put_turn_in)
    screen = Screen.of(storage(), current_principal())
    record = tasks.record_turn(
        storage(),
        current_principal(),
        task_id,
        turn_no,
        meta=data["meta"],
        summary_md=data["summary_md"],
        if_match=if_match(),
        if_none_match=if_none_match_star(),
        artifacts=uploads,
        size=request.content_length if boundary is not None else None,
        screen=screen,
    )
    return json_response(turn_json(record), headers={"ETag": record.etag, **masked_headers(screen)})


# <anyname:name>: a name with a slash or a line break reaches the view and its 422 naming
# the rule, where the router gave a generic 404, or a 405 when another method's route took it.
@bp.get("/tasks/<task_id>/turns/<turn>/artifacts/<anyname:name>")
@doc(
    params=[TASK_ID, TURN, NAME],
    responses={
        200: ("application/octet-stream", {"type": "string", "format": "binary"}),
        304: None,
        404: "HTTPError",
        **ERRORS,
    },
    headers=ETAG_HEADER,
)
def get_artifact(task_id: str, turn: str, name: str) -> ResponseReturnValue:
    """Download a turn artifact (stored Content-Type)"""
    opened = store().open_artifact(
        current_principal().scope, path_task_id(task_id), path_turn(turn), path_artifact_name(name)
    )
    return artifact_response(opened)


@bp.put("/tasks/<task_id>/turns/<turn>/artifacts/<anyname:name>")
@doc(
    params=[TASK_ID, TURN, NAME, *CONDITIONAL],
    body={"type": "string", "format": "binary"},
    body_content_type="application/octet-stream",
    responses={
        200: s.ArtifactRecord,
        404: "HTTPError",
        **CONDITIONAL_ERRORS,
        413: "HTTPError",
        **FULL,
        **ERRORS,
    },
    headers=WRITE_HEADERS,
    links={
        200: links(
            "get_artifact", "delete_artifact", task_id="/task_id", turn="/turn", name="/name"
        )
    },
)
def put_artifact(task_id: str, turn: str, name: str) -> ResponseReturnValue:
    """Store a turn artifact (raw body, Content-Type kept, max 50 MiB)"""
    task_id, turn_no, name = path_task_id(task_id), path_turn(turn), path_artifact_name(name)
    kind = content_type()
    task_store = store()
    limit = task_store.max_artifact_bytes
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"artifact of {declared} bytes exceeds the limit", limit=limit)
    # One above the limit: werkzeug refuses a read once the limit is reached, which would
    # turn a body of exactly the limit into a 413; stage_stream counts the bytes itself.
    request.max_content_length = limit + 1
    screen = Screen.of(storage(), current_principal())
    info = tasks.put_artifact(
        storage(),
        current_principal(),
        task_id,
        turn_no,
        name,
        body_stream(),
        content_type=kind,
        if_match=if_match(),
        if_none_match=if_none_match_star(),
        size=declared,  # admitted against quotas and the disk before the body is read
        screen=screen,
    )
    payload = artifact_out.dump(info)
    payload.update(task_id=task_id, turn=turn_no)
    return json_response(payload, headers={"ETag": info.etag, **masked_headers(screen)})


def max_usage_hours(app: Flask) -> int:
    """The most hours of traffic a usage report gives: what the retention period keeps."""
    return max(1, int(app.config["RETENTION_DAYS"] * 24))


@bp.get("/usage")
@doc(
    params=[
        lambda app: {
            "name": "hours",
            "in": "query",
            "required": False,
            "description": "Hours of traffic to return, the current one included, up to the"
            " retention period's (MEMORY_RETENTION_DAYS).",
            "schema": {
                "type": "integer",
                "minimum": 1,
                "maximum": max_usage_hours(app),
                "default": 24,
            },
        }
    ],
    responses={200: us.UsageReport, **ERRORS},
)
def get_usage() -> ResponseReturnValue:
    """Usage, quotas and traffic of the project (tenant_admin and admin: of every project of the tenant)

    Counters kept by every write, never a walk of what is stored; quotas from
    `flask --app wsgi quota`. A write that would go over a quota answers 507.
    """
    hours = query_int("hours", 24, 1, max_usage_hours(current_app))
    principal = current_principal()
    body = usage_report.report(
        storage(), principal.scope, whole_tenant=sees_tenant(principal), hours=hours
    )
    if not sees_everything(principal):
        body["disk"] = None  # the disk is every tenant's
    return json_response(usage_out.dump(body))


@bp.get("/search")
@doc(
    params=[
        lambda app: {
            "name": "q",
            "in": "query",
            "required": True,
            "description": 'Words that must all match; "a quoted phrase"; prefix* (2+ letters).'
            " Case and diacritics are ignored. OR/NOT/NEAR and other operators are refused."
            f" At most {MAX_TERMS} terms and {MAX_QUERY_CHARS} characters; no control"
            " character but tab, newline and carriage return.",
            "schema": rules.search_query(),
        },
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
        },
        {
            "name": "mode",
            "in": "query",
            "required": False,
            "description": "hybrid: keyword and vector rankings fused (the default when the"
            " server has an embedder); keyword: full text only (the default without one);"
            " semantic: by meaning alone. The answer's modes say which ran.",
            "schema": {"type": "string", "enum": ["hybrid", "keyword", "semantic"]},
        },
        cursor_param("next_cursor (of the same q and mode)"),
    ],
    responses={200: s.SearchResults, 501: "HTTPError", **ERRORS},
)
def search_project() -> ResponseReturnValue:
    """Search the project's turns and memories (keywords and meaning, best first)

    Finds live turns by task id, meta values and summary, and live memories of the project's
    memory stores by path and content. Deleted, replaced and expired text is never found.
    """
    query = request.args.get("q")
    if query is None:
        raise validation_error(["query", "q"], "Field required", "missing")
    limit = query_int("limit", 20, 1, 100)
    cursor = request.args.get("cursor") or None
    mode = request.args.get("mode") or None
    if mode is not None and mode not in SEARCH_MODES:
        raise validation_error(
            ["query", "mode"], f"must be one of {', '.join(SEARCH_MODES)}", "enum", mode
        )
    page = storage().search(current_principal().scope, query, limit=limit, cursor=cursor, mode=mode)
    return json_response(search_out.dump(page))


@bp.get("/context")
@doc(
    params=[
        {
            "name": "task_id",
            "in": "query",
            "required": True,
            "description": f"The task the session works on: {ID_PATTERN}",
            "schema": rules.identifier(),
        },
        {
            "name": "max_bytes",
            "in": "query",
            "required": False,
            "description": "The context's budget, in bytes of UTF-8.",
            "schema": {
                "type": "integer",
                "minimum": session_context.MIN_BYTES,
                "maximum": session_context.MAX_BYTES,
                "default": session_context.DEFAULT_BYTES,
            },
        },
        {
            "name": "turns",
            "in": "query",
            "required": False,
            "description": "How many of the task's last turns to show (each cut at"
            f" {session_context.TURN_CHARS} characters).",
            "schema": {
                "type": "integer",
                "minimum": 0,
                "maximum": session_context.MAX_TURNS,
                "default": session_context.DEFAULT_TURNS,
            },
        },
    ],
    responses={200: s.SessionContext, **ERRORS},
    beyond_seed=True,
)
def get_context() -> ResponseReturnValue:
    """A coding agent's session-start context in one request, within a byte budget

    The task's last turns (newest first, at most half the budget), the newest whole sections
    of project.md, and other turns and memories that mention the task (at most a quarter).
    Stored text is framed between <stored-text> and </stored-text>, which it cannot close.
    What a hook asks for when a session starts (docs/agents.md).
    """
    task_id = query_task_id()
    max_bytes = query_int(
        "max_bytes",
        session_context.DEFAULT_BYTES,
        session_context.MIN_BYTES,
        session_context.MAX_BYTES,
    )
    turns = query_int("turns", session_context.DEFAULT_TURNS, 0, session_context.MAX_TURNS)
    found = session_context.assemble(
        storage(), current_principal().scope, task_id, max_bytes=max_bytes, turns=turns
    )
    return json_response(context_out.dump(found))


@bp.post("/recall")
@reads
@doc(
    body=s.RecallRequest,
    responses={200: s.Recall, **ERRORS},
    beyond_seed=True,
)
def post_recall() -> ResponseReturnValue:
    """What the project's memory holds about a prompt, within a character budget

    The prompt's words (stop words and short words left out, at most 12, each longer one a
    prefix) searched for, any of them matching; the task's own turns first (newest first),
    then the other turns and memories, best first; each an excerpt of its text, framed
    between <stored-text> and </stored-text>. The context is empty when nothing matched.
    A POST that only reads (any token of the project): the prompt travels in the body, never
    in a URL, and is neither stored nor logged. What the coding agents' prompt hook asks for
    (docs/agents.md).
    """
    data = json_body(recall_in)
    found = recall.recall(
        storage(),
        current_principal().scope,
        data["prompt"],
        task_id=data["task_id"],
        max_chars=data["max_chars"],
        mode=data["mode"],
    )
    return json_response(recall_out.dump(found))


@bp.get("/whoami")
@doc(responses={200: s.WhoAmI, **ERRORS})
def get_whoami() -> ResponseReturnValue:
    """The token of this request (never its secret), its role, and the tenant/project it acts in

    Beyond the seed's API: what a client shows as "who am I" (project-memory whoami). The
    tenant and project are the ones this request resolved to, from the token and the
    X-Sandbox-Tenant-Id / X-Sandbox-Project-Id headers; visibility, the space of the project
    (the team's, or the user's private one); user, the person the token belongs to.
    """
    principal = current_principal()
    token = principal.token
    user = users.user_of(storage(), token)
    body = {
        "token_id": token.id,
        "name": token.name,
        "role": token.role,
        "tenant": principal.scope.tenant,
        # A private space is named by its project and the visibility, never by its own name.
        "project": principal.scope.team.project,
        "visibility": "private" if principal.scope.owner is not None else "project",
        "user": token.user,
        "user_name": user.display if user is not None else None,
        "token_tenant": token.tenant,
        "token_project": token.project,
        "created_at": token.created_at,
        "expires_at": token.expires_at,
    }
    return json_response(whoami_out.dump(body))


@bp.get("/secrets/policy")
@doc(responses={200: s.SecretPolicy, **ERRORS}, beyond_seed=True)
def get_secret_policy() -> ResponseReturnValue:
    """What this project does with the secrets a write holds: its policy and allowlists

    Beyond the seed's API. Every write (turns, meta, text artifacts, memories, store names
    and descriptions, by any door) is scanned for credentials: under `mask` each one is
    stored as `[secret:<kind>]` and the answer's `Memory-Secrets-Masked` header counts them
    by kind; under `reject` the write is refused with a 422 naming each one's kind and
    place; under `allow` it is stored as given. docs/secrets.md lists what is detected.
    """
    scope = current_principal().scope
    policy = secrets.policy_of(storage(), scope.tenant, scope.project)
    return json_response(secret_policy_out.dump(policy.to_json()))


@bp.put("/secrets/policy")
@doc(body=s.SecretPolicyRequest, responses={200: s.SecretPolicy, **ERRORS}, beyond_seed=True)
def put_secret_policy() -> ResponseReturnValue:
    """Set this project's secret policy or allowlists (project_admin and above)

    Each field given replaces the stored one; the others stay. Every change is in the audit
    log (`allow` above all). Answers the policy now in force.
    """
    data = json_body(secret_policy_in)
    principal = current_principal()
    scope = principal.scope
    change = SecretsOverride(
        data.get("policy"),
        tuple(data["allow_patterns"]) if "allow_patterns" in data else None,
        tuple(data["allow_fingerprints"]) if "allow_fingerprints" in data else None,
    )
    secrets.set_policy(storage(), principal.token, scope.tenant, scope.project, change)
    policy = secrets.policy_of(storage(), scope.tenant, scope.project)
    return json_response(secret_policy_out.dump(policy.to_json()))
