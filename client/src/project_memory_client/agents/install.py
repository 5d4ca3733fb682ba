"""What ``agent install`` writes into a repository, and ``agent uninstall`` takes out again.

Claude Code (``claude-code``):
  ``.claude/settings.json`` (shared with the team): the hooks, SessionStart, Stop and
  PreCompact.
  ``.claude/settings.local.json`` (the user's own): the permission for the server's read
  tools (``mcp__project-memory__search`` ...; a write or a delete is still asked for) and the
  project's MCP server enabled (``enabledMcpjsonServers``); with ``--share-memory``, also
  ``autoMemoryDirectory``: Claude Code's memory folder, the one agents/shared_memory.py
  keeps in sync with a memory store (uninstall puts the value before back).
  Claude Code ignores permissions in a project's settings until the person trusts the
  folder, except in a ``settings.local.json`` that git does not track: install keeps it
  untracked (a line in ``.git/info/exclude`` when nothing ignores it yet). So ``claude`` and
  ``claude -p`` in the repository load the server, may call its tools and run the hooks,
  with no prompt and no flag.
  ``.mcp.json``: the server ``project-memory``, Streamable HTTP at
  ``${PROJECT_MEMORY_URL}/mcp`` with ``Authorization: Bearer ${PROJECT_MEMORY_TOKEN}``:
  Claude Code fills both in from the environment, so no secret is written.
Codex CLI (``codex``):
  ``.codex/config.toml``: ``[mcp_servers.project-memory]`` with ``bearer_token_env_var``,
  in a block marked as ours; ``.codex/hooks.json``: the same three hooks.
Cursor (``cursor``): ``.cursor/mcp.json``, the server with ``${env:PROJECT_MEMORY_TOKEN}``.

With ``auth="oauth"`` the server's entry is its URL and nothing else: no header, no token
variable. The agent then finds the server's OAuth metadata from its 401 and signs the person
in itself (``claude mcp login``, ``codex mcp login``, Cursor's MCP settings), keeping the
tokens in its own store. The hooks are the same either way: they record turns through the
REST API with the ``pm_`` token of the environment or the client's config file.

Whatever else those files hold is kept; installing twice changes nothing; uninstalling
removes exactly the entries install adds (and a file or directory it leaves empty).

A repository is whatever its authors committed, so install writes inside it and nowhere
else: no symbolic link is followed, every file is read and checked before any is written
(a file of the wrong shape leaves all of them as they were), each file keeps its mode (a new
one is 0600), and no user name or password of the URL is written.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .._files import fsync_dir

SERVER = "project-memory"
# The server's tools that only read (app/services/mcp/tools.py: read_only, no writes). Only
# these are allowed without asking: a delete, a rename or a write is the person's to approve.
READ_TOOLS = (
    "search",
    "read_digest",
    "list_tasks",
    "read_timeline",
    "read_task",
    "read_turn",
    "read_artifact",
)
PERMISSIONS = tuple(f"mcp__{SERVER}__{tool}" for tool in READ_TOOLS)
LEGACY_PERMISSION = f"mcp__{SERVER}"  # every tool of the server, as older installs allowed
API_PREFIX = "/sandbox/memory/v1"
HOOK_EVENTS = {
    "SessionStart": "session-start",
    "Stop": "stop",
    "PreCompact": "pre-compact",
    "UserPromptSubmit": "user-prompt-submit",
}
HOOK_TIMEOUT = 10  # seconds: the agent's own limit, far above the hook's
OURS = re.compile(
    r"(?:^|[/\s'\"])(?:project-memory|project_memory_client\.cli)['\"]?\s+agent hook "
)
TOML_BEGIN = "# >>> project-memory (agent install codex; agent uninstall codex removes it)"
TOML_END = "# <<< project-memory"
AGENTS = ("claude-code", "codex", "cursor")
# How the agent signs in to the MCP server: with the pm_ token it reads from the environment,
# or by OAuth, the agent's own flow against the server's metadata.
AUTHS = ("token", "oauth")
LOCAL_SETTINGS = ".claude/settings.local.json"
EXCLUDE_NOTE = (
    "# project-memory agent install: Claude Code honours this file's permissions while untracked"
)
EXCLUDE_LINE = "/" + LOCAL_SETTINGS


class InstallError(Exception):
    """A file cannot be merged (not valid JSON/TOML, of the wrong shape, a link, or holding a
    conflicting entry): nothing was changed."""


@dataclass
class Change:
    """What one install or uninstall did to the repository."""

    agent: str
    root: Path
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "root": str(self.root),
            "written": self.written,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "notes": self.notes,
            "warnings": self.warnings,
        }


def repo_root(start: Path) -> Path:
    """The git work tree ``start`` is in, else ``start`` itself."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=start,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return start
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else start


