"""Claude Code's own memory (its auto-memory folder), shared with the team through a memory
store: ``agent install claude-code --share-memory [STORE]``.

Claude Code (2.1.332) keeps its auto-memory in a folder of Markdown files: ``MEMORY.md``, an
index it loads into the model's context at every session start, and one topic file per
memory, which the model writes with its Write and Edit tools. ``autoMemoryDirectory`` in
``.claude/settings.local.json`` names that folder. Install points it at a folder of this
client's state directory, per user and outside the repository::

    <state dir>/claude-memory/<server>/<tenant>/<project>/<store id>/
        memory/      the folder Claude Code reads and writes (with the store's marker)
        sync.json    what both sides had at the last sync (mount/sync.py's state)
        sync.lock    one sync at a time, whichever session runs it
        conflicts/   a local version the store could not take, kept (never synced)
    <state dir>/claude-memory/repos/<hash of the repository's path>.json
                     which store this repository shares, and the setting's value before

and keeps that folder in sync with the store, without a daemon: the ``session-start`` hook
syncs before the model's first request and the ``stop`` hook after each turn, each within
its time (agents/hooks.py), with the mount's engine (mount/sync.py) over the hooks' own HTTP
(agents/wire.py: no httpx). Conflicts follow ``Conflicts.MERGE``: both versions go into the
store's history and the file becomes their union (mount/merge.py). A local delete is sent
at the next sync (a hook runs between turns, when no tool is writing), except when every
synced file is gone at once (a wipe, restored from the store). Names starting with ``.``
(Claude Code's own lock files) are never synced.

Claude Code reads ``MEMORY.md`` before the session-start hook has synced: when the sync
changed it, the hook adds the new index to the session's context, framed as stored text.

Nothing here follows a symbolic link: a folder on the way, or the memory folder itself,
that is a link stops the sync (the hook logs it; the session goes on), and a file in the
folder that is a link is neither synced nor deleted on the server. A hook finds its
repository's share with agents/share_record.py; this module and the engine load only where
there is one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from .share_record import Share, link_path, shares_root

if TYPE_CHECKING:
    from ..mount.sync import SyncReport
    from ..settings import Settings

SETTING = "autoMemoryDirectory"
DEFAULT_STORE = "Claude Code auto-memory"
STORE_DESCRIPTION = "Claude Code's auto-memory of this project, shared by project-memory"
STORE_METADATA = {"project-memory": "claude-code-auto-memory"}
SYNC_SHARE = 0.5  # of the session-start hook's network time: the context gets the rest
LOCK_WAIT = 1.0  # seconds a hook waits for another session's sync of the same folder
INSTALL_SYNC_SECONDS = 30.0
NOTE_BYTES = 4_000  # of the new MEMORY.md added to the session's context
# The server's id pattern: a tenant, project or store id that matches it names a folder.
SAFE_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
# A stored-text tag, as app/services/framing.py finds one (any case, spaces or zero-width
# characters inside, a full-width or small '<').
STORED_TEXT_TAG = (
    r"[<\uff1c\ufe64](?=[\s/\u200b-\u200f\u2060\ufeff]*stored[\s_\-\u200b-\u200f\u2060\ufeff]*text)"
)


class SharedMemoryError(Exception):
    """The memory cannot be shared as asked (no server, no such store, a link on the way);
    ``unreachable``: because the server cannot be reached."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


# -- where things are -------------------------------------------------------------------------
def _segment(value: str) -> str:
    """``value`` as one directory name: itself when the server's id pattern allows it and
    it is not all dots, else its hash."""
    if re.fullmatch(SAFE_SEGMENT, value) and value.strip("."):
        return value
    return "h-" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def home_for(state: Path, url: str, tenant: str, project: str, store_id: str) -> Path:
    parts = urlsplit(url)
    server = re.sub(r"[^A-Za-z0-9.]+", "-", f"{parts.netloc}{parts.path}").strip("-.")
    return shares_root(state).joinpath(
        _segment(server or "server"), _segment(tenant), _segment(project), _segment(store_id)
    )


