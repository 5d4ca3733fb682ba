"""Schemas of the MCP tools' arguments (app/services/mcp/), one per tool: the source of each
tool's ``inputSchema`` (app/services/mcp/schemas.py turns them into JSON Schema as the
OpenAPI document turns the REST bodies), and of the bounds and defaults the tools read.
Below them, the results of the tools that return records: the source of their
``outputSchema`` and the shape their ``structuredContent`` is dumped in.

Where a tool takes what a REST endpoint takes, it takes it by the same fields and rules:
record_turn's meta is the PUT turn body's TurnMeta, a task id and a turn follow the path's
rules, the memory tool's fields are the memory-tool endpoint's (app/schemas/memory_tool.py)
with their types. The tools still check each argument themselves, so that a fault reaches
the model as a sentence (app/services/mcp/arguments.py); an unknown argument is refused, as
``additionalProperties: false`` says.
"""

from __future__ import annotations

from marshmallow import Schema, fields, validate

from app.schemas import project_memory, rules
from app.schemas.common import StrictInteger, StrictString
from app.schemas.project_memory import MemoryArtifact, SearchHit, TaskSummary, TurnMeta
from app.services.memory_tool import COMMANDS
from app.storage.core import ledger
from app.storage.core.clock import time_pattern
from app.storage.core.names import ARTIFACT_NAME_PATTERN, MAX_TURN
from app.storage.core.query import MAX_QUERY_CHARS
from app.storage.core.task_rules import MAX_ARTIFACTS_PER_WRITE, MAX_CONTENT_TYPE_CHARS
from app.storage.core.vectors import MODES as SEARCH_MODES

# Claude Code warns above 10,000 tokens of tool output and cuts at 25,000: 20,000 characters
# (about 5,000 tokens) leave room for several calls in one context.
OUTPUT_CHARS = 20_000
DIGEST_DEFAULT_CHARS = 6_000
SEARCH_DEFAULT_LIMIT = 10
SEARCH_MAX_LIMIT = 100  # the REST search's own bound
LIST_DEFAULT_LIMIT = 20
LIST_MAX_LIMIT = 100  # rows of about 100 characters: a full page stays under OUTPUT_CHARS
TIMELINE_DEFAULT_LIMIT = 20
# Each turn of read_timeline shows the start of its summary (TIMELINE_SUMMARY_CHARS): a
# full page stays under OUTPUT_CHARS.
TIMELINE_MAX_LIMIT = 50
TIMELINE_SUMMARY_CHARS = 200
# record_turn's artifacts travel inside the JSON-RPC message (at most MAX_JSON_BYTES, 4 MiB
# by default): 1 MiB of them in all, as base64 (4/3 of it) beside a summary of up to
# 1 MiB, stays well inside it. A larger file goes up with the CLI or the REST API.
MCP_ARTIFACT_BYTES = 1 << 20
UPLOAD_HINT = (
    "a larger file goes up with the CLI (project-memory turn put TASK N --artifact PATH) or"
    " the REST API"
)
TEXT = "text"
BASE64 = "base64"


def _task_id() -> StrictString:
    return StrictString(
        required=True,
        metadata={
            "description": "A task id as list_tasks or search shows it, e.g. fix-login.",
            "rule": rules.identifier,
        },
    )


def _turn(*, required: bool = True, description: str | None = None) -> StrictInteger:
    metadata = {} if description is None else {"description": description}
    return StrictInteger(
        required=required, validate=validate.Range(min=0, max=MAX_TURN), metadata=metadata
    )


def _offset(description: str) -> StrictInteger:
    return StrictInteger(
        load_default=0, validate=validate.Range(min=0), metadata={"description": description}
    )


def _artifact_name(description: str) -> StrictString:
    return StrictString(
        required=True,
        metadata={"pattern": f"^{ARTIFACT_NAME_PATTERN}$", "description": description},
    )


def _cursor(description: str | None = None) -> StrictString:
    return StrictString(metadata={} if description is None else {"description": description})


class Search(Schema):
    query = StrictString(required=True, validate=validate.Length(min=1, max=MAX_QUERY_CHARS))
    limit = StrictInteger(
        load_default=SEARCH_DEFAULT_LIMIT, validate=validate.Range(min=1, max=SEARCH_MAX_LIMIT)
    )
    mode = StrictString(
        validate=validate.OneOf(SEARCH_MODES),
        metadata={
            "description": "hybrid: keywords and meaning together (the default when the"
            " server has an embedder); keyword: every word must match; semantic: by meaning"
            " alone. The result says which ran, and why it fell back to keywords."
        },
    )
    cursor = _cursor("From a previous result's 'more hits' line (same query and mode).")


class ReadDigest(Schema):
    max_chars = StrictInteger(
        load_default=DIGEST_DEFAULT_CHARS, validate=validate.Range(min=1, max=OUTPUT_CHARS)
    )


class ListTasks(Schema):
    limit = StrictInteger(
        load_default=LIST_DEFAULT_LIMIT, validate=validate.Range(min=1, max=LIST_MAX_LIMIT)
    )
    cursor = _cursor()


