"""The MCP endpoint, ``/mcp``: Streamable HTTP, stateless, one JSON answer per message.

Protocol revisions: ``2026-07-28`` (no handshake: every request carries its revision and the
client's capabilities in ``params._meta``, mirrored in the ``MCP-Protocol-Version``,
``Mcp-Method`` and ``Mcp-Name`` headers, and ``server/discover`` tells what the server
offers) and, through the ``initialize`` handshake, ``2025-11-25``, ``2025-06-18`` and
``2025-03-26``. A request whose ``MCP-Protocol-Version`` header names anything but a
handshake revision takes the 2026-07-28 path, which refuses it when it names none we serve
(the official SDK routes the same way).

JSON-RPC batches (a JSON array) exist in 2025-03-26 only: 2025-06-18 dropped them. A
2025-03-26 client sends no ``MCP-Protocol-Version`` (the header came with 2025-06-18, which
has a server assume 2025-03-26 without it), so a batch with no header or with that one is
run entry by entry, the answers in one array in order (a notification's or a response's
none; 202 when no entry has one), and a batch under any other revision is Invalid Request.
A batch is one message to the body limit and to the rate limits, held to ``MAX_BATCH``
entries; each entry's tool checks the caller's role as it does alone.

Stateless: no ``Mcp-Session-Id``, nothing kept between requests, so any worker answers any
request. ``GET`` (a server-to-client stream) and ``DELETE`` (a session's end) answer 405.
The credentials, roles and scope are the REST API's (app/web/auth.py); the tools are
app/services/mcp/. A tool that fails is an error *result* (``isError``), the
model's to read; only a malformed message, a name no tool has and a ``tools/list`` cursor
(the list is one page: we issue none) are JSON-RPC errors.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

from flask import Blueprint, current_app, g, request
from flask.typing import ResponseReturnValue
from werkzeug.wrappers import Response

from app.api.common import json_response, storage
from app.schemas.mcp import MCP_ARTIFACT_BYTES, UPLOAD_HINT
from app.services.access import Principal, may_write
from app.services.framing import NOTE
from app.services.mcp.arguments import ToolFailure, lone_surrogate_at
from app.services.mcp.tools import McpTools, ToolOutput, UnknownTool
from app.storage.core.errors import StorageError
from app.web.auth import resolve_principal
from app.web.body import READ_AHEAD_BYTES
from app.web.errors import ApiError, RequestValidationError, from_storage

log = logging.getLogger(__name__)

MODERN_VERSIONS = ("2026-07-28",)
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
SUPPORTED_VERSIONS = (*MODERN_VERSIONS, *HANDSHAKE_VERSIONS)
VERSION_HEADER = "MCP-Protocol-Version"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
# Pages of these hosts may call /mcp whatever their port: a browser on the machine the
# server runs on (an inspector, a local tool); a rebinding attacker cannot take these names.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# A message over MAX_JSON_BYTES is read to its end, to this size, so that its answer arrives.
MAX_DRAIN_BYTES = 16 << 20
DRAIN_CHUNK = 64 << 10
# The one revision whose clients may batch; its clients send no MCP-Protocol-Version.
BATCH_VERSION = "2025-03-26"
# A batch costs the rate limits one request, however many calls it holds: its calls are
# bounded so that a token's request budget bounds its tool calls.
MAX_BATCH = 16

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
HEADER_MISMATCH = -32020
UNSUPPORTED_VERSION = -32022
# The 2026-07-28 transport's statuses for the errors it answers (the rest are 200).
MODERN_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    UNSUPPORTED_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}

try:
    _VERSION = metadata.version("project-memory")
except metadata.PackageNotFoundError:  # a checkout run without an install
    _VERSION = "0"
SERVER_INFO = {"name": "project-memory", "version": _VERSION}
CAPABILITIES = {"tools": {"listChanged": False}}
INSTRUCTIONS = (
    "Project Memory is this project's durable memory, shared by every agent and teammate"
    " that works on it. Before starting, search it (search, read_digest) for earlier"
    " decisions, fixes and notes on the task; read_task and read_turn show a task's history."
    " Writers can record what was done with record_turn, and keep notes in the project's"
    " memory stores with the memory tool. " + NOTE + " So is the text a tool's structured"
    " (JSON) result holds: its summaries, meta, snippets, digest and contents."
)

bp = Blueprint("mcp", __name__)

Answer = dict[str, Any]
Reply = tuple[int, Answer | None]  # a status, and the answer (None: no body)


@bp.before_request
def _authenticate() -> None:
    # Readers POST too (every call is a POST): the role is checked tool by tool.
    g.principal = resolve_principal()


@bp.errorhandler(413)
def refuse_too_large(exc: Exception) -> ResponseReturnValue:
    """A message over its limit, answered as JSON-RPC: the SDK's client hands a JSON-RPC
    error at any status to the request that caused it, where a bare 413 reads as a failure
    of the server. Its id is null: the message was not read."""
    principal: Principal | None = g.get("principal")
    limit = message_limit(principal)
    if principal is not None and may_write(principal):
        # A reader's refused message is not waited for: draining it would hold this thread
        # for as long as the reader takes to send it.
        _drain_body()
    message = (
        f"Invalid request: the message is larger than the {limit} bytes this endpoint takes."
        f" record_turn takes at most {MCP_ARTIFACT_BYTES} bytes of artifacts in one call;"
        f" {UPLOAD_HINT}."
    )
    return json_response(_error(None, INVALID_REQUEST, message), 413)


def _drain_body() -> None:
    """Read the rest of a refused body, up to MAX_DRAIN_BYTES. Closing the connection on
    unread bytes makes the kernel send a reset, which destroys the answer before the client
    reads it (the relay and the SDK's client then see "connection reset", not why); the
    worker's own linger drains only 64 KiB. A body declared larger is not read at all."""
    length = request.content_length
    if length is not None and length > MAX_DRAIN_BYTES:
        return
    stream = request.environ.get("wsgi.input")
    left = MAX_DRAIN_BYTES
    # Best effort: a client that hangs up, or one too slow for the body's floor, has had
    # its answer decided already; whatever reading raises changes nothing of it.
    with contextlib.suppress(Exception):
        while stream is not None and left > 0:
            chunk = stream.read(min(DRAIN_CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)


# The endpoint is at the server's root; it answers under the API's prefix too, where a
# client given the URL with the API's path (PROJECT_MEMORY_URL=http://host/sandbox/memory/v1,
# which docs/client.md allows) looks for it.
ALIAS = "/sandbox/memory/v1/mcp"


@bp.route("/mcp", methods=["GET", "DELETE"])
@bp.route(ALIAS, methods=["GET", "DELETE"])
def refuse_stream() -> ResponseReturnValue:
    """No server-to-client stream and no session to end: the endpoint is stateless."""
    return Response(status=405, headers={"Allow": "POST"})


@bp.post("/mcp")
@bp.post(ALIAS)
def post_mcp() -> ResponseReturnValue:
    """One JSON-RPC message (or a 2025-03-26 batch) in, one JSON answer (or 202 for a
    notification) out."""
    _check_origin()
    if not _accepts_json(request.headers.get("Accept")):
        raise ApiError(406, "this endpoint answers application/json: send it in Accept")
    request.max_content_length = message_limit(g.principal)
    raw = request.get_data(cache=False)
    body: Answer | list[Answer] | None
    try:
        message = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        status, body = 400, _error(None, PARSE_ERROR, f"Parse error: {exc}"[:300])
    else:
        where = lone_surrogate_at(_envelope_only(message))
        if where is not None:
            # The answer may quote the id or the method, and no UTF-8 carries a lone
            # surrogate: a message that holds one is not text. (A tool's arguments are the
            # tool's to refuse, as an error result the model reads.)
            why = f"Parse error: {where[:200]} holds an unpaired UTF-16 surrogate escape"
            return json_response(_error(None, PARSE_ERROR, why), 400)
        principal: Principal = g.principal
        tools = McpTools(storage(), principal)
        version = request.headers.get(VERSION_HEADER)
        if isinstance(message, list):
            status, body = _batch(message, tools, version)
        elif version is not None and version not in HANDSHAKE_VERSIONS:
            status, body = _modern(message, tools)
        else:
            status, body = _legacy(message, tools)
    if body is None:
        return Response(status=status)
    return json_response(body, status)


def message_limit(principal: Principal | None) -> int:
    """The largest message ``principal`` may send.

    A writer's message may carry a turn and its artifacts. A reader's calls take a few names
    and a query, so its message is held to what the worker reads before a thread serves the
    request (app/web/body.py): a reader trickling a large message holds no thread.
    """
    limit: int = current_app.config["MAX_JSON_BYTES"]
    if principal is None or not may_write(principal):
        return min(limit, READ_AHEAD_BYTES)
    return limit


def _check_origin() -> None:
    """Refuse a browser page of any origin but ours (MEMORY_PUBLIC_URL's) and loopback's.

    DNS rebinding: a page of the attacker's site, whose name it then points at this server's
    address, sends a Host naming that site, so an Origin that matches Host proves nothing.
    A request without Origin comes from no browser (the SDKs, curl, the agents): the MCP
    specification leaves it to the credentials, as here."""
    origin = request.headers.get("Origin")
    if origin is None or _allowed_origin(origin):
        return
    raise ApiError(
        403,
        f"requests from origin {origin[:200]} are not accepted: a browser page may call /mcp"
        " from MEMORY_PUBLIC_URL's origin or from localhost only",
    )


def _allowed_origin(origin: str) -> bool:
    found = _origin_parts(origin)
    if found is None:
        return False  # "null" (a sandboxed page, a file), or not an origin at all
    if found[1] in LOOPBACK_HOSTS:
        return True
    public: str = current_app.config.get("PUBLIC_URL", "")
    return bool(public) and found == _origin_parts(public)


def _origin_parts(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) origin, the port a default one if not given;
    None for anything else."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if parts.path or parts.query or parts.fragment or parts.username is not None:
        return None
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _envelope_only(message: Any) -> Any:
    """``message`` without a tools/call's arguments (each entry's, in a batch)."""
    if isinstance(message, list):
        return [_envelope_only(entry) for entry in message]
    params = message.get("params") if isinstance(message, dict) else None
    if isinstance(params, dict) and "arguments" in params:
        rest = {k: v for k, v in params.items() if k != "arguments"}
        return {**message, "params": rest}
    return message


def _accepts_json(accept: str | None) -> bool:
    if accept is None or not accept.strip():
        return True
    kinds = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return bool(kinds & {"application/json", "application/*", "*/*"})


def _error(mid: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": mid, "error": error}


def _ok(mid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": mid, "result": result}


def _request_id(message: dict[str, Any]) -> Any:
    mid = message.get("id")
    valid = isinstance(mid, str) or (isinstance(mid, int) and not isinstance(mid, bool))
    return mid if valid else None


def _envelope_fault(message: Any) -> str | None:
    """Why ``message`` is not one JSON-RPC request or notification (None when it is)."""
    if not isinstance(message, dict):
        return "a JSON-RPC message must be an object"
    if message.get("jsonrpc") != "2.0":
        return 'jsonrpc must be "2.0"'
    if not isinstance(message.get("method"), str):
        return "method must be a string"
    if "id" in message and _request_id(message) is None:
        return "id must be a string or an integer"
    params = message.get("params")
    if params is not None and not isinstance(params, dict):
        return "params must be an object"
    return None


def _is_response(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and "method" not in message
        and "id" in message
        and ("result" in message or "error" in message)
    )


# -- 2025-03-26: batches -------------------------------------------------------------------
def _batch(
    messages: list[Any], tools: McpTools, version: str | None
) -> tuple[int, Answer | list[Answer] | None]:
    if version not in (None, BATCH_VERSION):
        why = (
            f"Invalid request: JSON-RPC batches are taken at protocol revision {BATCH_VERSION}"
            f" only ({VERSION_HEADER}: {version[:40]!r}; 2025-06-18 removed them): send one"
            " message per POST"
        )
        return 400, _error(None, INVALID_REQUEST, why)
    if not messages:
        return 400, _error(None, INVALID_REQUEST, "Invalid request: the batch is empty")
    if len(messages) > MAX_BATCH:
        why = f"Invalid request: a batch holds at most {MAX_BATCH} messages, not {len(messages)}"
        return 400, _error(None, INVALID_REQUEST, why)
    answers: list[Answer] = []
    for message in messages:
        answer: Answer | None
        if isinstance(message, dict) and message.get("method") == "initialize":
            # 2025-03-26: "The initialize request MUST NOT be part of a JSON-RPC batch".
            why = "Invalid request: initialize must not be part of a batch: send it alone"
            answer = _error(_request_id(message), INVALID_REQUEST, why)
            if "id" not in message:
                answer = None  # a notification is never answered, not even with an error
        else:
            _, answer = _legacy(message, tools)
        if answer is not None:
            answers.append(answer)
    return (200, answers) if answers else (202, None)


# -- 2025-03-26 .. 2025-11-25: the initialize handshake ----------------------------------
def _legacy(message: Any, tools: McpTools) -> Reply:
    if _is_response(message):
        return 202, None  # an answer to a server request: this server sends none
    fault = _envelope_fault(message)
    if fault is not None:
        mid = _request_id(message) if isinstance(message, dict) else None
        return 400, _error(mid, INVALID_REQUEST, f"Invalid request: {fault}")
    if "id" not in message:
        return 202, None  # notifications/initialized, cancelled, ...: nothing to act on
    mid, method = message["id"], message["method"]
    params: dict[str, Any] = message.get("params") or {}
    if method == "initialize":
        asked = params.get("protocolVersion")
        version = asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
        return 200, _ok(
            mid,
            {
                "protocolVersion": version,
                "capabilities": CAPABILITIES,
                "serverInfo": SERVER_INFO,
                "instructions": INSTRUCTIONS,
            },
        )
    if method == "ping":
        return 200, _ok(mid, {})
    if method == "tools/list":
        return 200, _cursor_fault(mid, params) or _ok(mid, {"tools": tools.listed()})
    if method == "tools/call":
        return 200, _call(mid, params, tools)
    return 200, _error(mid, METHOD_NOT_FOUND, "Method not found", method)


# -- 2026-07-28: every request carries its own envelope -----------------------------------
def _modern(message: Any, tools: McpTools) -> Reply:
    version = request.headers.get(VERSION_HEADER, "")
    if isinstance(message, dict) and "id" not in message:
        if not isinstance(message.get("method"), str):
            return 400, _error(None, INVALID_REQUEST, "Invalid request: method must be a string")
        if version not in MODERN_VERSIONS:
            return 400, _unsupported(None, version)
        return 202, None  # no client notification means anything on this revision
    fault = _envelope_fault(message)
    if fault is not None:
        mid = _request_id(message) if isinstance(message, dict) else None
        return 400, _error(mid, INVALID_REQUEST, f"Invalid request: {fault}")
    mid, method = message["id"], message["method"]
    params: dict[str, Any] = message.get("params") or {}
    rejection = _ladder(mid, method, params, version)
    if rejection is not None:
        return MODERN_STATUS[rejection["error"]["code"]], rejection
    result: dict[str, Any]
    if method == "server/discover":
        result = {
            "supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": CAPABILITIES,
            "instructions": INSTRUCTIONS,
            "cacheScope": "public",
            "ttlMs": 0,
        }
    elif method == "tools/list":
        refused = _cursor_fault(mid, params)
        if refused is not None:
            return MODERN_STATUS[INVALID_PARAMS], refused
        # What a token is offered depends on its role: never shared across tokens.
        result = {"tools": tools.listed(), "cacheScope": "private", "ttlMs": 0}
    elif method == "tools/call":
        outcome = _call(mid, params, tools)
        if "error" in outcome:
            return MODERN_STATUS[outcome["error"]["code"]], outcome
        result = outcome["result"]
    else:
        # ping and initialize are gone at this revision, as the SDK answers them.
        return 404, _error(mid, METHOD_NOT_FOUND, "Method not found", method)
    result["resultType"] = "complete"
    result["_meta"] = {META_SERVER_INFO: SERVER_INFO}
    return 200, _ok(mid, result)


def _ladder(mid: Any, method: str, params: dict[str, Any], version: str) -> dict[str, Any] | None:
    """The 2026-07-28 checks of a request's envelope, in the spec's order; the first that
    fails is the answer."""
    meta = params.get("_meta")
    if not isinstance(meta, dict) or META_VERSION not in meta or META_CAPABILITIES not in meta:
        return _error(
            mid,
            INVALID_PARAMS,
            f"params._meta must be an object carrying {META_VERSION!r} and {META_CAPABILITIES!r}",
        )
    if meta[META_VERSION] != version:
        return _error(
            mid, HEADER_MISMATCH, f"{VERSION_HEADER} header does not match params._meta's version"
        )
    if request.headers.get(METHOD_HEADER) != method:
        return _error(mid, HEADER_MISMATCH, f"{METHOD_HEADER} header does not match the method")
    if method == "tools/call":
        name = params.get("name")
        if name is not None and request.headers.get(NAME_HEADER) != name:
            return _error(mid, HEADER_MISMATCH, f"{NAME_HEADER} header does not match the name")
    if version not in MODERN_VERSIONS:
        return _unsupported(mid, version)
    return None


def _unsupported(mid: Any, version: str) -> dict[str, Any]:
    return _error(
        mid,
        UNSUPPORTED_VERSION,
        "Unsupported protocol version",
        {"supported": list(MODERN_VERSIONS), "requested": version},
    )


# -- tools/list and tools/call ------------------------------------------------------------
def _cursor_fault(mid: Any, params: dict[str, Any]) -> dict[str, Any] | None:
    """INVALID_PARAMS for a tools/list cursor, None when there is none. The list is one page
    and no answer carries a nextCursor: any cursor is one this server never issued, and the
    spec wants an invalid cursor refused rather than read as the first page again."""
    if params.get("cursor") is None:
        return None
    return _error(
        mid,
        INVALID_PARAMS,
        "Invalid params: cursor is not one this server issued (tools/list answers every tool"
        " in one page, with no nextCursor): send tools/list without a cursor",
    )


def _call(mid: Any, params: dict[str, Any], tools: McpTools) -> dict[str, Any]:
    """A tools/call answer: the tool's result, an error result, or INVALID_PARAMS (a name
    that is no tool's, or params of the wrong shape)."""
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str):
        return _error(mid, INVALID_PARAMS, "Invalid params: name must be a string")
    if arguments is not None and not isinstance(arguments, dict):
        return _error(mid, INVALID_PARAMS, "Invalid params: arguments must be an object")
    try:
        output = tools.call(name, arguments)
    except UnknownTool:
        # The spec's own example of a protocol error, worded as it and the SDK word it; the
        # names let a model that guessed one pick a real one.
        offered = ", ".join(t.name for t in tools.offered())
        return _error(mid, INVALID_PARAMS, f"Unknown tool: {name[:200]}. The tools are: {offered}.")
    except ToolFailure as exc:
        output = ToolOutput(str(exc), is_error=True)
    except StorageError as exc:
        output = ToolOutput(storage_message(exc), is_error=True)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            log.exception("MCP tool %s failed", name)
        output = ToolOutput(_failed(name, exc), is_error=True)
    except Exception as exc:
        log.exception("MCP tool %s failed", name)
        output = ToolOutput(_failed(name, exc), is_error=True)
    result: dict[str, Any] = {"content": [{"type": "text", "text": output.text}]}
    if output.structured is not None:
        # Beside the text, which stays whole for a client that reads no structured content.
        result["structuredContent"] = output.structured
    result["isError"] = output.is_error
    return _ok(mid, result)


def _failed(name: str, exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "The server's disk is full: nothing was written."
    return f"{name} failed on the server (an internal error, logged there); nothing more is known."


def storage_message(exc: StorageError) -> str:
    """What a storage error tells the model, worded as the REST API words it."""
    http = from_storage(exc)
    if isinstance(http, RequestValidationError):
        return "; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in http.errors)
    text = http.message if isinstance(http, ApiError) else str(http.description)
    if http.code == 503:
        text += "; try again in a few seconds"
    return text[:1].upper() + text[1:] + "."
