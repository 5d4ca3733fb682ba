"""Flask CLI commands: ``flask --app wsgi tokens ...`` (and the operations commands)."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
from flask import Flask, current_app
from flask.cli import AppGroup, with_appcontext

from app.ops.secrets_cli import secrets_group
from app.services import oauth as oauth_service
from app.storage.core.errors import StorageError
from app.storage.core.limits import (
    QuotaOverride,
    RateOverride,
    RateOverrides,
    format_bytes,
    human_bytes,
    parse_bytes,
)
from app.storage.core.models import FsckReport
from app.storage.core.names import Scope
from app.storage.core.tokens import ROLES, SECRET_PREFIX, TOKEN_ID_PREFIX
from app.storage.interface import StorageBackend, TokenStore
from app.web.ratelimit import Limiter, limits_of, resolve

tokens = AppGroup("tokens", help="Create, list and revoke API tokens.")


def _registry() -> TokenStore:
    reg: TokenStore = current_app.extensions["token_registry"]
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
    registry = _registry()
    now = registry.clock()
    for t in registry.all():
        # The same rule as authentication: an expired token is refused, so never "active".
        state = "revoked" if t.revoked_at else "active" if t.usable(now) else "expired"
        click.echo(
            f"{t.id}\t{t.role}\ttenant={t.tenant or '*'}\tproject={t.project or '*'}\t"
            f"name={t.name!r}\tcreated={t.created_at}\texpires={t.expires_at or 'never'}\t{state}"
        )


@tokens.command("revoke")
@click.argument("token")
def revoke_token(token: str) -> None:
    """Revoke a token by its id (tok_..., from `tokens list`) or by its secret; every worker
    refuses it from the next request on. Only the id is ever printed."""
    from app.storage.core.errors import NotFound

    registry = _registry()
    if token.startswith(SECRET_PREFIX):
        found = registry.find_by_secret(token)
        if found is None:
            raise click.ClickException("no token has that secret")
        token = found.id
    elif not token.startswith(TOKEN_ID_PREFIX):
        # Maybe a secret pasted wrong: never echoed back to the terminal or a log.
        raise click.ClickException(
            f"not a token id ({TOKEN_ID_PREFIX}..., see `tokens list`) nor a secret"
            f" ({SECRET_PREFIX}...)"
        )
    try:
        revoked = registry.revoke(token)
    except NotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"revoked {revoked.id} at {revoked.revoked_at}")
    for grant in oauth_service.end_grants_of(_storage(), revoked.id, now=registry.clock()):
        click.echo(f"revoked {grant.id} (OAuth: {grant.client_name})")


oauth = AppGroup("oauth", help="OAuth grants made on the consent page (clients of /mcp).")


@oauth.command("grants")
def list_grants() -> None:
    """List grants, one per line, starting with the id (secrets are never kept)."""
    now = _registry().clock()
    for g in _storage().oauth.grants():
        state = "revoked" if g.revoked_at else "active" if g.usable(now) else "expired"
        click.echo(
            f"{g.id}\t{g.role}\ttenant={g.tenant}\tproject={g.project}\ttoken={g.token_id}\t"
            f"client={g.client_name!r}\tclient_id={g.client_id}\tcreated={g.created_at}\t"
            f"expires={g.expires_at}\t{state}" + (f" ({g.revoked_reason})" if g.revoked_at else "")
        )


@oauth.command("revoke")
@click.argument("grant_id")
def revoke_grant(grant_id: str) -> None:
    """Revoke a grant (grt_..., from `oauth grants`): its refresh token is refused at once,
    its access tokens within a second."""
    from app.storage.core.errors import NotFound

    try:
        grant = oauth_service.revoke(_storage(), None, grant_id, now=_registry().clock())
    except NotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"revoked {grant.id} at {grant.revoked_at}")


# -- operations: sweep, fsck, export, import ------------------------------------------------
def _storage() -> StorageBackend:
    found: StorageBackend = current_app.extensions["storage"]
    return found


def _parse_now(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO 8601 time", param_hint="--now") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@click.command("sweep")
@with_appcontext
@click.option("--now", "now_text", default=None, help="Sweep as of this ISO 8601 time (UTC).")
@click.option("--dry-run", is_flag=True, help="Report what would go; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--force",
    is_flag=True,
    help="Sweep even when the clock looks stepped forward past the last sweep.",
)
def sweep_command(now_text: str | None, dry_run: bool, as_json: bool, force: bool) -> None:
    """Delete expired turns, empty tasks, old versions and stale leftovers; print what went."""
    from app.ops.sweeper import run_sweep

    outcome = run_sweep(current_app, now=_parse_now(now_text), dry_run=dry_run, force=force)
    _storage().flush_derived()  # the sweep rewrites derived files without fsync (atomic_file)
    if as_json:
        click.echo(json.dumps(outcome.to_dict()))
    else:
        for line in outcome.lines():
            click.echo(line)
        for error in outcome.errors:
            click.echo(f"error: {error}", err=True)
    if outcome.errors or outcome.refused:
        raise SystemExit(1)


def _fsck_all(repair: bool, grace: timedelta) -> FsckReport:
    report = _storage().fsck(repair=repair, grace=grace)
    if repair:
        _storage().flush_derived()  # rebuilt derived files are written without fsync (atomic_file)
    return report


@click.command("fsck")
@with_appcontext
@click.option("--repair", is_flag=True, help="Rebuild derived files from the records.")
@click.option(
    "--grace-minutes",
    type=float,
    default=10.0,
    show_default=True,
    help="Temp files younger than this belong to writes in flight.",
)
def fsck_command(repair: bool, grace_minutes: float) -> None:
    """Check the whole storage root; exit 0 when consistent (or repaired), 1 otherwise."""
    grace = timedelta(minutes=grace_minutes)
    report = _fsck_all(repair, grace)
    fixed, broken = set(report.repaired), set(report.unrepairable)
    for problem in report.problems:
        state = "repaired" if problem in fixed else "UNREPAIRED" if repair else "problem"
        click.echo(f"{state}: {problem}")
    for line in report.unrepairable:
        if line not in report.problems:
            click.echo(f"UNREPAIRED: {line}")
    for note in report.notes:
        click.echo(f"note: {note}")
    if repair and report.problems:
        # Trust, but verify: what repair left behind is what the next check finds.
        report = _fsck_all(False, grace)
    ok = report.clean and not broken
    if ok:
        if repair:
            # A full check the start-up recovery left pending (or failed) is done now.
            _storage().recovery.recovered()
        click.echo("fsck: clean")
        return
    summary = f"fsck: {len(report.problems)} problem(s)"
    if report.unreadable:
        # Never "clean" while a file could not be read, and never a reason to repair.
        summary += (
            f", {len(report.unreadable)} of them file(s) that cannot be read now (I/O or"
            " permission errors, not damage; nothing that depends on them was changed):"
            " fix the disk or the files' owner and mode, then run fsck again"
        )
    elif repair:
        summary += " remain after repair"
    else:
        summary += "; run `flask --app wsgi fsck --repair`"
    click.echo(summary)
    raise SystemExit(1)


def _counts(counts: dict[str, int]) -> str:
    return (
        f"{counts['tasks']} task(s), {counts['turns']} turn(s), {counts['artifacts']}"
        f" artifact(s) ({counts['artifact_bytes']} byte(s)), {counts['stores']} memory"
        f" store(s), {counts['versions']} version(s)"
    )


@click.command("export")
@with_appcontext
@click.option("--tenant", default=None, help="Only this tenant (default: every tenant).")
@click.option("--project", default=None, help="Only this project of --tenant.")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def export_command(tenant: str | None, project: str | None, file: Path) -> None:
    """Back up one project, one tenant or the whole root (tasks, memory stores) to FILE."""
    from app.storage.core.errors import StorageError

    try:
        summary = _storage().export(file, tenant=tenant, project=project)
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    what = f"{tenant}/{project}" if project else tenant or "the whole root"
    click.echo(f"exported {what}: {_counts(summary.counts)} -> {file}")


@click.command("import")
@with_appcontext
@click.option("--tenant", default=None, help="Into this tenant (a backup of one project only).")
@click.option("--project", default=None, help="Into this project (with --tenant).")
@click.option("--overwrite", is_flag=True, help="Replace tasks and stores that already exist.")
@click.argument("file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
def import_command(tenant: str | None, project: str | None, overwrite: bool, file: Path) -> None:
    """Check FILE whole and restore it: all of it, or nothing."""
    from app.storage.core.errors import StorageError

    try:
        with open(file, "rb") as fh:
            summary = _storage().import_(fh, tenant=tenant, project=project, overwrite=overwrite)
    except StorageError as exc:
        raise click.ClickException(f"import refused: {exc}") from None
    _storage().flush_derived()  # the import writes derived files without fsync (atomic_file)
    click.echo(f"imported {_counts(summary.counts)}")
    _mask_imported(tenant, project)
    if summary.kept:
        shown = ", ".join(summary.kept[:10]) + (", ..." if len(summary.kept) > 10 else "")
        click.echo(
            f"kept {len(summary.kept)} task(s) created while the import ran, as their writers"
            f" left them (their copies in the backup were not imported): {shown}"
        )


def _mask_imported(tenant: str | None, project: str | None) -> None:
    """What an import restored holds no secret its projects' policies keep out: each project it
    may have written (every project, for a whole backup) is purged as `secrets purge` does,
    but for those whose policy is allow."""
    from app.services.secret_sweep import Sweep, scopes_named

    storage = _storage()
    scopes = scopes_named(storage, tenant, project)
    tally = Sweep(storage, purge=True, report=lambda found: None, skip_allowed=True).run(scopes)
    if tally.found:
        click.echo(f"masked {tally.found} secret(s) in {tally.purged} record(s) (docs/secrets.md)")
    for skipped in tally.skipped:
        click.echo(f"not masked: {skipped}", err=True)


# -- rate limits: per-tenant and per-project overrides of the MEMORY_RATE_LIMIT_* settings -----
ratelimit = AppGroup(
    "ratelimit", help="Show and change rate limits per tenant and project (<root>/.limits.json)."
)


class _ByteCount(click.ParamType[int, Any]):
    name = "bytes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return parse_bytes(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _limiter() -> Limiter:
    limiter: Limiter = current_app.extensions["rate_limiter"]
    return limiter


def _where(tenant: str, project: str | None) -> str:
    return f"project {tenant}/{project}" if project else f"tenant {tenant}"


def _fields_text(rate: RateOverride) -> str:
    parts = []
    for name, value in rate.to_json().items():
        shown = format_bytes(int(value)) if name.startswith("upload") else f"{value:g}"
        parts.append(f"{name}={shown}")
    return " ".join(parts)


def _applies(tenant: str, project: str | None, overrides: RateOverrides) -> dict[str, Any]:
    """The limits that apply in a project (or, without one, in a tenant's projects that
    have no entry of their own)."""
    resolved = resolve(_limiter().defaults, overrides, tenant, project or "")
    return {"limits": resolved.to_json(), "text": limits_of(resolved).describe()}


@ratelimit.command("set")
@click.option("--tenant", required=True)
@click.option("--project", default=None, help="Omit to set the default of the tenant's projects.")
@click.option("--rps", type=click.FloatRange(min=0), help="Requests per second; 0: no limit.")
@click.option("--burst", type=click.IntRange(min=0), help="Requests at once; 0: the rate.")
@click.option(
    "--upload-bps", type=_ByteCount(), help="Body bytes per second of writes (10MiB); 0: no limit."
)
@click.option(
    "--upload-burst", type=_ByteCount(), help="Body bytes at once; 0: one second's worth."
)
def set_rate_limit(
    tenant: str,
    project: str | None,
    rps: float | None,
    burst: int | None,
    upload_bps: int | None,
    upload_burst: int | None,
) -> None:
    """Set rate limits of a project (or a tenant); fields not given keep their value.

    Every worker applies the change within a second, without a restart.
    """
    change = RateOverride(rps=rps, burst=burst, upload_bps=upload_bps, upload_burst=upload_burst)
    if change.empty:
        raise click.UsageError("give at least one of --rps, --burst, --upload-bps, --upload-burst")
    file = _limiter().file
    try:
        entry = file.set_rate(tenant, project, change)
        applies = _applies(tenant, project, file.rates())
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{_where(tenant, project)}: {_fields_text(entry)} -> {applies['text']}")


@ratelimit.command("show")
@click.option("--tenant", default=None, help="Only the limits that apply in this tenant ...")
@click.option("--project", default=None, help="... or in this project of it.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show_rate_limits(tenant: str | None, project: str | None, as_json: bool) -> None:
    """Show the settings' limits and every override, with the limits each leads to."""
    if project is not None and tenant is None:
        raise click.UsageError("--project needs --tenant")
    limiter = _limiter()
    try:
        overrides = limiter.file.rates()
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    defaults = resolve(limiter.defaults, overrides, "", "")
    out: dict[str, Any] = {
        "file": str(limiter.file.path),
        "exempt_admin": limiter.exempt_admin,
        "settings": {"limits": defaults.to_json(), "text": limits_of(defaults).describe()},
    }
    if tenant is not None:
        out["applies"] = {
            "tenant": tenant,
            "project": project,
            **_applies(tenant, project, overrides),
        }
    else:
        out["tenants"] = {
            name: {"rate": rate.to_json(), **_applies(name, None, overrides)}
            for name, rate in sorted(overrides.tenants.items())
        }
        out["projects"] = {
            f"{t}/{p}": {"rate": rate.to_json(), **_applies(t, p, overrides)}
            for (t, p), rate in sorted(overrides.projects.items())
        }
        out["skipped"] = list(overrides.skipped)
    if as_json:
        click.echo(json.dumps(out))
        return
    admins = "exempt" if limiter.exempt_admin else "limited like any token"
    click.echo(f"settings (MEMORY_RATE_LIMIT_*): {out['settings']['text']}; admin tokens {admins}")
    if tenant is not None:
        click.echo(f"{_where(tenant, project)}: {out['applies']['text']}")
        return
    for name, entry in out["tenants"].items():
        click.echo(f"tenant {name}: {_fields_text(overrides.tenants[name])} -> {entry['text']}")
    for key, entry in out["projects"].items():
        t, _, p = key.partition("/")
        click.echo(f"project {key}: {_fields_text(overrides.projects[(t, p)])} -> {entry['text']}")
    for fault in overrides.skipped:
        click.echo(f"skipped, limits nothing (clear or set it again): {fault}")
    if not overrides.tenants and not overrides.projects and not overrides.skipped:
        click.echo(f"no overrides in {limiter.file.path}")


