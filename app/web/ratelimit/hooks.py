"""The Flask side of the rate limits: the request hooks that charge, refuse with 429 and
add the RateLimit fields, and the meter that charges a body's bytes as they are read."""

from __future__ import annotations

import weakref

from flask import Blueprint, Flask, current_app, g, request
from werkzeug.wrappers import Response

from app.storage.core.task_rules import max_form_bytes
from app.web.body import COUNTED_INPUT, CountingInput
from app.web.errors import ApiError
from app.web.ratelimit.limiter import Limiter, Outcome

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The one route whose body is not JSON: an artifact, up to MAX_ARTIFACT_BYTES.
ARTIFACT_ENDPOINT = "project_memory.put_artifact"
TURN_ENDPOINT = "project_memory.put_turn"


def body_limit(endpoint: str | None, content_type: str | None = None) -> int:
    """The largest request body the route accepts (a turn with its artifacts: the form of
    app/api/turn_form.py)."""
    config = current_app.config
    if endpoint == ARTIFACT_ENDPOINT:
        return int(config["MAX_ARTIFACT_BYTES"])
    if endpoint == TURN_ENDPOINT and (content_type or "").startswith("multipart/form-data"):
        return max_form_bytes(int(config["MAX_JSON_BYTES"]), int(config["MAX_ARTIFACT_BYTES"]))
    return int(config["MAX_JSON_BYTES"])


def check_request() -> None:
    """Refuse the request with 429 when one of its budgets is spent (a blueprint hook that
    runs after the blueprint's authentication, which leaves the principal on ``g``)."""
    # One lookup through each context proxy: this runs on every request of the APIs.
    ctx = g._get_current_object()
    req = request._get_current_object()  # type: ignore[attr-defined]
    limiter: Limiter = current_app.extensions["rate_limiter"]
    principal = ctx.principal
    # A private space spends its project's budgets: it is the project's, kept apart.
    token, scope = principal.token, principal.scope.team
    upload: int | None = None  # no body
    environ = req.environ
    if environ["REQUEST_METHOD"] not in READ_METHODS:
        upload = req.content_length
        if upload is None and "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            upload = 0  # its size is known only once read: admitted unless overdrawn
    if upload and upload > body_limit(req.endpoint, environ.get("CONTENT_TYPE")):
        # The view refuses such a body unread (413), so it is charged as a request without
        # one: a claimed length of any size must not drain the upload budgets.
        upload = None
    outcome = limiter.check(token.id, token.role, scope.tenant, scope.project, upload)
    if outcome is None:
        return
    if outcome.retry_after:
        raise ApiError(429, outcome.message, headers=outcome.headers())
    if upload is not None and outcome.limits.upload is not None:
        counting: CountingInput | None = environ.get(COUNTED_INPUT)  # app/web/body.py
        if counting is not None:
            counting.meter = UploadMeter(limiter, token.id, scope.tenant, scope.project)
    # Admitted responses carry the RateLimit fields once a budget is half spent: a client
    # is told in time to slow down, and far from its limits no response pays for them.
    if outcome.low:
        ctx.rate_limit = outcome


class UploadMeter:
    """Charges a request's body bytes to its upload budgets as they are read, and refuses
    the rest of the body (429) once they leave a budget overdrawn (Limiter.charge_received).
    What was read is charged whatever the request's outcome; what never came costs nothing."""

    __slots__ = ("limiter", "mine", "project", "tenant", "token_id")

    def __init__(self, limiter: Limiter, token_id: str, tenant: str, project: str) -> None:
        self.limiter = limiter
        self.token_id = token_id
        self.tenant = tenant
        self.project = project
        self.mine = 0

    def __call__(self, received: int) -> None:
        self.mine += received
        refused = self.limiter.charge_received(
            self.token_id, self.tenant, self.project, received, self.mine
        )
        if refused is not None:
            raise ApiError(429, refused.message, headers=refused.headers())


def check_token_request(token_id: str, role: str, tenant: str | None) -> None:
    """Refuse with 429 a request in no project whose token's budget is spent."""
    limiter: Limiter = current_app.extensions["rate_limiter"]
    outcome = limiter.check_token(token_id, role, tenant)
    if outcome is None:
        return
    if outcome.retry_after:
        raise ApiError(429, outcome.message, headers=outcome.headers())
    if outcome.low:
        g.rate_limit = outcome


def _after_request(response: Response) -> Response:
    # g.get, not getattr with a default: g's __getattr__ raises for a missing name, and
    # building that exception on every request costs more than the rest of this function.
    outcome: Outcome | None = g.get("rate_limit")
    if outcome is None:
        return response
    if outcome.low:
        headers = response.headers
        headers["RateLimit"] = outcome.rate_limit_field()
        headers["RateLimit-Policy"] = outcome.limits.policy
    return response


_limited: weakref.WeakSet[Blueprint] = weakref.WeakSet()


def limit_blueprints(*blueprints: Blueprint) -> None:
    """Check every request of these blueprints, after their own ``before_request`` hooks.

    A blueprint's hooks run in the order they were added, so the check, added after the
    authentication hook each API blueprint declares, sees the token and the scope. Call it
    before the blueprints are registered (Flask refuses new hooks afterwards); blueprints are
    module-level, so later apps find them limited already.
    """
    for bp in blueprints:
        if bp not in _limited:
            bp.before_request(check_request)
            _limited.add(bp)


def init_app(app: Flask) -> None:
    # The overrides live where the storage backend keeps what every node shares.
    app.extensions["rate_limiter"] = Limiter.from_config(
        app.config, app.extensions["storage"].limits()
    )


def init_after_request(app: Flask) -> None:
    """Charge what each limited request read once it is answered (an app that serves)."""
    app.after_request(_after_request)
