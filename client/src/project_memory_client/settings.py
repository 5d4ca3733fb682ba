"""Where the client finds its server, token and scope.

Each setting comes from the first of: an explicit argument (a CLI flag), an environment
variable, the config file. The config file is
``${XDG_CONFIG_HOME:-~/.config}/project-memory/config.toml``::

    url = "http://127.0.0.1:8000"
    token = "pm_..."
    tenant = "acme"      # optional: for a token that covers several
    project = "web"      # optional
    timeout = 30         # optional, seconds
    visibility = "private"  # optional: act in your own private space of the project

It holds a secret, so it is refused unless it is a regular file owned by the user with
mode 0600 or stricter (as ssh treats its keys). The token never appears in a repr, a log
line or an error message.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from .errors import SettingsError

if TYPE_CHECKING:
    import httpx

URL_ENV = "PROJECT_MEMORY_URL"
# The mount's name for the URL since before the client had one: still read, after URL_ENV.
URL_ENV_ALIAS = "PROJECT_MEMORY_SERVER"
TOKEN_ENV = "PROJECT_MEMORY_TOKEN"  # noqa: S105 - the variable's name
TENANT_ENV = "PROJECT_MEMORY_TENANT"
PROJECT_ENV = "PROJECT_MEMORY_PROJECT"
TIMEOUT_ENV = "PROJECT_MEMORY_TIMEOUT"
VISIBILITY_ENV = "PROJECT_MEMORY_VISIBILITY"
CONFIG_ENV = "PROJECT_MEMORY_CONFIG"  # another config file than the default one
DEFAULT_TIMEOUT = 30.0
API_PREFIX = "/sandbox/memory/v1"
# How tenant and project go on the wire (both APIs), for a token that covers several.
TENANT_HEADER = "X-Sandbox-Tenant-Id"
PROJECT_HEADER = "X-Sandbox-Project-Id"
# Which space of the project a request acts in: the team's (the default) or the user's own
# private one (docs/api.md "Private spaces"), for a token that belongs to a user.
VISIBILITY_HEADER = "X-Sandbox-Visibility"
PRIVATE = "private"
VISIBILITIES = ("project", PRIVATE)
_KEYS = ("url", "token", "tenant", "project", "timeout", "visibility")


class Settings:
    """What a :class:`~project_memory_client.Client` needs; ``token`` is hidden from repr.

    Immutable. A plain class, not a dataclass: every hook process loads it, and the
    dataclasses module and a dataclass's generated code cost start-up time (agents/hooks.py).
    """

    __slots__ = ("url", "token", "tenant", "project", "timeout", "visibility", "sources")
    url: str | None
    token: str | None
    tenant: str | None
    project: str | None
    timeout: float
    # "private": every request acts in the user's private space; None: the team's project.
    visibility: str | None
    # Where each value came from ("flag", "env PROJECT_MEMORY_URL", "config <path>"): for
    # messages that say what to fix.
    sources: Mapping[str, str]

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        tenant: str | None = None,
        project: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        visibility: str | None = None,
        sources: Mapping[str, str] | None = None,
    ) -> None:
        if visibility not in (None, *VISIBILITIES):
            raise SettingsError(f"visibility must be one of {', '.join(VISIBILITIES)}")
        visibility = None if visibility == "project" else visibility
        for name, value in (
            ("url", url),
            ("token", token),
            ("tenant", tenant),
            ("project", project),
            ("timeout", timeout),
            ("visibility", visibility),
            ("sources", dict(sources or {})),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Settings are immutable: use with_overrides() to change {name}")

    def _key(self) -> tuple[Any, ...]:
        return (self.url, self.token, self.tenant, self.project, self.timeout, self.visibility)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"Settings(url={self.url!r}, tenant={self.tenant!r}, project={self.project!r},"
            f" timeout={self.timeout!r}, visibility={self.visibility!r})"
        )

    def require(self) -> Settings:
        """These settings, or SettingsError naming what is missing and how to give it."""
        missing = []
        if not self.url:
            missing.append(f"the server's URL (--url or {URL_ENV})")
        if not self.token:
            missing.append(f"a token ({TOKEN_ENV}, or --token)")
        if missing:
            raise SettingsError(
                f"missing {' and '.join(missing)}; or put them in {default_config_path()}"
            )
        for key, what in (
            ("token", "the token"),
            ("tenant", "the tenant"),
            ("project", "the project"),
        ):
            value: str | None = getattr(self, key)
            # Each goes in a header: printable ASCII, and tokens and ids hold no space.
            if value and not (value.isascii() and value.isprintable() and " " not in value):
                shown = "" if key == "token" else f" {value!r}"  # a token is never shown
                source = self.sources.get(key, "the arguments")
                source = f"the --{key} flag or argument" if source == "flag" else source
                raise SettingsError(
                    f"{what}{shown} (from {source}) holds a character other than printable"
                    " ASCII (letters, digits, punctuation; no spaces), so it cannot be sent:"
                    " check it was copied whole"
                )
        return self

    def headers(self, user_agent: str | None = None) -> dict[str, str]:
        """The headers every request to the server carries: the token, the tenant and project
        (for a token that covers several) and, when given, the ``User-Agent``."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if user_agent:
            headers["User-Agent"] = user_agent
        if self.tenant:
            headers[TENANT_HEADER] = self.tenant
        if self.project:
            headers[PROJECT_HEADER] = self.project
        if self.visibility:
            headers[VISIBILITY_HEADER] = self.visibility
        return headers

    @overload
    def http(
        self,
        user_agent: str | None = None,
        *,
        base_url: str = "",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        transport: httpx.BaseTransport | None = None,
        asynchronous: Literal[False] = False,
    ) -> httpx.Client: ...

    @overload
    def http(
        self,
        user_agent: str | None = None,
        *,
        base_url: str = "",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        asynchronous: Literal[True],
    ) -> httpx.AsyncClient: ...

    def http(
        self,
        user_agent: str | None = None,
        *,
        base_url: str = "",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        transport: httpx.BaseTransport | None = None,
        asynchronous: bool = False,
    ) -> httpx.Client | httpx.AsyncClient:
        """An HTTP client for the server: the one place the distribution makes one.

        It sends :meth:`headers` (with ``headers`` added) on every request, waits
        ``timeout`` seconds (these settings' by default) and follows no redirect.
        ``asynchronous``: an ``httpx.AsyncClient`` instead.
        """
        # Imported here: the hooks and the CLI's start-up load this module, and httpx costs
        # them a third of a second (agents/wire.py).
        import httpx

        options: dict[str, Any] = {
            "base_url": base_url,
            "headers": {**self.headers(user_agent), **(headers or {})},
            "timeout": self.timeout if timeout is None else timeout,
            "follow_redirects": False,
        }
        if asynchronous:
            return httpx.AsyncClient(**options)
        return httpx.Client(**options, transport=transport)

    def with_overrides(self, **values: Any) -> Settings:
        """A copy with the given non-None values put in, as flags would."""
        given = {k: v for k, v in values.items() if v is not None}
        sources = {**self.sources, **dict.fromkeys(given, "flag")}
        values = {k: getattr(self, k) for k in _KEYS}
        return Settings(**{**values, **given}, sources=sources)


