"""Schemas of the project-memory API, named as its specification names them."""

from __future__ import annotations

from typing import Any

from marshmallow import (
    INCLUDE,
    RAISE,
    Schema,
    ValidationError as MarshmallowError,
    fields,
    post_load,
)
from marshmallow.validate import Length, OneOf, Range

from app.schemas import rules
from app.schemas.common import IntOrObject, NumberOrObject, StrictInteger, StrictString, TimeValue
from app.services import recall
from app.storage.core.errors import InvalidName
from app.storage.core.names import validate_id
from app.storage.core.secret_policy import POLICIES
from app.storage.core.task_rules import MAX_SUMMARY_BYTES
from app.storage.core.vectors import MODES as SEARCH_MODES

TIME_METADATA = {
    "description": "ISO 8601 or epoch: an RFC 3339 time (a date alone, or one without an offset"
    " (UTC), too; e.g. 2026-01-01T12:00:00.5+02:00), or seconds since the epoch.",
    "type": ["string", "number"],
    "rule": lambda: rules.time(query=False),
}


class TurnMeta(Schema):
    """Run metadata for one turn. Every field is optional; unknown keys are kept."""

    class Meta:
        unknown = INCLUDE

    agent_id = StrictString(allow_none=True)
    model = StrictString(allow_none=True)
    job_id = StrictString(allow_none=True)
    sandbox_id = StrictString(allow_none=True)
    commit = StrictString(allow_none=True)
    exit_code = StrictInteger(allow_none=True)
    started_at = TimeValue(allow_none=True, metadata=TIME_METADATA)
    ended_at = TimeValue(allow_none=True, metadata=TIME_METADATA)
    tokens = IntOrObject(allow_none=True, metadata={"type": ["integer", "object"]})
    cost = NumberOrObject(allow_none=True, metadata={"type": ["number", "object"]})
    claude_session_id = StrictString(allow_none=True)


def _check_summary_size(value: str | None) -> None:
    if value is not None and len(value.encode("utf-8", "surrogatepass")) > MAX_SUMMARY_BYTES:
        raise MarshmallowError(f"Summary is longer than {MAX_SUMMARY_BYTES} bytes of UTF-8.")


