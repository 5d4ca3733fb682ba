"""Start-up checks shared by gunicorn (gunicorn.conf.py) and the CLI (``flask --app wsgi``).

Every MEMORY_* setting is checked before anything is created or served. A bad one stops the
process with one line on stderr and exit status 2, never a traceback: a wrong value in a
unit file or a compose file must read as what it is.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from app.config import PREFIX, ConfigError, load_config
from app.storage.core.errors import StorageError

if TYPE_CHECKING:
    from flask import Flask

EXIT_BAD_SETTING = 2
CONTROL_SOCKET = ".gunicorn.ctl"
# sun_path holds 108 bytes with its terminating NUL.
MAX_SOCKET_PATH = 107

_PORT = r"(?P<port>\d{1,5})"
_TCP = re.compile(rf"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\s:\[\]/]+)):{_PORT}")
_probed: set[str] = set()  # binds this process already checked (gunicorn re-reads its config)


def fail(message: str) -> NoReturn:
    """Stop the process: one line on stderr, exit status 2."""
    sys.stderr.write(f"project-memory: {message}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_BAD_SETTING)


@dataclass(frozen=True)
class Bind:
    """A parsed MEMORY_BIND: a TCP host and port, or a unix socket path."""

    text: str
    host: str = ""
    port: int = 0
    unix_path: str = ""

    @property
    def url(self) -> str:
        if self.unix_path:
            return f"http+unix://{self.unix_path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def everywhere(self) -> bool:
        return self.host in ("0.0.0.0", "::")  # noqa: S104 - recognising it, not binding it


def parse_bind(text: str) -> Bind:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``unix:PATH``; anything else is a ConfigError."""
    name = f"{PREFIX}_BIND"
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path.startswith("/"):
            raise ConfigError(f"{name}={text!r}: a unix socket needs an absolute path")
        return Bind(text, unix_path=path)
    match = _TCP.fullmatch(text)
    if match is None:
        raise ConfigError(f"{name}={text!r} is not HOST:PORT, [IPv6]:PORT or unix:/PATH")
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise ConfigError(f"{name}={text!r}: the port must be 1..65535")
    return Bind(text, host=match["v6"] or match["host"], port=port)


def probe_bind(bind: Bind) -> None:
    """Bind the address once and let it go: a port in use or an address this host does not
    have is one line now, not gunicorn's five retries and a traceback."""
    name = f"{PREFIX}_BIND"
    if bind.unix_path:
        parent = os.path.dirname(bind.unix_path) or "/"
        if not os.path.isdir(parent):
            raise ConfigError(f"{name}={bind.text!r}: {parent} is not a directory")
        return
    family = socket.AF_INET6 if ":" in bind.host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn does
            sock.bind((bind.host, bind.port))
    except OSError as exc:
        why = {
            errno.EADDRINUSE: "the port is in use (another server, or another instance)",
            errno.EADDRNOTAVAIL: "this host has no such address",
            errno.EACCES: "ports below 1024 need privileges",
        }.get(exc.errno or 0, exc.strerror or str(exc))
        raise ConfigError(f"{name}={bind.text!r}: cannot listen there: {why}") from None


