"""``search QUERY``: turns and memories, best first."""

from __future__ import annotations

import argparse

from . import Context, Output, add_common_options, configure, table
from .tasks import paging_options

# The server marks each matched word of a snippet with U+0002 ... U+0003.
_MARK_START, _MARK_END = "\x02", "\x03"


def register(parser: argparse.ArgumentParser) -> None:
    add_common_options(parser)
    parser.add_argument(
        "query",
        metavar="QUERY",
        help='every word must match; "a phrase"; prefix* (quote it for the shell)',
    )
    parser.add_argument(
        "--mode",
        choices=("hybrid", "keyword", "semantic"),
        help="hybrid: keywords and meaning (the server's default when it has an embedder);"
        " keyword: every word must match; semantic: meaning alone",
    )
    paging_options(parser, default=20, high=100)
    configure(parser, search)


def plain(snippet: str) -> str:
    """A snippet for a terminal: each matched word in [brackets]."""
    return snippet.replace(_MARK_START, "[").replace(_MARK_END, "]")


def search(ctx: Context) -> Output:
    a = ctx.args
    client = ctx.client()
    if a.all:
        first = client.search_page(a.query, limit=a.limit, mode=a.mode)
        hits = list(first.hits)
        cursor = first.next_cursor
        while cursor:
            page = client.search_page(a.query, limit=a.limit, cursor=cursor, mode=a.mode)
            hits += page.hits
            cursor = page.next_cursor
        data = {
            "query": a.query,
            "hits": [h.to_dict() for h in hits],
            "next_cursor": None,
            "modes": list(first.modes),
            "fallback": first.fallback,
        }
        more, fallback = None, first.fallback
    else:
        page = client.search_page(a.query, limit=a.limit, cursor=a.cursor, mode=a.mode)
        hits = list(page.hits)
        data = {"query": a.query, **page.to_dict()}
        more, fallback = page.next_cursor, page.fallback
    rows = []
    for h in hits:
        where = f"{h.task_id} #{h.turn}" if h.kind == "turn" else f"{h.store_name}: {h.path}"
        rows.append((h.kind, where, f"{h.score:.2f}", plain(h.snippet)))
    text = table(["kind", "where", "score", "snippet"], rows, max_width=70)
    text += f"\n{len(hits)} hit(s)"
    if more:
        text += f"; more: --cursor {more}"
    if fallback:
        text += f"\nkeyword results only: {fallback}"
    return Output(data, text)