class PutTurnRequest(Schema):
    class Meta:
        unknown = RAISE

    meta = fields.Nested(
        TurnMeta,
        allow_none=True,
        load_default=dict,
        metadata={
            "description": "Run metadata for one turn. Every field is optional; unknown keys are kept."
        },
    )
    summary_md = StrictString(
        allow_none=True,
        load_default="",
        validate=_check_summary_size,
        metadata={
            "description": 'Markdown summary of the turn (max 1 MiB). Default: "".',
            # In characters; the server counts the limit in bytes of UTF-8.
            "rule": {"maxLength": MAX_SUMMARY_BYTES},
        },
    )

    @post_load
    def _defaults(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        data["meta"] = data.get("meta") or {}
        data["summary_md"] = data.get("summary_md") or ""
        return data


class MemoryArtifact(Schema):
    name = fields.String(required=True)
    content_type = fields.String(required=True)
    size = fields.Integer(required=True)
    updated_at = fields.String(allow_none=True)


class ArtifactRecord(MemoryArtifact):
    task_id = fields.String(required=True)
    turn = fields.Integer(required=True)


class TurnRecord(Schema):
    task_id = fields.String(required=True)
    turn = fields.Integer(required=True)
    meta = fields.Dict(required=True)
    summary_md = fields.String(required=True)
    artifacts = fields.List(fields.Nested(MemoryArtifact), required=True)
    created_at = fields.String(allow_none=True)
    updated_at = fields.String(allow_none=True)
    retain_until = fields.String(allow_none=True)


class TaskSummary(Schema):
    task_id = fields.String(required=True)
    latest_turn = fields.Integer(allow_none=True)
    turn_count = fields.Integer(allow_none=True)
    updated_at = fields.String(allow_none=True)
    retain_until = fields.String(allow_none=True)


class TaskList(Schema):
    tasks = fields.List(fields.Nested(TaskSummary), required=True)
    total = fields.Integer(required=True)
    next_cursor = fields.String(
        allow_none=True,
        metadata={"description": "Pass back as ?cursor= for the next page; null at the end."},
    )


class TaskTurn(Schema):
    turn = fields.Integer(required=True)
    meta = fields.Dict(required=True)
    artifacts = fields.List(fields.String(), required=True)
    created_at = fields.String(allow_none=True)
    updated_at = fields.String(allow_none=True)
    retain_until = fields.String(allow_none=True)


class TaskIndex(Schema):
    task_id = fields.String(required=True)
    owner = fields.String(
        allow_none=True, metadata={"description": "Id of the token that first wrote the task."}
    )
    created_at = fields.String(allow_none=True)
    updated_at = fields.String(allow_none=True)
    retain_until = fields.String(allow_none=True)
    latest_turn = fields.Integer(allow_none=True)
    turn_count = fields.Integer(required=True)
    turns = fields.List(fields.Nested(TaskTurn), required=True)


class ValidationError(Schema):
    loc = fields.List(
        fields.Raw(metadata={"oneOf": [{"type": "string"}, {"type": "integer"}]}), required=True
    )
    msg = fields.String(required=True)
    type = fields.String(required=True)
    input = fields.Raw()
    ctx = fields.Dict()


class HTTPValidationError(Schema):
    detail = fields.List(fields.Nested(ValidationError))


class HTTPError(Schema):
    detail = fields.String(required=True)


class SessionContext(Schema):
    """A coding agent's session-start context, assembled within a byte budget."""

    task_id = fields.String(required=True)
    context = fields.String(
        required=True,
        metadata={
            "description": "Markdown: the task's last turns, the newest sections of project.md"
            " and other mentions of the task; stored text between <stored-text> and"
            " </stored-text>."
        },
    )
    bytes = fields.Integer(
        required=True, metadata={"description": "The context's size in bytes of UTF-8."}
    )
    turns = fields.List(
        fields.Integer(),
        required=True,
        metadata={"description": "The numbers of the task's turns it shows, newest first."},
    )
    sections = fields.Integer(
        required=True, metadata={"description": "Sections of project.md it shows."}
    )
    hits = fields.Integer(
        required=True, metadata={"description": "Mentions of the task elsewhere it shows."}
    )


def _check_task_id(value: str | None) -> None:
    if value is not None:
        try:
            validate_id("task_id", value)
        except InvalidName as exc:
            raise MarshmallowError(exc.message) from None


class RecallRequest(Schema):
    """A prompt, and the task it is about: what the project's memory holds about it."""

    class Meta:
        unknown = RAISE

    prompt = StrictString(
        required=True,
        validate=Length(max=recall.MAX_PROMPT_CHARS),
        metadata={
            "description": "The prompt as the person wrote it (natural language). Neither"
            " stored nor logged."
        },
    )
    task_id = StrictString(
        allow_none=True,
        load_default=None,
        validate=_check_task_id,
        metadata={
            "description": "The task the session works on: its own turns come first.",
            "rule": rules.identifier,
        },
    )
    max_chars = StrictInteger(
        load_default=recall.DEFAULT_CHARS,
        validate=Range(min=recall.MIN_CHARS, max=recall.MAX_CHARS),
        metadata={"description": "The context's budget, in characters."},
    )
    mode = StrictString(
        load_default="keyword",
        validate=OneOf(SEARCH_MODES),
        metadata={
            "description": "keyword (the default): texts that hold any of the prompt's words;"
            " hybrid: ranked by meaning too; semantic: by meaning alone. A ranking by meaning"
            " always has a nearest text, so with hybrid or semantic a prompt that matches"
            " nothing still gets context."
        },
    )


class RecallHit(Schema):
    kind = fields.String(
        required=True,
        metadata={"enum": ["turn", "memory"], "description": "A turn of a task, or a memory."},
    )
    score = fields.Float(required=True, metadata={"description": "The search's score."})
    task_id = fields.String(allow_none=True, metadata={"description": "A turn's task."})
    turn = fields.Integer(allow_none=True, metadata={"description": "A turn's number."})
    memory_store_id = fields.String(allow_none=True, metadata={"description": "A memory's store."})
    memory_id = fields.String(allow_none=True)
    path = fields.String(allow_none=True, metadata={"description": "A memory's path."})
    this_task = fields.Boolean(
        required=True, metadata={"description": "A turn of the task the request named."}
    )


class Recall(Schema):
    """What the project's memory holds about a prompt, within a character budget."""

    context = fields.String(
        required=True,
        metadata={
            "description": "Markdown: a header, then one line per hit (the task's own turns"
            " first, newest first; then the others, best first), each an excerpt of stored"
            " text between <stored-text> and </stored-text>. Empty when nothing matched."
        },
    )
    chars = fields.Integer(required=True, metadata={"description": "The context's length."})
    terms = fields.List(
        fields.String(),
        required=True,
        metadata={"description": "What the prompt was searched for (word, or prefix*)."},
    )
    hits = fields.List(fields.Nested(RecallHit), required=True)
    modes = fields.List(
        fields.String(metadata={"enum": ["keyword", "semantic"]}),
        required=True,
        metadata={"description": "The rankings the search ran: keyword, semantic, or both."},
    )
    fallback = fields.String(
        required=True,
        allow_none=True,
        metadata={
            "description": "Why meaning was not used (the embedder down, none configured):"
            " keyword results only. Null otherwise."
        },
    )


class EmptiedSpace(Schema):
    """What emptying a private space deleted."""

    deleted_tasks = fields.Integer(required=True)
    deleted_stores = fields.Integer(required=True)


class WhoAmI(Schema):
    """The token a request was made with (never its secret) and the scope it acts in."""

    token_id = fields.String(required=True)
    name = fields.String(required=True)
    role = fields.String(
        required=True,
        metadata={"enum": ["reader", "writer", "project_admin", "tenant_admin", "admin"]},
    )
    tenant = fields.String(
        required=True, metadata={"description": "The tenant this request acts in."}
    )
    project = fields.String(
        required=True, metadata={"description": "The project this request acts in."}
    )
    visibility = fields.String(
        required=True,
        metadata={
            "enum": ["project", "private"],
            "description": "The space of the project this request acts in: the team's, or"
            " the user's own private space (?visibility=private).",
        },
    )
    user = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "The user the token belongs to (usr_...); null: none."},
    )
    user_name = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "That user's name (else email); null: no user."},
    )
    token_tenant = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "The token's own tenant; null: any (an admin token)."},
    )
    token_project = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "The token's own project; null: any of its tenant's."},
    )
    created_at = fields.String(required=True)
    expires_at = fields.String(
        allow_none=True, required=True, metadata={"description": "null: never."}
    )


