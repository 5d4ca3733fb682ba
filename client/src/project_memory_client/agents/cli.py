"""``project-memory agent install|uninstall|status|doctor|flush|hook``: coding agents
plugged in.

docs/agents.md is the guide; the modules here: install.py (the repository's config files),
hooks.py (what the hooks do), prompt.py (the context added to each prompt), spool.py (turns
not sent yet), transcripts.py, secrets.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..commands import CommandError, Context, Output, configure, fields, leaf, subcommands

AGENT_CHOICES = ("claude-code", "codex", "cursor")


def register(parser: argparse.ArgumentParser) -> None:
    sub = subcommands(parser)
    for name, run, help_text in (
        ("install", _install, "set an agent up for this repository (hooks and the MCP server)"),
        ("uninstall", _uninstall, "remove exactly what install added"),
    ):
        child = leaf(sub, name, run, help=help_text)
        child.add_argument("agent", choices=AGENT_CHOICES)
        child.add_argument(
            "--dir",
            type=Path,
            default=None,
            help="the repository (default: the git work tree of the current directory)",
        )
        if name == "install":
            child.add_argument(
                "--transport",
                choices=("http", "stdio"),
                default="http",
                help="claude-code: the MCP server over HTTP (default; the token from"
                " PROJECT_MEMORY_TOKEN) or stdio (`project-memory mcp`, which also reads"
                " the config file)",
            )
            child.add_argument(
                "--auth",
                choices=("token", "oauth"),
                default="token",
                help="how the agent signs in to the MCP server: token (default; the"
                " Authorization header from PROJECT_MEMORY_TOKEN) or oauth (only the URL is"
                " written; the agent signs in itself, e.g. `claude mcp login project-memory`)",
            )
            child.add_argument(
                "--share-memory",
                nargs="?",
                const="",
                default=None,
                metavar="STORE",
                help="claude-code: share Claude Code's auto-memory with the team through the"
                " memory store STORE (an id or a name; default: the store named 'Claude Code"
                " auto-memory', created if missing): its folder, kept in your state directory,"
                " is synced at each session's start and after each turn (docs/agents.md)",
            )
            child.add_argument(
                "--private",
                action="store_true",
                help="this repository's turns go to your private space of the project (the"
                " hooks read their context from it too), and with --share-memory the store is"
                " found or made there: no one else in the project sees them. Needs a token"
                " that belongs to you (a user); recorded in your state directory, not in the"
                " repository, so teammates' hooks are unchanged",
            )
    status = leaf(
        sub, "status", _status, help="what is installed, whether the server answers, the spool"
    )
    status.add_argument("--dir", type=Path, default=None)
    doctor = leaf(
        sub,
        "doctor",
        _doctor,
        help="check everything the agents need, end to end: exit 1 with one line per problem",
        description="Check the agent path the way the agents run it: the settings, the token"
        " (whoami), each installed agent's hook commands (run as the agent runs them) and MCP"
        " server (tools/list with the headers the agent expands), Codex's trust of the"
        " project and the hooks, and the spool. Exit status 0: nothing wrong; 1: one line per"
        " problem.",
    )
    doctor.add_argument("--dir", type=Path, default=None)
    leaf(sub, "flush", _flush, help="send the turns the spool holds")
    hook = sub.add_parser("hook", help="run a hook (the agents call this; JSON on stdin)")
    hook.add_argument(
        "event", choices=("session-start", "stop", "pre-compact", "user-prompt-submit")
    )
    hook.add_argument("--agent", choices=("claude-code", "codex"), default="claude-code")
    hook.add_argument(
        "--private",
        action="store_true",
        help="write the turns to (and read the context from) your private space of the"
        " project: a token that belongs to you (a user) is needed",
    )
    configure(hook, _hook)


def _root(ctx: Context) -> Path:
    from .install import repo_root

    given = getattr(ctx.args, "dir", None)
    return (given or repo_root(Path.cwd())).resolve()


def _install(ctx: Context) -> Output:
    from ..errors import SettingsError
    from .install import InstallError, install

    try:
        settings = ctx.settings()
    except SettingsError:
        settings = None
    url = settings.url if settings is not None else None
    root = _root(ctx)
    share = None
    private = bool(ctx.args.private)
    if private:
        _check_private(settings)
    if ctx.args.share_memory is not None:
        from .shared_memory import share_for_install

        share = share_for_install(
            ctx.args.agent, root, settings, ctx.args.share_memory, private=private
        )
    try:
        change = install(
            ctx.args.agent,
            root,
            url=url,
            transport=ctx.args.transport,
            auth=ctx.args.auth,
            memory_dir=share.folder if share is not None else None,
        )
    except InstallError as exc:
        raise CommandError(str(exc), exit_code=2, kind="install") from None
    if share is not None:
        share.installed(change)
    else:
        _record_private(root, private, change)
    return Output(change.to_dict(), _describe(change, "installed"))


def _check_private(settings: Any) -> None:
    """``--private`` needs a token of a user: asked of the server (whoami), which would
    refuse every private write of another."""
    from ..errors import ClientError, SettingsError

    if settings is None:
        raise CommandError(
            "--private needs the server's URL and your token (a user's)", exit_code=2
        )
    from ..client import Client

    try:
        with Client(settings=settings.require()) as client:
            me = client.whoami()
    except SettingsError as exc:
        raise CommandError(str(exc), exit_code=2) from None
    except ClientError as exc:
        raise CommandError(
            f"--private: cannot ask the server who you are: {exc}", exit_code=3
        ) from None
    if not me.user:
        raise CommandError(
            "--private needs a token that belongs to you (minted in the console after signing"
            " in, or your sign-in's): this one belongs to no user",
            exit_code=2,
        )


def _record_private(root: Path, private: bool, change: Any) -> None:
    """Record (or clear) that ``root``'s turns go to the user's private space."""
    from .shared_memory import set_private
    from .spool import state_dir

    try:
        set_private(state_dir(), root, private)
    except OSError as exc:
        if private:
            change.warnings.append(f"the private setting cannot be recorded ({exc}): install again")
        return
    if private:
        change.notes.append(
            "This repository's turns now go to your private space of the project (no one else"
            " sees them); the session's context comes from there. Install again without"
            " --private to share them with the team again."
        )


def _uninstall(ctx: Context) -> Output:
    from .install import InstallError, uninstall
    from .shared_memory import Unshare

    root = _root(ctx)
    unshare = Unshare.of(ctx.args.agent, root)
    try:
        change = uninstall(ctx.args.agent, root, memory=unshare.memory)
    except InstallError as exc:
        raise CommandError(str(exc), exit_code=2, kind="install") from None
    unshare.done(change)
    return Output(change.to_dict(), _describe(change, "uninstalled"))


def _describe(change: Any, verb: str) -> str:
    lines = [f"{change.agent} {verb} in {change.root}"]
    lines += [f"  wrote    {p}" for p in change.written]
    lines += [f"  removed  {p}" for p in change.removed]
    lines += [f"  kept     {p} (nothing to change)" for p in change.unchanged]
    lines += [f"note: {n}" for n in change.notes]
    lines += [f"warning: {w}" for w in change.warnings]
    return "\n".join(lines)


def _status(ctx: Context) -> Output:
    import os

    from ..errors import ApiError, ClientError, SettingsError
    from .install import installed, mcp_auth
    from .spool import Spool, state_dir

    root = _root(ctx)
    agents = {agent: installed(agent, root) for agent in AGENT_CHOICES}
    auths = {agent: mcp_auth(agent, root) for agent in AGENT_CHOICES}
    server: dict[str, Any] = {"url": None, "answers": False, "detail": None}
    try:
        settings = ctx.settings()
        server["url"] = settings.url
        settings.require()
        who = ctx.client().whoami()
        server.update(
            answers=True, detail=f"token of role {who.role} in {who.tenant}/{who.project}"
        )
    except SettingsError as exc:
        server["detail"] = str(exc)
    except ApiError as exc:
        server.update(answers=True, detail=f"refused the token: {exc.status} {exc.message}")
    except ClientError as exc:
        server["detail"] = f"unreachable: {exc}"
    spool = Spool(state_dir())
    count, size, oldest = spool.backlog()
    queue = {
        "queued": count,
        "bytes": size,
        "oldest_seconds": None if oldest is None else round(oldest, 1),
        "rejected": spool.rejected_count(),
        "dir": str(spool.dir),
    }
    warnings = []
    # An OAuth entry reads no token: the agent keeps its own.
    if {"token", "stdio"} & set(auths.values()) and "PROJECT_MEMORY_TOKEN" not in os.environ:
        warnings.append(
            "PROJECT_MEMORY_TOKEN is not in the environment: the agents' MCP entries read the"
            " token from it (claude-code --transport stdio reads the config file too)"
        )
    data: dict[str, Any] = {
        "root": str(root),
        "agents": agents,
        "mcp_auth": auths,
        "server": server,
        "spool": queue,
        "warnings": warnings,
    }
    pairs: list[tuple[str, object]] = [("repository", root)]
    for agent, parts in agents.items():
        state = (
            "installed"
            if all(parts.values())
            else "partly"
            if any(parts.values())
            else "not installed"
        )
        signs_in = f", MCP by {auths[agent]}" if auths[agent] else ""
        pairs.append(
            (
                agent,
                f"{state} ({', '.join(k for k, v in parts.items() if v) or 'nothing'}{signs_in})",
            )
        )
    from .share_record import is_private
    from .shared_memory import linked

    record = linked(state_dir(), root)
    share = record if record is not None and "store_id" in record else None
    data["shared_memory"] = share
    data["private"] = is_private(record)
    if share is not None:
        where = "your private space's" if share.get("store_private") else "the"
        pairs.append(
            (
                "shared memory",
                f"Claude Code's auto-memory {share.get('folder')}, synced with {where} memory"
                f" store {share.get('store_name')!r} ({share.get('store_id')})",
            )
        )
    if data["private"]:
        pairs.append(("turns", "to your private space of the project (installed with --private)"))
    answer = "answers" if server["answers"] else "does not answer"
    pairs.append(("server", f"{server['url'] or '(no URL)'} {answer}: {server['detail']}"))
    from .doctor import age

    oldest_text = f", oldest {age(oldest)}" if count else ""
    pairs.append(
        (
            "spool",
            f"{count} turn(s) queued ({size} bytes{oldest_text}), {queue['rejected']} rejected"
            f" ({queue['dir']})",
        )
    )
    text = fields(pairs) + "".join(f"\nwarning: {w}" for w in warnings)
    return Output(data, text)


def _doctor(ctx: Context) -> Output:
    from .doctor import diagnose, report

    checks = diagnose(_root(ctx))
    problems = [c for c in checks if not c.ok]
    data = {
        "ok": not problems,
        "checks": [c.to_dict() for c in checks],
        "problems": [f"{c.name}: {c.detail}" for c in problems],
    }
    return Output(data, report(checks), exit_code=1 if problems else 0)


def _flush(ctx: Context) -> Output:
    from .spool import Spool, state_dir

    settings = ctx.settings().require()
    spool = Spool(state_dir())
    outcome = spool.flush(
        ctx.client(),
        url=settings.url or "",
        tenant=settings.tenant,
        project=settings.project,
        visibility=settings.visibility,
    )
    data = {
        "sent": outcome.sent,
        "already_recorded": outcome.already,
        "rejected": outcome.rejected,
        "kept": outcome.kept,
        "deferred": outcome.deferred,
        "errors": outcome.errors,
        "rejections": outcome.rejections,
    }
    text = (
        f"sent {outcome.sent}, already recorded {outcome.already}, rejected {outcome.rejected},"
        f" still queued {outcome.kept}"
    )
    if outcome.deferred:
        text += f", left to the process sending their task's earlier turns {outcome.deferred}"
    text += "".join(f"\nrejected (moved to {spool.dir}/rejected/): {r}" for r in outcome.rejections)
    if outcome.errors:
        text += f"\nlast error: {outcome.errors[-1]}"
    code = 3 if outcome.unreachable else 1 if outcome.kept or outcome.rejected else 0
    return Output(data, text, exit_code=code)


def _hook(ctx: Context) -> Output:
    if ctx.args.event == "user-prompt-submit":
        from .prompt import main as prompt_hook

        raise SystemExit(prompt_hook(ctx.args.agent, ctx.args.private))
    from .hooks import main

    raise SystemExit(main(ctx.args.agent, ctx.args.event, ctx.args.private))