def _when(what: str) -> StrictString:
    return StrictString(
        metadata={
            "description": f"{what}: an RFC 3339 time (2026-01-31T09:00:00Z; a date alone is"
            " its midnight, UTC), a count of minutes, hours, days or weeks before now (30m,"
            " 12h, 7d, 2w), or today / yesterday (their midnight, UTC).",
            "pattern": f"^(?:{time_pattern(query=False)}|{ledger.RELATIVE_PATTERN})$",
        }
    )


def _exactly(what: str) -> StrictString:
    return StrictString(
        validate=validate.Length(max=ledger.MAX_FILTER_CHARS),
        metadata={
            "description": f"Only the turns whose {what} is exactly this.",
            "pattern": ledger.CONTROL_FREE_PATTERN,
        },
    )


class ReadTimeline(Schema):
    since = _when("From this moment on")
    until = _when("Before this moment")
    agent = _exactly("agent (meta agent_id: claude-code, codex...)")
    model = _exactly("model")
    branch = _exactly("git branch")
    limit = StrictInteger(
        load_default=TIMELINE_DEFAULT_LIMIT,
        validate=validate.Range(min=1, max=TIMELINE_MAX_LIMIT),
    )
    cursor = _cursor("From a previous result's 'more' line (same filters).")


class ReadTask(Schema):
    task_id = _task_id()


class ReadTurn(Schema):
    task_id = _task_id()
    turn = _turn()
    offset = _offset("Characters of the summary to skip (to read a long one).")


class ReadArtifact(Schema):
    task_id = _task_id()
    turn = _turn()
    name = _artifact_name("An artifact name, e.g. test.log (letters, digits, '.', '_', '-').")
    offset = _offset("Bytes of the artifact to skip (to read a large one).")


class Artifact(Schema):
    """One of record_turn's artifacts: a file's text, or its bytes in base64."""

    name = _artifact_name("e.g. test.log; replaces the turn's artifact of that name.")
    content = StrictString(
        required=True,
        metadata={"description": "The file's text; with encoding base64, its bytes in base64."},
    )
    encoding = StrictString(load_default=TEXT, validate=validate.OneOf([TEXT, BASE64]))
    content_type = StrictString(
        validate=validate.Length(max=MAX_CONTENT_TYPE_CHARS),
        metadata={
            "description": "A media type, e.g. text/x-diff. Default: from the name's"
            " extension, else text/plain; charset=utf-8 for text and"
            " application/octet-stream for base64."
        },
    )


class RecordTurn(Schema):
    """The PUT turn body (its meta is the same TurnMeta), the task and turn the REST API
    takes in its path, and artifacts sent with the turn."""

    task_id = _task_id()
    summary_md = StrictString(required=True, metadata={"description": "At most 1 MiB of UTF-8."})
    meta = fields.Nested(TurnMeta)
    turn = _turn(required=False, description="Omit to take the next free turn number.")
    artifacts = fields.List(
        fields.Nested(Artifact),
        validate=validate.Length(max=MAX_ARTIFACTS_PER_WRITE),
        metadata={
            "description": f"At most {MCP_ARTIFACT_BYTES} bytes (1 MiB) in all, counted"
            f" after base64 decoding; {UPLOAD_HINT}."
        },
    )


class Memory(Schema):
    """A memory-tool command (app/schemas/memory_tool.py's MemoryToolInput, each field with
    its type) and the store it runs against."""

    store = StrictString(required=True, metadata={"description": "memstore_... id, or the name."})
    command = StrictString(required=True, validate=validate.OneOf(COMMANDS))
    path = StrictString(metadata={"description": "view, create, str_replace, insert"})
    view_range = fields.List(
        StrictInteger(),
        validate=validate.Length(equal=2),
        metadata={"description": "view: [first line, last line]; -1 is the end."},
    )
    file_text = StrictString(metadata={"description": "create"})
    old_str = StrictString(metadata={"description": "str_replace: unique text"})
    new_str = StrictString(metadata={"description": "str_replace"})
    insert_line = StrictInteger(metadata={"description": "insert: 0 = the top"})
    insert_text = StrictString(metadata={"description": "insert"})
    old_path = StrictString(metadata={"description": "rename"})
    new_path = StrictString(metadata={"description": "rename"})


class DeleteTurn(Schema):
    task_id = _task_id()
    turn = _turn()


class DeleteArtifact(Schema):
    task_id = _task_id()
    turn = _turn()
    name = StrictString(required=True, validate=validate.Length(min=1, max=255))


# -- results: a tool's structuredContent, and its outputSchema -----------------------------
# A result holds what the tool's text shows, cut where the text is cut (the same hits, turns,
# artifacts and part of a summary), so that it keeps to the text's bound: a client may give
# the model this in place of the text. The item schemas are the REST API's where the item is.


def _next_offset(unit: str) -> fields.Integer:
    return fields.Integer(
        required=True,
        allow_none=True,
        metadata={"description": f"The offset (in {unit}) that reads on; null: this is the end."},
    )