class SearchHit(Schema):
    kind = fields.String(
        required=True,
        metadata={"enum": ["turn", "memory"], "description": "A turn of a task, or a memory."},
    )
    score = fields.Float(
        required=True,
        metadata={
            "description": "Relevance, higher is better: bm25 (keyword), the reciprocal-rank"
            " fusion sum (hybrid), the cosine similarity (semantic)."
        },
    )
    snippet = fields.String(
        required=True,
        metadata={
            "description": "Plain text around the matches; each matched word stands between"
            " U+0002 and U+0003 (those two characters occur nowhere else in it). Escape it,"
            " then turn the markers into highlighting."
        },
    )
    task_id = fields.String(allow_none=True, metadata={"description": "A turn's task."})
    turn = fields.Integer(allow_none=True, metadata={"description": "A turn's number."})
    memory_store_id = fields.String(allow_none=True, metadata={"description": "A memory's store."})
    store_name = fields.String(allow_none=True)
    memory_id = fields.String(allow_none=True)
    path = fields.String(allow_none=True, metadata={"description": "A memory's path."})


class SearchResults(Schema):
    hits = fields.List(fields.Nested(SearchHit), required=True)
    next_cursor = fields.String(
        allow_none=True,
        metadata={"description": "Pass back as ?cursor= (with the same q) for the next page."},
    )
    stores_searched = fields.Integer(required=True)
    stores_skipped = fields.Integer(
        required=True,
        metadata={
            "description": "Memory stores beyond the per-search bound (the newest are searched)."
        },
    )
    modes = fields.List(
        fields.String(metadata={"enum": ["keyword", "semantic"]}),
        required=True,
        metadata={"description": "The rankings that ran: keyword, semantic, or both (hybrid)."},
    )
    fallback = fields.String(
        required=True,
        allow_none=True,
        metadata={
            "description": "Why vectors were asked for and not used (the embedder unavailable,"
            " none configured): the hits are keyword results. Null otherwise."
        },
    )


class SecretPolicyRequest(Schema):
    """A change of the project's secret policy: each field given replaces the stored one,
    each left out stays as it is."""

    class Meta:
        unknown = RAISE

    policy = fields.String(
        validate=OneOf(POLICIES),
        metadata={
            "description": "mask (the default): each secret is stored as [secret:<kind>];"
            " reject: a write holding one is refused (422); allow: stored as given (audited)."
        },
    )
    allow_patterns = fields.List(
        fields.String(),
        metadata={
            "description": "Regular expressions (at most 64, of up to 256 characters): a found"
            " value one of them matches is not a secret."
        },
    )
    allow_fingerprints = fields.List(
        fields.String(),
        metadata={
            "description": "SHA-256 (64 lowercase hex digits) of exact values that are not"
            " secrets (at most 1,024)."
        },
    )


class SecretPolicy(Schema):
    """What the project does with the secrets of a write, as in force (its own section, else
    its tenant's; the two allowlists together)."""

    policy = fields.String(required=True, metadata={"enum": list(POLICIES)})
    allow_patterns = fields.List(fields.String(), required=True)
    allow_fingerprints = fields.List(fields.String(), required=True)


