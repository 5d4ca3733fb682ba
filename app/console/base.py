"""The console's blueprint and what every page module reaches through it: the storage
interface, the signed-in principal, links within the project, the small request helpers.

The page modules (views.py, signin.py, tasks.py, stores.py, memories.py, admin.py, usage.py,
audit.py, ledger.py, compare.py) register their routes on :data:`bp`; views.py holds the
guard every request passes first (the session, the scope, the POST checks and the rate
limits).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, g, redirect, request, url_for
from werkzeug.wrappers import Response

from app.services.access import Principal
from app.storage.core.names import Scope
from app.storage.core.tokens import Token
from app.storage.interface import StorageBackend, StoreBackend, TaskBackend, TokenStore

bp = Blueprint(
    "console",
    __name__,
    url_prefix="/console",
    template_folder="templates",
    static_folder="static",
)


def storage() -> StorageBackend:
    found: StorageBackend = current_app.extensions["storage"]
    return found


def tasks() -> TaskBackend:
    return storage().tasks


def stores() -> StoreBackend:
    return storage().stores


def registry() -> TokenStore:
    found: TokenStore = current_app.extensions["token_registry"]
    return found


def principal() -> Principal:
    found: Principal = g.principal
    return found


def scope() -> Scope:
    return principal().scope


def signed_in() -> Token:
    found: Token = g.console_token
    return found


def turl(endpoint: str, **values: Any) -> str:
    """url_for a page of the current tenant."""
    return url_for(f"console.{endpoint}", tenant=g.tenant, **values)


def purl(endpoint: str, **values: Any) -> str:
    """url_for a page of the current project."""
    here = scope()
    return url_for(f"console.{endpoint}", tenant=here.tenant, project=here.project, **values)


def see_other(location: str) -> Response:
    # 303: after a POST the browser follows with a GET.
    return redirect(location, code=303)


def arg(name: str, limit: int = 256) -> str:
    return request.args.get(name, "").strip()[:limit]


def int_arg(name: str, default: int, *, lowest: int = 1, highest: int = 999_999) -> int:
    """A whole number from the query string, ``default`` when it is not one in range."""
    raw = request.args.get(name, "")
    if not (raw.isascii() and raw.isdigit() and len(raw) < 7):
        return default
    value = int(raw)
    return value if lowest <= value <= highest else default


def field(name: str, limit: int = 1024) -> str:
    """A form field as sent, cut at ``limit`` characters."""
    return request.form.get(name, "")[:limit]
