"""The web console: server-rendered pages under /console/ over the same storage interface
as the APIs (views.py), its session and CSRF rules (session.py) and its HTML rendering of
what agents wrote (render.py)."""

from __future__ import annotations

from app.console.views import PUBLIC_ENDPOINTS, init_app

__all__ = ["PUBLIC_ENDPOINTS", "init_app"]
