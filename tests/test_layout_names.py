"""Every record and side-file name of the tree is spelled in app/storage/core/names.py only.

A name spelled twice drifts: a reader looking for ``index.json`` where a writer wrote
``Index.json`` finds nothing, and a rename misses a copy. The check reads the string constants
of every module (f-string parts included) and fails on a path component that is one of the
layout's names, or a turn directory spelled by hand.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from app.storage.core import names as layout

APP = Path(__file__).resolve().parent.parent / "app"
NAMES = {
    layout.TASK_RECORD,
    layout.TURN_META,
    layout.TURN_SUMMARY,
    layout.TASK_INDEX,
    layout.PROJECT_DIGEST,
    layout.PROJECT_LISTING,
    layout.STORES_DIR,
    layout.STORE_RECORD,
    layout.STORE_INDEX,
    layout.LOCKS_DIR,
    layout.TRASH_DIR,
    layout.CURSOR_KEY,
    layout.CONSOLE_KEY,
    layout.SENTINEL,
    layout.LIMITS_FILE,
    layout.SERVER_LOCK,
}
TURN_DIR = re.compile(r"(^|/)-turn(/|$)|^[0-9]{4}-turn$")


def spelled(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue  # prose names files freely
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts = node.value.split("/")
            if any(part in NAMES for part in parts) or TURN_DIR.search(node.value):
                found.append((node.lineno, node.value))
    return found


def test_record_names_are_spelled_only_in_layout() -> None:
    offenders = []
    for path in sorted(APP.rglob("*.py")):
        if path.name == "names.py" and path.parent.name == "core":
            continue
        for line, text in spelled(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(APP.parent)}:{line}: {text!r}")
    assert not offenders, "use app/storage/core/names.py's names:\n" + "\n".join(offenders)


def test_the_check_finds_a_name_spelled_by_hand() -> None:
    assert spelled('p = d / "index.json"')
    assert spelled('p = f"{t}/{n:04d}-turn/artifacts"')
    assert spelled('p = root / ".locks" / "x"')
    assert not spelled('field = "summary_md"; other = "index"')
    assert not spelled('def f():\n    """Writes index.json."""\n')
