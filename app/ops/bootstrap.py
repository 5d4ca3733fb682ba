"""Every start: create the storage root, say where things are; on the first, make a token.

The first start creates an admin token and prints it once (``MEMORY_FIRST_TOKEN=print``, the
default), or creates none (``off``: for services whose stdout goes to a journal or
``docker logs``, where a secret would stay). Every later start prints the command that
makes a new admin token, never a secret.
"""

from __future__ import annotations

import os
import pwd
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

from flask import Flask

from app.config import PREFIX
from app.ops.startup import control_socket_path, parse_bind
from app.storage.core.files import make_config_dirs


def first_start(bind: str, app: Flask | None = None) -> None:
    """Create the storage root, the first token if it is time, and say where things are."""
    from app import create_app

    app = app or create_app()
    root = Path(app.config["STORAGE_ROOT"])
    make_config_dirs(root)
    registry = app.extensions["token_registry"]
    url = parse_bind(bind).url
    token_lines = []
    if registry.is_empty() and _prints_first_token(app):
        token_lines = first_token(app, url)
    lines = where_things_are(app, url) + token_lines
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def where_things_are(app: Flask, url: str) -> list[str]:
    """The lines every start prints: URL, storage root, registry and its size, how to get in."""
    registry = app.extensions["token_registry"]
    tokens = registry.all()
    now = datetime.now(UTC)
    usable = sum(1 for t in tokens if t.usable(now))
    where = url
    if url.startswith(("http://0.0.0.0:", "http://[::]:")):
        where += " (every interface)"
    ctl = control_socket_path(app.config["STORAGE_ROOT"])
    lines = [
        "Project Memory",
        f"  URL             {where}",
        f"  web console     {url}/console/",
        f"  storage root    {app.config['STORAGE_ROOT']}",
        f"  token registry  {_registry_place(app)}"
        + (f" ({_count(len(tokens), 'token')}, {usable} usable)" if tokens else " (no tokens yet)"),
        f"  control socket  {ctl or 'off (the storage root path is too long for a socket)'}",
    ]
    command = admin_token_command(app)
    if tokens:
        lines.append(f"  new admin token {command}")
    elif not _prints_first_token(app):
        lines.append(f"  first token     none ({PREFIX}_FIRST_TOKEN=off): create it with")
        lines.append(f"                  {command}")
    if _on_database(app) and (tokens or not _prints_first_token(app)):
        # Its URL may hold a password: the names only, never the values.
        names = ", ".join(f"{PREFIX}_{n}" for n in _DATABASE_SETTINGS)
        lines.append(f"                  (with this server's {names} and AWS_* set)")
    return lines


# The settings a command needs to reach the PostgreSQL backend (and its object store).
_DATABASE_SETTINGS = ("DATABASE_URL", "BLOB_URL", "S3_ENDPOINT_URL")


def _on_database(app: Flask) -> bool:
    return bool(app.config.get("DATABASE_URL"))


def _registry_place(app: Flask) -> str:
    if _on_database(app):
        return f"the database ({PREFIX}_DATABASE_URL)"
    return str(app.config["TOKENS_FILE"])


def _prints_first_token(app: Flask) -> bool:
    return bool(app.config["FIRST_TOKEN"] == "print")  # noqa: S105 - a mode, not a secret


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def admin_token_command(app: Flask) -> str:
    """The shell command that creates an admin token for this server, as it runs here."""
    flask = Path(sys.executable).with_name("flask")
    cwd = Path.cwd()
    if not flask.exists():
        shown = "flask"  # from PATH, wherever this interpreter's scripts went
    elif flask.is_relative_to(cwd):
        shown = str(flask.relative_to(cwd))
    else:
        shown = str(flask)
    words = [shown, "--app", "wsgi", "tokens", "create", "--role", "admin", "--name", "admin"]
    env = []
    # On the database the tokens are its own, wherever the (unused) root and file are.
    for name in () if _on_database(app) else ("STORAGE_ROOT", "TOKENS_FILE"):
        if f"{PREFIX}_{name}" in os.environ:
            env.append(f"{PREFIX}_{name}={shlex.quote(app.config[name])}")
    prefix = ""
    uid = os.geteuid()
    if 0 < uid < 1000:  # a system account, as in deploy/project-memory.service
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        prefix = f"sudo -u {shlex.quote(user)} env "
    elif env:
        prefix = "env "
    return f"cd {shlex.quote(str(cwd))} && {prefix}" + " ".join(
        [*env, *(shlex.quote(w) for w in words)]
    )


def first_token(app: Flask, url: str) -> list[str]:
    registry = app.extensions["token_registry"]
    tenant, project = app.config["DEFAULT_TENANT"], app.config["DEFAULT_PROJECT"]
    token, secret = registry.create(
        role="admin", tenant=tenant, project=project, name="first token (make run)"
    )
    return [
        "",
        "=" * 72,
        f"First start: created admin token {token.id} for tenant '{tenant}', project '{project}'.",
        "It is shown once and stored only as a hash. Keep it somewhere safe:",
        "",
        f"    {secret}",
        "",
        "Try it:",
        f"    curl -s -X PUT {url}/sandbox/memory/v1/tasks/hello/turns/0 \\",
        f"      -H 'Authorization: Bearer {secret}' -H 'Content-Type: application/json' \\",
        '      -d \'{"meta": {"model": "demo"}, "summary_md": "First turn."}\'',
        f"    curl -s {url}/sandbox/memory/v1/project.md -H 'Authorization: Bearer {secret}'",
        "",
        f"Web console: {url}/console/ (sign in there with the same token)",
        "",
        f"(Set {PREFIX}_FIRST_TOKEN=off where stdout is kept, e.g. a journal or docker logs.)",
        "=" * 72,
    ]
