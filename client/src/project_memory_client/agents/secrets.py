"""Masking credentials out of what a hook sends: prompts, answers, meta, artifacts.

A turn is read by everyone on the project, so strings that look like credentials are
replaced by ``[masked:<kind>]`` before anything leaves the machine (or reaches the spool).
The project-memory token in use is masked wherever it appears, whatever its shape. The
patterns (docs/agents.md lists them) favour false positives over leaks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

# (kind, pattern). A pattern's group "keep", when present, is kept and the rest masked.
PATTERNS: tuple[tuple[str, str], ...] = (
    (
        "private-key",
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----",
    ),
    ("project-memory-token", r"\bpm_[A-Za-z0-9_-]{20,}"),
    ("anthropic-key", r"\bsk-ant-[A-Za-z0-9_-]{16,}"),
    ("openai-key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
    ("aws-access-key", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"),
    ("github-token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"),
    ("gitlab-token", r"\bglpat-[A-Za-z0-9_-]{20,}"),
    ("slack-token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    ("google-api-key", r"\bAIza[0-9A-Za-z_-]{35}"),
    ("stripe-key", r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ("bearer-token", r"(?i)(?P<keep>\bbearer\s+)[A-Za-z0-9._~+/=-]{12,}"),
    ("basic-auth", r"(?i)(?P<keep>\bbasic\s+)[A-Za-z0-9+/=]{12,}"),
    ("url-password", r"(?P<keep>\b[a-z][a-z0-9+.-]*://[^\s:/@]+:)[^\s@/]{3,}(?=@)"),
    (
        "secret-assignment",
        r"(?i)(?P<keep>\b[A-Za-z0-9_.-]*(?:password|passwd|secret|api[_-]?key|access[_-]?key"
        r"|auth[_-]?token|private[_-]?key|client[_-]?secret|token)[A-Za-z0-9_.-]*"
        r"[\"']?\s*[:=]\s*[\"']?)(?!\[masked:)[^\s\"',;]{8,}",
    ),
)
_COMPILED = tuple((kind, re.compile(pattern)) for kind, pattern in PATTERNS)


def mask(text: str, literals: Iterable[str] = ()) -> str:
    """``text`` with every credential-like string and every one of ``literals`` masked."""
    for literal in literals:
        if literal and len(literal) >= 8:
            text = text.replace(literal, "[masked:project-memory-token]")
    for kind, regex in _COMPILED:
        text = regex.sub(_replacement(kind), text)
    return text


def _replacement(kind: str) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        keep = match.groupdict().get("keep") or ""
        return f"{keep}[masked:{kind}]"

    return replace


def mask_value(value: Any, literals: Iterable[str] = ()) -> Any:
    """``value`` (JSON: strings, lists, objects) with every string masked."""
    literals = tuple(literals)
    if isinstance(value, str):
        return mask(value, literals)
    if isinstance(value, list):
        return [mask_value(v, literals) for v in value]
    if isinstance(value, dict):
        return {k: mask_value(v, literals) for k, v in value.items()}
    return value