def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _usable_dir(setting: str, path: Path, what: str) -> None:
    """``what`` (the directory at ``path``) must be a directory this user can write."""
    if not path.is_dir():
        raise ConfigError(f"{setting}: {what} {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise ConfigError(f"{setting}: {what} {path} is not writable by uid {os.geteuid()}")


def _usable_or_creatable_dir(setting: str, path: Path, what: str) -> None:
    if os.path.lexists(path):
        _usable_dir(setting, path, what)
        return
    base = _nearest_existing(path.parent)
    _usable_dir(setting, base, f"{what} cannot be created:")


def check_paths(config: Mapping[str, Any]) -> None:
    """The storage root is (or can be made) a writable directory; the token registry can be
    read and replaced (it is rewritten through a temp file beside it)."""
    root = Path(config["STORAGE_ROOT"])
    _usable_or_creatable_dir(f"{PREFIX}_STORAGE_ROOT={root}", root, "the storage root")
    tokens = Path(config["TOKENS_FILE"])
    setting = f"{PREFIX}_TOKENS_FILE={tokens}"
    if os.path.lexists(tokens):
        if not tokens.is_file():
            raise ConfigError(f"{setting} is not a regular file")
        try:
            with open(tokens, "r+b"):
                pass
        except OSError as exc:
            raise ConfigError(
                f"{setting} cannot be read and written by uid {os.geteuid()} ({exc.strerror})"
            ) from None
    _usable_or_creatable_dir(setting, tokens.parent, "its directory")


def checked_config(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every setting, validated, with the paths checked; or one line and exit status 2."""
    from flask import Flask

    probe = Flask(__name__)
    try:
        load_config(probe, overrides)
        parse_bind(probe.config["BIND"])
        check_paths(probe.config)
    except ConfigError as exc:
        fail(str(exc))
    return dict(probe.config)


def checked_app(overrides: Mapping[str, Any] | None = None, *, http: bool = True) -> Flask:
    """``create_app()`` once every setting passed ``checked_config``."""
    from app import create_app

    checked_config(overrides)
    try:
        return create_app(overrides, http=http)
    except (ConfigError, OSError, StorageError) as exc:
        # StorageError: the database or the object store cannot be reached (or refused).
        fail(f"cannot start: {exc}")


# The flask CLI's own options that take a value (flask --help).
_FLASK_VALUE_OPTIONS = frozenset({"--app", "-A", "--env-file", "-e"})


def admin_command(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether this process is the flask CLI running one of the app's admin commands
    (``flask --app wsgi tokens list``): it builds the app to reach the storage and serves
    nothing, so it skips what only serving needs. Anything else (gunicorn, ``flask run``,
    ``flask routes``, a test) gets the whole app. Flask sets FLASK_RUN_FROM_CLI before it
    loads the app, for every command."""
    if environ.get("FLASK_RUN_FROM_CLI") != "true" or not argv:
        return False
    if os.path.basename(argv[0]) not in ("flask", "flask.exe", "__main__.py"):
        return False
    args = iter(argv[1:])
    for arg in args:
        if arg in _FLASK_VALUE_OPTIONS:
            next(args, None)
        elif not arg.startswith("-"):
            from app.ops.cli import NAMES

            return arg in NAMES
    return False


def control_socket_path(storage_root: str) -> str | None:
    """gunicorn's control socket for this storage root; None when the path is too long for
    a unix socket (the socket is then off)."""
    path = os.path.join(storage_root, CONTROL_SOCKET)
    return path if len(os.fsencode(path)) <= MAX_SOCKET_PATH else None


@dataclass(frozen=True)
class GunicornSettings:
    bind: str
    workers: int
    threads: int
    timeout: int
    control_socket: str
    control_socket_disable: bool


def gunicorn_settings() -> GunicornSettings:
    """What gunicorn.conf.py sets, from the checked MEMORY_* settings (or exit status 2).

    The bind is probed once per process, and not when the listening sockets are inherited
    (gunicorn's USR2 re-exec, systemd socket activation): then they are already bound.
    """
    config = checked_config()
    bind = parse_bind(config["BIND"])
    inherited = "GUNICORN_FD" in os.environ or "LISTEN_FDS" in os.environ
    if not inherited and bind.text not in _probed:
        try:
            probe_bind(bind)
        except ConfigError as exc:
            fail(str(exc))
        _probed.add(bind.text)
    # Per storage root: gunicorn's default (~/.gunicorn/gunicorn.ctl) is shared by every
    # instance of a user, and the first to stop unlinks the socket of the others.
    ctl = control_socket_path(config["STORAGE_ROOT"])
    return GunicornSettings(
        bind=bind.text,
        workers=config["WORKERS"],
        threads=config["THREADS"],
        timeout=config["WORKER_TIMEOUT"],
        control_socket=ctl or os.devnull,
        control_socket_disable=ctl is None,
    )
