"""The package's import boundaries, read from the source (ast): the folders are the
architecture only while nothing imports across them where it must not.

Every import counts, at the top of a module, inside a function or under ``TYPE_CHECKING``:
one inside a function only hides a cycle until the call, and a type-only one still ties the
two modules together. The rules:

* no import cycle anywhere in app/;
* ``app/storage/core/`` imports no backend (``tree``, ``pg``, ``backends``) and none of
  the drivers ``sqlite3``, ``psycopg``, ``boto3``, ``botocore``, ``filelock``;
* ``app/storage/tree/`` imports nothing of ``app/storage/pg/``, and ``pg/`` nothing of
  ``tree/``;
* ``app/storage/`` imports nothing of the app above it (api, web, console, ops, ...);
* the layers above storage (``api``, ``web``, ``console``, ``services``, ``ops``,
  ``schemas``) import the interface, ``core/`` and the ``app.storage`` package, never a
  backend module, and ``app/storage/backends.py`` (which builds the configured backend, the
  one place that names both) is imported by the app factory (``app/__init__.py``) only;
* a door imports no other door: ``console`` nothing of ``api``, ``api`` nothing of
  ``console``; and ``web`` (the plumbing both share) neither;
* ``services`` (the use cases every door calls) is plain Python: no door, no Flask,
  werkzeug or jinja2;
* the audit log is written by the use cases: nothing outside ``services`` imports
  ``app.services.audit``.

Two rules keep each use case's checks in one place, read from the code rather than the
imports (test_audit_events_and_role_ranks_have_one_home_each):

* only ``app/services/audit.py`` calls ``audit_log.record``;
* only ``app/services/access.py`` compares role ranks (``role_rank``), besides the token
  definitions in ``app/storage/core/tokens.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "app"
DRIVERS = frozenset({"sqlite3", "psycopg", "psycopg_pool", "boto3", "botocore", "filelock"})
BACKENDS = ("app.storage.tree", "app.storage.pg", "app.storage.backends")
ABOVE_STORAGE = ("api", "web", "console", "services", "ops", "schemas")
WEB_LIBRARIES = frozenset({"flask", "werkzeug", "jinja2"})
RANK_OWNERS = frozenset({"app.services.access", "app.storage.core.tokens"})


def modules(top: Path) -> dict[str, Path]:
    """Every module under ``top`` by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(top.rglob("*.py")):
        parts = path.relative_to(top.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(what ``name`` imports, line): a module of ``known`` where the import names one
    (``from a import b`` names ``a.b`` when that is a module), else the top-level name."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target != name:
                yield target, node.lineno


def graph(top: Path) -> dict[str, dict[str, int]]:
    """Module -> {imported module or top-level name: the first line importing it}."""
    known = modules(top)
    edges: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        out = edges.setdefault(name, {})
        for target, line in imports(name, path, known):
            out.setdefault(target, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(t for t in edges[root] if t in edges)))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(t for t in edges[child] if t in edges))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _within(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def broken_rules(name: str, target: str) -> list[str]:
    """The rules an import of ``target`` by ``name`` breaks."""
    rules = []
    if _within(name, "app.storage.core"):
        if _within(target, *BACKENDS):
            rules.append("core/ imports no backend")
        elif target.split(".")[0] in DRIVERS:
            rules.append("core/ imports no database or lock driver")
    if _within(name, "app.storage.tree") and _within(target, "app.storage.pg"):
        rules.append("the tree backend imports nothing of pg/")
    if _within(name, "app.storage.pg") and _within(target, "app.storage.tree"):
        rules.append("the pg backend imports nothing of tree/")
    if (
        _within(name, "app.storage")
        and _within(target, "app")
        and not _within(target, "app.storage", "app.embeddings")
    ):
        rules.append("storage imports nothing of the app above it")
    if (
        _within(name, "app.embeddings")
        and _within(target, "app")
        and not _within(target, "app.embeddings")
    ):
        # Storage ranks and stores vectors with it: it stays a leaf below storage.
        rules.append("embeddings/ imports nothing of the app")
    if _within(name, *(f"app.{layer}" for layer in ABOVE_STORAGE)) and _within(target, *BACKENDS):
        rules.append("above storage, only the interface and core/ (never a backend)")
    if target == "app.storage.backends" and name != "app":
        rules.append("backends.py is the app factory's (app/__init__.py) alone")
    if _within(name, "app.console", "app.web") and _within(target, "app.api"):
        rules.append("a door imports no other door")
    if _within(name, "app.web", "app.api") and _within(target, "app.console"):
        rules.append("a door imports no other door")
    if _within(name, "app.services"):
        if _within(target, "app.api", "app.console", "app.web"):
            rules.append("the use cases import no door")
        elif target.split(".")[0] in WEB_LIBRARIES:
            rules.append("the use cases import no web framework")
    if target == "app.services.audit" and not _within(name, "app.services"):
        rules.append("only the use cases (services/) record audit events")
    return rules


def violations(edges: dict[str, dict[str, int]]) -> list[str]:
    """Every import that crosses a boundary it must not, as ``module:line -> target (rule)``."""
    return [
        f"{name}:{line} -> {target} ({rule})"
        for name, targets in sorted(edges.items())
        for target, line in sorted(targets.items())
        for rule in broken_rules(name, target)
    ]


def use_case_violations(top: Path) -> list[str]:
    """Audit events recorded, or role ranks compared, outside the one module for each."""
    found: set[str] = set()
    for name, path in modules(top).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "record"
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "audit_log"
                and name != "app.services.audit"
            ):
                found.add(f"{name}:{node.lineno} audit_log.record (only services/audit.py)")
            if isinstance(node, ast.ImportFrom):
                named = {alias.name for alias in node.names}
            elif isinstance(node, ast.Name):
                named = {node.id}
            elif isinstance(node, ast.Attribute):
                named = {node.attr}
            else:
                continue
            if "role_rank" in named and name not in RANK_OWNERS:
                found.add(f"{name}:{node.lineno} role_rank (only services/access.py)")
    return sorted(found)


