"""The web console: server-rendered pages under /console/ over the same storage interface
as the APIs (views.py and the page modules beside it), its session and CSRF rules
(session.py) and its HTML rendering of what agents wrote (render.py)."""

from __future__ import annotations

# Each page module registers its routes on the blueprint as it is imported.
from app.console import (  # noqa: F401
    admin,
    audit,
    compare,
    ledger,
    memories,
    oauth,
    people,
    secrets,
    signin,
    stores,
    tasks,
    usage,
)
from app.console.views import PUBLIC_ENDPOINTS, init_app

__all__ = ["PUBLIC_ENDPOINTS", "init_app"]
