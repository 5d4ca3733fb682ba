"""Configuration: defaults, then MEMORY_* environment variables, then overrides; validated once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from flask import Flask

PREFIX = "MEMORY"
MiB = 1 << 20

# name -> (default, type, help). The README's configuration table is generated from this.
SETTINGS: dict[str, tuple[Any, type, str]] = {
    "STORAGE_ROOT": ("./var/storage", str, "Directory holding all data (a local filesystem)."),
    "TOKENS_FILE": ("./var/tokens.json", str, "Token registry (hashes only, mode 0600)."),
    "RETENTION_DAYS": (30.0, float, "Days a turn is kept after its last write; fractions allowed."),
    "LOCK_TIMEOUT": (10.0, float, "Seconds to wait for a busy lock before answering 503."),
    "MAX_ARTIFACT_BYTES": (50 * MiB, int, "Largest artifact accepted, in bytes."),
    "MAX_JSON_BYTES": (4 * MiB, int, "Largest JSON request body, in bytes."),
    "SWEEP_INTERVAL": (
        3600.0,
        float,
        "Seconds between retention sweeps run by the server; 0 disables.",
    ),
    "DEFAULT_TENANT": ("default", str, "Tenant of the first token `make run` creates."),
    "DEFAULT_PROJECT": ("default", str, "Project of the first token `make run` creates."),
    "LOG_LEVEL": ("INFO", str, "Python logging level of the request log."),
    "METRICS": ("off", str, "Prometheus metrics: off, or token (served to admin tokens)."),
    "CONSOLE_SESSION_HOURS": (
        12.0,
        float,
        "Hours a web console sign-in lasts (a revoked token ends it at once).",
    ),
    "TRUSTED_PROXIES": (
        0,
        int,
        "Reverse proxies in front whose X-Forwarded-Proto/-Host the console believes.",
    ),
}


class ConfigError(ValueError):
    """A setting has a value the service cannot start with."""


def load_config(app: Flask, overrides: Mapping[str, Any] | None) -> None:
    for name, (default, _, _) in SETTINGS.items():
        app.config.setdefault(name, default)
    # from_prefixed_env parses values as JSON where it can ("30" -> 30, "0.5" -> 0.5).
    app.config.from_prefixed_env(PREFIX)
    if overrides:
        app.config.update(overrides)
    validate_config(app.config)


def validate_config(config: dict[str, Any]) -> None:
    """Coerce each setting to its type and refuse values the service cannot run with."""
    for name, (_, kind, _) in SETTINGS.items():
        value = config[name]
        try:
            if kind is float and not isinstance(value, bool):
                value = float(value)
            elif kind is int and not isinstance(value, bool):
                value = int(value)
            elif kind is str:
                value = str(value)
            else:
                raise TypeError
        except (TypeError, ValueError):
            raise ConfigError(f"{PREFIX}_{name}={value!r} is not a valid {kind.__name__}") from None
        config[name] = value
    if config["RETENTION_DAYS"] <= 0:
        raise ConfigError(f"{PREFIX}_RETENTION_DAYS must be > 0 (got {config['RETENTION_DAYS']})")
    if config["LOCK_TIMEOUT"] <= 0:
        raise ConfigError(f"{PREFIX}_LOCK_TIMEOUT must be > 0 (got {config['LOCK_TIMEOUT']})")
    if config["MAX_ARTIFACT_BYTES"] < 1:
        raise ConfigError(f"{PREFIX}_MAX_ARTIFACT_BYTES must be >= 1")
    if config["MAX_JSON_BYTES"] < 1024:
        raise ConfigError(f"{PREFIX}_MAX_JSON_BYTES must be >= 1024")
    if config["SWEEP_INTERVAL"] < 0:
        raise ConfigError(f"{PREFIX}_SWEEP_INTERVAL must be >= 0")
    if not 0 < config["CONSOLE_SESSION_HOURS"] <= 24 * 366:
        raise ConfigError(f"{PREFIX}_CONSOLE_SESSION_HOURS must be > 0 and at most a year")
    if not 0 <= config["TRUSTED_PROXIES"] <= 16:
        raise ConfigError(f"{PREFIX}_TRUSTED_PROXIES must be between 0 and 16")
    if config["METRICS"] not in ("off", "token"):
        raise ConfigError(f"{PREFIX}_METRICS must be 'off' or 'token'")
    root = os.path.abspath(config["STORAGE_ROOT"])
    tokens = os.path.abspath(config["TOKENS_FILE"])
    if tokens == root or tokens.startswith(root + os.sep):
        raise ConfigError(f"{PREFIX}_TOKENS_FILE must live outside {PREFIX}_STORAGE_ROOT")
    config["STORAGE_ROOT"], config["TOKENS_FILE"] = root, tokens