@ratelimit.command("clear")
@click.option("--tenant", required=True)
@click.option("--project", default=None, help="Omit to clear the tenant's own entry.")
def clear_rate_limit(tenant: str, project: str | None) -> None:
    """Remove the rate limits set for a project (or a tenant): the next level applies again."""
    try:
        cleared = _limiter().file.clear_rate(tenant, project)
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    state = "rate limits cleared" if cleared else "had no rate limits set"
    click.echo(f"{_where(tenant, project)}: {state}")


# -- usage and quotas (app/storage/core/usage.py) ----------------------------------------------
@click.command("usage")
@with_appcontext
@click.option("--tenant", default=None, help="Only this tenant (default: every tenant).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def usage_command(tenant: str | None, as_json: bool) -> None:
    """Show what each project and tenant stores, against its quotas."""
    from app.services import usage_report as ur

    storage = _storage()
    try:
        quotas = storage.limits().quotas()
        tenants = ur.tenant_entries(storage, None if tenant is None else [tenant], quotas)
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    free = storage.free_space()
    disk = None if free is None else {"free_bytes": free[0], "floor_bytes": free[1]}
    if as_json:
        click.echo(json.dumps({"tenants": tenants, "disk": disk}))
        return
    for entry in tenants:
        click.echo(f"tenant {entry['tenant']}: {ur.usage_line(entry['usage'])}")
        click.echo(f"  quota: {ur.quota_text(entry['quota'])}")
        for project in entry["projects"]:
            click.echo(
                f"  project {entry['tenant']}/{project['project']}: {ur.usage_line(project['usage'])}"
            )
            if project["quota"]["bytes"] is not None or project["quota"]["tasks"] is not None:
                click.echo(f"    quota: {ur.quota_text(project['quota'])}")
    if not tenants:
        click.echo("nothing stored yet")
    if disk is not None:
        click.echo(
            f"disk: {human_bytes(disk['free_bytes'])} free; writes stop below"
            f" {human_bytes(disk['floor_bytes'])} free (MEMORY_MIN_FREE_BYTES)"
        )


quota = AppGroup(
    "quota", help="Show and change storage quotas per tenant and project (<root>/.limits.json)."
)


@quota.command("set")
@click.option("--tenant", required=True)
@click.option("--project", default=None, help="Omit to bound the tenant's total.")
@click.option("--bytes", "nbytes", type=_ByteCount(), help="Bytes it may store (10GiB, 500MB).")
@click.option("--tasks", type=click.IntRange(min=0), help="Tasks it may hold.")
def set_quota(tenant: str, project: str | None, nbytes: int | None, tasks: int | None) -> None:
    """Set a project's quota (or, without --project, the tenant's); fields not given keep
    their value. Every worker applies it within a second."""
    change = QuotaOverride(bytes=nbytes, tasks=tasks)
    if change.empty:
        raise click.UsageError("give at least one of --bytes, --tasks")
    try:
        entry = _storage().limits().set_quota(tenant, project, change)
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{_where(tenant, project)}: {_quota_text(entry)}")


def _quota_text(entry: QuotaOverride) -> str:
    from app.services.usage_report import quota_json, quota_text

    return quota_text(quota_json(entry))


@quota.command("show")
@click.option("--tenant", default=None, help="Only this tenant's quotas.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show_quotas(tenant: str | None, as_json: bool) -> None:
    """Show every quota, with what is stored against it."""
    from app.storage.core.usage import ZERO

    storage = _storage()
    try:
        quotas = storage.limits().quotas()
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    tenants = {t: q for t, q in sorted(quotas.tenants.items()) if tenant is None or t == tenant}
    projects = {
        k: q for k, q in sorted(quotas.projects.items()) if tenant is None or k[0] == tenant
    }
    by_tenant: dict[str, Any] = {
        t: {"quota": q.to_json(), "usage": sum(storage.usages([t]).values(), ZERO).to_json()}
        for t, q in tenants.items()
    }
    by_project: dict[str, Any] = {
        f"{t}/{p}": {"quota": q.to_json(), "usage": storage.usage(Scope(t, p)).to_json()}
        for (t, p), q in projects.items()
    }
    path = str(storage.limits().path)
    if as_json:
        click.echo(json.dumps({"file": path, "tenants": by_tenant, "projects": by_project}))
        return
    from app.services.usage_report import usage_line

    for name, entry in [*by_tenant.items(), *by_project.items()]:
        kind = "project" if "/" in name else "tenant"
        click.echo(
            f"{kind} {name}: {_quota_text(QuotaOverride(**entry['quota']))};"
            f" stores {usage_line(entry['usage'])}"
        )
    if not tenants and not projects:
        click.echo(f"no quotas in {path}")


@quota.command("clear")
@click.option("--tenant", required=True)
@click.option("--project", default=None, help="Omit to clear the tenant's own quota.")
@click.option("--bytes", "only_bytes", is_flag=True, help="Clear only the byte quota.")
@click.option("--tasks", "only_tasks", is_flag=True, help="Clear only the task quota.")
def clear_quota(tenant: str, project: str | None, only_bytes: bool, only_tasks: bool) -> None:
    """Remove a project's (or a tenant's) quota: nothing bounds it there any more."""
    names = tuple(n for n, on in (("bytes", only_bytes), ("tasks", only_tasks)) if on) or (
        "bytes",
        "tasks",
    )
    try:
        cleared = _storage().limits().clear_quota(tenant, project, names)
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    state = "quota cleared" if cleared else "had no such quota"
    click.echo(f"{_where(tenant, project)}: {state}")


def _one_line_errors(command: click.Command) -> None:
    """Make a storage failure of ``command`` (and of its subcommands) one line on stderr and
    exit status 1, as every command's own refusals are: a database or an object store that
    cannot be reached is an operator's situation, not a bug to print a traceback for."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _one_line_errors(sub)
    callback = command.callback
    if callback is None or getattr(callback, "_one_line", False):
        return

    @functools.wraps(callback)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except StorageError as exc:
            raise click.ClickException(str(exc)) from None

    guarded._one_line = True  # type: ignore[attr-defined]
    command.callback = guarded


def init_app(app: Flask) -> None:
    for command in COMMANDS:
        _one_line_errors(command)
        app.cli.add_command(command)


COMMANDS: tuple[click.Command, ...] = (
    tokens, oauth, ratelimit, quota, usage_command,
    sweep_command, fsck_command, export_command, import_command, secrets_group,
)  # fmt: skip
# `flask --app wsgi <one of these> ...` builds the app without its HTTP side (app.ops.startup).
NAMES = frozenset(str(command.name) for command in COMMANDS)
