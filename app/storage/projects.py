"""Which tenants and projects exist: one directory listing each, never a walk of the tree."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .errors import InvalidName, UnsafePath
from .layout import Layout, Scope, validate_id


def _ids(directory: Path) -> list[str]:
    """Names of the subdirectories that are ids; symlinks and side files are skipped."""
    try:
        with os.scandir(directory) as it:
            entries = [e for e in it if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        try:
            found.append(validate_id("id", entry.name))
        except InvalidName:
            continue  # '.locks', '.trash', '_stores', temp files: not a tenant or project
    return sorted(found)


def list_projects(layout: Layout, tenants: Iterable[str] | None = None) -> list[Scope]:
    """The projects of ``tenants`` (None: of every tenant), sorted by tenant then project."""
    if tenants is None:
        tenants = _ids(layout.root)
    found: list[Scope] = []
    for tenant in sorted(set(tenants)):
        directory = layout.root / validate_id("tenant", tenant)
        try:
            layout.check_inside(directory)
        except UnsafePath:
            continue  # a linked tenant directory is skipped like a linked project
        found.extend(Scope(tenant, project) for project in _ids(directory))
    return found
