"""Which tenants and projects exist: one directory listing each, never a walk of the tree."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .errors import InvalidName, UnsafePath
from .layout import Layout, Scope, validate_id


def _ids(layout: Layout, directory: Path) -> list[str]:
    """Names of the subdirectories that are ids; links and side files are skipped.

    Listed by descriptor (app/storage/tree.py): a directory that is, or lies beneath, a
    link is refused (UnsafePath) rather than listed.
    """
    found = []
    for entry in layout.tree.entries(directory):
        if entry.is_link or not entry.is_dir:
            continue
        try:
            found.append(validate_id("id", entry.name))
        except InvalidName:
            continue  # '.locks', '.trash', '_stores', temp files: not a tenant or project
    return found


def list_projects(layout: Layout, tenants: Iterable[str] | None = None) -> list[Scope]:
    """The projects of ``tenants`` (None: of every tenant), sorted by tenant then project."""
    if tenants is None:
        tenants = _ids(layout, layout.root)
    found: list[Scope] = []
    for tenant in sorted(set(tenants)):
        try:
            projects = _ids(layout, layout.root / validate_id("tenant", tenant))
        except (UnsafePath, NotADirectoryError):
            continue  # a linked tenant directory is skipped like a linked project
        found.extend(Scope(tenant, project) for project in projects)
    return found
