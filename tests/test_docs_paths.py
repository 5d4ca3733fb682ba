"""Every API path the docs name is one the server routes (a renamed or mistyped prefix is a
404 for whoever copies it)."""

from __future__ import annotations

import re
from pathlib import Path

from flask import Flask

REPO = Path(__file__).resolve().parents[1]
# A documented path up to its first placeholder: /sandbox/memory/v1/tasks, /v1/memory_stores.
_PATH = re.compile(r"(?<![\w/.])(/(?:sandbox/memory/)?v1(?:/[A-Za-z_][\w.-]*)+)")


def _routed(path: str, rules: list[list[str]]) -> bool:
    """Whether some rule starts with ``path``'s segments (a ``<converter>`` matches any)."""
    parts = path.strip("/").split("/")
    return any(
        len(rule) >= len(parts)
        and all(r == p or r.startswith("<") for r, p in zip(rule, parts, strict=False))
        for rule in rules
    )


def test_every_api_path_in_the_docs_is_routed(app: Flask) -> None:
    rules = [rule.rule.strip("/").split("/") for rule in app.url_map.iter_rules()]
    assert _routed("/sandbox/memory/v1/tasks/fix-login/turns", rules)
    assert not _routed("/sandbox/memory/v1/memory_stores", rules)
    missing = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for path in sorted(set(_PATH.findall(doc.read_text()))):
            if not _routed(path, rules):
                missing.append(f"{doc.relative_to(REPO)}: {path}")
    assert missing == []