def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    explicit = env.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "project-memory" / "config.toml"


def _parse_toml(data: bytes, path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the 3.10 fallback
        import tomli as tomllib
    try:
        parsed: dict[str, Any] = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: not valid TOML ({exc})") from None
    return parsed


def read_config(path: Path) -> dict[str, Any]:
    """The settings in the config file at ``path``; {} when there is none.

    Refused (SettingsError) unless the file is the user's own, not a link, with no bits for
    group or others: it holds a token.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SettingsError(
                f"{path}: the config file is a symbolic link; it holds a token, so it must be"
                " a file of its own"
            ) from None
        raise SettingsError(f"{path}: cannot read the config file ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise SettingsError(f"{path}: the config file is not a regular file")
        if st.st_uid != os.getuid():
            raise SettingsError(f"{path}: the config file is not yours; it holds a token")
        if st.st_mode & 0o077:
            raise SettingsError(
                f"{path}: the config file is mode {stat.S_IMODE(st.st_mode):04o} and holds a"
                f" token; make it private: chmod 600 {path}"
            )
        data = fh.read(1024 * 1024)
    parsed = _parse_toml(data, path)
    unknown = sorted(set(parsed) - set(_KEYS))
    if unknown:
        raise SettingsError(f"{path}: unknown setting(s) {', '.join(unknown)}")
    for key, value in parsed.items():
        if key == "timeout":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SettingsError(f"{path}: timeout must be a number of seconds")
        elif not isinstance(value, str):
            raise SettingsError(f"{path}: {key} must be a string")
    return parsed


def _timeout(raw: object, source: str) -> float:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SettingsError(f"{source}: the timeout must be a number of seconds") from None
    if not value > 0:
        raise SettingsError(f"{source}: the timeout must be more than 0 seconds")
    return value


def normalise_url(url: str) -> str:
    """The server's root URL: no trailing slash, and the API's path dropped if it was given
    (``$PM`` of the README's examples works as well as the root)."""
    url = url.strip().rstrip("/")
    if url.endswith(API_PREFIX):
        url = url[: -len(API_PREFIX)]
    if not url.startswith(("http://", "https://")):
        raise SettingsError(f"the server URL must start with http:// or https:// (got {url!r})")
    return url


def load_settings(
    *,
    url: str | None = None,
    token: str | None = None,
    tenant: str | None = None,
    project: str | None = None,
    timeout: float | None = None,
    visibility: str | None = None,
    env: Mapping[str, str] | None = None,
    config_path: Path | None = None,
) -> Settings:
    """Settings from the arguments, then the environment, then the config file.

    The config file is read when it exists, whatever the other sources give, so that one
    anyone may read is always reported.
    """
    env = os.environ if env is None else env
    path = config_path or default_config_path(env)
    config = read_config(path)
    flags = {
        "url": url,
        "token": token,
        "tenant": tenant,
        "project": project,
        "timeout": timeout,
        "visibility": visibility,
    }
    env_names = {
        "url": (URL_ENV, URL_ENV_ALIAS),
        "token": (TOKEN_ENV,),
        "tenant": (TENANT_ENV,),
        "project": (PROJECT_ENV,),
        "timeout": (TIMEOUT_ENV,),
        "visibility": (VISIBILITY_ENV,),
    }
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in _KEYS:
        if flags[key] not in (None, ""):
            values[key], sources[key] = flags[key], "flag"
            continue
        for name in env_names[key]:
            if env.get(name):
                values[key], sources[key] = env[name], f"env {name}"
                break
        else:
            if config.get(key) not in (None, ""):
                values[key], sources[key] = config[key], f"config {path}"
    if "timeout" in values:
        values["timeout"] = _timeout(values["timeout"], sources["timeout"])
    if "url" in values:
        values["url"] = normalise_url(str(values["url"]))
    if values.get("visibility") not in (None, *VISIBILITIES):
        raise SettingsError(
            f"{sources['visibility']}: visibility must be one of {', '.join(VISIBILITIES)}"
        )
    return Settings(**values, sources=sources)
