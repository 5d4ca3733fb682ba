"""``project-memory``: the remote CLI, parsed and run (cli.py is its entry point).

Exit status: 0 success; 1 the API refused (its message on one line), or the command failed
(a mount's final sync that did not complete); 2 bad usage (arguments, settings, a local
file); 3 the server cannot be reached. With ``--json`` every command prints one object:
``{"ok": true, "command": "turn get", "data": ...}`` or
``{"ok": false, "command": ..., "error": {"kind", "message", "status", "detail",
"correlation_id"}}``.

Commands come from :data:`COMMANDS`: a name, the ``module:function`` that registers its
arguments (see :mod:`project_memory_client.commands`), and its one-line help. Only the
module of the command being run is imported, so start-up stays fast however many there are.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NoReturn, TextIO

from . import __version__
from .commands import CommandError, Context, Output, UsageError, add_common_options
from .terminal import is_utf8, lone_surrogate, show

PROG = "project-memory"


class Command(NamedTuple):
    name: str
    register: str  # "package.module:function", called with the command's parser
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("turn", "project_memory_client.commands.turns:register", "put or get one turn"),
    Command("artifact", "project_memory_client.commands.artifacts:register", "store or fetch an artifact of a turn"),
    Command("tasks", "project_memory_client.commands.tasks:register_tasks", "list tasks, most recently updated first"),
    Command("task", "project_memory_client.commands.tasks:register_task", "show or delete one task"),
    Command("digest", "project_memory_client.commands.digest:register", "print project.md, one section per task"),
    Command("search", "project_memory_client.commands.search:register", "search the project's turns and memories"),
    Command("usage", "project_memory_client.commands.usage:register", "what the project stores, its quotas and traffic"),
    Command("ledger", "project_memory_client.commands.ledger:register_ledger", "turns, tokens, cost and time, summed by day, model, branch..."),
    Command("timeline", "project_memory_client.commands.ledger:register_timeline", "the project's turns across tasks, newest first"),
    Command("whoami", "project_memory_client.commands.whoami:register", "the token's role and scope"),
    Command("mount", "project_memory_client.mount.cli:register", "keep a local directory in sync with memory stores"),
    Command("import", "project_memory_client.memfiles.cli:register_import", "read agents' memory files (CLAUDE.md, AGENTS.md, ...) into a memory store"),
    Command("export", "project_memory_client.memfiles.cli:register_export", "write a memory store back as files"),
    Command("agent", "project_memory_client.agents.cli:register", "plug a coding agent in: install, status, flush, hooks"),
    Command("mcp", "project_memory_client.mcp.cli:register", "serve the server's MCP tools on stdio"),
)  # fmt: skip


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors raised (UsageError) so that ``--json`` can report them."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.partition(" ")[2] or None
        raise UsageError(message, usage=self.format_usage().strip(), command=command)


def build_parser(argv: Sequence[str]) -> Parser:
    parser = Parser(
        prog=PROG,
        description="The remote CLI of a Project Memory server.",
        epilog="Settings: flags, then PROJECT_MEMORY_URL / _TOKEN / _TENANT / _PROJECT, then"
        " ~/.config/project-memory/config.toml (mode 0600). Exit status: 0 ok, 1 the API"
        " refused, 2 bad usage, 3 the server cannot be reached. See docs/client.md.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_common_options(parser)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    wanted = set(argv)
    for command in COMMANDS:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        # Only the named command's module is loaded: an option value that happens to be a
        # command name loads one more, which is harmless.
        if command.name in wanted:
            module, _, function = command.register.partition(":")
            register: Callable[[argparse.ArgumentParser], None] = getattr(
                importlib.import_module(module), function
            )
            register(child)
    return parser


def _emit(out: TextIO, envelope: dict[str, Any]) -> None:
    text = json.dumps(envelope, ensure_ascii=False, indent=2, default=str)
    if not is_utf8(text):
        # A lone surrogate (a server may send "\\ud800") cannot be written as UTF-8: it goes
        # out as the JSON escape it came in as, which reads back as the same string.
        text = lone_surrogate().sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    out.write(text + "\n")
    out.flush()


def error_object(kind: str, message: str, **extra: Any) -> dict[str, Any]:
    """The envelope's ``error``: always these five keys."""
    error: dict[str, Any] = {
        "kind": kind,
        "message": message,
        "status": None,
        "detail": None,
        "correlation_id": None,
    }
    error.update(extra)
    return error


def _failure(
    ctx: Context | None,
    json_mode: bool,
    command: str | None,
    kind: str,
    message: str,
    code: int,
    **extra: Any,
) -> int:
    stdout = ctx.stdout if ctx else sys.stdout
    stderr = ctx.stderr if ctx else sys.stderr
    if json_mode:
        error = error_object(kind, message, **extra)
        _emit(stdout, {"ok": False, "command": command, "error": error})
    else:
        show(stderr, f"{PROG}: {message}\n")
    return code


def _usage_failure(
    ctx: Context | None, json_mode: bool, command: str | None, exc: UsageError
) -> int:
    if json_mode or not exc.usage:
        return _failure(ctx, json_mode, command, "usage", exc.message, 2)
    return _failure(ctx, json_mode, command, "usage", f"{exc.message}\n{exc.usage}", 2)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's) and run the command; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in argv
    try:
        args = build_parser(argv).parse_args(argv)
    except UsageError as exc:
        return _usage_failure(None, json_mode, exc.command, exc)
    ctx = Context(args)
    command: str = args.command
    return run(ctx, command)


def run(ctx: Context, command: str) -> int:
    """Run the parsed command; print its output or its error; the exit status."""
    from .errors import ApiError, ClientError, InvalidArgument, ServerUnreachable, SettingsError

    json_mode = ctx.json
    try:
        output: Output = ctx.args.run(ctx)
    except KeyboardInterrupt:
        return 130
    except UsageError as exc:
        return _usage_failure(ctx, json_mode, command, exc)
    except CommandError as exc:
        return _failure(ctx, json_mode, command, exc.kind, exc.message, exc.exit_code)
    except SettingsError as exc:
        return _failure(ctx, json_mode, command, "settings", str(exc), 2)
    except InvalidArgument as exc:
        return _failure(ctx, json_mode, command, "usage", str(exc), 2)
    except ApiError as exc:
        message = exc.message
        where = f" (correlation id {exc.correlation_id})" if exc.correlation_id else ""
        return _failure(
            ctx,
            json_mode,
            command,
            "api",
            f"{exc.status} {message}{where}",
            1,
            status=exc.status,
            detail=exc.detail,
            correlation_id=exc.correlation_id,
        )
    except ServerUnreachable as exc:
        return _failure(
            ctx, json_mode, command, "unreachable", f"cannot reach the server: {exc}", 3
        )
    except ClientError as exc:
        return _failure(ctx, json_mode, command, "failed", str(exc), 1)
    except OSError as exc:
        name = f"{exc.filename}: " if exc.filename else ""
        return _failure(ctx, json_mode, command, "local", f"{name}{exc.strerror or exc}", 2)
    finally:
        ctx.close()
    if json_mode:
        envelope: dict[str, Any] = {"ok": output.exit_code == 0, "command": command}
        if output.exit_code:
            envelope["error"] = error_object("failed", output.text or "")
        envelope["data"] = output.data
        _emit(ctx.stdout, envelope)
    elif output.text:
        stream = ctx.stderr if output.exit_code else ctx.stdout
        show(stream, output.text.rstrip("\n") + "\n")
    return output.exit_code