def real_dirs(top: Path, path: Path, *, create: bool) -> None:
    """Check (and with ``create``, make, mode 0700) every directory from ``top`` down to
    ``path``: none may be a symbolic link or anything but a directory."""
    rel = path.relative_to(top)
    current = top
    for part in (None, *rel.parts):
        if part is not None:
            current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            if not create:
                raise SharedMemoryError(f"{current} is missing") from None
            os.mkdir(current, 0o700)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise SharedMemoryError(
                f"{current} is a symbolic link: the shared memory follows no link (it could"
                " lead the team's memories anywhere); not synced"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise SharedMemoryError(f"{current} is not a directory; not synced")


def linked(state: Path, root: Path) -> dict[str, Any] | None:
    """The record install wrote for ``root`` (None: it shares nothing)."""
    try:
        data = json.loads(link_path(state, root).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("root") == str(root) else None


def link(
    state: Path, root: Path, share: Share, previous: tuple[bool, Any], *, private: bool = False
) -> None:
    """Record that ``root`` shares ``share``, and the setting's value before install
    (``(False, None)``: it had none), for uninstall; ``private``: its turns go to the
    user's private space (share_record.is_private)."""
    record = {"root": str(root), **share.to_dict(), "before": {"set": previous[0]}}
    if previous[0]:
        record["before"]["value"] = previous[1]
    if private:
        record["private"] = True
    _write_record(state, root, record)


def set_private(state: Path, root: Path, private: bool) -> None:
    """Record whether ``root``'s turns go to the user's private space, keeping the rest of
    its record (a share); a record that would say nothing else is removed."""
    record = linked(state, root) or {"root": str(root)}
    record.pop("private", None)
    if private:
        record["private"] = True
    if set(record) == {"root"}:
        unlink(state, root)
    else:
        _write_record(state, root, record)


def _write_record(state: Path, root: Path, record: dict[str, Any]) -> None:
    from .spool import private_dir, write_private

    path = link_path(state, root)
    private_dir(path.parent)
    write_private(path, json.dumps(record, indent=1).encode())


def unlink(state: Path, root: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link_path(state, root))


def restore_args(state: Path, root: Path, current: Any) -> tuple[str, tuple[bool, Any]] | None:
    """What uninstall puts back: ``(the value install wrote, (was there one before, its
    value))``; None when the setting is not one of ours. Without a record (a state
    directory lost since), a value inside our folder is ours, and there was none before."""
    record = linked(state, root)
    if record is not None and isinstance(record.get("folder"), str):
        before = record.get("before")
        if isinstance(before, dict) and before.get("set"):
            return record["folder"], (True, before.get("value"))
        return record["folder"], (False, None)
    if isinstance(current, str) and Path(current).is_relative_to(shares_root(state)):
        return current, (False, None)
    return None


# -- the store calls, over the hooks' HTTP ------------------------------------------------------
class StoreWire:
    """The memory-stores calls of the sync engine and of install, over one keep-alive
    connection of agents/wire.py (no httpx: a hook's start-up). Every call waits at most
    until its ``deadline`` and the client's own; errors are mount/errors.py's."""

    def __init__(self, settings: Settings, *, url: str, deadline: float) -> None:
        from .. import __version__
        from .wire import Connection

        self.connection = Connection(url)
        self.base = urlsplit(url).path.rstrip("/") + "/v1/memory_stores"
        self.deadline = deadline
        self.headers = settings.headers(f"project-memory-client/{__version__} (shared memory)")
        self.headers["Accept"] = "application/json"

    def close(self) -> None:
        self.connection.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        deadline: float | None = None,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Any:
        from ..mount.errors import ApiError, TransportError

        ends = min(self.deadline, deadline) if deadline is not None else self.deadline
        left = ends - time.monotonic()
        if left <= 0:
            raise TransportError(f"{method} {path}: out of time")
        target = self.base + path + (f"?{urlencode(params)}" if params else "")
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        try:
            response = self.connection.request(method, target, headers, data, max(0.05, left))
        except TimeoutError:
            raise TransportError(f"{method} {path}: no answer in time") from None
        except (OSError, ValueError) as exc:
            raise TransportError(f"{method} {path}: {exc}") from None
        if response.status >= 500:
            raise TransportError(f"{method} {path}: HTTP {response.status}")
        try:
            found = response.json()
        except ValueError:
            found = None
        if response.status >= 400:
            error = found.get("error") if isinstance(found, dict) else None
            error = error if isinstance(error, dict) else {}
            raise ApiError(
                response.status,
                str(error.get("type") or "error"),
                str(error.get("message") or response.reason or f"HTTP {response.status}"),
            )
        if found is None:
            raise TransportError(f"{method} {path}: the answer is not JSON")
        return found

    def _page(self, path: str, params: dict[str, Any], deadline: float | None) -> list[Any]:
        items: list[Any] = []
        while True:
            page = self._call("GET", path, deadline=deadline, params=params)
            items.extend(page.get("data") or [])
            if not page.get("next_page"):
                return items
            params = {**params, "page": page["next_page"]}

    # -- the engine's (mount/sync.py StoreApi) ---------------------------------------------
    def list_memories(
        self, store_id: str, *, full: bool = False, deadline: float | None = None
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = (
            {"view": "full", "limit": 20} if full else {"view": "basic", "limit": 100}
        )
        found = self._page(f"/{quote(store_id, safe='')}/memories", params, deadline)
        return [m for m in found if isinstance(m, dict) and m.get("type") == "memory"]

    def get_memory(
        self, store_id: str, memory_id: str, *, deadline: float | None = None
    ) -> dict[str, Any]:
        path = f"/{quote(store_id, safe='')}/memories/{quote(memory_id, safe='')}"
        found: dict[str, Any] = self._call("GET", path, deadline=deadline, params={"view": "full"})
        return found

    def create_memory(
        self, store_id: str, path: str, content: str, *, deadline: float | None = None
    ) -> dict[str, Any]:
        body = {"path": path, "content": content}
        found: dict[str, Any] = self._call(
            "POST", f"/{quote(store_id, safe='')}/memories", deadline=deadline, body=body
        )
        return found

    def update_memory(
        self,
        store_id: str,
        memory_id: str,
        content: str,
        expected_sha256: str,
        *,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        body = {
            "content": content,
            "precondition": {"type": "content_sha256", "content_sha256": expected_sha256},
        }
        path = f"/{quote(store_id, safe='')}/memories/{quote(memory_id, safe='')}"
        found: dict[str, Any] = self._call("POST", path, deadline=deadline, body=body)
        return found

    def delete_memory(
        self,
        store_id: str,
        memory_id: str,
        expected_sha256: str,
        *,
        deadline: float | None = None,
    ) -> None:
        path = f"/{quote(store_id, safe='')}/memories/{quote(memory_id, safe='')}"
        params = {"expected_content_sha256": expected_sha256}
        self._call("DELETE", path, deadline=deadline, params=params)

    def list_versions(
        self, store_id: str, memory_id: str, *, deadline: float | None = None
    ) -> list[dict[str, Any]]:
        params = {"memory_id": memory_id, "view": "full", "limit": 20}
        page = self._call(
            "GET", f"/{quote(store_id, safe='')}/memory_versions", deadline=deadline, params=params
        )
        return [v for v in page.get("data") or [] if isinstance(v, dict)]

    # -- install's -------------------------------------------------------------------------
    def get_store(self, store_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call("GET", f"/{quote(store_id, safe='')}")
        return found

    def stores_named(self, name: str) -> list[dict[str, Any]]:
        found = self._page("", {"limit": 100}, None)
        return [s for s in found if isinstance(s, dict) and s.get("name") == name]

    def create_store(self, name: str) -> dict[str, Any]:
        body = {"name": name, "description": STORE_DESCRIPTION, "metadata": STORE_METADATA}
        found: dict[str, Any] = self._call("POST", "", body=body)
        return found


# -- install ------------------------------------------------------------------------------------
def prepare(settings: Settings, state: Path, store: str | None) -> Share:
    """The store to share (``store``: an id, or a name found or created; default
    DEFAULT_STORE) and its folder, made. Raises SharedMemoryError."""
    from ..errors import ApiError as Refused, ClientError
    from ..mount.errors import ApiError, TransportError
    from ..rules import is_store_id
    from .install import InstallError, base_url
    from .wire import HookClient

    if not settings.url or not settings.token:
        raise SharedMemoryError(
            "sharing the memory needs the server's URL and a writer's token:"
            " PROJECT_MEMORY_URL and PROJECT_MEMORY_TOKEN, or the config file"
        )
    try:
        url = base_url(settings.url)
    except InstallError as exc:
        raise SharedMemoryError(str(exc)) from None
    ends = time.monotonic() + INSTALL_SYNC_SECONDS
    who = HookClient(settings, deadline=ends)
    wire = StoreWire(settings, url=url, deadline=ends)
    try:
        scope = who.send("GET", "/whoami").json()
        if is_store_id(store):
            assert store is not None
            try:
                found = wire.get_store(store)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                raise SharedMemoryError(f"no memory store {store} in this project") from None
        else:
            name = store or DEFAULT_STORE
            named = wire.stores_named(name)
            if len(named) > 1:
                ids = ", ".join(str(s.get("id")) for s in named)
                raise SharedMemoryError(
                    f"several memory stores are named {name!r} ({ids}): give the id of one"
                )
            found = named[0] if named else wire.create_store(name)
    except (ApiError, Refused) as exc:
        raise SharedMemoryError(f"the server refused: {exc}") from None
    except (TransportError, ClientError, ValueError) as exc:
        raise SharedMemoryError(f"the server cannot be reached: {exc}", unreachable=True) from None
    finally:
        who.close()
        wire.close()
    if found.get("archived_at"):
        raise SharedMemoryError(
            f"the memory store {found.get('id')} is archived (read-only): choose another"
        )
    if not isinstance(scope, dict) or not is_store_id(found.get("id")):
        raise SharedMemoryError("the server's answer is not a memory store")
    share = Share(
        url=url,
        tenant=str(scope.get("tenant") or ""),
        project=str(scope.get("project") or ""),
        scoped=bool(settings.tenant or settings.project),
        store_id=str(found["id"]),
        store_name=str(found.get("name") or ""),
        home=home_for(state, url, str(scope.get("tenant")), str(scope.get("project")), found["id"]),
        private=settings.visibility == "private",
    )
    from .spool import private_dir

    try:
        private_dir(state)
        real_dirs(state, share.home, create=True)
    except OSError as exc:
        raise SharedMemoryError(f"cannot make {share.home}: {exc}") from None
    return share


def first_sync(
    share: Share, settings: Settings, state: Path, log: Callable[[str], None] | None = None
) -> str:
    """Sync once, now (install's: the folder holds the store before Claude Code first reads
    it), the engine's warnings to ``log``; "" when it completed, else why not."""
    ends = time.monotonic() + INSTALL_SYNC_SECONDS
    _, why = _sync(share, settings, state, ends, log=log)
    return why


def _current_setting(root: Path) -> Any:
    """The ``autoMemoryDirectory`` of the repository's settings.local.json (None: unset)."""
    from .install import LOCAL_SETTINGS, _load_json, inside

    return (_load_json(inside(root, LOCAL_SETTINGS)) or {}).get(SETTING)


class PendingShare:
    """``agent install claude-code --share-memory``: the store found or made and its folder,
    before install writes the setting; :meth:`installed` records the share and syncs once."""

    def __init__(
        self,
        share: Share,
        root: Path,
        settings: Settings,
        state: Path,
        before: tuple[bool, Any],
        *,
        private: bool = False,
    ) -> None:
        self.private = private  # the repository's turns go to the user's private space
        self.share = share
        self.root = root
        self.settings = settings
        self.state = state
        self.before = before

    @property
    def folder(self) -> str:
        return str(self.share.folder)

    def installed(self, change: Any) -> None:
        share = self.share
        try:
            link(self.state, self.root, share, self.before, private=self.private)
        except OSError as exc:
            change.warnings.append(
                f"the shared memory's record cannot be written ({exc}): the hooks will not"
                " sync it; install again"
            )
            return
        said: list[str] = []
        why = first_sync(share, self.settings, self.state, said.append)
        change.notes += said
        if share.private:
            change.notes.append(
                f"Claude Code's auto-memory for this repository is now {share.folder} (yours,"
                f" outside the repository), kept in the memory store {share.store_name!r}"
                f" ({share.store_id}) of your private space of the project: no one else sees"
                " it. The hooks sync it when a session starts and after each turn."
            )
        else:
            change.notes.append(
                f"Claude Code's auto-memory for this repository is now {share.folder} (yours,"
                f" outside the repository), shared with the team through the memory store"
                f" {share.store_name!r} ({share.store_id}): the hooks sync it when a session"
                " starts and after each turn. Whatever Claude Code remembers there goes to"
                " everyone who shares the store, what it learns about you included; and what"
                " they write there is loaded into your sessions as memory."
            )
        change.notes.append(
            "Interactive claude uses it once you have trusted this folder (its trust dialog"
            " names autoMemoryDirectory); `claude -p` uses it at once."
        )
        if why:
            change.warnings.append(f"the first sync of the shared memory did not complete: {why}")


def share_for_install(
    agent: str, root: Path, settings: Settings | None, store: str, *, private: bool = False
) -> PendingShare:
    """The share ``--share-memory [STORE]`` asks for; CommandError when it cannot be. With
    ``private``, the store is found or made in the user's private space."""
    from ..commands import CommandError
    from .install import InstallError
    from .spool import state_dir

    if agent != "claude-code":
        raise CommandError(
            "--share-memory is Claude Code's (its auto-memory folder)", exit_code=2, kind="install"
        )
    if settings is None:
        raise CommandError(
            "sharing the memory needs the server's URL and a writer's token", exit_code=2
        )
    state = state_dir()
    try:
        current = _current_setting(root)
    except InstallError as exc:
        raise CommandError(str(exc), exit_code=2, kind="install") from None
    if private:
        settings = settings.with_overrides(visibility="private")
    try:
        share = prepare(settings, state, store or None)
    except SharedMemoryError as exc:
        code = 3 if exc.unreachable else 2  # the CLI's exit status for an unreachable server
        raise CommandError(str(exc), exit_code=code, kind="install") from None
    before: tuple[bool, Any] = (current is not None, current)
    ours = restore_args(state, root, current)
    if ours is not None and ours[0] == current:
        before = ours[1]  # installed before: what was there then
    return PendingShare(share, root, settings, state, before, private=private)


class Unshare:
    """``agent uninstall claude-code``: the setting put back, the share's record dropped;
    the memory files stay."""

    def __init__(
        self, root: Path, state: Path, memory: tuple[str, tuple[bool, Any]] | None
    ) -> None:
        self.root = root
        self.state = state
        self.memory = memory

    @classmethod
    def of(cls, agent: str, root: Path) -> Unshare:
        from .install import InstallError
        from .spool import state_dir

        state = state_dir()
        if agent != "claude-code":
            return cls(root, state, None)
        try:
            current = _current_setting(root)
        except InstallError:
            current = None
        return cls(root, state, restore_args(state, root, current))

    def done(self, change: Any) -> None:
        if linked(self.state, self.root) is None and self.memory is None:
            return
        unlink(self.state, self.root)
        if self.memory is not None:
            change.notes.append(
                f"The shared memory is no longer synced; its files stay in {self.memory[0]}"
                " (delete them yourself once you no longer need them)."
            )


# -- the hooks ---------------------------------------------------------------------------------
def sync_for_hook(
    share: Share,
    settings: Callable[[], Settings],
    state: Path,
    log: Callable[[str], None],
    event: str,
    *,
    deadline: float,
    note: bool,
) -> str:
    """A hook's sync: the settings as the hook reads them, its state directory and log
    (never raises but the hook's Deadline); with ``note``, what the session's context gets
    when the sync changed MEMORY.md (else "")."""
    index = share.folder / "MEMORY.md"
    before = _read(index) if note else None
    try:
        found = settings()
    except Exception as exc:  # noqa: BLE001 - the hook says why in its log, and goes on
        log(f"{event}: shared memory not synced: {exc}")
        return ""
    _, why = _sync(share, found, state, deadline, log=log, event=event)
    if why:
        log(f"{event}: shared memory ({share.store_id}): {why}")
    if not note:
        return ""
    after = _read(index)
    if not after or after == before:
        return ""
    return memory_note(share, after)


def memory_note(share: Share, index: bytes) -> str:
    """The new MEMORY.md, for the session's context: framed as stored text (teammates
    wrote it), cut at a line within NOTE_BYTES."""
    text = index.decode("utf-8", "replace")
    if len(index) > NOTE_BYTES:
        cut = text.encode()[:NOTE_BYTES].decode("utf-8", "ignore")
        text = cut[: cut.rfind("\n") + 1] or cut
        text += f"… (the rest is in {share.folder / 'MEMORY.md'})\n"
    if not text.endswith("\n"):
        text += "\n"
    source = f"shared auto-memory {share.store_name or share.store_id}: MEMORY.md"
    return (
        f"Your auto-memory folder ({share.folder}) is shared with the team through the"
        f" memory store {share.store_name or share.store_id!r}. Its index changed after this"
        " session loaded it; MEMORY.md now reads:\n"
        f'<stored-text from="{source}">\n{neutral(text)}</stored-text>'
    )


def neutral(text: str) -> str:
    """``text`` with every stored-text tag in it made inert: it cannot close its frame."""
    return re.sub(STORED_TEXT_TAG, "&lt;", text, flags=re.IGNORECASE)


def _read(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return fh.read(1024 * 1024)


def _sync(
    share: Share,
    settings: Settings,
    state: Path,
    deadline: float,
    *,
    log: Callable[[str], None] | None,
    event: str = "install",
) -> tuple[SyncReport | None, str]:
    """One sync of ``share``'s folder, under its lock: (the engine's report, or None when it
    did not run; why it did not run or complete, "" when it did)."""
    from .install import InstallError, base_url

    try:
        url = base_url(settings.url or "")
    except InstallError:
        url = ""
    if url != share.url:
        return None, (
            f"the settings name another server ({url or 'none'}) than the one this"
            f" repository shares its memory on ({share.url}): not synced"
        )
    top = shares_root(state)
    try:
        if not share.home.is_relative_to(top):
            raise SharedMemoryError(f"{share.home} is not under {top}; not synced")
        real_dirs(top, share.home, create=False)
        if os.path.lexists(share.folder):  # else the engine makes it, with its marker
            real_dirs(share.home, share.folder, create=False)
    except SharedMemoryError as exc:
        return None, str(exc)
    try:
        fd = os.open(share.home / "sync.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        return None, f"cannot open its lock: {exc}"
    try:
        import fcntl

        # Two sessions of one repository (or of two clones sharing one store) end turns at
        # once: one sync at a time; the other gives up soon, and the next hook syncs.
        waits = time.monotonic() + min(LOCK_WAIT, max(0.0, deadline - time.monotonic()))
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= waits:
                    return None, "another session is syncing it: next time"
                time.sleep(0.05)
        return _locked_sync(share, settings, deadline, log=log, event=event)
    finally:
        os.close(fd)


def _locked_sync(
    share: Share,
    settings: Settings,
    deadline: float,
    *,
    log: Callable[[str], None] | None,
    event: str,
) -> tuple[SyncReport | None, str]:
    import logging

    from ..mount.errors import ApiError
    from ..mount.sync import Conflicts, MountError, StoreSync

    class ToLog(logging.Handler):
        """The engine's warnings, as lines of the hook's log (its stderr is the agent's)."""

        def emit(self, record: logging.LogRecord) -> None:
            if log is not None:
                with contextlib.suppress(Exception):
                    log(f"{event}: shared memory {record.getMessage()}")

    logger = logging.getLogger("project_memory.mount")
    handler = ToLog(logging.WARNING)
    logger.addHandler(handler)
    propagated, logger.propagate = logger.propagate, False
    if share.scoped:
        settings = settings.with_overrides(tenant=share.tenant, project=share.project)
    # The store lives in the space it was found or made in, whatever the turns' is now.
    settings = settings.with_overrides(visibility="private" if share.private else "project")
    wire = StoreWire(settings, url=share.url, deadline=deadline)
    try:
        sync = StoreSync(
            wire,
            share.store_id,
            share.folder,
            state_file=share.state_file,
            delete_delay=0.0,  # a hook runs between turns, when no tool is writing
            conflicts=Conflicts.MERGE,
            skip_hidden=True,
        )
        try:
            sync.prepare()
        except (MountError, OSError) as exc:
            return None, f"not synced: {exc}"
        report = sync.sync_once(deadline=deadline)
    finally:
        wire.close()
        logger.removeHandler(handler)
        logger.propagate = propagated
    error = report.error
    if isinstance(error, ApiError) and error.status == 404:
        return report, (
            "the store is gone from the server (deleted?): the folder keeps its files and is"
            " no longer synced; `project-memory agent install claude-code --share-memory`"
            " shares it through a new store"
        )
    if not report.ok:
        return report, f"the sync did not complete ({error or 'stopped'}); next time"
    return report, ""