def executable() -> str:
    """How a hook command names this CLI: by its absolute path, so that it runs whatever
    PATH the agent has (a venv the agent's shell never activated is the common case); else
    this Python by its absolute path, with ``-m``.

    A link on the way (pipx's ``~/.local/bin/project-memory``) is kept as it is: it stays
    right when what it points to is upgraded."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    me = Path(os.path.abspath(argv0)) if argv0 else None
    if me is not None and me.name == "project-memory" and me.is_file():
        return shlex.quote(str(me))
    found = shutil.which("project-memory")
    if argv0 and found and Path(found).resolve() == Path(argv0).resolve():
        return shlex.quote(os.path.abspath(found))
    return f"{shlex.quote(os.path.abspath(sys.executable))} -m project_memory_client.cli"


# What a login shell has without the user's own environment: the agent may start hooks with
# little more (a desktop launcher, a service, an IDE).
LOGIN_SHELL = "/bin/sh"


def login_shell_problem(command: str, home: str | None = None) -> str | None:
    """Why ``command --version`` does not run in a plain login shell (``env -i``, HOME
    only), or None when it does."""
    env = {"HOME": home or os.path.expanduser("~"), "LANG": "C.UTF-8"}
    try:
        done = subprocess.run(
            [LOGIN_SHELL, "-lc", f"{command} --version"],
            env=env,
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{LOGIN_SHELL} could not run it: {exc}"
    if done.returncode == 0 and "project-memory" in done.stdout:
        return None
    why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return why[:300]


def hook_command(agent: str, event: str) -> str:
    suffix = " --agent codex" if agent == "codex" else ""
    return f"{executable()} agent hook {event}{suffix}"


# -- reading and writing inside the repository, and nowhere else ----------------------------
MAX_FILE_BYTES = 16 * 1024 * 1024  # a config file; anything larger is not one


def _kind(value: object) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _must(kind: type, value: object, where: str, rel: str) -> Any:
    """``value`` when it is a ``kind``; else InstallError naming the key and the file."""
    if not isinstance(value, kind):
        wanted = "an object" if kind is dict else "a list"
        raise InstallError(
            f"{rel}: {where} is {_kind(value)}, not {wanted}; fix it first, nothing was changed"
        )
    return value


def inside(root: Path, rel: str) -> Path:
    """``root/rel``, when no part of it that exists is a symbolic link, every directory on
    the way is one, and the file, if there, is a regular file; else InstallError.

    A repository is what someone committed: a ``.claude`` that links to the user's own
    ``~/.claude`` would make install rewrite the user's global settings. Nothing is followed.
    """
    path = root
    parts = Path(rel).parts
    for i, part in enumerate(parts):
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            break  # nothing below a missing directory exists either
        except OSError as exc:
            raise InstallError(f"{path}: {exc.strerror}; nothing was changed") from None
        if stat.S_ISLNK(st.st_mode):
            raise InstallError(
                f"{path} is a symbolic link: install writes inside the repository and follows"
                " no link (it could lead to your own settings); nothing was changed"
            )
        last = i == len(parts) - 1
        if not last and not stat.S_ISDIR(st.st_mode):
            raise InstallError(f"{path} is not a directory; nothing was changed")
        if last and not stat.S_ISREG(st.st_mode):
            raise InstallError(f"{path} is not a regular file; nothing was changed")
    return root.joinpath(*parts)


def _read(path: Path) -> bytes | None:
    """The bytes of ``path`` (checked by :func:`inside`), None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InstallError(f"{path}: {exc.strerror}; nothing was changed") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise InstallError(f"{path} is not a regular file; nothing was changed")
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise InstallError(f"{path} is larger than a config file can be; nothing was changed")
    return data


def _parse_json(data: bytes | None, path: Path) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        value = json.loads(data.decode("utf-8") or "{}")
    except RecursionError:
        raise InstallError(
            f"{path} is nested too deeply to be a settings file; nothing was changed"
        ) from None
    except ValueError as exc:
        raise InstallError(
            f"{path} is not valid JSON ({exc}); fix it first, nothing was changed"
        ) from None
    if not isinstance(value, dict):
        raise InstallError(f"{path} does not hold a JSON object; not touched")
    return value


def _load_json(path: Path) -> dict[str, Any] | None:
    return _parse_json(_read(path), path)


