"""The client side (app.mount, app.sdk_tool) installs and imports without the server's packages.

An agent's container installs ``project-memory[mount]`` or ``[sdk]``: importing the client
must not need any distribution that only the ``server`` extra brings (Flask, gunicorn,
filelock, python-ulid, orjson, ...). The storage package loads its parts lazily, so the
client shares the server's memory rules and atomic writes instead of restating them.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

DIST = "project-memory"


def _closure(roots: list[str]) -> set[str]:
    """The distributions ``roots`` need, transitively (normalised names, installed ones)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _extra(extra: str) -> list[str]:
    out = []
    for line in md.requires(DIST) or []:
        req = Requirement(line)
        marker = req.marker
        only_there = marker is not None and not marker.evaluate({"extra": ""})
        if only_there and marker.evaluate({"extra": extra}):
            out.append(req.name)
    return out


def _top_level_modules(dists: set[str]) -> set[str]:
    modules = set()
    for module, owners in md.packages_distributions().items():
        if any(o.lower().replace("_", "-") in dists for o in owners):
            modules.add(module)
    return modules


def test_the_server_extra_holds_what_the_client_must_not_need() -> None:
    base = [Requirement(r).name for r in md.requires(DIST) or [] if "extra ==" not in r]
    assert base == ["requests"]
    assert {"flask", "gunicorn", "filelock", "python-ulid", "orjson"} <= set(_extra("server"))
    assert _extra("mount") == []
    assert _extra("sdk") == ["anthropic"]


@pytest.mark.parametrize(
    "modules",
    ["app.mount.cli, app.mount.sync, app.mount.http", "app.sdk_tool"],
)
def test_client_modules_import_nothing_only_the_server_needs(modules: str) -> None:
    client = _closure(["requests", *_extra("sdk")])
    server_only = _closure(_extra("server")) - client
    forbidden = _top_level_modules(server_only)
    assert {"flask", "gunicorn", "filelock", "ulid", "orjson"} <= forbidden
    code = f"import json, sys, {modules}\nprint(json.dumps(sorted(sys.modules)))\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(run.stdout)
    bad = sorted(m for m in loaded if m.split(".")[0] in forbidden)
    assert bad == [], f"{modules} imported server-only modules: {bad}"
    # The storage package's plain modules (the memory rules, the layout, atomic writes) are
    # shared; the web layer is not.
    server_side = sorted(
        m for m in loaded if m.startswith(("app.api", "app.config", "app.web.auth"))
    )
    assert server_side == [], f"{modules} imported the server: {server_side}"
