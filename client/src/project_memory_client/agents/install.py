"""What ``agent install`` writes into a repository, and ``agent uninstall`` takes out again.

Claude Code (``claude-code``):
  ``.claude/settings.json`` (shared with the team): the hooks, SessionStart, Stop and
  PreCompact.
  ``.claude/settings.local.json`` (the user's own): the permission for the server's tools
  (``mcp__project-memory``) and the project's MCP server enabled (``enabledMcpjsonServers``).
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

Whatever else those files hold is kept; installing twice changes nothing; uninstalling
removes exactly the entries install adds (and a file or directory it leaves empty).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .spool import write_private

SERVER = "project-memory"
TOOLS_PERMISSION = f"mcp__{SERVER}"
HOOK_EVENTS = {"SessionStart": "session-start", "Stop": "stop", "PreCompact": "pre-compact"}
HOOK_TIMEOUT = 10  # seconds: the agent's own limit, far above the hook's
OURS = re.compile(
    r"(?:^|[/\s'\"])(?:project-memory|project_memory_client\.cli)['\"]?\s+agent hook "
)
TOML_BEGIN = "# >>> project-memory (agent install codex; agent uninstall codex removes it)"
TOML_END = "# <<< project-memory"
AGENTS = ("claude-code", "codex", "cursor")
LOCAL_SETTINGS = ".claude/settings.local.json"
EXCLUDE_NOTE = (
    "# project-memory agent install: Claude Code honours this file's permissions while untracked"
)
EXCLUDE_LINE = "/" + LOCAL_SETTINGS


class InstallError(Exception):
    """A file cannot be merged (it is not valid JSON/TOML, or holds a conflicting entry)."""


@dataclass
class Change:
    """What one install or uninstall did to the repository."""

    agent: str
    root: Path
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "root": str(self.root),
            "written": self.written,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "notes": self.notes,
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
    """How a hook command names this CLI: ``project-memory`` when that is what PATH finds,
    else its full path (or ``python -m``)."""
    me = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    found = shutil.which("project-memory")
    if found and me is not None and Path(found).resolve() == me:
        return "project-memory"
    if me is not None and me.name == "project-memory" and me.is_file():
        return shlex.quote(str(me))
    return f"{shlex.quote(sys.executable)} -m project_memory_client.cli"


def hook_command(agent: str, event: str) -> str:
    suffix = " --agent codex" if agent == "codex" else ""
    return f"{executable()} agent hook {event}{suffix}"


# -- JSON files -----------------------------------------------------------------------------
def _load_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    if path.is_symlink() or not path.is_file():
        raise InstallError(f"{path} is not a regular file; not touched")
    try:
        value = json.loads(path.read_text(encoding="utf-8") or "{}")
    except ValueError as exc:
        raise InstallError(
            f"{path} is not valid JSON ({exc}); fix it first, nothing was changed"
        ) from None
    if not isinstance(value, dict):
        raise InstallError(f"{path} does not hold a JSON object; not touched")
    return value


def _save(path: Path, value: dict[str, Any] | None, change: Change) -> None:
    rel = str(path.relative_to(change.root))
    if value is None or value == {}:
        if path.exists():
            path.unlink()
            change.removed.append(rel)
            parent = path.parent
            if parent != change.root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(value, indent=2, ensure_ascii=False) + "\n"
    write_private(path, text.encode("utf-8"))
    os.chmod(path, 0o644)  # shared with the repository, unlike the spool
    change.written.append(rel)


def _edit_json(
    path: Path, change: Change, edit: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    before = _load_json(path)
    current = json.loads(json.dumps(before or {}))
    after = edit(current)
    if after == (before or {}) and (before is not None or not after):
        change.unchanged.append(str(path.relative_to(change.root)))
        return
    _save(path, after, change)


def _add_hooks(settings: dict[str, Any], agent: str) -> dict[str, Any]:
    hooks = settings.setdefault("hooks", {})
    for event, name in HOOK_EVENTS.items():
        groups = hooks.setdefault(event, [])
        command = hook_command(agent, name)
        present = any(
            h.get("command") == command
            for g in groups
            if isinstance(g, dict)
            for h in g.get("hooks", [])
            if isinstance(h, dict)
        )
        if not present:
            _drop_ours(groups)  # an older entry of ours (another path): replaced
            groups.append(
                {"hooks": [{"type": "command", "command": command, "timeout": HOOK_TIMEOUT}]}
            )
    return settings


def _drop_ours(groups: list[Any]) -> None:
    for group in list(groups):
        if not isinstance(group, dict) or not isinstance(group.get("hooks"), list):
            continue
        group["hooks"] = [
            h
            for h in group["hooks"]
            if not (isinstance(h, dict) and OURS.search(str(h.get("command", ""))))
        ]
        if not group["hooks"]:
            groups.remove(group)


def _remove_hooks(settings: dict[str, Any]) -> dict[str, Any]:
    hooks = settings.get("hooks")
    if isinstance(hooks, dict):
        for event in HOOK_EVENTS:
            groups = hooks.get(event)
            if isinstance(groups, list):
                _drop_ours(groups)
                if not groups:
                    del hooks[event]
        if not hooks:
            del settings["hooks"]
    return settings


def _add_to_list(container: dict[str, Any], key: str, value: str) -> None:
    items = container.setdefault(key, [])
    if value not in items:
        items.append(value)


def _remove_from_list(container: dict[str, Any], key: str, value: str) -> None:
    items = container.get(key)
    if isinstance(items, list) and value in items:
        items.remove(value)
        if not items:
            del container[key]


def _mcp_entry(kind: str, url: str | None) -> dict[str, Any]:
    if kind == "stdio":
        parts = shlex.split(executable())
        return {"type": "stdio", "command": parts[0], "args": [*parts[1:], "mcp"]}
    # ${VAR:-default}: the URL known at install time, unless the environment names another.
    base = f"${{PROJECT_MEMORY_URL:-{url.rstrip('/')}}}" if url else "${PROJECT_MEMORY_URL}"
    return {
        "type": "http",
        "url": f"{base}/mcp",
        "headers": {"Authorization": "Bearer ${PROJECT_MEMORY_TOKEN}"},
    }


def _set_server(config: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    config.setdefault("mcpServers", {})[SERVER] = entry
    return config


def _remove_server(config: dict[str, Any]) -> dict[str, Any]:
    servers = config.get("mcpServers")
    if isinstance(servers, dict) and SERVER in servers:
        del servers[SERVER]
        if not servers:
            del config["mcpServers"]
    return config


# -- the three agents -------------------------------------------------------------------------
def install(agent: str, root: Path, *, url: str | None, transport: str = "http") -> Change:
    change = Change(agent, root)
    if agent == "claude-code":

        def personal(value: dict[str, Any]) -> dict[str, Any]:
            _add_to_list(value.setdefault("permissions", {}), "allow", TOOLS_PERMISSION)
            _add_to_list(value, "enabledMcpjsonServers", SERVER)
            return value

        _edit_json(root / ".claude" / "settings.json", change, lambda v: _add_hooks(v, agent))
        _edit_json(root / LOCAL_SETTINGS, change, personal)
        _keep_untracked(root, change)
        entry = _mcp_entry(transport, url)
        _edit_json(root / ".mcp.json", change, lambda v: _set_server(v, entry))
        if transport == "http":
            change.notes.append(
                "Claude Code reads PROJECT_MEMORY_TOKEN (and PROJECT_MEMORY_URL, if set) from"
                " the environment when it starts: export them in the shell that runs claude."
            )
    elif agent == "codex":
        if not url:
            raise InstallError("Codex needs the server's URL written in its config: give --url")
        _install_codex_toml(root / ".codex" / "config.toml", url, change)
        _edit_json(root / ".codex" / "hooks.json", change, lambda v: _add_hooks(v, agent))
        change.notes.append(
            "Codex loads a project's .codex/ only once the project is trusted, and runs a new"
            " or changed hook only once it is trusted: run `codex` here and trust the project"
            " and the hooks (/hooks), or `codex exec --trust` once. PROJECT_MEMORY_TOKEN must"
            " be in Codex's environment."
        )
    elif agent == "cursor":
        if not url:
            raise InstallError("Cursor needs the server's URL written in its config: give --url")
        entry = {
            "url": f"{url.rstrip('/')}/mcp",
            "headers": {"Authorization": "Bearer ${env:PROJECT_MEMORY_TOKEN}"},
        }
        _edit_json(root / ".cursor" / "mcp.json", change, lambda v: _set_server(v, entry))
    else:
        raise InstallError(f"unknown agent {agent!r}: one of {', '.join(AGENTS)}")
    return change


def uninstall(agent: str, root: Path) -> Change:
    change = Change(agent, root)
    if agent == "claude-code":

        def personal(value: dict[str, Any]) -> dict[str, Any]:
            permissions = value.get("permissions")
            if isinstance(permissions, dict):
                _remove_from_list(permissions, "allow", TOOLS_PERMISSION)
                if not permissions:
                    del value["permissions"]
            _remove_from_list(value, "enabledMcpjsonServers", SERVER)
            return value

        _edit_json(root / ".claude" / "settings.json", change, _remove_hooks)
        _edit_json(root / LOCAL_SETTINGS, change, personal)
        _forget_untracked(root, change)
        _edit_json(root / ".mcp.json", change, _remove_server)
    elif agent == "codex":
        _uninstall_codex_toml(root / ".codex" / "config.toml", change)
        _edit_json(root / ".codex" / "hooks.json", change, _remove_hooks)
    elif agent == "cursor":
        _edit_json(root / ".cursor" / "mcp.json", change, _remove_server)
    else:
        raise InstallError(f"unknown agent {agent!r}: one of {', '.join(AGENTS)}")
    return change


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


def _keep_untracked(root: Path, change: Change) -> None:
    """Keep .claude/settings.local.json out of git, where Claude Code honours it."""
    ignored = _git(root, "check-ignore", "-q", LOCAL_SETTINGS)
    exclude = _exclude_file(root)
    if ignored is None or ignored.returncode != 1 or exclude is None:
        return  # ignored already (0), or not a git work tree (128)
    text = exclude.read_text(encoding="utf-8") if exclude.exists() else ""
    if EXCLUDE_LINE in text.splitlines():
        return
    exclude.parent.mkdir(parents=True, exist_ok=True)
    tail = "" if not text or text.endswith("\n") else "\n"
    exclude.write_text(f"{text}{tail}{EXCLUDE_NOTE}\n{EXCLUDE_LINE}\n", encoding="utf-8")
    change.written.append("(git) info/exclude: /" + LOCAL_SETTINGS)


def _forget_untracked(root: Path, change: Change) -> None:
    exclude = _exclude_file(root)
    if exclude is None or not exclude.exists():
        return
    lines = exclude.read_text(encoding="utf-8").splitlines()
    if EXCLUDE_LINE not in lines:
        return
    kept = [line for line in lines if line not in (EXCLUDE_NOTE, EXCLUDE_LINE)]
    exclude.write_text("\n".join(kept) + ("\n" if kept else ""), encoding="utf-8")
    change.removed.append("(git) info/exclude: /" + LOCAL_SETTINGS)


def _toml_block(url: str) -> str:
    return (
        f"{TOML_BEGIN}\n"
        f"[mcp_servers.{SERVER}]\n"
        f"url = {json.dumps(url.rstrip('/') + '/mcp')}\n"
        'bearer_token_env_var = "PROJECT_MEMORY_TOKEN"\n'
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


def _install_codex_toml(path: Path, url: str, change: Change) -> None:
    rel = str(path.relative_to(change.root))
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    rest = _without_block(before)
    if SERVER in (_parse_toml(rest, path).get("mcp_servers") or {}):
        raise InstallError(
            f"{path} already defines [mcp_servers.{SERVER}] outside our block; not touched"
        )
    after = (rest + "\n\n" if rest else "") + _toml_block(url)
    _parse_toml(after, path)
    if after == before:
        change.unchanged.append(rel)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, after.encode("utf-8"))
    os.chmod(path, 0o644)
    change.written.append(rel)


def _uninstall_codex_toml(path: Path, change: Change) -> None:
    if not path.exists():
        return
    before = path.read_text(encoding="utf-8")
    if TOML_BEGIN not in before:
        change.unchanged.append(str(path.relative_to(change.root)))
        return
    after = _without_block(before)
    if after.strip():
        write_private(path, (after + "\n").encode("utf-8"))
        os.chmod(path, 0o644)
        change.written.append(str(path.relative_to(change.root)))
    else:
        _save(path, None, change)


def installed(agent: str, root: Path) -> dict[str, bool]:
    """Which of the agent's entries are in the repository."""

    def has_hooks(path: Path) -> bool:
        try:
            value = _load_json(path) or {}
        except InstallError:
            return False
        found = value.get("hooks")
        hooks: dict[str, Any] = found if isinstance(found, dict) else {}
        return all(
            any(
                OURS.search(str(h.get("command", "")))
                for g in hooks.get(event, [])
                if isinstance(g, dict)
                for h in g.get("hooks", [])
                if isinstance(h, dict)
            )
            for event in HOOK_EVENTS
        )

    def has_server(path: Path) -> bool:
        try:
            value = _load_json(path) or {}
        except InstallError:
            return False
        servers = value.get("mcpServers")
        return isinstance(servers, dict) and SERVER in servers

    if agent == "claude-code":
        try:
            local = _load_json(root / LOCAL_SETTINGS) or {}
        except InstallError:
            local = {}
        allowed = (local.get("permissions") or {}).get("allow") or []
        return {
            "hooks": has_hooks(root / ".claude" / "settings.json"),
            "mcp": has_server(root / ".mcp.json"),
            "permission": TOOLS_PERMISSION in allowed,
        }
    if agent == "codex":
        toml = root / ".codex" / "config.toml"
        return {
            "hooks": has_hooks(root / ".codex" / "hooks.json"),
            "mcp": toml.exists() and TOML_BEGIN in toml.read_text(encoding="utf-8"),
        }
    return {"mcp": has_server(root / ".cursor" / "mcp.json")}
