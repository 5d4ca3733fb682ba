"""The audit view of a project: who created, changed, redacted or deleted what, and when.

The events the use cases record as they act, whichever door they came by
(app/services/audit.py): creations, changes, redactions and deletions, sign-ins, token and
limit changes, each with the token that made it. Newest first, filtered by actor and kind,
paged both ways; project_admin and above only, for it names tokens.
"""

from __future__ import annotations

from typing import Any

from flask import render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import Forbidden

from app.console.base import arg, bp, int_arg, principal, purl, scope, storage
from app.services.access import MANAGER, may_manage
from app.storage.core.audit import KEEP_DAYS, KINDS
from app.storage.core.errors import InvalidName

PER_PAGE = 50


@bp.get("/p/<tenant>/<project>/audit")
def audit(tenant: str, project: str) -> ResponseReturnValue:
    """Who did what in this project, newest first."""
    if not may_manage(principal()):
        raise Forbidden(f"the audit view needs the {MANAGER} role or above")
    actor = arg("actor", 64) or None
    kind = arg("kind", 32) or None
    per_page = int_arg("per_page", PER_PAGE, highest=200)
    after, before = request.args.get("after") or None, request.args.get("before") or None
    page, error = None, None
    if kind is not None and kind not in KINDS:
        error = "kind: one of " + ", ".join(KINDS)
    else:
        try:
            page = storage().audit_log.page(
                scope(),
                actor=actor,
                kind=kind,
                limit=per_page,
                cursor=before or after,
                backward=before is not None,
            )
        except InvalidName as exc:  # a cursor of another view: say so on the page
            error = f"{exc.field}: {exc.message}"
    keep: dict[str, Any] = {k: v for k, v in (("actor", actor), ("kind", kind)) if v}
    if per_page != PER_PAGE:
        keep["per_page"] = per_page
    return render_template(
        "console/audit.html",
        page=page,
        events=page.events if page else (),
        actor=actor or "",
        kind=kind or "",
        kinds=KINDS,
        keep_days=KEEP_DAYS,
        error=error,
        next_url=purl("audit", after=page.next_cursor, **keep)
        if page and page.next_cursor
        else None,
        prev_url=purl("audit", before=page.prev_cursor, **keep)
        if page and page.prev_cursor
        else None,
    )
