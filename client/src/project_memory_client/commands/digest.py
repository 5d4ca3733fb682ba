"""``digest``: project.md, streamed to stdout (or a file), or its first bytes."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._files import atomic_file
from ..terminal import show_stream
from . import Context, Output, add_common_options, configure


def register(parser: argparse.ArgumentParser) -> None:
    add_common_options(parser)
    parser.add_argument(
        "--max-bytes",
        type=int,
        metavar="N",
        help="stop after N bytes (at the last whole line): the newest sections only",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write it to FILE instead")
    configure(parser, show_digest)


def show_digest(ctx: Context) -> Output:
    a = ctx.args
    client = ctx.client()
    if ctx.json or a.max_bytes is not None:
        markdown = client.get_digest(max_bytes=a.max_bytes)
        data = {"markdown": markdown, "bytes": len(markdown.encode("utf-8"))}
        if a.output:
            with atomic_file(Path(a.output)) as fh:
                fh.write(markdown.encode("utf-8"))
            return Output({**data, "path": a.output}, f"wrote {a.output}")
        return Output(data, markdown)
    # Streamed through: a digest of many tasks need not fit in memory.
    size = 0
    if a.output:
        with atomic_file(Path(a.output)) as fh:
            for block in client.iter_digest():
                fh.write(block)
                size += len(block)
        return Output({"bytes": size, "path": a.output}, f"wrote {a.output} ({size} bytes)")
    size = show_stream(ctx.stdout, client.iter_digest())
    return Output({"bytes": size}, None)
