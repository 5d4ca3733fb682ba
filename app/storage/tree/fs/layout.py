"""Every path of the storage tree, built from validated ids and the names of core/names.py.

On disk (``<root>`` is MEMORY_STORAGE_ROOT)::

    <root>/<tenant>/<project>/<task>/task.json            record: owner, created_at
    <root>/<tenant>/<project>/<task>/0000-turn/meta.json  record: the TurnRecord (commit point)
    <root>/<tenant>/<project>/<task>/0000-turn/summary.md derived copy of the summary
    <root>/<tenant>/<project>/<task>/0000-turn/artifacts/<name>   the bytes
    <root>/<tenant>/<project>/<task>/index.json           derived task index
    <root>/<tenant>/<project>/_project.md                 derived digest
    <root>/<tenant>/<project>/_listing.sqlite3            derived listing index (WAL)
    <root>/<tenant>/<project>/_stores/<store_id>/         a memory store (tree/stores/)
        store.json                                        record: name, description, ...
        versions/<version_id>.json                        records: one per version
        memories/<path>                                   derived: each live memory's content
        index.sqlite3                                     derived: the store's index (WAL)
    <root>/.locks/_tasks/NNNN.lock, _stores/NNNN.lock     lock stripes, never deleted
    <root>/.locks/_tasks.inflight, _stores.inflight       the write in flight on each stripe
    <root>/.locks/<tenant>/<project>/project.lock         the digest's render lock
    <root>/.locks/<tenant>/<project>/search.lock          held by the rebuild of its search index
    <root>/.locks/<tenant>/<project>/embed.lock           held by the worker embedding its queue
    <root>/.locks/_server.lock, _canary, _recovering      the root lock and the recovery's state
    <root>/.server-running                                the running sentinel (tree/recovery.py)
    <root>/.trash/                                        deletions in progress
    <root>/.locks/<tenant>/_usage.lock                    checks against the tenant's quota
    <root>/.locks/**/_waiting                             who waits for each lock (fs/locks.py)
    <root>/.traffic.sqlite3                               requests and bytes per hour (tree/usage.py)
    <root>/.audit.sqlite3                                 the audit log (tree/audit.py)
    <root>/.cursor-key                                    signs list cursors (core/cursor.py)
    <root>/.console-key                                   signs the console's session cookies
    <root>/.~tmp-*  (any directory)                        temp files of in-flight writes

Nothing else in the tree backend joins a path from ids.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from app.storage.core.errors import InvalidName, Unreadable, UnsafePath
from app.storage.core.names import (
    ARTIFACTS_DIR,
    AUDIT_DB,
    CANARY,
    CURSOR_KEY,
    LOCKS_DIR,
    MEMORIES_DIR,
    PROJECT_DIGEST,
    PROJECT_LEDGER,
    PROJECT_LISTING,
    RECOVERING,
    SENTINEL,
    SERVER_LOCK,
    STORE_ID_PATTERN,
    STORE_ID_RE,
    STORE_INDEX,
    STORE_RECORD,
    STORES_DIR,
    TASK_INDEX,
    TASK_RECORD,
    TRAFFIC_DB,
    TRASH_DIR,
    TURN_META,
    VERSION_ID_PATTERN,
    VERSION_ID_RE,
    VERSIONS_DIR,
    Scope,
    is_id,
    turn_dirname,
    validate_artifact_name,
    validate_id,
    validate_turn,
)
from app.storage.tree.fs.beneath import Beneath, Unavailable
from app.storage.tree.fs.noatime import open_noatime, read_all
from app.storage.tree.fs.walk import Tree, remove_planted_link

_P = TypeVar("_P", str, Path)


class Layout:
    """Build every path from validated ids; nothing else in the engine joins paths."""

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.abspath(root))
        self._root_text = os.fspath(self.root)
        self._root_prefix = self._root_text.rstrip(os.sep) + os.sep
        self._beneath = Beneath(self._root_text)
        self.tree = Tree(self.root, self._beneath)

    # -- project level -------------------------------------------------------------------
    def project_dir(self, scope: Scope) -> Path:
        return self.root / scope.tenant / scope.project

    def digest(self, scope: Scope) -> Path:
        return self.project_dir(scope) / PROJECT_DIGEST

    def listing(self, scope: Scope) -> Path:
        return self.project_dir(scope) / PROJECT_LISTING

    def ledger(self, scope: Scope) -> Path:
        return self.project_dir(scope) / PROJECT_LEDGER

    # -- task level ----------------------------------------------------------------------
    def task_dir(self, scope: Scope, task_id: str) -> Path:
        return self.project_dir(scope) / validate_id("task_id", task_id)

    def task_record(self, scope: Scope, task_id: str) -> Path:
        return self.task_dir(scope, task_id) / TASK_RECORD

    def task_index(self, scope: Scope, task_id: str) -> Path:
        return self.task_dir(scope, task_id) / TASK_INDEX

    def turn_dir(self, scope: Scope, task_id: str, turn: int) -> Path:
        return self.task_dir(scope, task_id) / turn_dirname(validate_turn(turn))

    def turn_meta_text(self, scope: Scope, task_id: str, turn: int) -> str:
        """A turn's meta.json as a plain string: reading a turn is the hottest path, and
        building it through pathlib costs more than the read itself."""
        validate_id("task_id", task_id)
        dirname = turn_dirname(validate_turn(turn))
        return f"{self._root_prefix}{scope.tenant}/{scope.project}/{task_id}/{dirname}/{TURN_META}"

    def artifact(self, scope: Scope, task_id: str, turn: int, name: str) -> Path:
        return self.turn_dir(scope, task_id, turn) / ARTIFACTS_DIR / validate_artifact_name(name)

    # -- memory stores -------------------------------------------------------------------
    def stores_dir(self, scope: Scope) -> Path:
        return self.project_dir(scope) / STORES_DIR

    def store_dir(self, scope: Scope, store_id: str) -> Path:
        if not isinstance(store_id, str) or not STORE_ID_RE.fullmatch(store_id):
            raise InvalidName("memory_store_id", store_id, f"must match {STORE_ID_PATTERN}")
        return self.stores_dir(scope) / store_id

    @staticmethod
    def store_record(store_dir: Path) -> Path:
        return store_dir / STORE_RECORD

    @staticmethod
    def versions_dir(store_dir: Path) -> Path:
        return store_dir / VERSIONS_DIR

    @staticmethod
    def version_file(store_dir: Path, version_id: str) -> Path:
        if not VERSION_ID_RE.fullmatch(version_id):
            raise InvalidName("memory_version_id", version_id, f"must match {VERSION_ID_PATTERN}")
        return store_dir / VERSIONS_DIR / f"{version_id}.json"

    @staticmethod
    def memories_dir(store_dir: Path) -> Path:
        return store_dir / MEMORIES_DIR

    @staticmethod
    def memory_file(store_dir: Path, path: str) -> Path:
        """The live file of the memory at ``path`` (a path the memory rules accepted)."""
        return store_dir.joinpath(MEMORIES_DIR, *path.lstrip("/").split("/"))

    @staticmethod
    def store_index(store_dir: Path) -> Path:
        return store_dir / STORE_INDEX

    # -- side trees ----------------------------------------------------------------------
    def locks_dir(self) -> Path:
        return self.root / LOCKS_DIR

    def stripe_lock(self, kind: str, stripe: int) -> Path:
        """One of the ``LOCK_STRIPES`` lock files of an engine (``TASK_LOCKS``, ``STORE_LOCKS``)."""
        return self.locks_dir() / kind / f"{stripe:04d}.lock"

    def inflight(self, kind: str) -> Path:
        """The journal of the write in flight on each lock stripe of an engine."""
        return self.locks_dir() / f"{kind}.inflight"

    def project_lock(self, scope: Scope) -> Path:
        return self.locks_dir() / scope.tenant / scope.project / "project.lock"

    def search_lock(self, scope: Scope) -> Path:
        """Held by the one process rebuilding the project's search index from the records."""
        return self.locks_dir() / scope.tenant / scope.project / "search.lock"

    def embed_lock(self, scope: Scope) -> Path:
        """Held by the one process embedding the project's queued rows (tree/embedding.py)."""
        return self.locks_dir() / scope.tenant / scope.project / "embed.lock"

    def tenant_usage_lock(self, tenant: str) -> Path:
        """Held while a write checks and reserves against its tenant's quota."""
        return self.locks_dir() / validate_id("tenant", tenant) / "_usage.lock"

    def traffic(self) -> Path:
        return self.root / TRAFFIC_DB

    def audit(self) -> Path:
        return self.root / AUDIT_DB

    def sentinel(self) -> Path:
        return self.root / SENTINEL

    def server_lock(self) -> Path:
        return self.locks_dir() / SERVER_LOCK

    def canary(self) -> Path:
        return self.locks_dir() / CANARY

    def recovering_marker(self) -> Path:
        return self.locks_dir() / RECOVERING

    def trash_dir(self) -> Path:
        return self.root / TRASH_DIR

    def cursor_key(self) -> Path:
        return self.root / CURSOR_KEY

    def projects(self, links: list[Path], tenants: Iterable[str] | None = None) -> Iterator[Scope]:
        """Every tenant/project directory (of ``tenants`` only, when given: their directories
        alone are listed), in name order; id-named links met on the way are appended to
        ``links`` (never entered)."""
        if tenants is None:
            found = [t for t in self.tree.entries(self.root) if is_id(t.name)]
        else:
            wanted = sorted({t for t in tenants if is_id(t)})
            found = [e for t in wanted if (e := self.tree.entry(self.root / t)) is not None]
        for tenant in found:
            if tenant.is_link:
                links.append(tenant.path)
                continue
            if not tenant.is_dir:
                continue
            for project in self.tree.entries(tenant.path):
                if not is_id(project.name):
                    continue
                if project.is_link:
                    links.append(project.path)
                elif project.is_dir:
                    yield Scope(tenant.name, project.name)

    def open_read(self, path: str) -> int | None:
        """A read-only descriptor for ``path`` below the root; None when it is absent.

        Refuses what :meth:`check_inside` refuses (UnsafePath), in one openat2 call where the
        kernel has it (see tree/fs/beneath.py), else by the walk and an O_NOFOLLOW open.
        """
        if self._beneath.available and path.startswith(self._root_prefix):
            try:
                return self._beneath.open_read(path[len(self._root_prefix) :])
            except Unavailable:
                pass
        self.check_inside(path)
        try:
            return open_noatime(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink planted since the walk
                raise UnsafePath(f"{path} is a symlink; the service never follows one") from None
            raise Unreadable.of(exc, path) from None

    def own_file(self, path: Path) -> Path:
        """``path``, a file only the service makes and reads (a lock, a journal, a marker, a
        key), checked for a write: its directory must be reached without a link, and a link
        planted at the file itself is removed (the link, never its target) so the service
        makes its own file there again. Nothing but the service's state is lost: what was
        there was not a file the service wrote."""
        self.check_inside(path.parent)
        remove_planted_link(path, "the service")
        return path

    def read_bytes(self, path: str | Path) -> bytes | None:
        """The bytes of the file ``path`` below the root, None when absent (UnsafePath for a
        link anywhere on the way)."""
        fd = self.open_read(os.fspath(path))
        return None if fd is None else read_all(fd, path=path)

    def check_inside(self, path: _P, *, below: Path | None = None) -> _P:
        """Refuse a path outside the root or one that passes through a symlink.

        The service never creates symlinks, so one inside the root is an attack or a
        mistake; following it could read or overwrite files outside the root.

        ``below``: a directory under the root that this same operation has just checked;
        only the components of ``path`` after it are looked at. A write checks a task's
        paths this way, one lstat per new component instead of a walk from the root for
        each. ``below`` is no weaker
        than a new walk: every check leaves the same window until the path is used.
        """
        # Plain string work: this runs on every request, and pathlib's parsing is a
        # measurable share of a read's CPU.
        text = os.fspath(path)
        if below is None:
            start, prefix = self._root_text, self._root_prefix
        else:
            start = os.fspath(below)
            prefix = start.rstrip(os.sep) + os.sep
            if start != self._root_text and not start.startswith(self._root_prefix):
                raise UnsafePath(f"{below} is not under the storage root")
        if not text.startswith(prefix):
            if text == self._root_text:
                return path
            raise UnsafePath(f"{path} escapes the storage root")
        parts = text[len(prefix) :].split(os.sep)
        # Check every component before the walk below stops at the first missing one:
        # root/missing/../../etc would otherwise pass.
        if any(part in ("", ".", "..") for part in parts):
            raise UnsafePath(f"{path} has a '.' or '..' component")
        current = start
        for part in parts:
            current = f"{current}{os.sep}{part}"
            try:
                st = os.lstat(current)
            except (FileNotFoundError, NotADirectoryError):
                break  # nothing further down exists (a file where a directory would be)
            if stat.S_ISLNK(st.st_mode):
                raise UnsafePath(f"{current} is a symlink; the service never follows one")
        return path