class JsonStyle:
    """How a JSON file is laid out, so that what install and uninstall write keeps the
    person's own layout: the indent (None: one line), the separators, whether non-ASCII is
    escaped, whether it ends with a newline. Keys keep their order (JSON objects load in
    order). A new file gets two spaces."""

    __slots__ = ("indent", "separators", "ascii", "newline")

    def __init__(
        self,
        indent: str | None = "  ",
        separators: tuple[str, str] = (",", ": "),
        ascii: bool = False,
        newline: bool = True,
    ) -> None:
        self.indent = indent
        self.separators = separators
        self.ascii = ascii
        self.newline = newline

    @classmethod
    def of(cls, text: str) -> JsonStyle:
        found = re.search(r"^[{\[][ \t]*\r?\n([ \t]+)\S", text)
        indent = found.group(1) if found else None
        if indent is None and re.search(r"\n[ \t]+\S", text):
            found = re.search(r"\n([ \t]+)\S", text)  # the first indented line
            indent = found.group(1) if found else None
        colon = ":" if re.search(r'":\S', text) and not re.search(r'":\s', text) else ": "
        comma = "," if indent is not None or re.search(r',["\[{0-9tfn-]', text) else ", "
        # Non-ASCII written as \u escapes, and none written as is: keep escaping it.
        ascii = bool(re.search(r"\\u(?!00[0-7])[0-9a-fA-F]{4}", text)) and text.isascii()
        return cls(indent, (comma, colon), ascii, text.endswith("\n"))

    def dump(self, value: dict[str, Any]) -> bytes:
        text = json.dumps(
            value, indent=self.indent, separators=self.separators, ensure_ascii=self.ascii
        )
        return (text + ("\n" if self.newline else "")).encode("utf-8")


@dataclass
class _Write:
    rel: str
    path: Path
    data: bytes | None  # None: the file is removed
    mode: int  # the file's own, or NEW_FILE_MODE
    takes_out: bool = False  # a write that removes our lines: reported as removed
    before: bytes | None = None  # the file as it was (for the record of what install did)
    recorded: bool = False  # install records it, uninstall forgets it


