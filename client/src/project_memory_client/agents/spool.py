"""The local spool: turns that are not on the server yet, one file each.

A hook writes every turn here first and then sends it; the next hook that reaches the
server sends what is left, and so does ``project-memory agent flush``. The spool lives in
``$PROJECT_MEMORY_STATE_DIR`` (default ``${XDG_STATE_HOME:-~/.local/state}/project-memory``),
``spool/`` of mode 0700, entries of mode 0600. An entry holds what the turn will be (masked
already), the server and scope it is for, never a token.

Nothing is lost, nothing is doubled:

* An entry is created whole or not at all (a temp file linked to its name, which fails if
  the name exists), and never changed after; it is removed only once the turn, and every
  artifact, is on the server.
* Its ``record_id`` goes into the turn's meta. Before a turn is written, the task's index
  is read: a turn that already carries the record id is that entry, sent before (its answer
  lost, or sent by another process), and is not written again.
* The turn takes the task's next free number with ``If-None-Match: *``, so it never
  overwrites another session's turn; losing that race to another writer means taking the
  next number.
* A process sends an entry only while it holds a lock on the entry's file, so a hook and
  ``agent flush`` never send one entry at the same time.
* Entries go oldest first: by the time their files were written, and for files of one
  clock tick (a hook that spools several turns at once) by the time each entry records.
* An entry the server refuses for good moves to ``rejected/`` with the reason; each is
  counted in the flush's outcome (the hook logs them).
* A temp file a killed process left (``.tmp-*``) is removed once it is older than any write
  in flight can be.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._files import fsync_dir
from ..next_turn import put_next_turn

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Protocol

    from ..models import Upload

    class IndexedTurn(Protocol):
        @property
        def turn(self) -> int: ...
        @property
        def meta(self) -> dict[str, Any]: ...
        @property
        def artifacts(self) -> Sequence[str]: ...

    class Index(Protocol):
        @property
        def turns(self) -> Sequence[IndexedTurn]: ...
        @property
        def latest_turn(self) -> int | None: ...

    class Sender(Protocol):
        """What sends a spooled turn: the full client (``agent flush``) or the hooks' own
        (agents/wire.py), which take the same calls and raise the same errors."""

        def get_task(self, task_id: str) -> Index: ...

        def put_turn(
            self,
            task_id: str,
            turn: int,
            *,
            meta: dict[str, Any] | None = ...,
            summary_md: str = ...,
            if_none_match: Any = ...,
            artifacts: Any = ...,
        ) -> object: ...

        def put_artifact(
            self, task_id: str, turn: int, name: str, source: Any, *, content_type: Any = ...
        ) -> object: ...


try:  # POSIX; elsewhere entries are sent without the cross-process lock
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

STATE_ENV = "PROJECT_MEMORY_STATE_DIR"
ENTRY_SUFFIX = ".json"
RECORD_KEY = "record_id"
TEMP_PREFIX = ".tmp-"
# A temp file is a write in flight for milliseconds; one this old was left by a process
# that died between creating it and removing it.
STALE_TEMP_SECONDS = 600.0
# A refusal that sending again cannot change: the entry moves to spool/rejected/.
FINAL_STATUSES = frozenset({400, 413, 415, 422})


def state_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    if env.get(STATE_ENV):
        return Path(env[STATE_ENV])
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "project-memory"


def private_dir(path: Path) -> Path:
    """``path`` as a directory of mode 0700 (made so if it is not)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.is_symlink() or not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def write_private(path: Path, data: bytes, *, replace: bool = True) -> bool:
    """Write ``path`` (mode 0600) whole or not at all. ``replace=False`` writes it only if
    it does not exist (False then); a reader never sees a part."""
    tmp = path.with_name(f"{TEMP_PREFIX}{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)
    return True


ENTRY_FIELDS = (
    "record_id",
    "agent",
    "url",
    "tenant",
    "project",
    "task_id",
    "meta",
    "summary_md",
    "created_at",
    "artifacts",
    "visibility",
)


class Entry:
    """A turn waiting to be sent. ``artifacts``: ``{"name", "file", "content_type"}``, the
    file beside the entry in the spool. (A plain class: hooks load it at every start.)"""

    def __init__(
        self,
        record_id: str,
        agent: str,
        url: str,
        tenant: str | None,
        project: str | None,
        task_id: str,
        meta: dict[str, Any],
        summary_md: str,
        created_at: float | None = None,
        artifacts: list[dict[str, str]] | None = None,
        visibility: str | None = None,
    ) -> None:
        self.record_id = record_id
        self.agent = agent
        self.url = url
        self.tenant = tenant
        self.project = project
        self.task_id = task_id
        self.meta = meta
        self.summary_md = summary_md
        self.created_at = time.time() if created_at is None else created_at
        self.artifacts = [] if artifacts is None else artifacts
        # "private": the turn goes to its user's private space (settings.VISIBILITY_HEADER),
        # and only a flush acting there sends it.
        self.visibility = visibility

    def to_json(self) -> bytes:
        value = {k: getattr(self, k) for k in ENTRY_FIELDS}
        return json.dumps(value, ensure_ascii=False, indent=1).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> Entry:
        value = json.loads(data)
        return cls(**{k: value[k] for k in ENTRY_FIELDS if k in value})

    def task_key(self) -> tuple[str, str | None, str | None, str | None, str]:
        """The task the turn goes to, on its server and in its scope."""
        return (self.url.rstrip("/"), self.tenant, self.project, self.visibility, self.task_id)


class Outcome:
    """What a flush did."""

    def __init__(self) -> None:
        self.sent = 0
        self.already = 0  # found on the server (sent before): removed, not written again
        self.rejected = 0  # refused for good: moved to spool/rejected/
        self.kept = 0  # still spooled (the server is down, busy, or refused the token)
        self.deferred = 0  # left behind a turn of their task another process is sending
        self.unreachable = False
        self.errors: list[str] = []
        self.rejections: list[str] = []  # "<file>: <why>", one per rejected


class Spool:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "spool"

    def _ready(self) -> Path:
        private_dir(self.root)
        return private_dir(self.dir)

    def add(self, entry: Entry, artifacts: dict[str, tuple[bytes, str]] | None = None) -> bool:
        """Spool ``entry`` with its artifacts (name → (bytes, content type)); False when an
        entry of that record id is spooled already (it is the same turn). OSError (a full
        disk) when it cannot be written: then nothing of it is left."""
        directory = self._ready()
        self.remove_stale_temps()
        written: list[Path] = []
        try:
            for name, (data, content_type) in (artifacts or {}).items():
                file = f"{entry.record_id}.{name}"
                write_private(directory / file, data)
                written.append(directory / file)
                entry.artifacts.append({"name": name, "file": file, "content_type": content_type})
            return write_private(
                directory / f"{entry.record_id}{ENTRY_SUFFIX}", entry.to_json(), replace=False
            )
        except OSError:
            entry.artifacts.clear()
            for path in written:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise

    def remove_stale_temps(self) -> int:
        """Remove the temp files a killed process left in the spool and the state directory
        (older than STALE_TEMP_SECONDS: a write in flight is never one); how many went."""
        removed = 0
        limit = time.time() - STALE_TEMP_SECONDS
        for directory in (self.root, self.root / "sessions", self.dir, self.dir / "rejected"):
            try:
                names = [n for n in os.listdir(directory) if n.startswith(TEMP_PREFIX)]
            except OSError:
                continue
            for name in names:
                with contextlib.suppress(OSError):
                    st = os.stat(directory / name, follow_symlinks=False)
                    if st.st_mtime < limit:
                        os.unlink(directory / name)
                        removed += 1
        return removed

    def _entry_files(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        return [
            p
            for p in self.dir.iterdir()
            if p.name.endswith(ENTRY_SUFFIX) and not p.name.startswith(TEMP_PREFIX)
        ]

    def paths(self) -> list[Path]:
        """Spooled entries, oldest first: by their files' times, and for files of one clock
        tick (several turns one hook spooled) by the times the entries record."""
        times: dict[Path, int] = {}
        for path in self._entry_files():
            with contextlib.suppress(FileNotFoundError):  # sent by another process meanwhile
                times[path] = path.stat().st_mtime_ns
        ticks: dict[int, int] = {}
        for mtime in times.values():
            ticks[mtime] = ticks.get(mtime, 0) + 1

        def order(path: Path) -> tuple[int, float, str]:
            mtime = times[path]
            return (mtime, _created_at(path) if ticks[mtime] > 1 else 0.0, path.name)

        return sorted(times, key=order)

    def count(self) -> int:
        return len(self._entry_files())

    def backlog(self) -> tuple[int, int, float | None]:
        """What waits: the entries, their bytes (their artifacts' files included), and the
        oldest one's age in seconds (None when there is none)."""
        entries = 0
        size = 0
        oldest: float | None = None
        now = time.time()
        try:
            names = os.listdir(self.dir)
        except OSError:
            return 0, 0, None
        for name in names:
            if name.startswith(TEMP_PREFIX):
                continue
            with contextlib.suppress(OSError):
                st = os.stat(self.dir / name, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    continue
                size += st.st_size
                if name.endswith(ENTRY_SUFFIX):
                    entries += 1
                    oldest = max(oldest or 0.0, now - st.st_mtime)
        return entries, size, oldest

    def rejected_count(self) -> int:
        """Entries the server refused for good, kept in ``rejected/`` with the reason."""
        rejected = self.dir / "rejected"
        if not rejected.is_dir():
            return 0
        return len([p for p in rejected.iterdir() if p.name.endswith(ENTRY_SUFFIX)])

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[Entry | str | None]:
        """The entry at ``path`` while this process holds its lock; None when another
        process holds it, or it was sent and removed meanwhile; why, when it could not be
        read (it moved to ``rejected/``)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, OSError):
            yield None
            return
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield None
                    return
            if os.fstat(fd).st_nlink == 0:  # removed by whoever held the lock before
                yield None
                return
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read()
            try:
                entry = Entry.from_json(data)
            except (ValueError, TypeError, RecursionError):
                self._reject(path, "unreadable entry")
                yield "unreadable entry"
                return
            yield entry
        finally:
            os.close(fd)

    def _remove(self, path: Path, entry: Entry) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        for artifact in entry.artifacts:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dir / artifact["file"])
        fsync_dir(self.dir)

    def _reject(self, path: Path, why: str) -> None:
        rejected = private_dir(self.dir / "rejected")
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, rejected / path.name)
            # The reason is a help, the move is what counts: a full disk may refuse it.
            with contextlib.suppress(OSError):
                write_private(rejected / f"{path.name}.why", why.encode("utf-8"))

    def flush(
        self,
        client: Sender,
        *,
        url: str,
        tenant: str | None = None,
        project: str | None = None,
        visibility: str | None = None,
        deadline: float | None = None,
    ) -> Outcome:
        """Send every entry for the server at ``url`` and the scope ``client`` acts in
        (``tenant``, ``project``, ``visibility``: its settings), oldest first, until ``deadline``
        (``time.monotonic()``); entries for another server or scope are left for it.

        A task's turns keep their order: once an entry of a task is not sent (another
        process is sending it, or it failed), its later entries wait for the next flush."""
        from ..errors import ApiError, ClientError, ServerUnreachable

        outcome = Outcome()
        self.remove_stale_temps()
        waiting: set[tuple[str, str | None, str | None, str | None, str]] = set()  # held back
        for path in self.paths():
            if deadline is not None and time.monotonic() >= deadline:
                outcome.kept += 1
                continue
            with self._locked(path) as entry:
                if entry is None:
                    # Another process holds it (an entry is never changed: it reads whole).
                    held = _peek(path)
                    if held is not None:
                        waiting.add(held.task_key())
                    continue
                if isinstance(entry, str):
                    outcome.rejected += 1
                    outcome.rejections.append(f"{path.name}: {entry}")
                    continue
                if (entry.url.rstrip("/"), entry.tenant, entry.project, entry.visibility) != (
                    url.rstrip("/"),
                    tenant,
                    project,
                    visibility,
                ):
                    outcome.kept += 1
                    continue
                if entry.task_key() in waiting:
                    outcome.deferred += 1
                    continue
                try:
                    found = send(client, entry, spooled_uploads(entry, self.dir))
                except ServerUnreachable as exc:
                    outcome.kept += 1
                    outcome.unreachable = True
                    outcome.errors.append(str(exc))
                    deadline = time.monotonic()  # the rest would fail the same way
                    continue
                except ApiError as exc:
                    if exc.status in FINAL_STATUSES:
                        self._reject(path, f"{exc.status} {exc.message}")
                        outcome.rejected += 1
                        outcome.rejections.append(f"{path.name}: {exc.status} {exc.message}")
                    else:
                        outcome.kept += 1
                        waiting.add(entry.task_key())
                    outcome.errors.append(f"{exc.status} {exc.message}")
                    continue
                except (ClientError, RuntimeError) as exc:
                    outcome.kept += 1
                    waiting.add(entry.task_key())
                    outcome.errors.append(str(exc))
                    continue
                self._remove(path, entry)
                if found:
                    outcome.already += 1
                else:
                    outcome.sent += 1
        return outcome


def _peek(path: Path) -> Entry | None:
    try:
        return Entry.from_json(path.read_bytes())
    except (OSError, ValueError, TypeError, RecursionError):
        return None


def _created_at(path: Path) -> float:
    try:
        return float(json.loads(path.read_bytes()).get("created_at", 0.0))
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):
        return 0.0


def spooled_uploads(entry: Entry, directory: Path) -> list[Upload]:
    """The artifacts of a spooled entry, from their files beside it."""
    from ..models import Upload

    return [
        Upload(a["name"], directory / a["file"], a["content_type"])
        for a in entry.artifacts
        if (directory / a["file"]).is_file()
    ]


def send(client: Sender, entry: Entry, uploads: list[Upload]) -> bool:
    """Put ``entry``'s turn with ``uploads`` on the server, once; True when it was there
    already.

    A turn not there yet goes with its artifacts in one request (all or nothing); one that
    is there gets each artifact it lacks (what a cut delivery of the seed's requests, or a
    file spooled after, left out).
    """
    from ..errors import NotFound

    task_id = entry.task_id
    meta = {**entry.meta, RECORD_KEY: entry.record_id}

    def read_index() -> Index | None:
        try:
            return client.get_task(task_id)
        except NotFound:
            return None

    def put(index: Index | None, number: int) -> bool:
        # A turn that carries this entry's record id is this entry, sent before.
        turns = index.turns if index is not None else ()
        mine = [t for t in turns if t.meta.get(RECORD_KEY) == entry.record_id]
        if mine:
            names = set(mine[0].artifacts)
            for upload in uploads:
                if upload.name not in names:
                    client.put_artifact(
                        task_id,
                        mine[0].turn,
                        upload.name,
                        upload.source,
                        content_type=upload.content_type,
                    )
            return True
        client.put_turn(
            task_id,
            number,
            meta=meta,
            summary_md=entry.summary_md,
            if_none_match="*",
            artifacts=uploads,
        )
        return False

    return put_next_turn(task_id, read_index, put)