# -- the turn ledger (core/ledger.py) ---------------------------------------------------------
class LedgerFigures(Schema):
    """What some turns add up to, each figure in the unit its name says."""

    turns = fields.Integer(required=True)
    sessions = fields.Integer(
        required=True,
        metadata={
            "description": "Sessions whose first turn is among these turns: each session counts"
            " once, where it started, so rows add up to the totals."
        },
    )
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    cache_read_tokens = fields.Integer(required=True)
    cache_creation_tokens = fields.Integer(required=True)
    cost_usd = fields.Float(
        required=True,
        metadata={
            "description": "US dollars: the cost turns report in their meta (`cost`), and the"
            " tokens of the others priced by the project's price table (GET ledger/prices)."
        },
    )
    reported_cost_usd = fields.Float(
        required=True, metadata={"description": "The part of cost_usd the turns' meta reports."}
    )
    unpriced_turns = fields.Integer(
        required=True,
        metadata={
            "description": "Turns with no cost of their own whose model the price table does"
            " not price: nothing of theirs is in cost_usd."
        },
    )
    wall_seconds = fields.Float(
        required=True, metadata={"description": "The sum of each turn's ended_at - started_at."}
    )
    nonzero_exits = fields.Integer(
        required=True, metadata={"description": "Turns whose exit_code is not 0."}
    )


class LedgerKey(Schema):
    """A ledger row's key: each dimension it groups by (null where the turns name none)."""

    day = fields.String(metadata={"description": "A UTC day, YYYY-MM-DD."})
    agent = fields.String(allow_none=True)
    model = fields.String(allow_none=True)
    branch = fields.String(allow_none=True)
    task = fields.String(allow_none=True, metadata={"description": "A task id."})
    session = fields.String(allow_none=True)
    owner = fields.String(
        allow_none=True,
        metadata={"description": "The token that created the tasks (tok_...); null: unknown."},
    )
    owner_name = fields.String(
        allow_none=True,
        metadata={
            "description": "How that token is named: its person's name and its own (\"ana via"
            " laptop\") for a person's token, else its name; null: a token no longer on record."
        },
    )


class LedgerRow(LedgerFigures, LedgerKey):
    """One group of group_by: its key, then its figures."""


class LedgerReport(Schema):
    group_by = fields.List(fields.String(), required=True)
    since = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "The first UTC day counted (YYYY-MM-DD); null: no bound."},
    )
    until = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "The last UTC day counted (YYYY-MM-DD); null: no bound."},
    )
    totals = fields.Nested(LedgerFigures, required=True)
    rows = fields.List(fields.Nested(LedgerRow), required=True)
    next_cursor = fields.String(
        allow_none=True,
        metadata={"description": "Pass back as ?cursor= (with the same question) for more rows."},
    )


class TimelineTurn(Schema):
    task_id = fields.String(required=True)
    turn = fields.Integer(required=True)
    at = fields.String(
        required=True,
        metadata={
            "description": "When the turn happened: its started_at, else its first write (UTC)."
        },
    )
    agent = fields.String(required=True, allow_none=True)
    model = fields.String(required=True, allow_none=True)
    branch = fields.String(required=True, allow_none=True)
    session = fields.String(required=True, allow_none=True)
    commit = fields.String(required=True, allow_none=True)
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    cache_read_tokens = fields.Integer(required=True)
    cache_creation_tokens = fields.Integer(required=True)
    cost_usd = fields.Float(
        required=True,
        allow_none=True,
        metadata={"description": "Reported, else priced; null when neither."},
    )
    wall_seconds = fields.Float(required=True)
    exit_code = fields.Integer(required=True, allow_none=True)


class Timeline(Schema):
    turns = fields.List(fields.Nested(TimelineTurn), required=True)
    next_cursor = fields.String(
        allow_none=True,
        metadata={"description": "Pass back as ?cursor= (with the same filters) for older turns."},
    )


class ModelPrice(Schema):
    input = fields.Float(required=True)
    output = fields.Float(required=True)
    cache_read = fields.Float(required=True)
    cache_creation = fields.Float(required=True)


class LedgerPrices(Schema):
    """The project's price table: what a million tokens of each kind cost with each model."""

    unit = fields.String(required=True, metadata={"enum": ["USD per million tokens"]})
    models = fields.Dict(keys=fields.String(), values=fields.Nested(ModelPrice), required=True)


class LedgerPricesRequest(Schema):
    """The project's new price table, whole (core/ledger.py checks each entry)."""

    class Meta:
        unknown = RAISE

    models = fields.Dict(required=True)