def test_app_has_no_import_cycle() -> None:
    found = cycles(graph(APP))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_app_keeps_its_boundaries() -> None:
    found = violations(graph(APP))
    assert not found, "imports across a boundary:\n" + "\n".join(found)


def test_audit_events_and_role_ranks_have_one_home_each() -> None:
    found = use_case_violations(APP)
    assert not found, "a use-case rule restated outside app/services:\n" + "\n".join(found)


# -- the checks find what they look for -------------------------------------------------------
def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, source in files.items():
        path = root / "app" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    for directory in (root / "app").rglob("*"):
        if directory.is_dir() and not (directory / "__init__.py").exists():
            (directory / "__init__.py").write_text("", encoding="utf-8")
    (root / "app" / "__init__.py").touch()
    return root / "app"


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function_or_type_checking(
    tmp_path: Path,
) -> None:
    top = _package(
        tmp_path,
        {
            "web/a.py": "def f():\n    from app.web import b\n",
            "web/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n",
            "web/c.py": "from app.web import a\n",
        },
    )
    assert cycles(graph(top)) == [["app.web.a", "app.web.b"]]


@pytest.mark.parametrize(
    ("module", "source", "rule"),
    [
        (
            "storage/core/x.py",
            "from app.storage.tree.fs import atomic\n",
            "core/ imports no backend",
        ),
        ("storage/core/x.py", "import sqlite3\n", "no database or lock driver"),
        ("storage/core/x.py", "def f():\n    import filelock\n", "no database or lock driver"),
        ("storage/tree/x.py", "from app.storage.pg.db import Database\n", "nothing of pg/"),
        ("storage/pg/x.py", "from ..tree import tasks\n", "nothing of tree/"),
        ("storage/tree/x.py", "from app.web.errors import ApiError\n", "the app above it"),
        ("web/x.py", "from app.storage.tree.fs.locks import locked\n", "never a backend"),
        ("api/x.py", "from app.storage.pg import backend\n", "never a backend"),
        ("ops/x.py", "from app.storage.backends import open_backend\n", "never a backend"),
        ("console/x.py", "from app.storage import backends\n", "never a backend"),
        ("storage/core/x.py", "from app.storage import backends\n", "core/ imports no backend"),
        ("storage/x.py", "from app.storage.backends import open_backend\n", "factory"),
        ("console/x.py", "from app.api.common import storage\n", "no other door"),
        ("web/x.py", "from app.console import base\n", "no other door"),
        ("console/x.py", "from app.services import audit\n", "use cases"),
        ("api/x.py", "def f():\n    from app.console import base\n", "no other door"),
        ("services/x.py", "from app.web.errors import ApiError\n", "import no door"),
        ("services/x.py", "from flask import g\n", "no web framework"),
    ],
)
def test_the_boundary_check_finds_each_kind_of_crossing(
    tmp_path: Path, module: str, source: str, rule: str
) -> None:
    top = _package(
        tmp_path,
        {
            module: source,
            "storage/backends.py": "",
            "storage/tree/fs/atomic.py": "",
            "storage/tree/fs/locks.py": "",
            "storage/tree/tasks.py": "",
            "storage/pg/db.py": "",
            "storage/pg/backend.py": "",
            "web/errors.py": "",
            "api/common.py": "",
            "console/base.py": "",
            "services/audit.py": "",
        },
    )
    found = violations(graph(top))
    assert found and all(f.startswith("app." + module[:-3].replace("/", ".")) for f in found)
    assert any(rule in f for f in found), found


def test_the_boundary_check_lets_the_layers_use_the_interface_and_core(tmp_path: Path) -> None:
    top = _package(
        tmp_path,
        {
            "__init__.py": "def create_app():\n    from app.storage.backends import open_backend\n",
            "storage/backends.py": "from app.storage.tree import backend\nfrom app.storage.pg import backend as pg\n",
            "storage/interface.py": "from app.storage.core.names import Scope\n",
            "storage/core/names.py": "import re\n",
            "storage/tree/backend.py": "import sqlite3\nfrom app.storage.core import names\n",
            "storage/pg/backend.py": "import psycopg\nfrom app.storage.core import names\n",
            "web/auth.py": "from app.storage.interface import TokenStore\nfrom app.storage.core.names import Scope\n",
            "ops/cli.py": "from app.storage.core.names import Scope\nfrom app.web import auth\n",
        },
    )
    assert violations(graph(top)) == []


def test_the_use_case_check_finds_a_restated_rule(tmp_path: Path) -> None:
    top = _package(
        tmp_path,
        {
            "console/x.py": "def f(s):\n    s.audit_log.record('t', None)\n",
            "api/y.py": "from app.storage.core.tokens import role_rank\n",
            "services/mcp.py": "def f(t):\n    return tokens.role_rank(t.role)\n",
            "services/access.py": "from app.storage.core.tokens import role_rank\n",
            "services/audit.py": "def record(s):\n    s.audit_log.record('t', None)\n",
            "storage/core/tokens.py": "def role_rank(role):\n    return 0\n",
        },
    )
    found = [f.split(" ")[0] for f in use_case_violations(top)]
    assert found == ["app.api.y:1", "app.console.x:2", "app.services.mcp:2"], found
