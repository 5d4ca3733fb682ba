"""Masking credentials out of what a hook sends: prompts, answers, meta, artifacts.

A turn is read by everyone on the project, so each secret is replaced by
``[secret:<kind>]`` before anything leaves the machine (or reaches the spool). The finding
is the shared scanner's (project_memory_client/secret_scan.py, the same rules the server
uses; docs/secrets.md lists them); the project-memory token in use is masked too,
wherever it appears, whatever its shape.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .. import secret_scan


def mask(text: str, literals: Iterable[str] = ()) -> str:
    """``text`` with every secret and every one of ``literals`` masked."""
    return secret_scan.mask(text, literals=literals)[0]


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
