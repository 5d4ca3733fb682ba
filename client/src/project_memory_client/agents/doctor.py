"""``project-memory agent doctor``: every part of the agent path checked the way the agent
will run it, each problem in one line.

``agent status`` says what is installed; the doctor says whether it works:

* the settings: a URL and a token;
* the token answers ``whoami`` (a wrong URL answers 404 or something not this server, a
  wrong token 401, a server down does not answer);
* each installed agent's hook commands run, as the agent runs them: ``sh -c '<command>'``
  with this environment (the one the agent inherits), the event on stdin and the hooks told
  to do nothing (``PROJECT_MEMORY_HOOKS=off``);
* each installed agent's MCP server answers ``tools/list``, at the URL and with the headers
  its config gives once the agent has expanded them (``${PROJECT_MEMORY_TOKEN}``,
  ``${env:...}``, ``bearer_token_env_var``); an entry with no credential (``--auth oauth``)
  is checked as the agent finds its way to sign in: the 401's resource metadata (RFC 9728)
  names this URL and an authorization server whose metadata (RFC 8414) takes PKCE S256.
  Whether the agent has signed in is in the agent's own store, which the doctor does not read;
* Codex: the project and each of our hooks are trusted in ``$CODEX_HOME/config.toml``
  (Codex reads no .codex/ of an untrusted project, and runs no untrusted hook, and says
  nothing);
* the spool: what waits, and for how long; turns refused for good; the last hook error.

Exit status 0 when nothing is wrong, 1 with one line per problem (``--json``: every check).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .install import (
    HOOK_EVENTS,
    LOCAL_SETTINGS,
    OURS,
    PERMISSIONS,
    SERVER,
    TOML_BEGIN,
    InstallError,
    _load_json,
    _read,
    inside,
    installed,
    server_entry,
)
from .spool import Spool, state_dir

BACKLOG_SECONDS = 600.0  # a turn waiting longer than this was not sent by the next hooks
RUN_TIMEOUT = 20.0  # for a hook command or a stdio server to answer
HTTP_TIMEOUT = 10.0
# How each agent is told to sign in to an OAuth entry.
LOGIN = {
    "claude-code": f"`claude mcp login {SERVER}` (or /mcp in claude)",
    "codex": f"`codex mcp login {SERVER}` in the repository",
    "cursor": f"log in to {SERVER} in Cursor's MCP settings",
}
# The headers the server takes a token in (app/web/auth.py).
CREDENTIAL_HEADERS = ("authorization", "x-api-key")
# ${VAR} and ${VAR:-default} (Claude Code's .mcp.json), ${env:VAR} (Cursor's).
_VARIABLE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class Check:
    def __init__(self, name: str, ok: bool, detail: str) -> None:
        self.name = name
        self.ok = ok
        self.detail = " ".join(detail.split())  # one line, whatever the cause said

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def expand(text: str, env: Mapping[str, str], unset: list[str]) -> str:
    """``text`` with its variables filled in from ``env`` as the agents do (a variable not
    set, and without a default, is empty, and named in ``unset``)."""

    def fill(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        unset.append(name)
        return ""

    return _VARIABLE.sub(fill, text)


def diagnose(root: Path, env: Mapping[str, str] | None = None) -> list[Check]:
    """Every check, in order (see the module's docstring)."""
    env = dict(os.environ if env is None else env)
    checks = _server(env)
    agents = {agent: installed(agent, root) for agent in ("claude-code", "codex", "cursor")}
    if not any(any(parts.values()) for parts in agents.values()):
        checks.append(
            Check("install", False, f"no agent is installed in {root}: run agent install")
        )
    if any(agents["claude-code"].values()):
        checks += _claude_code(root, env, agents["claude-code"])
    if any(agents["codex"].values()):
        checks += _codex(root, env, agents["codex"])
    if any(agents["cursor"].values()):
        checks += _cursor(root, env)
    checks += _spool(env)
    return checks


# -- the server and the token -----------------------------------------------------------------
def _server(env: dict[str, str]) -> list[Check]:
    from ..client import Client
    from ..errors import ApiError, ClientError, SettingsError
    from ..settings import load_settings

    try:
        settings = load_settings(env=env).require()
    except SettingsError as exc:
        return [Check("settings", False, str(exc))]
    checks = [Check("settings", True, f"server {settings.url}")]
    try:
        with Client(settings=settings.with_overrides(timeout=HTTP_TIMEOUT), max_retries=0) as c:
            who = c.whoami()
    except ApiError as exc:
        if exc.status in (401, 403):
            why = f"the server at {settings.url} refused the token ({exc.status} {exc.message})"
            return [*checks, Check("token", False, why + ": check PROJECT_MEMORY_TOKEN")]
        return [
            *checks,
            Check(
                "url",
                False,
                f"{settings.url} answered {exc.status} to {exc.method} {exc.path}: not a"
                " Project Memory server there (check PROJECT_MEMORY_URL)",
            ),
        ]
    except ClientError as exc:
        return [*checks, Check("server", False, f"cannot reach {settings.url}: {exc}")]
    except ValueError:  # an answer that is not this API's JSON
        return [
            *checks,
            Check("url", False, f"{settings.url} is not a Project Memory server (its answer)"),
        ]
    detail = f"the token ({who.name or who.token_id}) is a {who.role} of {who.tenant}/{who.project}"
    return [*checks, Check("token", True, detail)]


# -- hooks ---------------------------------------------------------------------------------
def _our_commands(root: Path, rel: str) -> dict[str, str]:
    try:
        value = _load_json(inside(root, rel)) or {}
    except InstallError:
        return {}
    hooks = value.get("hooks")
    found: dict[str, str] = {}
    for event in HOOK_EVENTS:
        groups = hooks.get(event) if isinstance(hooks, dict) else None
        for group in groups if isinstance(groups, list) else []:
            entries = group.get("hooks") if isinstance(group, dict) else None
            for hook in entries if isinstance(entries, list) else []:
                command = hook.get("command") if isinstance(hook, dict) else None
                if isinstance(command, str) and OURS.search(command):
                    found.setdefault(event, command)
    return found


def _hooks(agent: str, root: Path, rel: str, env: dict[str, str]) -> list[Check]:
    commands = _our_commands(root, rel)
    missing = [event for event in HOOK_EVENTS if event not in commands]
    checks = []
    if missing:
        checks.append(
            Check(
                f"{agent} hooks",
                False,
                f"{rel} has no hook for {', '.join(missing)}: run agent install {agent}",
            )  # fmt: skip
        )
    failing = []
    for command in dict.fromkeys(commands.values()):
        problem = run_hook_command(command, root, env)
        if problem is not None:
            failing.append((command, problem))
    if failing:
        command, problem = failing[0]
        checks.append(
            Check(
                f"{agent} hooks",
                False,
                f"{len(failing)} of {len(set(commands.values()))}"
                f" hook commands do not run as {agent} runs them: `{command}`: {problem}",
            )  # fmt: skip
        )
    elif commands:
        checks.append(Check(f"{agent} hooks", True, f"{len(commands)} hooks run"))
    return checks


def run_hook_command(command: str, root: Path, env: Mapping[str, str]) -> str | None:
    """Why ``command`` does not run as an agent runs a hook (``sh -c``, this environment,
    JSON on stdin), or None when it runs and exits 0."""
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            input=json.dumps({"session_id": "doctor", "cwd": str(root)}),
            env={**env, "PROJECT_MEMORY_HOOKS": "off"},
            cwd=root,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"no exit within {RUN_TIMEOUT:g} s"
    except OSError as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    why = (done.stderr.strip().splitlines() or [""])[-1]
    if done.returncode == 127:
        return f"not found ({why}); PATH is {env.get('PATH', '(unset)')[:200]}"
    return f"exit status {done.returncode} ({why})"


# -- MCP -----------------------------------------------------------------------------------
def tools_list(url: str, headers: dict[str, str]) -> tuple[list[str] | None, str]:
    """The tool names ``url`` answers ``tools/list`` with (None and why, when it does not)."""
    import httpx

    from ..settings import Settings

    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    # The agent's own URL and headers, none of ours: what the agent will send is checked.
    accept = {"Accept": "application/json, text/event-stream"}
    try:
        with Settings().http(headers={**headers, **accept}, timeout=HTTP_TIMEOUT) as http:
            response = http.post(url, json=message)
    except httpx.HTTPError as exc:
        return None, f"cannot reach {url}: {exc or type(exc).__name__}"
    if response.status_code == 404:
        return None, f"{url} answered 404: not the server's MCP endpoint"
    if response.status_code in (401, 403):
        return None, f"{url} refused the token ({response.status_code})"
    try:
        tools = response.json()["result"]["tools"]
        return [str(t["name"]) for t in tools], f"{len(tools)} tools at {url}"
    except (ValueError, KeyError, TypeError):
        return None, f"{url} answered {response.status_code} with no tool list"


def _get_json(http: Any, url: str) -> tuple[dict[str, Any] | None, str]:
    """The JSON object at ``url`` (None and why, when there is none)."""
    import httpx

    try:
        response = http.get(url)
    except httpx.HTTPError as exc:
        return None, f"cannot reach {url}: {exc or type(exc).__name__}"
    if response.status_code != 200:
        return None, f"{url} answered {response.status_code}"
    try:
        value = response.json()
    except ValueError:
        return None, f"{url} answered no JSON"
    return (value, "") if isinstance(value, dict) else (None, f"{url} answered no JSON object")


def _well_known(url: str, name: str) -> str:
    """``url``'s well-known document ``name``, inserted between the host and the path as
    RFC 8414 and RFC 9728 have it."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, f"/.well-known/{name}{path}", "", ""))


def _resource_of(metadata_url: str) -> str | None:
    """The resource a well-known protected-resource metadata URL is for, or None when it
    does not say (another form, or the root's document, which some servers serve for a
    resource with a path)."""
    parts = urlsplit(metadata_url)
    prefix = "/.well-known/oauth-protected-resource"
    path = parts.path[len(prefix) :]
    if not parts.path.startswith(prefix + "/") or not path.strip("/"):
        return None
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _elsewhere(resource: str, url: str) -> str:
    return (
        f"the server names its MCP endpoint {resource}, not {url}, and an agent takes no"
        " token meant for another: install with the URL agents reach the server at, or set"
        " the server's MEMORY_PUBLIC_URL to it"
    )


def oauth_offer(url: str) -> tuple[bool, str]:
    """Whether an agent can sign in to ``url`` by OAuth, found as the agent finds it: a
    request without a credential answered 401, whose ``WWW-Authenticate`` names the resource
    metadata (RFC 9728; else its well-known place); that metadata names ``url`` itself as the
    resource (an agent refuses a token meant for another) and an authorization server; that
    server's metadata (RFC 8414) has both endpoints and takes PKCE with S256, the only method
    MCP clients use. (True, what was found) or (False, why not)."""
    import httpx

    from ..settings import Settings

    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    with Settings().http(headers=accept, timeout=HTTP_TIMEOUT) as http:
        try:
            response = http.post(url, json=message)
        except httpx.HTTPError as exc:
            return False, f"cannot reach {url}: {exc or type(exc).__name__}"
        if response.status_code == 404:
            return False, f"{url} answered 404: not the server's MCP endpoint"
        if response.status_code != 401:
            return False, (
                f"{url} answered {response.status_code} to a request without a credential,"
                " not 401: an agent starts no OAuth sign-in"
            )
        found = re.search(
            r'resource_metadata="([^"]+)"', response.headers.get("WWW-Authenticate", "")
        )
        where = found.group(1) if found else _well_known(url, "oauth-protected-resource")
        # The metadata's own URL names its resource (RFC 9728 §3.1): a server that calls
        # itself by a public URL this machine may not even reach is told apart unfetched.
        named = _resource_of(where)
        if named is not None and named.rstrip("/") != url.rstrip("/"):
            return False, _elsewhere(named, url)
        metadata, why = _get_json(http, where)
        if metadata is None:
            return False, (
                f"{url} asks for a token but offers no OAuth ({why}): a server without it"
                " takes the pm_ token only; install with --auth token"
            )
        resource = str(metadata.get("resource") or "")
        if resource.rstrip("/") != url.rstrip("/"):
            return False, _elsewhere(resource or "(nothing)", url)
        servers = metadata.get("authorization_servers")
        if not isinstance(servers, list) or not servers or not isinstance(servers[0], str):
            return False, f"{where} names no authorization server"
        issuer = servers[0]
        found_server, why = _get_json(http, _well_known(issuer, "oauth-authorization-server"))
        if found_server is None:
            return False, f"the authorization server {issuer} has no metadata ({why})"
        missing = [
            key for key in ("authorization_endpoint", "token_endpoint") if not found_server.get(key)
        ]
        methods = found_server.get("code_challenge_methods_supported")
        if missing or not isinstance(methods, list) or "S256" not in methods:
            lacks = ", ".join(missing) or "code_challenge_methods_supported: S256"
            return False, f"the authorization server {issuer}'s metadata lacks {lacks}"
    return True, f"{url} offers OAuth (authorization server {issuer})"


def _mcp_oauth(agent: str, url: str, unset: list[str]) -> Check:
    if unset:
        return _mcp_http(agent, url, {}, unset)
    ok, why = oauth_offer(url)
    if ok:
        why += (
            f"; {agent} signs in itself: {LOGIN[agent]}, once (the doctor cannot see whether it"
            " has)"
        )
    return Check(f"{agent} mcp", ok, why)


def _mcp_http(agent: str, url: str, headers: dict[str, str], unset: list[str]) -> Check:
    if unset:
        return Check(
            f"{agent} mcp",
            False,
            f"{', '.join(sorted(set(unset)))} is not set in this environment, and {agent}"
            " fills the server's URL or token in from it",
        )
    names, why = tools_list(url, headers)
    return Check(f"{agent} mcp", names is not None and "search" in names, why)


def _mcp_stdio(agent: str, entry: dict[str, Any], env: dict[str, str], root: Path) -> Check:
    command = [str(entry.get("command") or "")] + [str(a) for a in entry.get("args") or []]
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "doctor", "version": "1"}}},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command,
            input="".join(json.dumps(m) + "\n" for m in lines),
            env={**env, **{str(k): str(v) for k, v in (entry.get("env") or {}).items()}},
            cwd=root,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(f"{agent} mcp", False, f"`{shlex.join(command)}` does not run: {exc}")
    for line in done.stdout.splitlines():
        try:
            answer = json.loads(line)
        except ValueError:
            continue
        if answer.get("id") == 1:
            if "error" in answer:
                return Check(f"{agent} mcp", False, f"tools/list: {answer['error'].get('message')}")
            tools = answer.get("result", {}).get("tools", [])
            return Check(f"{agent} mcp", True, f"{len(tools)} tools from `{shlex.join(command)}`")
    why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return Check(f"{agent} mcp", False, f"`{shlex.join(command)}` gave no tool list: {why}")


def _json_mcp(agent: str, root: Path, rel: str, env: dict[str, str]) -> Check:
    entry = server_entry(root, rel)
    if entry is None:
        return Check(f"{agent} mcp", False, f"{rel} has no {SERVER} server: run agent install")
    if entry.get("command"):
        return _mcp_stdio(agent, entry, env, root)
    unset: list[str] = []
    url = expand(str(entry.get("url") or ""), env, unset)
    headers = {str(k): expand(str(v), env, unset) for k, v in (entry.get("headers") or {}).items()}
    if not any(k.lower() in CREDENTIAL_HEADERS for k in headers):
        return _mcp_oauth(agent, url, unset)
    return _mcp_http(agent, url, headers, unset)


# -- the agents ------------------------------------------------------------------------------
def _claude_code(root: Path, env: dict[str, str], parts: dict[str, bool]) -> list[Check]:
    checks = _hooks("claude-code", root, ".claude/settings.json", env)
    checks.append(_json_mcp("claude-code", root, ".mcp.json", env))
    if not parts.get("permission"):
        checks.append(
            Check(
                "claude-code permission",
                False,
                f"{LOCAL_SETTINGS} does not allow the read"
                f" tools ({PERMISSIONS[0]} ...): run agent install claude-code",
            )  # fmt: skip
        )
    return checks


def _codex_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("CODEX_HOME") or Path(env.get("HOME") or "~").expanduser() / ".codex")


def _codex(root: Path, env: dict[str, str], parts: dict[str, bool]) -> list[Check]:
    checks = _hooks("codex", root, ".codex/hooks.json", env)
    checks.append(_codex_mcp(root, env))
    checks += codex_trust(root, env)
    return checks


def _codex_mcp(root: Path, env: dict[str, str]) -> Check:
    from .install import _parse_toml

    try:
        path = inside(root, ".codex/config.toml")
        text = (_read(path) or b"").decode("utf-8")
        table = _parse_toml(text, path).get("mcp_servers", {}).get(SERVER)
    except (InstallError, UnicodeDecodeError, AttributeError):
        table = None
    if not isinstance(table, dict) or TOML_BEGIN not in text:
        return Check("codex mcp", False, f".codex/config.toml has no [mcp_servers.{SERVER}]")
    variable = str(table.get("bearer_token_env_var") or "")
    if not variable:
        return _mcp_oauth("codex", str(table.get("url") or ""), [])
    unset = [variable] if not env.get(variable) else []
    headers = {"Authorization": f"Bearer {env.get(variable, '')}"} if variable else {}
    return _mcp_http("codex", str(table.get("url") or ""), headers, unset)


def codex_trust(root: Path, env: Mapping[str, str]) -> list[Check]:
    """Whether Codex trusts the project (it reads no .codex/ of an untrusted one) and each of
    our hooks (it runs a new or changed hook only once the person trusted it).

    Codex 0.171 keeps both in ``$CODEX_HOME/config.toml``: ``[projects."<root>"]
    trust_level = "trusted"``, and for each hook it trusts ``[hooks.state."<hooks.json
    path>:<event>:<group>:<hook>"]`` with the ``trusted_hash`` of what it trusted.
    ``codex exec --trust`` writes the first only. A hook changed since it was trusted keeps
    its entry under another hash, which only Codex can check: /hooks shows it."""
    from .install import _parse_toml

    config_path = _codex_home(env) / "config.toml"
    try:
        config = _parse_toml(config_path.read_text(encoding="utf-8"), config_path)
    except (OSError, InstallError, UnicodeDecodeError):
        config = {}
    projects = config.get("projects")
    project = projects.get(str(root)) if isinstance(projects, dict) else None
    trusted = isinstance(project, dict) and project.get("trust_level") == "trusted"
    checks = [
        Check(
            "codex trust",
            trusted,
            f"Codex trusts {root}"
            if trusted
            else f"Codex does not trust {root} ({config_path}): it reads no .codex/ there;"
            " run `codex` in it and trust the folder (or `codex exec --trust` once)",
        )
    ]
    hooks = config.get("hooks")
    state = hooks.get("state") if isinstance(hooks, dict) else None
    entries = state if isinstance(state, dict) else {}
    places = our_hook_places(root)
    untrusted = [
        key
        for key in places
        if not (isinstance(entries.get(key), dict) and entries[key].get("trusted_hash"))
    ]
    if places:
        checks.append(
            Check(
                "codex hook trust",
                not untrusted,
                f"Codex trusts the {len(places)} hooks"
                if not untrusted
                else f"Codex has not trusted {len(untrusted)} of the {len(places)} hooks"
                f" (first: {untrusted[0].rsplit('/', 1)[-1]}), and runs none of those: run"
                ' `codex` here and choose "Trust all and continue" (or /hooks, then t)',
            )
        )
    return checks


_SNAKE = {"SessionStart": "session_start", "Stop": "stop", "PreCompact": "pre_compact"}


def our_hook_places(root: Path) -> list[str]:
    """Codex's key for each of our hooks in .codex/hooks.json: the file's path, the event,
    the group's and the hook's places."""
    path = root / ".codex" / "hooks.json"
    try:
        value = _load_json(inside(root, ".codex/hooks.json")) or {}
    except InstallError:
        return []
    hooks = value.get("hooks")
    places = []
    for event, snake in _SNAKE.items():
        groups = hooks.get(event) if isinstance(hooks, dict) else None
        for g, group in enumerate(groups if isinstance(groups, list) else []):
            entries = group.get("hooks") if isinstance(group, dict) else None
            for h, hook in enumerate(entries if isinstance(entries, list) else []):
                command = hook.get("command") if isinstance(hook, dict) else None
                if isinstance(command, str) and OURS.search(command):
                    places.append(f"{path}:{snake}:{g}:{h}")
    return places


def _cursor(root: Path, env: dict[str, str]) -> list[Check]:
    return [_json_mcp("cursor", root, ".cursor/mcp.json", env)]


# -- the spool -----------------------------------------------------------------------------
def _spool(env: Mapping[str, str]) -> list[Check]:
    root = state_dir(dict(env))
    spool = Spool(root)
    count, size, oldest = spool.backlog()
    checks = []
    if count and oldest is not None and oldest > BACKLOG_SECONDS:
        checks.append(
            Check(
                "spool",
                False,
                f"{count} turn(s) ({size} bytes) have waited up to"
                f" {age(oldest)} in {spool.dir}: the hooks could not send them; fix the"
                " server or the token, then run agent flush",
            )  # fmt: skip
        )
    else:
        waiting = f"{count} turn(s) waiting, oldest {age(oldest)}" if count else "empty"
        checks.append(Check("spool", True, waiting))
    rejected = spool.rejected_count()
    if rejected:
        checks.append(
            Check(
                "spool",
                False,
                f"{rejected} turn(s) refused for good by the server, in"
                f" {spool.dir / 'rejected'} with the reason (hook.log says more)",
            )  # fmt: skip
        )
    last = last_hook_error(root)
    if last:
        checks.append(Check("last hook error", True, last))
    return checks


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def last_hook_error(root: Path) -> str | None:
    """The last line the hooks logged (``hook.log`` holds only problems)."""
    try:
        with open(root / "hook.log", "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 8192))
            lines = [line for line in fh.read().decode("utf-8", "replace").splitlines() if line]
    except OSError:
        return None
    # A traceback's lines are indented: the entry is the last line that starts with a date.
    for line in reversed(lines):
        if re.match(r"\d{4}-\d\d-\d\dT", line):
            return line[:300]
    return None


def report(checks: list[Check]) -> str:
    problems = [c for c in checks if not c.ok]
    lines = [f"{'problem' if not c.ok else 'ok':<8}{c.name}: {c.detail}" for c in checks]
    lines.append(f"{len(problems)} problem(s)" if problems else "everything the agents need works")
    return "\n".join(lines)
