"""Build the storage backend a configuration names: the tree, or PostgreSQL with an object
store. The one place that knows both; everything above it sees app/storage/interface.py."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from app.embeddings.factory import make_embedder
from app.storage.core.clock import system_clock
from app.storage.core.query import DEFAULT_SEARCH_TIMEOUT
from app.storage.core.secret_policy import DEFAULT_POLICY
from app.storage.core.sweep import ClockGuard
from app.storage.interface import StorageBackend


def open_backend(settings: Mapping[str, Any]) -> StorageBackend:
    """The backend of ``settings`` (the app's validated config: ``STORAGE_ROOT``,
    ``DATABASE_URL``, ``BLOB_URL``, ``S3_ENDPOINT_URL``, ``RETENTION_DAYS``,
    ``LOCK_TIMEOUT``, ``MAX_ARTIFACT_BYTES``, ``TOKENS_FILE``, ``THREADS``, ``CLOCK``,
    ``GROUP_COMMIT``, ``MIN_FREE_BYTES``: the tree's free-space floor, None for none,
    ``MIN_FREE_INODES``: its inode floor; ``SEARCH_TIMEOUT``; ``SECRETS_POLICY``: the policy of
    a project without one)."""
    common: dict[str, Any] = {
        "clock_guard": ClockGuard(
            margin_days=float(settings.get("SWEEP_CLOCK_MARGIN_DAYS", 1.0)),
            share=float(settings.get("SWEEP_CLOCK_SHARE", 0.5)),
        ),
        "retention": timedelta(days=settings["RETENTION_DAYS"]),
        "lock_timeout": settings["LOCK_TIMEOUT"],
        "max_artifact_bytes": settings["MAX_ARTIFACT_BYTES"],
        "clock": settings.get("CLOCK") or system_clock,
        "search_timeout": settings.get("SEARCH_TIMEOUT", DEFAULT_SEARCH_TIMEOUT),
        # A quarter of the request threads run searches at most: fewer threads contend for
        # the interpreter lock with each of them. The rest of a burst waits for them
        # (core/query.py SearchSlots) rather than being refused: a waiting search holds a
        # request thread, and other requests take the next one a search frees.
        "search_slots": _search_slots(settings),
        "search_waiting": max(0, int(settings.get("THREADS", 8)) - _search_slots(settings)),
        "secrets_policy": settings.get("SECRETS_POLICY", DEFAULT_POLICY),
        "resident_bytes": int(settings.get("VECTOR_CACHE_MB", 256)) << 20,
    }
    if settings.get("DATABASE_URL"):
        from app.storage.pg.backend import PgStorage

        return PgStorage(
            settings["DATABASE_URL"],
            settings["BLOB_URL"],
            s3_endpoint_url=settings.get("S3_ENDPOINT_URL") or None,
            # A connection per request thread, and one spare for the sweeper's reads.
            pool_size=int(settings.get("THREADS", 8)) + 1,
            embedder=make_embedder(settings),
            **common,
        )
    from app.storage.tree.backend import TreeStorage

    return TreeStorage(
        Path(settings["STORAGE_ROOT"]),
        tokens_file=Path(settings["TOKENS_FILE"]),
        group_commit=settings.get("GROUP_COMMIT", True),
        min_free=settings.get("MIN_FREE_BYTES"),
        min_free_inodes=settings.get("MIN_FREE_INODES", "2%"),
        # Vectors beside the text (tree/embedding.py, pg/vectors.py).
        embedder=make_embedder(settings),
        **common,
    )


def _search_slots(settings: Mapping[str, Any]) -> int:
    return max(1, int(settings.get("THREADS", 8)) // 4)
