"""The token CLI is a public contract: `flask --app wsgi tokens create|list|revoke`."""

from __future__ import annotations

from flask import Flask

from app.storage.tree.tokens import TokenRegistry
from tests.conftest import FixedClock


def test_create_prints_the_secret_alone_on_the_last_line(app: Flask) -> None:
    runner = app.test_cli_runner()
    result = runner.invoke(
        args=[
            "tokens",
            "create",
            "--role",
            "writer",
            "--tenant",
            "acme",
            "--project",
            "web",
            "--name",
            "ci",
        ]
    )
    assert result.exit_code == 0, result.output
    secret = result.output.strip().splitlines()[-1]
    assert secret.startswith("pm_") and len(secret) >= 43 + 3
    registry: TokenRegistry = app.extensions["token_registry"]
    token = registry.authenticate(secret)
    assert (
        token is not None
        and token.role == "writer"
        and token.tenant == "acme"
        and token.project == "web"
    )
    assert token.name == "ci"


def test_list_never_shows_secrets_and_revoke_works(app: Flask) -> None:
    runner = app.test_cli_runner()
    created = runner.invoke(
        args=["tokens", "create", "--role", "reader", "--tenant", "acme", "--expires-in-days", "2"]
    )
    secret = created.output.strip().splitlines()[-1]
    listing = runner.invoke(args=["tokens", "list"])
    assert listing.exit_code == 0
    line = listing.output.strip().splitlines()[-1]
    token_id = line.split()[0]
    assert token_id.startswith("tok_") and secret not in listing.output and "active" in line
    revoked = runner.invoke(args=["tokens", "revoke", token_id])
    assert revoked.exit_code == 0
    assert app.extensions["token_registry"].authenticate(secret) is None
    assert "revoked" in runner.invoke(args=["tokens", "list"]).output
    assert runner.invoke(args=["tokens", "revoke", "tok_nope"]).exit_code != 0


def test_create_refuses_bad_combinations(app: Flask) -> None:
    runner = app.test_cli_runner()
    assert runner.invoke(args=["tokens", "create", "--role", "writer"]).exit_code != 0  # no tenant
    assert (
        runner.invoke(args=["tokens", "create", "--role", "root", "--tenant", "a"]).exit_code != 0
    )
    assert (
        runner.invoke(args=["tokens", "create", "--role", "reader", "--tenant", "../x"]).exit_code
        != 0
    )
    assert runner.invoke(args=["tokens", "create", "--role", "admin"]).exit_code == 0


def test_list_shows_an_expired_token_as_expired(app: Flask, clock: FixedClock) -> None:
    runner = app.test_cli_runner()
    runner.invoke(args=["tokens", "create", "--role", "reader", "--tenant", "a", "--name", "old"])
    runner.invoke(
        args=["tokens", "create", "--role", "reader", "--tenant", "a", "--expires-in-days", "1"]
    )
    clock.advance(days=2)
    lines = runner.invoke(args=["tokens", "list"]).output.strip().splitlines()
    assert [line.rsplit("\t", 1)[-1] for line in lines] == ["active", "expired"]


def test_revoke_never_prints_a_secret_back_and_takes_one_in_place_of_the_id(app: Flask) -> None:
    runner = app.test_cli_runner()
    created = runner.invoke(args=["tokens", "create", "--role", "reader", "--tenant", "a"])
    secret = created.output.strip().splitlines()[-1]
    registry: TokenRegistry = app.extensions["token_registry"]
    token = registry.authenticate(secret)
    assert token is not None
    # A secret of no token: refused, without the secret in the message.
    unknown = runner.invoke(args=["tokens", "revoke", "pm_" + "x" * 43])
    assert unknown.exit_code != 0 and "x" * 43 not in unknown.output
    assert "no token has that secret" in unknown.output
    # Neither an id nor a secret: refused without echoing it either.
    other = runner.invoke(args=["tokens", "revoke", "hunter2-maybe-a-password"])
    assert other.exit_code != 0 and "hunter2" not in other.output
    # The secret itself revokes its token, and only the id is printed.
    revoked = runner.invoke(args=["tokens", "revoke", secret])
    assert revoked.exit_code == 0, revoked.output
    assert secret not in revoked.output and f"revoked {token.id}" in revoked.output
    assert registry.authenticate(secret) is None