class Records:
    """What install found in each file it changed, kept in the state directory (mode 0700;
    one file each, 0600: a settings file may hold secrets), so that uninstall can give the
    file back byte for byte, the person's own layout included (inline lists, their indent,
    their key order). Only while the file is as install left it, and only when those bytes
    mean what taking our entries out means; otherwise uninstall takes the entries out and
    writes the file in its own layout as far as it can read it (JsonStyle)."""

    def __init__(self) -> None:
        from .spool import state_dir

        self.dir = state_dir() / "installs"

    def _path(self, path: Path) -> Path:
        return self.dir / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json")

    def get(self, path: Path) -> dict[str, Any] | None:
        try:
            fd = os.open(self._path(path), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                value = json.loads(fh.read(2 * MAX_FILE_BYTES))
        except (OSError, ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) and value.get("path") == str(path) else None

    def original(self, path: Path, now: bytes | None) -> tuple[bool, bytes | None]:
        """(True, the bytes before install) when ``path`` is as install left it."""
        found = self.get(path)
        if found is None or now is None or found.get("after") != _digest(now):
            return False, None
        before = found.get("before")
        return True, (base64.b64decode(before) if isinstance(before, str) else None)

    def keep(self, path: Path, before: bytes | None, after: bytes) -> None:
        from .spool import private_dir, write_private

        known, first = self.original(path, before)
        original = first if known else before
        value = {
            "path": str(path),
            "before": None if original is None else base64.b64encode(original).decode(),
            "after": _digest(after),
        }
        with contextlib.suppress(OSError):
            private_dir(self.dir)
            write_private(self._path(path), json.dumps(value).encode())

    def forget(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self._path(path))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


NEW_FILE_MODE = 0o600  # a new file may come to hold a secret (an env block, a header)
_REMOVE = b"\x00remove"  # what _restored gives for "the file was not there before"


class Plan:
    """Every file an install or uninstall changes, read and checked first and written last,
    all of them or none: a file that cannot be merged leaves every file as it was."""

    def __init__(self, root: Path, change: Change, *, installing: bool) -> None:
        self.root = root
        self.change = change
        self.installing = installing
        self.records = Records()
        self.writes: list[_Write] = []

    def _restored(self, path: Path, raw: bytes | None, clean: Callable[[bytes], bool]) -> Any:
        """What uninstall writes back: the bytes install found (_REMOVE: there was no file),
        when the file is as install left it and those bytes hold nothing of ours (``clean``:
        an older install's entries are not brought back); else None."""
        if self.installing:
            return None
        known, before = self.records.original(path, raw)
        if not known:
            return None
        if before is None:
            return _REMOVE
        try:
            return before if clean(before) else None
        except (ValueError, RecursionError, InstallError):
            return None

    def _mode(self, path: Path) -> int:
        try:
            return stat.S_IMODE(os.lstat(path).st_mode)
        except FileNotFoundError:
            return NEW_FILE_MODE

    def json(self, rel: str, edit: Callable[[dict[str, Any], str], dict[str, Any]]) -> None:
        """Merge ``edit`` into the JSON object at ``rel`` (a file left empty is removed)."""
        path = inside(self.root, rel)
        raw = _read(path)
        before = _parse_json(raw, path)
        style = JsonStyle.of(raw.decode("utf-8")) if raw and before else JsonStyle()
        current = json.loads(json.dumps(before or {}))
        after = edit(current, rel)
        if after == (before or {}) and (before is not None or not after):
            self.change.unchanged.append(rel)
            return
        if not after and before is None:
            return
        data = None if not after else style.dump(after)

        def clean(old: bytes) -> bool:
            value = _parse_json(old, path) or {}
            return edit(json.loads(json.dumps(value)), rel) == value

        restored = self._restored(path, raw, clean)
        if restored is not None:
            data = None if restored is _REMOVE else restored
        self.writes.append(_Write(rel, path, data, self._mode(path), before=raw, recorded=True))

    def text(self, rel: str, edit: Callable[[str | None], str | None]) -> None:
        """Replace the text at ``rel`` with ``edit(text)`` (None: remove the file)."""
        path = inside(self.root, rel)
        raw = _read(path)
        try:
            before = None if raw is None else raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InstallError(f"{path} is not UTF-8 text; nothing was changed") from None
        after = edit(before)
        if after == before:
            if before is not None:
                self.change.unchanged.append(rel)
            return
        data = None if after is None else after.encode("utf-8")
        restored = self._restored(path, raw, lambda old: edit(old.decode("utf-8")) == old.decode())
        if restored is not None:
            data = None if restored is _REMOVE else restored
        self.writes.append(_Write(rel, path, data, self._mode(path), before=raw, recorded=True))

    def add(self, rel: str, path: Path, data: bytes, *, takes_out: bool = False) -> None:
        """A file outside the checked paths (git's own exclude file): not a link either."""
        if path.is_symlink() or path.parent.is_symlink():
            raise InstallError(f"{path} is a symbolic link; nothing was changed")
        self.writes.append(_Write(rel, path, data, self._mode(path), takes_out))

    def commit(self) -> Change:
        """Write every planned file: each to a temp file beside it first, then all renamed.
        A failure before the renames leaves every file as it was."""
        staged: list[tuple[_Write, Path]] = []
        made: list[Path] = []
        try:
            for write in self.writes:
                if write.data is None:
                    continue
                made += _make_dirs(self.root, write.path.parent)
                staged.append((write, _stage(write.path, write.data, write.mode)))
        except OSError as exc:
            for _, tmp in staged:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            for directory in reversed(made):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise InstallError(
                f"cannot write {exc.filename or 'a file'}: {exc.strerror}; nothing was changed"
            ) from None
        for write, tmp in staged:
            os.replace(tmp, write.path)
            with contextlib.suppress(OSError):
                fsync_dir(write.path.parent)
            (self.change.removed if write.takes_out else self.change.written).append(write.rel)
        for write in self.writes:
            if write.recorded and self.installing and write.data is not None:
                self.records.keep(write.path, write.before, write.data)
            elif write.recorded and not self.installing:
                self.records.forget(write.path)
        for write in self.writes:
            if write.data is not None:
                continue
            with contextlib.suppress(FileNotFoundError):
                write.path.unlink()
            self.change.removed.append(write.rel)
            parent = write.path.parent
            if parent != self.root and self.root in parent.parents:
                with contextlib.suppress(OSError):  # not empty: kept
                    parent.rmdir()
        return self.change


def _make_dirs(root: Path, directory: Path) -> list[Path]:
    """Create ``directory`` (under ``root``) and its missing parents; those it created."""
    missing = []
    while directory != root and not os.path.lexists(directory):
        missing.append(directory)
        directory = directory.parent
    made = []
    for path in reversed(missing):
        os.mkdir(path)
        made.append(path)
    return made


def _stage(path: Path, data: bytes, mode: int) -> Path:
    tmp = path.with_name(f".tmp-pm-{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)  # exactly the old file's mode, whatever the umask
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


# -- the entries ------------------------------------------------------------------------------
def _add_hooks(settings: dict[str, Any], agent: str, rel: str) -> dict[str, Any]:
    hooks = _must(dict, settings.setdefault("hooks", {}), "hooks", rel)
    for event, name in HOOK_EVENTS.items():
        groups = _must(list, hooks.setdefault(event, []), f"hooks.{event}", rel)
        for i, group in enumerate(groups):
            _must(dict, group, f"hooks.{event}[{i}]", rel)
            _must(list, group.get("hooks", []), f"hooks.{event}[{i}].hooks", rel)
        command = hook_command(agent, name)
        present = any(
            h.get("command") == command
            for g in groups
            for h in g.get("hooks", [])
            if isinstance(h, dict)
        )
        if not present:
            _drop_ours(groups)  # an older entry of ours (another path): replaced
            groups.append(
                {"hooks": [{"type": "command", "command": command, "timeout": HOOK_TIMEOUT}]}
            )
    return settings


def _drop_ours(groups: list[Any]) -> bool:
    """Take our hook entries out of ``groups`` (and a group they leave empty); whether any
    was there."""
    dropped = False
    for group in list(groups):
        if not isinstance(group, dict) or not isinstance(group.get("hooks"), list):
            continue
        kept = [
            h
            for h in group["hooks"]
            if not (isinstance(h, dict) and OURS.search(str(h.get("command", ""))))
        ]
        if len(kept) == len(group["hooks"]):
            continue
        dropped = True
        group["hooks"] = kept
        if not kept:
            groups.remove(group)
    return dropped


def _remove_hooks(settings: dict[str, Any], rel: str = "") -> dict[str, Any]:
    hooks = settings.get("hooks")
    if isinstance(hooks, dict):
        dropped = False
        for event in HOOK_EVENTS:
            groups = hooks.get(event)
            # A list the person left empty stays; one we emptied goes.
            if isinstance(groups, list) and _drop_ours(groups):
                dropped = True
                if not groups:
                    del hooks[event]
        if dropped and not hooks:
            del settings["hooks"]
    return settings


def _add_to_list(container: dict[str, Any], key: str, value: str, where: str, rel: str) -> None:
    items = _must(list, container.setdefault(key, []), where, rel)
    if value not in items:
        items.append(value)


def _remove_from_list(container: dict[str, Any], key: str, value: str) -> None:
    items = container.get(key)
    if isinstance(items, list) and value in items:
        items.remove(value)
        if not items:
            del container[key]


def _add_permissions(value: dict[str, Any], rel: str) -> dict[str, Any]:
    permissions = _must(dict, value.setdefault("permissions", {}), "permissions", rel)
    allow = _must(list, permissions.setdefault("allow", []), "permissions.allow", rel)
    if LEGACY_PERMISSION in allow:
        allow.remove(LEGACY_PERMISSION)  # an older install allowed every tool
    for permission in PERMISSIONS:
        _add_to_list(permissions, "allow", permission, "permissions.allow", rel)
    _add_to_list(value, "enabledMcpjsonServers", SERVER, "enabledMcpjsonServers", rel)
    return value


def _remove_permissions(value: dict[str, Any], rel: str = "") -> dict[str, Any]:
    permissions = value.get("permissions")
    if isinstance(permissions, dict):
        for permission in (*PERMISSIONS, LEGACY_PERMISSION):
            _remove_from_list(permissions, "allow", permission)
        if not permissions:
            del value["permissions"]
    _remove_from_list(value, "enabledMcpjsonServers", SERVER)
    return value


MEMORY_SETTING = "autoMemoryDirectory"


def _set_memory_dir(value: dict[str, Any], folder: str) -> dict[str, Any]:
    value[MEMORY_SETTING] = folder
    return value


def _unset_memory_dir(value: dict[str, Any], ours: str, before: tuple[bool, Any]) -> dict[str, Any]:
    """The setting as it was before install, while it is the folder install wrote (one the
    person set since is theirs)."""
    if value.get(MEMORY_SETTING) == ours:
        if before[0]:
            value[MEMORY_SETTING] = before[1]
        else:
            del value[MEMORY_SETTING]
    return value


def _mcp_entry(kind: str, url: str | None, auth: str) -> dict[str, Any]:
    if kind == "stdio":
        parts = shlex.split(executable())
        return {"type": "stdio", "command": parts[0], "args": [*parts[1:], "mcp"]}
    # The base URL as it is now, normalised (base_url): not ${PROJECT_MEMORY_URL}, which
    # Claude Code expands as it finds it (with the API's path, a trailing slash ...).
    if auth == "oauth":
        # Any Authorization header would be sent instead of the agent's own OAuth token.
        return {"type": "http", "url": f"{url}/mcp"}
    return {
        "type": "http",
        "url": f"{url}/mcp",
        "headers": {"Authorization": "Bearer ${PROJECT_MEMORY_TOKEN}"},
    }


def _set_server(config: dict[str, Any], entry: dict[str, Any], rel: str) -> dict[str, Any]:
    servers = _must(dict, config.setdefault("mcpServers", {}), "mcpServers", rel)
    if SERVER in servers:
        _must(dict, servers[SERVER], f"mcpServers.{SERVER}", rel)
    servers[SERVER] = entry
    return config


def _remove_server(config: dict[str, Any], rel: str = "") -> dict[str, Any]:
    servers = config.get("mcpServers")
    if isinstance(servers, dict) and isinstance(servers.get(SERVER), dict):
        del servers[SERVER]
        if not servers:
            del config["mcpServers"]
    return config


def base_url(url: str, change: Change | None = None) -> str:
    """The server's base URL as written into a repository's files: ``scheme://host[:port]``
    and its path, without the API's path, a trailing slash, a query or a fragment, and
    without a user name or password, which files that may be committed must not hold."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise InstallError("the server URL is not a URL: give http(s)://host[:port]") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InstallError("the server URL must be http(s)://host[:port]")
    if (parts.username is not None or parts.password is not None) and change is not None:
        change.notes.append(
            "The server URL holds a user name and password: they were left out of what was"
            " written (these files may be committed)."
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{port}" if port is not None else host
    path = parts.path.rstrip("/")
    if path.endswith(API_PREFIX):
        path = path[: -len(API_PREFIX)].rstrip("/")
    return urlunsplit((parts.scheme, netloc, path, "", ""))


# -- the three agents -------------------------------------------------------------------------
# Said after an OAuth install: the MCP sign-in is the agent's, the hooks' token is not.
HOOKS_NOTE = (
    " The hooks still record turns with the pm_ token of PROJECT_MEMORY_TOKEN or the client's"
    " config file: OAuth signs in the MCP server only."
)


def install(
    agent: str,
    root: Path,
    *,
    url: str | None,
    transport: str = "http",
    auth: str = "token",
    memory_dir: str | None = None,
) -> Change:
    """Install ``agent``'s entries into the repository at ``root``: every file or none.

    ``memory_dir`` (claude-code): Claude Code's auto-memory folder, the one the hooks keep in
    sync with a memory store (agents/shared_memory.py), as ``autoMemoryDirectory`` in
    ``settings.local.json``: the user's own, and a path of theirs."""
    if auth not in AUTHS:
        raise InstallError(f"unknown auth {auth!r}: one of {', '.join(AUTHS)}")
    if auth == "oauth" and transport != "http":
        raise InstallError(
            "--auth oauth is for the HTTP transport: the stdio relay (project-memory mcp)"
            " signs in with the pm_ token"
        )
    change = Change(agent, root)
    plan = Plan(root, change, installing=True)
    base = base_url(url, change) if url else None
    if agent == "claude-code":
        if transport == "http" and not base:
            raise InstallError(
                "Claude Code needs the server's URL written in .mcp.json: give --url or"
                " PROJECT_MEMORY_URL"
            )
        plan.json(".claude/settings.json", lambda v, rel: _add_hooks(v, agent, rel))
        if memory_dir is None:
            plan.json(LOCAL_SETTINGS, _add_permissions)
        else:
            plan.json(
                LOCAL_SETTINGS, lambda v, rel: _set_memory_dir(_add_permissions(v, rel), memory_dir)
            )
        _keep_untracked(root, plan)
        entry = _mcp_entry(transport, base, auth)
        plan.json(".mcp.json", lambda v, rel: _set_server(v, entry, rel))
        if auth == "oauth":
            change.notes.append(
                f"Claude Code signs in to the MCP server itself (OAuth): run `claude mcp login"
                f" {SERVER}`, or /mcp in claude, once; its tokens stay in Claude Code's own"
                " store." + HOOKS_NOTE
            )
        elif transport == "http":
            change.notes.append(
                "Claude Code reads PROJECT_MEMORY_TOKEN from the environment when it starts:"
                " export it in the shell that runs claude."
            )
    elif agent == "codex":
        if not base:
            raise InstallError("Codex needs the server's URL written in its config: give --url")
        plan.text(".codex/config.toml", lambda text: _with_codex_block(text, base, root, auth))
        plan.json(".codex/hooks.json", lambda v, rel: _add_hooks(v, agent, rel))
        trust = (
            "Codex loads a project's .codex/ only once the project is trusted, and runs a new"
            " or changed hook only once it is trusted: run `codex` here and trust the project"
            " and the hooks (/hooks), or `codex exec --trust` once."
        )
        if auth == "oauth":
            change.notes.append(
                f"{trust} Then sign Codex in to the MCP server (OAuth), here, once: `codex mcp"
                f" login {SERVER}`." + HOOKS_NOTE
            )
        else:
            change.notes.append(f"{trust} PROJECT_MEMORY_TOKEN must be in Codex's environment.")
    elif agent == "cursor":
        if not base:
            raise InstallError("Cursor needs the server's URL written in its config: give --url")
        entry = {"url": f"{base}/mcp"}
        if auth == "token":
            entry["headers"] = {"Authorization": "Bearer ${env:PROJECT_MEMORY_TOKEN}"}
        else:
            change.notes.append(
                f"Cursor signs in to the MCP server itself (OAuth): log in to {SERVER} in its"
                " MCP settings, once."
            )
        plan.json(".cursor/mcp.json", lambda v, rel: _set_server(v, entry, rel))
    else:
        raise InstallError(f"unknown agent {agent!r}: one of {', '.join(AGENTS)}")
    done = plan.commit()
    if agent in ("claude-code", "codex"):
        problem = login_shell_problem(executable())
        if problem is not None:
            done.warnings.append(
                f"the hooks' command ({executable()}) does not run from a plain login shell"
                f" ({problem}): an agent started without your shell's environment would not"
                " run it; install the client where it stays (pipx, or a venv you keep)"
            )
    return done


def uninstall(
    agent: str, root: Path, *, memory: tuple[str, tuple[bool, Any]] | None = None
) -> Change:
    """Take out exactly what install put in (a file or directory left empty goes too).

    ``memory``: the ``autoMemoryDirectory`` install wrote, and whether the setting had a
    value before (and which): put back, or taken out."""
    change = Change(agent, root)
    plan = Plan(root, change, installing=False)
    if agent == "claude-code":
        plan.json(".claude/settings.json", _remove_hooks)
        if memory is None:
            plan.json(LOCAL_SETTINGS, _remove_permissions)
        else:
            plan.json(
                LOCAL_SETTINGS, lambda v, rel: _unset_memory_dir(_remove_permissions(v), *memory)
            )
        _forget_untracked(root, plan)
        plan.json(".mcp.json", _remove_server)
    elif agent == "codex":
        plan.text(".codex/config.toml", _without_codex_block)
        plan.json(".codex/hooks.json", _remove_hooks)
    elif agent == "cursor":
        plan.json(".cursor/mcp.json", _remove_server)
    else:
        raise InstallError(f"unknown agent {agent!r}: one of {', '.join(AGENTS)}")
    return plan.commit()


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None


def _exclude_file(root: Path) -> Path | None:
    found = _git(root, "rev-parse", "--git-path", "info/exclude")
    if found is None or found.returncode != 0 or not found.stdout.strip():
        return None
    path = Path(found.stdout.strip())
    return path if path.is_absolute() else root / path


def _keep_untracked(root: Path, plan: Plan) -> None:
    """Keep .claude/settings.local.json out of git, where Claude Code honours it."""
    ignored = _git(root, "check-ignore", "-q", LOCAL_SETTINGS)
    exclude = _exclude_file(root)
    if ignored is None or ignored.returncode != 1 or exclude is None:
        return  # ignored already (0), or not a git work tree (128)
    raw = _read(exclude) if not exclude.is_symlink() else None
    text = raw.decode("utf-8", "replace") if raw is not None else ""
    if EXCLUDE_LINE in text.splitlines():
        return
    tail = "" if not text or text.endswith("\n") else "\n"
    data = f"{text}{tail}{EXCLUDE_NOTE}\n{EXCLUDE_LINE}\n".encode()
    plan.add("(git) info/exclude: /" + LOCAL_SETTINGS, exclude, data)


def _forget_untracked(root: Path, plan: Plan) -> None:
    exclude = _exclude_file(root)
    if exclude is None or exclude.is_symlink() or not exclude.is_file():
        return
    raw = _read(exclude)
    lines = (raw or b"").decode("utf-8", "replace").splitlines()
    if EXCLUDE_LINE not in lines:
        return
    kept = [line for line in lines if line not in (EXCLUDE_NOTE, EXCLUDE_LINE)]
    data = ("\n".join(kept) + ("\n" if kept else "")).encode()
    plan.add("(git) info/exclude: /" + LOCAL_SETTINGS, exclude, data, takes_out=True)


def _toml_block(url: str, auth: str = "token") -> str:
    token = 'bearer_token_env_var = "PROJECT_MEMORY_TOKEN"\n' if auth == "token" else ""
    return (
        f"{TOML_BEGIN}\n"
        f"[mcp_servers.{SERVER}]\n"
        f"url = {json.dumps(url.rstrip('/') + '/mcp')}\n"
        f"{token}"
        f"{TOML_END}\n"
    )


def _parse_toml(text: str, path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        parsed: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InstallError(
            f"{path} is not valid TOML ({exc}); fix it first, nothing was changed"
        ) from None
    return parsed


def _without_block(text: str) -> str:
    pattern = re.compile(rf"\n?{re.escape(TOML_BEGIN)}\n.*?{re.escape(TOML_END)}\n?", re.S)
    return pattern.sub("\n", text).strip("\n")


def _with_codex_block(before: str | None, url: str, root: Path, auth: str = "token") -> str:
    path = root / ".codex" / "config.toml"
    rest = _without_block(before or "")
    servers = _parse_toml(rest, path).get("mcp_servers", {})
    if not isinstance(servers, dict):
        raise InstallError(
            f".codex/config.toml: mcp_servers is {_kind(servers)}, not a table; fix it first,"
            " nothing was changed"
        )
    if SERVER in servers:
        raise InstallError(
            f"{path} already defines [mcp_servers.{SERVER}] outside our block; not touched"
        )
    after = (rest + "\n\n" if rest else "") + _toml_block(url, auth)
    _parse_toml(after, path)
    return after


def _without_codex_block(before: str | None) -> str | None:
    if before is None or TOML_BEGIN not in before:
        return before
    after = _without_block(before)
    return after + "\n" if after.strip() else None


def installed(agent: str, root: Path) -> dict[str, bool]:
    """Which of the agent's entries are in the repository (a link is not followed: what it
    leads to is not this repository's)."""

    def load(rel: str) -> dict[str, Any]:
        try:
            return _load_json(inside(root, rel)) or {}
        except InstallError:
            return {}

    def has_hooks(rel: str) -> bool:
        found = load(rel).get("hooks")
        hooks: dict[str, Any] = found if isinstance(found, dict) else {}

        def ours(event: str) -> bool:
            groups = hooks.get(event)
            return any(
                OURS.search(str(h.get("command", "")))
                for g in (groups if isinstance(groups, list) else [])
                if isinstance(g, dict) and isinstance(g.get("hooks"), list)
                for h in g["hooks"]
                if isinstance(h, dict)
            )

        return all(ours(event) for event in HOOK_EVENTS)

    def has_server(rel: str) -> bool:
        servers = load(rel).get("mcpServers")
        return isinstance(servers, dict) and isinstance(servers.get(SERVER), dict)

    if agent == "claude-code":
        permissions = load(LOCAL_SETTINGS).get("permissions")
        allowed = permissions.get("allow") if isinstance(permissions, dict) else None
        return {
            "hooks": has_hooks(".claude/settings.json"),
            "mcp": has_server(".mcp.json"),
            "permission": isinstance(allowed, list) and all(p in allowed for p in PERMISSIONS),
        }
    if agent == "codex":
        try:
            raw = _read(inside(root, ".codex/config.toml")) or b""
        except InstallError:
            raw = b""
        return {
            "hooks": has_hooks(".codex/hooks.json"),
            "mcp": TOML_BEGIN in raw.decode("utf-8", "replace"),
        }
    return {"mcp": has_server(".cursor/mcp.json")}


def server_entry(root: Path, rel: str) -> dict[str, Any] | None:
    """Our server's entry in the JSON MCP config ``rel`` under ``root``; None when there is
    none, or the file cannot be read as one."""
    try:
        value = _load_json(inside(root, rel)) or {}
    except InstallError:
        return None
    servers = value.get("mcpServers")
    entry = servers.get(SERVER) if isinstance(servers, dict) else None
    return entry if isinstance(entry, dict) else None


def mcp_auth(agent: str, root: Path) -> str | None:
    """How the agent's MCP entry in the repository signs in: ``token`` (a header or a token
    variable), ``oauth`` (an HTTP entry with neither: the agent's own sign-in), ``stdio``
    (the relay, with the client's token), or None when there is no entry of ours."""
    if agent == "codex":
        try:
            path = inside(root, ".codex/config.toml")
            text = (_read(path) or b"").decode("utf-8")
            servers = _parse_toml(text, path).get("mcp_servers")
        except (InstallError, UnicodeDecodeError):
            return None
        table = servers.get(SERVER) if isinstance(servers, dict) else None
        if TOML_BEGIN not in text or not isinstance(table, dict):
            return None
        return "token" if table.get("bearer_token_env_var") else "oauth"
    rel = ".mcp.json" if agent == "claude-code" else ".cursor/mcp.json"
    entry = server_entry(root, rel)
    if entry is None:
        return None
    if entry.get("command"):
        return "stdio"
    headers = entry.get("headers")
    named = [str(k).lower() for k in headers] if isinstance(headers, dict) else []
    # The server takes its token in either header.
    return "token" if {"authorization", "x-api-key"} & set(named) else "oauth"
