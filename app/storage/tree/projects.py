"""Which tenants and projects exist: one directory listing each, never a walk of the tree."""

from __future__ import annotations

from collections.abc import Iterable

from app.storage.core.names import Scope
from app.storage.tree.fs.layout import Layout


def list_projects(layout: Layout, tenants: Iterable[str] | None = None) -> list[Scope]:
    """The projects of ``tenants`` (None: of every tenant), sorted by tenant then project.

    Listed by descriptor (app/storage/tree.py): a linked tenant or project is skipped.
    """
    return list(layout.projects([], tenants))
