"""The memory tool (``memory_20250818``) served from a store: one POST per tool call.

A command that fails (a missing file, a refused path) is a 200 result with
``is_error: true``: it is the model's to read. An unknown store, a bad credential or a
busy lock are HTTP errors in the memory-stores envelope.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app
from flask.blueprints import BlueprintSetupState

from app.api.common import json_body, storage
from app.api.docs import doc
from app.api.params import STORE_ERRORS, STORE_FULL, STORE_ID, STORE_TAGS
from app.schemas import memory_tool as s
from app.services import stores
from app.web.auth import current_principal, require_principal

bp = Blueprint("memory_tool", __name__)
tool_input = s.MemoryToolInput()
tool_result_out = s.MemoryToolResult()


@bp.record_once
def _register_schemas(state: BlueprintSetupState) -> None:
    state.app.extensions.setdefault("openapi_schemas", []).extend(s.OPENAPI_SCHEMAS)


@bp.before_request
def _authenticate() -> None:
    require_principal()


@bp.post("/<memory_store_id>/memory_tool")
@doc(
    params=[STORE_ID],
    body=s.MemoryToolInput,
    responses={200: s.MemoryToolResult, **STORE_ERRORS, **STORE_FULL},
    tags=STORE_TAGS,
)
def run_memory_tool(memory_store_id: str) -> Response:
    """Run one memory-tool command (/memories/<rel> is the store's /<rel>)

    A write over a quota, or at the disk's free-space floor, is a 507 (nothing was written).
    """
    data = json_body(tool_input)
    result = stores.run_memory_tool(storage(), current_principal(), memory_store_id, data)
    response: Response = current_app.json.response(  # type: ignore[assignment]
        tool_result_out.dump(result)
    )
    return response
