"""What every CLI command is built with: the shared options, the run context, the output.

A command module has a ``register(parser)`` function (named in
``command_line.COMMANDS``) that adds its arguments, or its sub-commands with
:func:`subcommands` and :func:`leaf`. Each leaf
runs as ``run(ctx) -> Output``: ``Output.data`` is what ``--json`` prints inside the
envelope, ``Output.text`` the human form. A command raises instead of printing errors;
``command_line.run`` turns the exception into the message, the envelope and the exit code.

Import nothing heavy at module level (no httpx, no client): ``--help`` and the start-up of
every command import these modules. ``ctx.client()`` loads the client when a command needs it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from ..client import Client, Progress
    from ..settings import Settings

Run = Callable[["Context"], "Output"]
PROGRESS_MIN_BYTES = 1024 * 1024  # smaller transfers show no progress bar


class UsageError(Exception):
    """Bad usage: exit status 2. ``usage`` is the command's usage line (printed after the
    message, not part of the ``--json`` envelope); ``command`` its name, when known."""

    def __init__(self, message: str, *, usage: str = "", command: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage
        self.command = command


class CommandError(Exception):
    """A command that fails in its own way: ``message`` is printed (or is the envelope's
    error, of ``kind``), and the CLI exits with ``exit_code``."""

    def __init__(self, message: str, *, exit_code: int, kind: str = "failed") -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.kind = kind


@dataclass
class Output:
    """What a command produced: ``data`` for ``--json``, ``text`` for people (None: nothing
    more to print), and the exit status (0 unless the command says otherwise)."""

    data: Any
    text: str | None = None
    exit_code: int = 0


@dataclass
class Context:
    args: argparse.Namespace
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    _client: Client | None = None

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    def settings(self) -> Settings:
        from ..settings import load_settings

        a = self.args
        return load_settings(
            url=getattr(a, "url", None),
            token=getattr(a, "token", None),
            tenant=getattr(a, "tenant", None),
            project=getattr(a, "project", None),
            timeout=getattr(a, "timeout", None),
        )

    def client(self) -> Client:
        """The client, built on first use from the flags, the environment and the config."""
        if self._client is None:
            from ..client import Client

            self._client = Client(settings=self.settings())
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def progress(self, label: str) -> Progress | None:
        """A progress bar on stderr for a transfer over 1 MiB, when stderr is a terminal and
        the output is not ``--json``; None otherwise."""
        if self.json or not self.stderr.isatty():
            return None
        return ProgressBar(label, self.stderr)


class ProgressBar:
    """``label  12.0 MiB / 50.0 MiB  24% [######..................]``, redrawn at most 10
    times a second on one line of a terminal."""

    WIDTH = 24

    def __init__(self, label: str, out: TextIO) -> None:
        from ..terminal import visible

        self.label = visible(label)  # drawn with a "\r" of its own, so not through show()
        self.out = out
        self.last = 0.0
        self.shown = False

    def __call__(self, done: int, total: int | None) -> None:
        if max(done, total or 0) < PROGRESS_MIN_BYTES:
            return
        now = time.monotonic()
        finished = total is not None and done >= total
        if not finished and now - self.last < 0.1:
            return
        self.last = now
        line = f"{self.label}  {mib(done)}"
        if total:
            share = min(1.0, done / total)
            filled = int(share * self.WIDTH)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            line += f" / {mib(total)}  {share:4.0%} [{bar}]"
        self.out.write("\r" + line)
        self.shown = True
        if finished:
            self.out.write("\n")
        self.out.flush()


def mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


# -- building parsers ----------------------------------------------------------------------
def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The options every command takes, before or after its name. Their defaults are left
    out of the namespace (SUPPRESS), so one given before the command is not reset by the
    sub-command's parser."""
    group = parser.add_argument_group("settings (else the environment, else the config file)")
    s = argparse.SUPPRESS
    group.add_argument(
        "--url",
        default=s,
        help="the server's base URL, e.g. http://127.0.0.1:8000 (PROJECT_MEMORY_URL)",
    )
    group.add_argument(
        "--token",
        default=s,
        help="the API token (better: PROJECT_MEMORY_TOKEN, which ps does not show)",
    )
    group.add_argument(
        "--tenant",
        default=s,
        help="tenant, for a token that covers several (PROJECT_MEMORY_TENANT)",
    )
    group.add_argument(
        "--project",
        default=s,
        help="project, for a token that covers several (PROJECT_MEMORY_PROJECT)",
    )
    group.add_argument(
        "--timeout",
        default=s,
        type=float,
        metavar="SECONDS",
        help="for each request (default 30; PROJECT_MEMORY_TIMEOUT)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=s,
        help='print one JSON object: {"ok": true, "command", "data"} or {"ok": false, "command", "error"}',
    )


def subcommands(parser: argparse.ArgumentParser, title: str = "commands") -> Any:
    return parser.add_subparsers(title=title, metavar="COMMAND", required=True)


def leaf(
    sub: Any,
    name: str,
    run: Run,
    *,
    help: str,
    description: str | None = None,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """A sub-command of ``sub`` that runs ``run``, with the common options."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description or help, epilog=epilog
    )
    add_common_options(parser)
    configure(parser, run)
    return parser


def configure(parser: argparse.ArgumentParser, run: Run) -> None:
    """Make ``parser`` run ``run``; the envelope's ``command`` is its name ("turn get")."""
    parser.set_defaults(run=run, command=parser.prog.split(" ", 1)[-1])


def turn_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a turn number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a turn number: {text!r}")
    return value


def task_and_turn(
    parser: argparse.ArgumentParser, turn_metavar: str = "N", turn_type: Any = None
) -> None:
    """The TASK and N positionals most commands start with."""
    parser.add_argument("task", metavar="TASK")
    parser.add_argument("turn", metavar=turn_metavar, type=turn_type or turn_number)


def conditions(parser: argparse.ArgumentParser, what: str) -> None:
    """``--if-match ETAG`` or ``--if-none-match``, for a write of ``what``."""
    cond = parser.add_mutually_exclusive_group()
    cond.add_argument(
        "--if-match", metavar="ETAG", help=f"write only over this version of {what} (412 else)"
    )
    cond.add_argument(
        "--if-none-match",
        action="store_true",
        help=f"write only if {what} does not exist yet (412 else)",
    )


# -- human output --------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Sequence[Sequence[object]], max_width: int = 60) -> str:
    """Rows under a header line, columns padded to their widest cell (cut at ``max_width``)."""

    def cell(value: object) -> str:
        text = "-" if value is None else " ".join(str(value).split())
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(t.ljust(w) for t, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def fields(pairs: Sequence[tuple[str, object]]) -> str:
    """``key   value`` lines, keys padded to the longest."""
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in pairs)
