"""First start: create the storage root and a first admin token, printed once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from flask import Flask

from .storage.atomic import make_dirs


def first_start(bind: str, app: Flask | None = None) -> None:
    from . import create_app

    app = app or create_app()
    root = Path(app.config["STORAGE_ROOT"])
    make_dirs(root, Path(root.anchor))
    registry = app.extensions["token_registry"]
    if not registry.is_empty():
        return
    tenant, project = app.config["DEFAULT_TENANT"], app.config["DEFAULT_PROJECT"]
    token, secret = registry.create(
        role="admin", tenant=tenant, project=project, name="first token (make run)"
    )
    host = bind if "://" in bind else f"http://{bind}"
    lines = [
        "",
        "=" * 72,
        f"First start: created admin token {token.id} for tenant '{tenant}', project '{project}'.",
        "It is shown once and stored only as a hash. Keep it somewhere safe:",
        "",
        f"    {secret}",
        "",
        "Try it:",
        f"    curl -s -X PUT {host}/sandbox/memory/v1/tasks/hello/turns/0 \\",
        f"      -H 'Authorization: Bearer {secret}' -H 'Content-Type: application/json' \\",
        '      -d \'{"meta": {"model": "demo"}, "summary_md": "First turn."}\'',
        f"    curl -s {host}/sandbox/memory/v1/project.md -H 'Authorization: Bearer {secret}'",
        "",
        f"Web console: {host}/console/ (sign in there with the same token)",
        "",
        f"Token registry: {app.config['TOKENS_FILE']}   Storage root: {root}",
        "=" * 72,
        "",
    ]
    sys.stdout.write("\n".join(lines))
    sys.stdout.flush()
    os.environ.setdefault("MEMORY_FIRST_TOKEN_ID", token.id)
