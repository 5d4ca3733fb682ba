"""``flask --app wsgi secrets``: a project's secret policy and allowlists, from the shell.

The operator's door to what ``PUT /sandbox/memory/v1/secrets/policy`` sets
(core/secret_policy.py): the policy and allowlists of a project, or of a tenant (which its
projects inherit). Each change is written to ``<root>/.limits.json`` under its lock, applied
by every worker within a second, and recorded in the project's audit log as made by ``cli``
(services/secrets.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from flask import current_app
from flask.cli import AppGroup

from app.services.secrets import operator_set_policy
from app.storage.core import secret_scan
from app.storage.core.errors import StorageError
from app.storage.core.secret_policy import POLICIES, SecretsOverride
from app.storage.interface import StorageBackend

secrets_group = AppGroup(
    "secrets", help="Show and set what each project does with the secrets it is sent."
)


def _storage() -> StorageBackend:
    found: StorageBackend = current_app.extensions["storage"]
    return found


def _where(tenant: str, project: str | None) -> str:
    return f"{tenant}/{project}" if project else f"tenant {tenant} (its projects inherit it)"


@secrets_group.command("policy")
@click.option("--tenant", required=True)
@click.option("--project", default=None, help="Omit for the tenant's, which projects inherit.")
@click.option("--set", "policy", type=click.Choice(POLICIES), help="The policy to set.")
def policy_command(tenant: str, project: str | None, policy: str | None) -> None:
    """Show the policy in force, or set it (mask, reject, allow)."""
    storage = _storage()
    try:
        if policy is not None:
            operator_set_policy(storage, tenant, project, SecretsOverride(policy=policy))
        settings = storage.limits().secrets()
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    if project is None:
        own = settings.tenants.get(tenant) or SecretsOverride()
        click.echo(f"{_where(tenant, None)}: {own.policy or 'not set (mask)'}")
        return
    found = settings.of(tenant, project)
    click.echo(
        f"{tenant}/{project}: {found.policy}; allow patterns {len(found.allow_patterns)},"
        f" allow fingerprints {len(found.allow_fingerprints)}"
    )


@secrets_group.command("allow")
@click.option("--tenant", required=True)
@click.option("--project", default=None, help="Omit for the tenant's, which projects inherit.")
@click.option("--pattern", "patterns", multiple=True, help="A regular expression (repeatable).")
@click.option(
    "--fingerprint", "fingerprints", multiple=True, help="A value's SHA-256, hex (repeatable)."
)
@click.option(
    "--value-from-stdin",
    is_flag=True,
    help="Read one value from stdin and allow its fingerprint (the value is never stored).",
)
@click.option("--clear", is_flag=True, help="Empty both allowlists first.")
def allow_command(
    tenant: str,
    project: str | None,
    patterns: tuple[str, ...],
    fingerprints: tuple[str, ...],
    value_from_stdin: bool,
    clear: bool,
) -> None:
    """Add to (or, with --clear, replace) the allowlists: what the scanner found that is no
    secret."""
    storage = _storage()
    prints = list(fingerprints)
    if value_from_stdin:
        value = sys.stdin.read().rstrip("\n")
        if not value:
            raise click.UsageError("stdin held no value")
        prints.append(secret_scan.fingerprint(value))
    if not (patterns or prints or clear):
        raise click.UsageError("give --pattern, --fingerprint, --value-from-stdin or --clear")
    try:
        settings = storage.limits().secrets()
        section = (
            settings.projects.get((tenant, project)) if project else settings.tenants.get(tenant)
        ) or SecretsOverride()
        kept_patterns = () if clear else section.allow_patterns or ()
        kept_prints = () if clear else section.allow_fingerprints or ()
        done = operator_set_policy(
            storage,
            tenant,
            project,
            SecretsOverride(
                allow_patterns=tuple(dict.fromkeys((*kept_patterns, *patterns))),
                allow_fingerprints=tuple(dict.fromkeys((*kept_prints, *prints))),
            ),
        )
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"{_where(tenant, project)}: allow patterns {len(done.allow_patterns or ())},"
        f" allow fingerprints {len(done.allow_fingerprints or ())}"
    )


def _sweep(tenant: str | None, project: str | None, state: Path | None, purge: bool) -> None:
    from app.services.secret_sweep import Found, State, Sweep, scopes_named

    if project is not None and tenant is None:
        raise click.UsageError("--project needs --tenant")
    storage = _storage()

    def report(found: Found) -> None:
        click.echo(json.dumps(found.to_json()))

    try:
        tally = Sweep(storage, purge=purge, report=report, state=State(state)).run(
            scopes_named(storage, tenant, project)
        )
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps({"summary": tally.to_json()}))
    if tally.skipped:
        raise click.ClickException(f"{len(tally.skipped)} place(s) left as they were (see skipped)")


_SWEEP_OPTIONS = (
    click.option("--tenant", default=None, help="Only this tenant (default: every one)."),
    click.option("--project", default=None, help="Only this project (with --tenant)."),
    click.option(
        "--state",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="A file keeping where the walk got to: run again with it to go on from there.",
    ),
)


def _with_sweep_options(command: Any) -> Any:
    for option in reversed(_SWEEP_OPTIONS):
        command = option(command)
    return command


@secrets_group.command("scan")
@_with_sweep_options
def scan_command(tenant: str | None, project: str | None, state: Path | None) -> None:
    """Find the secrets already stored (turns, text artifacts, stores, every memory version):
    one JSON line per finding (where and what kind, never the value), then a summary."""
    _sweep(tenant, project, state, purge=False)


@secrets_group.command("purge")
@_with_sweep_options
def purge_command(tenant: str | None, project: str | None, state: Path | None) -> None:
    """Mask the secrets already stored, in place: turns rewritten masked, memory versions
    redacted (a live memory's head written masked first), stores updated. The findings are
    printed as by `scan`."""
    _sweep(tenant, project, state, purge=True)
