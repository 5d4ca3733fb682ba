"""``project-memory mcp``: an MCP server on stdio that relays to the server's ``/mcp``."""

from __future__ import annotations

import argparse

from ..commands import Context, Output, configure


def register(parser: argparse.ArgumentParser) -> None:
    configure(parser, _serve)


def _serve(ctx: Context) -> Output:
    from .bridge import serve

    raise SystemExit(serve(ctx.settings()))