def _left_out(what: str) -> fields.Integer:
    return fields.Integer(
        required=True, metadata={"description": f"{what} left out to keep the result in bound."}
    )


def _meta() -> fields.Dict:
    return fields.Dict(
        required=True,
        metadata={"description": "The turn's meta: the keys that fit in the result's bound."},
    )


class SearchHitResult(SearchHit):
    snippet = fields.String(
        required=True,
        metadata={"description": "The text around the matches, each match in **bold**."},
    )
    path = fields.String(
        allow_none=True,
        metadata={"description": "A memory's path in its store, after /memories."},
    )


class SearchResult(Schema):
    hits = fields.List(fields.Nested(SearchHitResult), required=True)
    hits_left_out = _left_out("Hits of this page (search with a smaller limit to see them)")
    next_cursor = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "Pass as cursor, with the same query, for more hits."},
    )
    stores_searched = fields.Integer(required=True)
    stores_skipped = fields.Integer(
        required=True,
        metadata={"description": "Memory stores beyond the per-search bound (not searched)."},
    )
    modes = fields.List(
        fields.String(validate=validate.OneOf(["keyword", "semantic"])),
        required=True,
        metadata={"description": "The rankings that ran: keyword, semantic, or both (hybrid)."},
    )
    fallback = fields.String(
        required=True,
        allow_none=True,
        metadata={
            "description": "Why meaning was asked for and not used (the embedder down, none"
            " configured): the hits are keyword results. Null otherwise."
        },
    )


class DigestResult(Schema):
    digest = fields.String(
        required=True,
        metadata={"description": "project.md's newest sections, within max_chars characters."},
    )
    more = fields.Boolean(required=True, metadata={"description": "Older sections were left out."})


class TaskListResult(Schema):
    tasks = fields.List(fields.Nested(TaskSummary), required=True)
    total = fields.Integer(required=True)
    next_cursor = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "Pass as cursor for the next page; null at the end."},
    )


class TaskTurnResult(Schema):
    turn = fields.Integer(required=True)
    updated_at = fields.String(required=True)
    meta = _meta()
    meta_keys_left_out = _left_out("Keys of meta")
    artifacts = fields.List(fields.String(), required=True, metadata={"description": "Names."})
    artifacts_left_out = _left_out("Artifact names")


class TaskResult(Schema):
    task_id = fields.String(required=True)
    created_at = fields.String(required=True)
    updated_at = fields.String(required=True)
    retain_until = fields.String(required=True)
    turn_count = fields.Integer(required=True)
    turns = fields.List(
        fields.Nested(TaskTurnResult),
        required=True,
        metadata={"description": "Newest first; read_turn reads any turn."},
    )
    turns_left_out = _left_out("Older turns")


class TurnResult(Schema):
    task_id = fields.String(required=True)
    turn = fields.Integer(required=True)
    created_at = fields.String(required=True)
    updated_at = fields.String(required=True)
    retain_until = fields.String(required=True)
    meta = _meta()
    meta_keys_left_out = _left_out("Keys of meta")
    artifacts = fields.List(fields.Nested(MemoryArtifact), required=True)
    artifacts_left_out = _left_out("Artifacts")
    summary_md = fields.String(
        required=True,
        metadata={"description": "The summary from summary_offset, as much as fits."},
    )
    summary_offset = fields.Integer(required=True)
    summary_chars = fields.Integer(
        required=True, metadata={"description": "The whole summary's length in characters."}
    )
    next_offset = _next_offset("characters")


class ArtifactResult(Schema):
    task_id = fields.String(required=True)
    turn = fields.Integer(required=True)
    name = fields.String(required=True)
    content_type = fields.String(required=True)
    size = fields.Integer(required=True, metadata={"description": "In bytes."})
    updated_at = fields.String(required=True)
    sha256 = fields.String(required=True)
    offset = fields.Integer(required=True, metadata={"description": "The first byte of content."})
    encoding = fields.String(required=True, validate=validate.OneOf([TEXT, BASE64]))
    content = fields.String(
        required=True,
        metadata={"description": "Bytes from offset: UTF-8 text as it is, else in base64."},
    )
    next_offset = _next_offset("bytes")


class RecordedTurn(Schema):
    task_id = fields.String(required=True)
    turn = fields.Integer(required=True)
    updated_at = fields.String(required=True)
    retain_until = fields.String(required=True)
    artifacts = fields.List(
        fields.Nested(MemoryArtifact),
        required=True,
        metadata={"description": "Those sent with this call, as stored."},
    )


class TimelineTurn(project_memory.TimelineTurn):
    """A turn of the REST timeline, with the start of its summary."""

    summary = fields.String(
        required=True,
        allow_none=True,
        metadata={
            "description": f"The start of its summary (at most {TIMELINE_SUMMARY_CHARS}"
            " characters; read_turn reads it whole); null when it was removed since."
        },
    )


class TimelineResult(Schema):
    turns = fields.List(
        fields.Nested(TimelineTurn), required=True, metadata={"description": "Newest first."}
    )
    next_cursor = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "Pass as cursor (with the same filters) for older turns."},
    )
