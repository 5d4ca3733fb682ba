"""``project-memory``: the entry point of the remote CLI (command_line.py parses and runs it).

Exit status: 0 success; 1 the API refused, or the command failed; 2 bad usage; 3 the server
cannot be reached (docs/client.md).

``agent hook EVENT`` (what Claude Code and Codex run at every hook, a new process each time)
goes straight to the hook, without loading the parser and every command's options: the
hook's start-up is time the agent waits for (agents/hooks.py). So does ``mcp`` with no
option, as the agents start it: they wait for its first answer (mcp/bridge.py).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["agent", "hook"]:
        if argv[2:3] == ["user-prompt-submit"]:
            from .agents.prompt import main_argv
        else:
            from .agents.hooks import main_argv

        code = main_argv(argv[2:])
        if code is not None:
            return code
    if argv == ["mcp"]:
        from .mcp.bridge import main as relay

        return relay()
    from .command_line import main as run_command_line

    return run_command_line(argv)


def __getattr__(name: str) -> Any:
    """The command line's names (``build_parser``, ``run``, ``COMMANDS``, ...), loaded when
    first asked for."""
    if name.startswith("__"):
        # ``from project_memory_client.cli import main`` (the console script's line) asks
        # for ``__path__``: loading the command line to answer it would cost every hook
        # and relay the parser this module keeps them from.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import command_line

    try:
        return getattr(command_line, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
