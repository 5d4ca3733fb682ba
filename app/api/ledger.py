"""The turn ledger's routes of the project-memory API (beyond the seed): the ledger, the
timeline and the price table (app/services/ledger.py; what they mean: core/ledger.py).
Registered on the project-memory blueprint, whose authentication they share."""

from __future__ import annotations

from functools import partial
from typing import Any

from flask import request
from flask.blueprints import BlueprintSetupState
from flask.typing import ResponseReturnValue

from app.api.common import json_body, json_response, storage
from app.api.docs import doc
from app.api.params import ERRORS, cursor_param
from app.api.project_memory import bp
from app.api.query import query_checked, query_int, query_when
from app.schemas import project_memory as s
from app.services import ledger
from app.storage.core import ledger as lg
from app.storage.core.clock import time_pattern, to_us
from app.storage.core.ledger import Filters, LedgerQuery, TimelineQuery
from app.web.auth import current_principal, registry

prices_out = s.LedgerPrices()
prices_in = s.LedgerPricesRequest()


@bp.record_once
def _register_schemas(state: BlueprintSetupState) -> None:
    state.app.extensions.setdefault("openapi_schemas", []).extend(
        [s.LedgerReport, s.Timeline, s.LedgerPrices]
    )


_WHEN = {
    "type": "string",
    "pattern": f"^(?:{time_pattern(query=True)}|{lg.RELATIVE_PATTERN})$",
}
_TEXT = {"type": "string", "maxLength": lg.MAX_FILTER_CHARS, "pattern": lg.CONTROL_FREE_PATTERN}
FILTER_PARAMS: list[dict[str, Any]] = [
    {
        "name": "since",
        "in": "query",
        "required": False,
        "description": "From this moment on: an RFC 3339 time (a date alone is its midnight; no"
        " offset is UTC), a count of minutes, hours, days or weeks before now (30m, 12h, 7d,"
        " 2w), or today / yesterday (their midnight, UTC). The ledger counts whole UTC days:"
        " the day this moment falls in, and every day after.",
        "schema": _WHEN,
    },
    {
        "name": "until",
        "in": "query",
        "required": False,
        "description": "Before this moment (the same forms as since). The ledger counts the"
        " days before it, and the day it falls in unless it is that day's midnight.",
        "schema": _WHEN,
    },
    *(
        {
            "name": name,
            "in": "query",
            "required": False,
            "description": f"Only the turns whose {what} is exactly this (empty: the turns"
            f" that name none).",
            "schema": _TEXT,
        }
        for name, what in (
            ("agent", "meta agent_id"),
            ("model", "meta model"),
            ("branch", "meta branch"),
        )
    ),
]


def _filters() -> Filters:
    now_us = to_us(storage().tasks.clock())
    return Filters(
        query_when("since", now_us),
        query_when("until", now_us),
        query_checked("agent", partial(lg.check_filter, "agent")),
        query_checked("model", partial(lg.check_filter, "model")),
        query_checked("branch", partial(lg.check_filter, "branch")),
    )


@bp.get("/ledger")
@doc(
    params=[
        {
            "name": "group_by",
            "in": "query",
            "required": False,
            "description": "Dimensions to group by, separated by commas, in the order rows are"
            f" sorted by ({', '.join(lg.DIMENSIONS)}; the newest day first, every other in"
            " byte order); empty: the totals alone. Default: day.",
            "schema": {"type": "string", "pattern": lg.GROUP_BY_PATTERN, "default": "day"},
        },
        *FILTER_PARAMS,
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {
                "type": "integer",
                "minimum": 1,
                "maximum": lg.MAX_LEDGER_LIMIT,
                "default": lg.LEDGER_LIMIT,
            },
        },
        cursor_param("next_cursor (of the same group_by and filters)"),
    ],
    responses={200: s.LedgerReport, **ERRORS},
    beyond_seed=True,
)
def get_ledger() -> ResponseReturnValue:
    """What the project's turns add up to: turns, sessions, tokens, cost, wall time, failures

    Totals and rows by UTC day, agent, model, branch, task, session or owner (any of them
    together; owner: the token that created each task, named with its person in owner_name),
    summed from rollups every write keeps (never a walk of the turns): a request costs what
    the rows of its days hold. Tokens, wall time and exit codes come from each turn's meta
    (docs/api.md, "The ledger"); cost is the meta's own, else the tokens priced by the
    project's price table at the time of the read.
    """
    group_by = query_checked("group_by", lg.group_by_of)
    query = LedgerQuery(
        ("day",) if group_by is None else group_by,
        _filters(),
        query_int("limit", lg.LEDGER_LIMIT, 1, lg.MAX_LEDGER_LIMIT),
        request.args.get("cursor") or None,
    )
    page = ledger.report(storage(), current_principal(), query, registry())
    body = {
        "group_by": list(page.group_by),
        "since": None if page.since_day is None else lg.day_iso(page.since_day),
        "until": None if page.until_day is None else lg.day_iso(page.until_day),
        "totals": page.totals.to_json(),
        "rows": page.rows,
        "next_cursor": page.next_cursor,
    }
    # Built by hand in LedgerReport's shape (tests/api/test_ledger_api.py pins the two
    # together): marshmallow's dump of a page of rows costs more than the storage's read.
    return json_response(body)


