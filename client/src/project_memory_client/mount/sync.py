"""Keep one local directory in sync with one memory store.

Each sync compares, per path, three hashes: the local file's (L), the one both sides had
at the last sync (B, the baseline, kept in a state file) and the server's
``content_sha256`` (R):

* L == R: in sync.
* only R moved: the server's change is written locally (or the local file removed).
* only L moved: the local change is uploaded (update on a ``content_sha256`` precondition,
  or create); a local delete is sent only once the file has stayed missing for
  ``delete_delay`` seconds.
* both moved: the server wins and a warning is logged, naming the copy of the local
  version kept in the state folder; except a remote delete of a file with an unsynced
  local edit, which re-creates the memory from the local file. With ``Conflicts.MERGE``
  (Claude Code's shared memory, agents/shared_memory.py) the local version goes into the
  store's history after the server's, on a precondition on the server's sha, and the union
  of the two (merge.py) becomes the head, on the server and here.

A synced path held here by a symbolic link or a device is neither synced nor deleted on the
server: nothing can be written there, and nothing there was deleted.

The store directory carries a marker naming the store; without it nothing is synced. A
folder whose synced files are all gone is a wipe, never propagated: it is restored.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._files import write_atomic
from ..rules import TMP_PREFIX
from .errors import ApiError, TransportError
from .merge import merge_texts

if TYPE_CHECKING:
    from typing import Protocol

    class StoreApi(Protocol):
        """The store calls a sync makes: http.StoreClient (httpx), or the hooks' own
        (agents/shared_memory.py); both raise errors.ApiError and errors.TransportError."""

        def list_memories(
            self, store_id: str, *, full: bool = False, deadline: float | None = None
        ) -> list[dict[str, Any]]: ...

        def get_memory(
            self, store_id: str, memory_id: str, *, deadline: float | None = None
        ) -> dict[str, Any]: ...

        def create_memory(
            self, store_id: str, path: str, content: str, *, deadline: float | None = None
        ) -> dict[str, Any]: ...

        def update_memory(
            self,
            store_id: str,
            memory_id: str,
            content: str,
            expected_sha256: str,
            *,
            deadline: float | None = None,
        ) -> dict[str, Any]: ...

        def delete_memory(
            self,
            store_id: str,
            memory_id: str,
            expected_sha256: str,
            *,
            deadline: float | None = None,
        ) -> None: ...

        def list_versions(
            self, store_id: str, memory_id: str, *, deadline: float | None = None
        ) -> list[dict[str, Any]]: ...


log = logging.getLogger("project_memory.mount")

MARKER = ".anthropic-memory-store"  # the name and content the official workers use
STATE_DIR = ".project-memory"
CONFLICTS_DIR = "conflicts"  # under STATE_DIR: local versions that lost, never synced
MAX_NAME_BYTES = 255  # NAME_MAX of ext4, xfs, btrfs
DELETE_DELAY = 30.0
MAX_UPLOAD_BYTES = 1024 * 1024  # bigger files are refused without sending them
BULK_DOWNLOADS = 20  # more files to write than this: one view=full listing, 20 a page


def marker_text(store_id: str) -> str:
    """What the marker holds: hex SHA-256 of ``"version 1\\n" + store_id`` (TS SDK format)."""
    return hashlib.sha256(f"version 1\n{store_id}".encode()).hexdigest()


class Deletions(str, Enum):
    ENABLED = "enabled"
    LOG_ONLY = "log_only"
    DISABLED = "disabled"


class Conflicts(str, Enum):
    """What a sync does when a file changed both here and on the server."""

    SERVER_WINS = "server_wins"  # the local version is copied to the conflicts folder
    MERGE = "merge"  # both versions into the store's history, then their union (merge.py)


class Action(str, Enum):
    IN_SYNC = "in_sync"
    DOWNLOAD = "download"  # the server changed
    REMOVE_LOCAL = "remove_local"  # the server deleted
    UPLOAD = "upload"  # local edit of a synced file
    CREATE = "create"  # new local file
    DELETE_REMOTE = "delete_remote"  # local delete
    CONFLICT = "conflict"  # both changed: the server's version is written locally
    RECREATE = "recreate"  # server deleted, local edited: upload the local file again
    IGNORE_LOCAL = "ignore_local"  # read-only: a local change that is never uploaded


def decide(local: str | None, base: str | None, remote: str | None, *, read_only: bool) -> Action:
    """The three-way rule for one path (None: absent on that side / never synced)."""
    if local == remote:
        return Action.IN_SYNC
    if local == base:
        return Action.DOWNLOAD if remote is not None else Action.REMOVE_LOCAL
    if remote == base:
        if read_only:
            return Action.IGNORE_LOCAL
        if local is None:
            return Action.DELETE_REMOTE
        return Action.CREATE if remote is None else Action.UPLOAD
    if remote is None:
        return Action.REMOVE_LOCAL if read_only else Action.RECREATE
    return Action.CONFLICT


class MountError(Exception):
    """The mount cannot start (a folder it did not create, a marker of another store)."""


@dataclass
class _Local:
    sha: str
    data: bytes | None  # None: not read (too large, or an unchanged cached hash)


@dataclass
class SyncReport:
    ok: bool = True
    actions: dict[str, int] = field(default_factory=dict)
    error: Exception | None = None  # what ended a sync that did not complete

    def count(self, action: str) -> None:
        self.actions[action] = self.actions.get(action, 0) + 1


class StoreSync:
    """One store mounted at ``root / slug``; ``sync_once()`` runs one reconciliation."""

    def __init__(
        self,
        client: StoreApi,
        store_id: str,
        folder: Path,
        *,
        state_file: Path,
        read_only: bool = False,
        deletions: Deletions = Deletions.ENABLED,
        delete_delay: float = DELETE_DELAY,
        monotonic: Callable[[], float] = time.monotonic,
        conflicts: Conflicts = Conflicts.SERVER_WINS,
        skip_hidden: bool = False,
    ) -> None:
        self.client = client
        self.store_id = store_id
        self.folder = folder
        self.state_file = state_file
        # Beside the state file, outside the store folder: a kept copy is never uploaded.
        self.conflicts = state_file.parent / CONFLICTS_DIR / store_id
        self.read_only = read_only
        self.deletions = deletions
        self.delete_delay = delete_delay
        self.monotonic = monotonic
        self.conflict_rule = conflicts
        # A name starting with "." here or on the server is never synced (an agent's own
        # lock file, an editor's swap file); the marker is one such name.
        self.skip_hidden = skip_hidden
        self.baseline: dict[str, dict[str, str]] = {}  # path -> {"id", "sha"}
        self.refused: dict[str, str] = {}  # path -> local sha the server refused
        self.missing_since: dict[str, float] = {}
        self._hash_cache: dict[str, tuple[int, int, int, str]] = {}
        self._said: set[tuple[str, ...]] = set()  # one-time log lines already written
        self._saved = b""
        self._prefetched: dict[str, dict[str, Any]] = {}  # id -> memory with its content
        self.occupied: set[str] = set()  # paths held here by a link or a device
        self._load_state()

    # -- logging -----------------------------------------------------------------------
    def _tag(self) -> str:
        return f"[{self.folder.name}]"

    def _once(self, key: tuple[str, ...], level: int, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.log(level, f"{self._tag()} {message}", *args)

    # -- state -------------------------------------------------------------------------
    def _load_state(self) -> None:
        try:
            data = json.loads(self.state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning(
                "%s state file %s unreadable (%s): starting fresh",
                self._tag(),
                self.state_file,
                exc,
            )
            return
        if isinstance(data, dict) and data.get("store_id") == self.store_id:
            self.baseline = dict(data.get("baseline") or {})
            self.refused = dict(data.get("refused") or {})

    def _save_state(self) -> None:
        body = {"store_id": self.store_id, "baseline": self.baseline, "refused": self.refused}
        data = json.dumps(body, indent=1, sort_keys=True).encode("utf-8")
        if data == self._saved:
            return  # a quiet sync writes nothing
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.state_file, data)
        self._saved = data

    # -- the folder ----------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the folder with its marker, or accept it if our marker is there already.

        Refuses a non-empty folder without the marker (not ours) and a marker of another
        store: syncing would upload someone else's files or mix two stores.
        """
        marker = self.folder / MARKER
        try:
            st = os.lstat(self.folder)
        except FileNotFoundError:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            self.folder.mkdir(mode=0o700)
            write_atomic(marker, marker_text(self.store_id).encode())
            log.info("%s created %s for %s", self._tag(), self.folder, self.store_id)
            return
        if not stat.S_ISDIR(st.st_mode):
            raise MountError(f"{self.folder} exists and is not a directory")
        if self._marker_ok():
            log.info("%s resuming in %s (marker found)", self._tag(), self.folder)
            return
        if marker.exists() or marker.is_symlink():
            raise MountError(f"{self.folder}: its marker names another store; not syncing it")
        if os.listdir(self.folder):
            raise MountError(
                f"{self.folder} exists, is not empty and was not created by project-memory"
                " mount (no marker): refusing to sync over it"
            )
        write_atomic(marker, marker_text(self.store_id).encode())
        log.info("%s adopted the empty folder %s", self._tag(), self.folder)

    def _marker_ok(self) -> bool:
        try:
            fd = os.open(self.folder / MARKER, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        with os.fdopen(fd, "rb") as fh:
            return fh.read(200).strip() == marker_text(self.store_id).encode()

    def _local_path(self, path: str) -> Path:
        return self.folder / path.lstrip("/")

    def _scan(self) -> tuple[dict[str, _Local], list[str]]:
        """Every regular file under the folder, hashed; and the paths that cannot be memories.

        ``self.occupied`` gets the paths held by a link or a device."""
        found: dict[str, _Local] = {}
        unusable: list[str] = []
        cache: dict[str, tuple[int, int, int, str]] = {}
        self.occupied = set()
        for dirpath, dirnames, filenames in os.walk(self.folder):
            base = Path(dirpath)
            for d in dirnames:
                if (base / d).is_symlink():
                    self.occupied.add("/" + (base / d).relative_to(self.folder).as_posix())
            dirnames[:] = [
                d
                for d in dirnames
                if not (base / d).is_symlink() and not (self.skip_hidden and d.startswith("."))
            ]
            for name in filenames:
                full = base / name
                rel = "/" + full.relative_to(self.folder).as_posix()
                if rel == "/" + MARKER or name.startswith(TMP_PREFIX):
                    continue
                if self.skip_hidden and name.startswith("."):
                    continue
                try:
                    rel.encode("utf-8")
                except UnicodeEncodeError:
                    unusable.append(rel)
                    continue
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    self.occupied.add(rel)
                    continue  # symlinks and devices are never synced
                key = (st.st_mtime_ns, st.st_size, st.st_ino)
                cached = self._hash_cache.get(rel)
                # A file changed twice within the clock's granularity keeps its mtime:
                # trust the cached hash only for files that have been still for a while.
                settled = time.time_ns() - st.st_mtime_ns > 2_000_000_000
                if cached is not None and cached[:3] == key and settled:
                    found[rel] = _Local(cached[3], None)
                    cache[rel] = cached
                    continue
                data = _read_nofollow(full)
                if data is None:
                    continue
                sha = hashlib.sha256(data).hexdigest()
                found[rel] = _Local(sha, data if len(data) <= MAX_UPLOAD_BYTES else None)
                if settled:
                    # Only a hash read when the file was already still can be trusted
                    # later: a same-size rewrite in the same clock tick is invisible.
                    cache[rel] = (*key, sha)
        self._hash_cache = cache
        return found, unusable

    # -- one sync ----------------------------------------------------------------------
    def sync_once(
        self, *, deadline: float | None = None, stop: Callable[[], bool] | None = None
    ) -> SyncReport:
        """Reconcile once; ``ok`` is False when the sync could not complete.

        ``stop`` is asked between paths: a shutdown does not wait for a long sync (the
        final sync that follows picks up what is left).
        """
        report = SyncReport()
        if not self._marker_ok():
            log.warning(
                "%s marker %s missing or altered: not syncing this folder",
                self._tag(),
                self.folder / MARKER,
            )
            report.ok = False
            return report
        try:
            remote_items = self.client.list_memories(self.store_id, deadline=deadline)
            remote = self._holdable(remote_items)
            local, unusable = self._scan()
            for rel in unusable:
                self._once(
                    ("unusable", rel), logging.WARNING, "skipping %r: its name is not UTF-8", rel
                )
            wipe = self._is_wipe(local)
            if wipe:
                log.warning(
                    "%s all %d synced files are gone: treating it as a wipe; nothing is"
                    " deleted on the server, the files are restored from it",
                    self._tag(),
                    len(self.baseline),
                )
            plan = []
            for path in sorted(set(local) | set(remote) | set(self.baseline)):
                l_entry = local.get(path)
                r_entry = remote.get(path)
                b_entry = self.baseline.get(path)
                action = decide(
                    l_entry.sha if l_entry else None,
                    b_entry["sha"] if b_entry else None,
                    r_entry["content_sha256"] if r_entry else None,
                    read_only=self.read_only,
                )
                if wipe and l_entry is None and r_entry is not None:
                    action = Action.DOWNLOAD  # restore, whatever the mode
                if l_entry is None and self._held(path) and action is not Action.IN_SYNC:
                    continue  # no file can be written there, and none was deleted
                plan.append((path, action, l_entry, b_entry, r_entry))
            self._prefetch(plan, deadline)
            deletes_left = max(8, min(50, len(self.baseline) // 4))
            for path, action, l_entry, b_entry, r_entry in plan:
                if stop is not None and stop():
                    report.ok = False
                    break
                if action is Action.DELETE_REMOTE and deletes_left <= 0:
                    continue  # a capped number of deletes per sync, the rest next time
                if path in self.missing_since and action is not Action.DELETE_REMOTE:
                    del self.missing_since[path]
                done = self._apply(action, path, l_entry, b_entry, r_entry, deadline)
                if done and action is Action.DELETE_REMOTE:
                    deletes_left -= 1
                report.count(action.value if done else f"{action.value}_skipped")
        except TransportError as exc:
            log.warning("%s sync failed, will retry: %s", self._tag(), exc)
            report.ok, report.error = False, exc
        except ApiError as exc:
            log.warning("%s sync failed: %s", self._tag(), exc)
            report.ok, report.error = False, exc
        except OSError as exc:
            log.error("%s sync failed on the local disk: %s", self._tag(), exc)
            report.ok, report.error = False, exc
        finally:
            self._prefetched = {}
            try:
                self._save_state()
            except OSError as exc:
                log.error("%s cannot save the sync state %s: %s", self._tag(), self.state_file, exc)
                report.ok = False
        moved = {
            k: v
            for k, v in report.actions.items()
            if k != Action.IN_SYNC.value and not k.endswith("_skipped")
        }
        if moved:
            log.info("%s sync done: %s", self._tag(), json.dumps(report.actions, sort_keys=True))
        return report

    def _holdable(self, items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The server's memories by path, less those no local file can hold (logged once).

        This server refuses such paths, but a sync must not stop for one odd entry of
        another server (or a future one): that memory is skipped, the others are synced.
        """
        remote: dict[str, dict[str, Any]] = {}
        for memory in items:
            path = memory.get("path")
            why = unholdable(path)
            if why is None and not all(
                isinstance(memory.get(k), str) for k in ("id", "content_sha256")
            ):
                why = "the listing entry has no id or content_sha256"
            if why is not None:
                self._once(
                    ("unholdable", repr(path)),
                    logging.WARNING,
                    "skipping the server's memory %r: %s",
                    path,
                    why,
                )
                continue
            assert isinstance(path, str)
            if path == "/" + MARKER:
                continue
            if self.skip_hidden and any(s.startswith(".") for s in path[1:].split("/")):
                continue
            remote[path] = memory
        return remote

    def _held(self, path: str) -> bool:
        """Whether ``path``, or a directory on its way, is held here by something other
        than a regular file or directory (said once)."""
        held = next((p for p in self.occupied if path == p or path.startswith(p + "/")), None)
        if held is not None:
            self._once(
                ("occupied", path),
                logging.WARNING,
                "%s is not a regular file here (a symbolic link?): %s is neither synced nor"
                " deleted on the server",
                held,
                path,
            )
        return held is not None

    def _prefetch(
        self, plan: list[tuple[str, Action, Any, Any, Any]], deadline: float | None
    ) -> None:
        """Many files to write (a first mount, a restore): read them 20 a page, not 1 a call."""
        wanted = sum(1 for item in plan if item[1] in (Action.DOWNLOAD, Action.CONFLICT))
        self._prefetched = {}
        if wanted > BULK_DOWNLOADS:
            items = self.client.list_memories(self.store_id, full=True, deadline=deadline)
            self._prefetched = {m["id"]: m for m in items}

    def _is_wipe(self, local: dict[str, _Local]) -> bool:
        # One missing file is a delete; every synced file gone at once (and nothing else
        # there) is what `rm -rf dir/*` or a lost volume looks like.
        return len(self.baseline) >= 2 and not local

    def _apply(
        self,
        action: Action,
        path: str,
        local: _Local | None,
        base: dict[str, str] | None,
        remote: dict[str, Any] | None,
        deadline: float | None,
    ) -> bool:
        """Carry out one decision; False when it was held back (refused, delayed, lost)."""
        if action is Action.IN_SYNC:
            if remote is None:
                self.baseline.pop(path, None)
            else:
                self.baseline[path] = {"id": remote["id"], "sha": remote["content_sha256"]}
            self.refused.pop(path, None)
            return True
        if action is Action.DOWNLOAD:
            assert remote is not None
            return self._download(path, local, remote, deadline)
        if action is Action.CONFLICT and local is None:
            assert remote is not None
            log.warning(
                "%s conflict on %s: deleted here, changed on the server; keeping the server's"
                " version",
                self._tag(),
                path,
            )
            return self._download(path, local, remote, deadline)
        if action is Action.CONFLICT:
            assert remote is not None and local is not None
            if self.conflict_rule is Conflicts.MERGE and not self.read_only:
                merged = self._merge(path, local, base, remote, deadline)
                if merged is not None:
                    return merged
            # The server's version wins (and, merging, when the store cannot take the local
            # one): the local version is kept in the conflicts folder.
            kept = self._keep_local(path, local)
            if kept is None:
                log.info("%s %s changed while syncing: deciding again next sync", self._tag(), path)
                return False
            if not self._download(path, local, remote, deadline):
                _remove_kept(kept, self.conflicts)
                return False
            log.warning(
                "%s conflict on %s: changed here and on the server; keeping the server's"
                " version; the local version is kept in %s",
                self._tag(),
                path,
                kept,
            )
            return True
        if action is Action.REMOVE_LOCAL:
            edited = local is not None and (base is None or base["sha"] != local.sha)
            if not edited:
                return self._remove_local(path, local)
            assert local is not None
            kept = self._keep_local(path, local)
            if kept is None or not self._remove_local(path, local):
                if kept is not None:
                    _remove_kept(kept, self.conflicts)
                return False
            log.warning(
                "%s %s was deleted on the server; the local edits are kept in %s",
                self._tag(),
                path,
                kept,
            )
            return True
        if action is Action.IGNORE_LOCAL:
            self._once(
                ("read_only", path, local.sha if local else ""),
                logging.WARNING,
                "read-only: the local change to %s is not uploaded (the next change on the"
                " server overwrites it)",
                path,
            )
            return False
        if action is Action.DELETE_REMOTE:
            assert base is not None
            return self._delete_remote(path, base, deadline)
        assert local is not None
        if action is Action.RECREATE:
            log.warning(
                "%s %s was deleted on the server but has unsynced local edits: re-creating it",
                self._tag(),
                path,
            )
            return self._create(path, local, deadline)
        if action is Action.CREATE:
            return self._create(path, local, deadline)
        assert remote is not None
        return self._upload(path, local, remote, deadline)

    def _keep_local(self, path: str, local: _Local) -> Path | None:
        """Copy the local version that is about to lose into the state folder.

        None when the file changed since the scan (the next sync decides again).
        """
        data = local.data
        if data is None:
            data = _read_nofollow(self._local_path(path))
        if data is None or hashlib.sha256(data).hexdigest() != local.sha:
            return None
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        kept = self.conflicts / stamp / path.lstrip("/")
        kept.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(kept, data)
        return kept

    # -- both changed, merging ----------------------------------------------------------
    def _merge(
        self,
        path: str,
        local: _Local,
        base: dict[str, str] | None,
        remote: dict[str, Any],
        deadline: float | None,
    ) -> bool | None:
        """Both changed (Conflicts.MERGE): the local version goes into the store as the
        version after the server's (a precondition on the server's sha: a third writer in
        between makes the next sync decide again), then the union of the two (merge.py)
        as the one after it, and here. Every version stays whole in the store's history.

        None when the store cannot take the local version (too large, not UTF-8): the
        caller keeps it in the conflicts folder, as the server-wins rule does.
        """
        content = self._content(path, local)
        if content is None:
            return None if self.refused.get(path) == local.sha else False
        theirs = self._memory(remote, deadline)
        if theirs is None or theirs.get("content_sha256") != remote["content_sha256"]:
            return False  # changed or deleted since the listing: decided again next sync
        theirs_text = str(theirs.get("content") or "")
        base_text = self._base_text(remote["id"], base, deadline)
        try:
            mine = self.client.update_memory(
                self.store_id, remote["id"], content, remote["content_sha256"], deadline=deadline
            )
        except ApiError as exc:
            if exc.status == 404 or exc.error_type == "memory_precondition_failed_error":
                log.info("%s %s changed on the server meanwhile: next sync", self._tag(), path)
                return False
            done = self._upload_refused(path, local, exc)
            return None if self.refused.get(path) == local.sha else done
        self.baseline[path] = {"id": mine["id"], "sha": mine["content_sha256"]}
        self.refused.pop(path, None)
        merged = merge_texts(base_text, content, theirs_text)
        held = "this machine's version is the file's"
        if merged != content:
            try:
                head = self.client.update_memory(
                    self.store_id, remote["id"], merged, mine["content_sha256"], deadline=deadline
                )
            except ApiError as exc:
                if exc.status not in (400, 404, 409, 413):
                    raise
                # A third writer came in between (the next sync merges again), or the union is
                # more than the store takes: this machine's version stays the head.
                log.warning(
                    "%s %s: the union of both versions was not stored (%s); this machine's"
                    " version is the head",
                    self._tag(),
                    path,
                    exc,
                )
                return exc.status in (400, 413)
            if not replace_file(self.folder, path, merged.encode("utf-8"), expected_sha=local.sha):
                log.info("%s %s changed while syncing: merged again next sync", self._tag(), path)
                return False
            self.baseline[path] = {"id": head["id"], "sha": head["content_sha256"]}
            held = "the file now holds both"
        log.warning(
            "%s conflict on %s: changed here and on the server; both versions are whole in the"
            " store's history (the server's %s, this machine's %s) and %s",
            self._tag(),
            path,
            theirs.get("memory_version_id") or "version",
            mine.get("memory_version_id") or "version",
            held,
        )
        return True

    def _memory(self, remote: dict[str, Any], deadline: float | None) -> dict[str, Any] | None:
        """The server's memory with its content (None: deleted since the listing)."""
        memory = self._prefetched.pop(remote["id"], None)
        if memory is not None:
            return memory
        try:
            return self.client.get_memory(self.store_id, remote["id"], deadline=deadline)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _base_text(
        self, memory_id: str, base: dict[str, str] | None, deadline: float | None
    ) -> str | None:
        """The content both sides last had, from the store's history (its newest versions);
        None when there was none (a first sync) or it is no longer kept."""
        if base is None or base.get("id") != memory_id:
            return None
        try:
            versions = self.client.list_versions(self.store_id, memory_id, deadline=deadline)
        except ApiError:
            return None
        for version in versions:
            if version.get("content_sha256") == base["sha"] and isinstance(
                version.get("content"), str
            ):
                return str(version["content"])
        return None

    # -- downloads ---------------------------------------------------------------------
    def _download(
        self, path: str, local: _Local | None, remote: dict[str, Any], deadline: float | None
    ) -> bool:
        memory = self._prefetched.pop(remote["id"], None)
        if memory is None:
            try:
                memory = self.client.get_memory(self.store_id, remote["id"], deadline=deadline)
            except ApiError as exc:
                if exc.status == 404:
                    return False  # deleted since the list: the next sync removes it here
                raise
        data = str(memory["content"]).encode("utf-8")
        try:
            written = replace_file(
                self.folder, path, data, expected_sha=local.sha if local else None
            )
        except (OSError, ValueError) as exc:
            self._once(
                ("write", path, memory["content_sha256"]),
                logging.WARNING,
                "cannot write %s here (%s): skipped",
                path,
                getattr(exc, "strerror", None) or exc,
            )
            return False
        if not written:
            log.info("%s %s changed while syncing: deciding again next sync", self._tag(), path)
            return False
        self.baseline[path] = {"id": memory["id"], "sha": memory["content_sha256"]}
        self.refused.pop(path, None)
        log.info("%s downloaded %s (%d bytes)", self._tag(), path, len(data))
        return True

    def _remove_local(self, path: str, local: _Local | None) -> bool:
        if local is not None:
            removed = remove_file(self.folder, path, expected_sha=local.sha)
            if not removed:
                log.info("%s %s changed while syncing: kept", self._tag(), path)
                return False
            log.info("%s removed %s (deleted on the server)", self._tag(), path)
        self.baseline.pop(path, None)
        self.refused.pop(path, None)
        return True

    # -- uploads -----------------------------------------------------------------------
    def _content(self, path: str, local: _Local) -> str | None:
        """The local file as text, or None (logged once) when the server could not take it
        or already refused these very bytes."""
        if self.refused.get(path) == local.sha:
            return None
        data = local.data
        if data is None:
            full = self._local_path(path)
            data = _read_nofollow(full)
            if data is None or hashlib.sha256(data).hexdigest() != local.sha:
                return None  # changed since the scan: next sync
        if len(data) > MAX_UPLOAD_BYTES:
            self._refuse(path, local, f"{len(data)} bytes is far over the store's limit")
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self._refuse(path, local, "not UTF-8 text")
            return None

    def _refuse(self, path: str, local: _Local, why: str) -> None:
        if self.refused.get(path) != local.sha:
            log.warning("%s %s refused (%s): skipped until it changes", self._tag(), path, why)
        self.refused[path] = local.sha

    def _create(self, path: str, local: _Local, deadline: float | None) -> bool:
        content = self._content(path, local)
        if content is None:
            return False
        try:
            memory = self.client.create_memory(self.store_id, path, content, deadline=deadline)
        except ApiError as exc:
            return self._upload_refused(path, local, exc)
        self.baseline[path] = {"id": memory["id"], "sha": memory["content_sha256"]}
        log.info("%s created %s on the server", self._tag(), path)
        return True

    def _upload(
        self, path: str, local: _Local, remote: dict[str, Any], deadline: float | None
    ) -> bool:
        content = self._content(path, local)
        if content is None:
            return False
        try:
            memory = self.client.update_memory(
                self.store_id, remote["id"], content, remote["content_sha256"], deadline=deadline
            )
        except ApiError as exc:
            if exc.status == 404:
                log.info(
                    "%s %s was deleted on the server meanwhile: re-creating it", self._tag(), path
                )
                return self._create(path, local, deadline)
            return self._upload_refused(path, local, exc)
        self.baseline[path] = {"id": memory["id"], "sha": memory["content_sha256"]}
        log.info("%s uploaded %s", self._tag(), path)
        return True

    def _upload_refused(self, path: str, local: _Local, exc: ApiError) -> bool:
        if exc.error_type == "memory_precondition_failed_error":
            log.warning(
                "%s %s changed on the server meanwhile: the server's version wins",
                self._tag(),
                path,
            )
            return False
        if exc.status in (400, 413) or exc.error_type == "memory_path_conflict_error":
            self._refuse(path, local, exc.message)
            return False
        if exc.status == 409:  # e.g. an archived store
            self._once(
                ("conflict", path, local.sha),
                logging.WARNING,
                "%s not uploaded: %s",
                path,
                exc.message,
            )
            return False
        raise exc

    def _delete_remote(self, path: str, base: dict[str, str], deadline: float | None) -> bool:
        now = self.monotonic()
        since = self.missing_since.setdefault(path, now)
        if now - since < self.delete_delay:
            if since == now:
                log.info(
                    "%s %s is missing here: deleting it on the server if it stays missing for %gs",
                    self._tag(),
                    path,
                    self.delete_delay,
                )
            return False
        if self.deletions is Deletions.DISABLED:
            self._once(
                ("nodelete", path),
                logging.INFO,
                "%s deleted here; deletions are disabled: kept on the server",
                path,
            )
            return False
        if self.deletions is Deletions.LOG_ONLY:
            self._once(
                ("nodelete", path),
                logging.WARNING,
                "%s deleted here; would delete it on the server (deletions=log_only)",
                path,
            )
            return False
        if os.path.lexists(self._local_path(path)):
            return False  # back again: checked afresh right before the delete
        try:
            self.client.delete_memory(self.store_id, base["id"], base["sha"], deadline=deadline)
        except ApiError as exc:
            if exc.status == 404:
                pass  # already gone
            elif exc.status in (409, 412):
                log.warning(
                    "%s %s was deleted here but changed on the server: keeping the server's"
                    " version",
                    self._tag(),
                    path,
                )
                return False
            else:
                raise
        self.baseline.pop(path, None)
        self.missing_since.pop(path, None)
        log.info(
            "%s deleted %s on the server (missing here for %gs)", self._tag(), path, now - since
        )
        return True


# -- files -------------------------------------------------------------------------------
def unholdable(path: object) -> str | None:
    """Why no local file can hold the memory at ``path``; None when one can."""
    if not isinstance(path, str):
        return "its path is not a string"
    if not path.startswith("/"):
        return "its path does not start with /"
    if "\x00" in path:
        return "its path contains a NUL"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "its path is not valid UTF-8"
    for segment in path[1:].split("/"):
        if segment in ("", ".", ".."):
            return "its path has an empty, . or .. segment"
        if segment.startswith(TMP_PREFIX):
            return f"a name starting with {TMP_PREFIX!r} is a temp file here"
        if len(segment.encode("utf-8")) > MAX_NAME_BYTES:
            return f"a name is longer than {MAX_NAME_BYTES} bytes"
    return None


def _remove_kept(kept: Path, top: Path) -> None:
    """Drop a kept copy that turned out not to be needed, and the folders it empties."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(kept)
    parent = kept.parent
    while parent != top and top in parent.parents:
        try:
            os.rmdir(parent)
        except OSError:
            break
        parent = parent.parent


def _read_nofollow(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _sha_of(path: Path) -> str | None:
    """The hash of the regular file at ``path``; None if absent. Raises on a non-file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EEXIST, "not a regular file", str(path))
    data = _read_nofollow(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def _safe_parent(root: Path, rel: str) -> Path:
    """Create the parents of ``rel`` under ``root``; never through a symlink."""
    parts = rel.strip("/").split("/")
    current = root
    for part in parts[:-1]:
        if part in ("", ".", ".."):
            raise OSError(errno.EINVAL, "unsafe path", rel)
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            os.mkdir(current, 0o700)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, "a file is in the way", str(current))
    if parts[-1] in ("", ".", ".."):
        raise OSError(errno.EINVAL, "unsafe path", rel)
    return current


def replace_file(root: Path, rel: str, data: bytes, *, expected_sha: str | None) -> bool:
    """Write ``data`` at ``rel`` atomically if the file still has ``expected_sha``.

    False (nothing written) when the file changed since it was scanned: an edit made while
    we synced must not be overwritten by a decision taken before it.
    """
    parent = _safe_parent(root, rel)
    target = parent / rel.rsplit("/", 1)[-1]
    if _sha_of(target) != expected_sha:
        return False
    write_atomic(target, data)
    return True


def remove_file(root: Path, rel: str, *, expected_sha: str) -> bool:
    """Remove ``rel`` if it still has ``expected_sha``, then the directories it empties."""
    target = root / rel.lstrip("/")
    try:
        if _sha_of(target) != expected_sha:
            return False
    except OSError:
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)
    parent = target.parent
    while parent != root and root in parent.parents:
        try:
            os.rmdir(parent)
        except OSError:
            break
        parent = parent.parent
    return True
