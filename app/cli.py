"""Flask CLI commands: ``flask --app wsgi tokens ...`` (and the operations commands)."""

from __future__ import annotations

from datetime import timedelta

import click
from flask import Flask, current_app
from flask.cli import AppGroup

from .storage.tokens import ROLES, TokenRegistry

tokens = AppGroup("tokens", help="Create, list and revoke API tokens.")


def _registry() -> TokenRegistry:
    reg: TokenRegistry = current_app.extensions["token_registry"]
    return reg


@tokens.command("create")
@click.option("--role", type=click.Choice(ROLES), required=True)
@click.option("--tenant", default=None, help="Tenant the token acts in (omit only for admin).")
@click.option("--project", default=None, help="Restrict the token to one project.")
@click.option("--name", default="", help="A label for people reading `tokens list`.")
@click.option("--expires-in-days", type=float, default=None)
def create_token(
    role: str, tenant: str | None, project: str | None, name: str, expires_in_days: float | None
) -> None:
    """Create a token; its secret is printed once, alone on the last line."""
    expires = timedelta(days=expires_in_days) if expires_in_days is not None else None
    try:
        token, secret = _registry().create(
            role=role, tenant=tenant, project=project, name=name, expires_in=expires
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(
        f"created {token.id} role={token.role} tenant={token.tenant or '*'} "
        f"project={token.project or '*'} expires={token.expires_at or 'never'}",
        err=False,
    )
    click.echo(secret)


@tokens.command("list")
def list_tokens() -> None:
    """List tokens, one per line, starting with the id (secrets are never shown)."""
    for t in _registry().all():
        state = "revoked" if t.revoked_at else "active"
        click.echo(
            f"{t.id}\t{t.role}\ttenant={t.tenant or '*'}\tproject={t.project or '*'}\t"
            f"name={t.name!r}\tcreated={t.created_at}\texpires={t.expires_at or 'never'}\t{state}"
        )


@tokens.command("revoke")
@click.argument("token_id")
def revoke_token(token_id: str) -> None:
    """Revoke a token by id; every worker refuses it from the next request on."""
    from .storage import NotFound

    try:
        token = _registry().revoke(token_id)
    except NotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"revoked {token.id} at {token.revoked_at}")


def init_app(app: Flask) -> None:
    app.cli.add_command(tokens)