@bp.get("/timeline")
@doc(
    params=[
        *FILTER_PARAMS,
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {
                "type": "integer",
                "minimum": 1,
                "maximum": lg.MAX_TIMELINE_LIMIT,
                "default": lg.TIMELINE_LIMIT,
            },
        },
        cursor_param("next_cursor (of the same filters)"),
    ],
    responses={200: s.Timeline, **ERRORS},
    beyond_seed=True,
)
def get_timeline() -> ResponseReturnValue:
    """The project's turns across its tasks, newest first

    Each turn as the ledger keeps it (when, by which agent and model, on which branch and
    commit, its tokens, cost, wall time and exit code), filtered as the ledger is but to the
    moment: what happened since yesterday 09:00 on a branch, by one agent, in one call. A
    page is one index range, whatever the project's size; GET a turn for its summary.
    """
    query = TimelineQuery(
        _filters(),
        query_int("limit", lg.TIMELINE_LIMIT, 1, lg.MAX_TIMELINE_LIMIT),
        request.args.get("cursor") or None,
    )
    page = ledger.timeline(storage(), current_principal(), query)
    body = {"turns": [e.to_json() for e in page.entries], "next_cursor": page.next_cursor}
    return json_response(body)  # in Timeline's shape, by hand as get_ledger's


_PRICE = {"type": "number", "minimum": 0, "maximum": lg.MAX_PRICE}
PRICES_BODY = {
    "type": "object",
    "required": ["models"],
    "additionalProperties": False,
    "properties": {
        "models": {
            "type": "object",
            "description": f"Each model's prices, in {lg.PRICE_UNIT} of each kind (one left"
            " out costs nothing); the whole table, which replaces the stored one ({} clears it).",
            "maxProperties": lg.MAX_PRICED_MODELS,
            "propertyNames": {
                "minLength": 1,
                "maxLength": lg.MAX_MODEL_CHARS,
                "pattern": lg.CONTROL_FREE_PATTERN,
            },
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {kind: _PRICE for kind in lg.TOKEN_KINDS},
            },
        }
    },
}


def _prices_body() -> dict[str, Any]:
    scope = current_principal().scope
    table = ledger.prices_of(storage(), scope)
    body: dict[str, Any] = prices_out.dump(
        {"unit": lg.PRICE_UNIT, "models": lg.prices_to_json(table)}
    )
    return body


@bp.get("/ledger/prices")
@doc(responses={200: s.LedgerPrices, **ERRORS}, beyond_seed=True)
def get_ledger_prices() -> ResponseReturnValue:
    """The project's price table: US dollars per million tokens of each kind, by model

    What the ledger prices the tokens of a turn with no cost of its own at (its model's
    entry), at each read.
    """
    return json_response(_prices_body())


@bp.put("/ledger/prices")
@doc(body=PRICES_BODY, responses={200: s.LedgerPrices, **ERRORS}, beyond_seed=True)
def put_ledger_prices() -> ResponseReturnValue:
    """Replace the project's price table (project_admin and above)

    The whole table, in US dollars per million tokens of each kind by model name (as turns'
    meta name it). Every read prices with it from then on, past turns too. Audited.
    """
    data = json_body(prices_in)
    principal = current_principal()
    ledger.set_prices(storage(), principal, principal.scope, data["models"])
    return json_response(_prices_body())
