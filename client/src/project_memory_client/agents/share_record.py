"""Which memory store a repository shares Claude Code's auto-memory through, and whether
its turns go to the user's private space, as install recorded them (agents/shared_memory.py),
and finding that record from a hook.

Every Claude Code hook loads this module to ask whether its repository shares its memory:
it is small and loads nothing but the standard library's basics, so that a repository that
shares nothing pays one ``open`` per folder from the session's folder up to the root, and
the sync's modules load only where there is a share.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SHARES = "claude-memory"  # under the state directory
MEMORY_DIR = "memory"


class Share:
    """One repository's shared memory: the server, scope and store, and where its folder is."""

    __slots__ = ("url", "tenant", "project", "scoped", "store_id", "store_name", "home", "private")

    def __init__(
        self,
        *,
        url: str,
        tenant: str,
        project: str,
        scoped: bool,
        store_id: str,
        store_name: str,
        home: Path,
        private: bool = False,
    ) -> None:
        self.url = url
        self.tenant = tenant
        self.project = project
        self.scoped = scoped  # the tenant and project were given: sent as headers
        self.store_id = store_id
        self.store_name = store_name
        self.home = home
        # The store is in the user's private space: every call to it says so.
        self.private = private

    @property
    def folder(self) -> Path:
        return self.home / MEMORY_DIR

    @property
    def state_file(self) -> Path:
        return self.home / "sync.json"

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "tenant": self.tenant,
            "project": self.project,
            "scoped": self.scoped,
            "store_id": self.store_id,
            "store_name": self.store_name,
            "folder": str(self.folder),
            "store_private": self.private,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Share | None:
        try:
            folder = Path(str(data["folder"]))
            share = cls(
                url=str(data["url"]),
                tenant=str(data["tenant"]),
                project=str(data["project"]),
                scoped=bool(data.get("scoped")),
                store_id=str(data["store_id"]),
                store_name=str(data.get("store_name") or ""),
                home=folder.parent,
                private=data.get("store_private") is True,
            )
        except (KeyError, TypeError, ValueError):
            return None
        return share if folder.name == MEMORY_DIR and folder.is_absolute() else None


# -- where things are ------------------------------------------------------------------------
def shares_root(state: Path) -> Path:
    return state / SHARES


def link_path(state: Path, root: Path) -> Path:
    """Where the record of ``root``'s share is (by the hash of its path, resolved)."""
    digest = hashlib.sha256(str(root).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return shares_root(state) / "repos" / f"{digest}.json"


def find(state: Path, cwd: str, project_dir: str | None = None) -> Share | None:
    """The share of the repository the session runs in (find_record's)."""
    record = find_record(state, cwd, project_dir)
    return None if record is None or "store_id" not in record else Share.from_dict(record)


def is_private(record: Mapping[str, Any] | None) -> bool:
    """Whether install recorded that the repository's turns go to the user's private space."""
    return record is not None and record.get("private") is True


def find_record(state: Path, cwd: str, project_dir: str | None = None) -> dict[str, Any] | None:
    """The record install wrote for the repository the session runs in: Claude Code's
    project directory, else the session's folder or the nearest folder above it that has
    one. One ``open`` per folder when there is none."""
    candidates = [Path(project_dir)] if project_dir else []
    here = Path(cwd)
    candidates += [here, *here.parents]
    real = Path(os.path.realpath(project_dir or cwd))
    if real != candidates[0]:  # install recorded the repository's real path
        candidates += [real, *real.parents]
    for candidate in candidates:
        path = link_path(state, candidate)
        try:
            with open(path, "rb") as fh:
                data = json.loads(fh.read(64 * 1024))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, RecursionError):
            return None
        if isinstance(data, dict) and data.get("root") == str(candidate):
            return data
        return None
    return None
