"""``whoami``: which token this is (never its secret), its role, and where it acts."""

from __future__ import annotations

import argparse

from . import Context, Output, add_common_options, configure, fields


def register(parser: argparse.ArgumentParser) -> None:
    add_common_options(parser)
    configure(parser, whoami)


def whoami(ctx: Context) -> Output:
    client = ctx.client()
    me = client.whoami()
    data = {"url": client.url, **me.to_dict()}
    text = fields(
        [
            ("server", client.url),
            ("token", f"{me.token_id} ({me.name})" if me.name else me.token_id),
            ("user", f"{me.user_name or me.user} ({me.user})" if me.user else "none"),
            ("role", me.role),
            ("tenant", me.tenant),
            (
                "project",
                me.project + (" (your private space)" if me.visibility == "private" else ""),
            ),
            ("expires", me.expires_at or "never"),
        ]
    )
    return Output(data, text)
