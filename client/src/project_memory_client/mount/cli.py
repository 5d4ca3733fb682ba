"""``project-memory mount``: the console command (see docs/mounting.md).

Exit status: 0 when the final sync succeeded, 1 when it did not (unsynced changes may
remain), 2 when the mount could not start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..commands import CommandError, Context, Output, add_common_options, configure
from ..errors import SettingsError
from ..rules import is_store_id, slugify

if TYPE_CHECKING:  # loaded by run(): `--help` and the other commands need no httpx
    from .http import StoreClient
    from .sync import StoreSync

log = logging.getLogger("project_memory.mount")

DEFAULT_INTERVAL = 15.0
MIN_INTERVAL = 5.0
FINAL_SYNC_SECONDS = 30.0
# For tests only: lower the interval floor and the delete delay so a suite runs in seconds.
# Not for production use: a shorter delay turns a file an editor briefly replaces into a
# delete on the server.
TEST_MIN_INTERVAL_ENV = "PROJECT_MEMORY_TEST_MIN_INTERVAL"
TEST_DELETE_DELAY_ENV = "PROJECT_MEMORY_TEST_DELETE_DELAY"
DELETIONS = ("enabled", "log_only", "disabled")  # the values of sync.Deletions


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Keep DIR/<slug> in sync with each --store until SIGINT/SIGTERM, then sync once more"
        " (at most 30 s). Exit 0 if that final sync succeeded, 1 if not, 2 if the mount could"
        " not start."
    )
    add_common_options(parser)
    parser.add_argument(
        "--server",
        dest="url",
        default=argparse.SUPPRESS,
        help="the same as --url (or PROJECT_MEMORY_SERVER)",
    )
    parser.add_argument(
        "--store",
        dest="stores",
        action="append",
        required=True,
        metavar="memstore_...",
        help="a store to mount; repeat for several",
    )
    parser.add_argument(
        "--read-only", action="store_true", help="download only; never upload or delete"
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        help=f"seconds between syncs (default {DEFAULT_INTERVAL:g}, at least {MIN_INTERVAL:g})",
    )
    parser.add_argument(
        "--deletions",
        choices=DELETIONS,
        default=DELETIONS[0],
        help="local deletes: sent to the server (enabled, after 30 s missing), only logged,"
        " or ignored",
    )
    parser.add_argument("--once", action="store_true", help="sync once and exit")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    parser.add_argument("dir", type=Path, help="the directory the stores are mounted under")
    configure(parser, run)


class _ShownFormatter(logging.Formatter):
    """Log lines name memory paths and quote the server: written as every other line the
    CLI prints for people is (terminal.py)."""

    def format(self, record: logging.LogRecord) -> str:
        from ..terminal import shown_on

        return shown_on(sys.stderr, super().format(record))


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise _cannot_start(f"{name} must be a number of seconds") from None


def _cannot_start(message: str) -> CommandError:
    return CommandError(message, exit_code=2, kind="mount")


def run(ctx: Context) -> Output:
    args = ctx.args
    level = args.log_level.upper()
    if not isinstance(logging.getLevelName(level), int):
        raise _cannot_start(f"--log-level: not a level: {args.log_level}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ShownFormatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    try:
        settings = ctx.settings().require()
    except SettingsError as exc:
        raise _cannot_start(str(exc)) from None
    floor = _env_float(TEST_MIN_INTERVAL_ENV, MIN_INTERVAL)
    if args.interval < floor:
        raise _cannot_start(f"--interval must be at least {floor:g} seconds")
    bad = [s for s in args.stores if not is_store_id(s)]
    if bad:
        raise _cannot_start(f"not a memory store id: {', '.join(bad)}")
    assert settings.url is not None and settings.token is not None
    from .http import DEFAULT_TIMEOUT, StoreClient

    client = StoreClient(
        settings.url,
        settings.token,
        tenant=settings.tenant,
        project=settings.project,
        timeout=settings.timeout if "timeout" in settings.sources else DEFAULT_TIMEOUT,
    )
    try:
        return _mount(client, args, scoped=bool(settings.tenant or settings.project))
    finally:
        client.close()


def _mount(client: StoreClient, args: argparse.Namespace, *, scoped: bool) -> Output:
    from .http import ApiError, TransportError
    from .sync import MountError

    try:
        syncs = _prepare(client, args)
    except ApiError as exc:
        hint = ""
        if exc.status == 404 and not scoped:
            hint = " (a store of another project? name it with --tenant/--project)"
        raise _cannot_start(f"cannot mount: {exc}{hint}") from None
    except (MountError, TransportError, OSError) as exc:
        raise _cannot_start(f"cannot mount: {exc}") from None
    data: dict[str, Any] = {
        "stores": [
            {"store_id": s.store_id, "folder": str(s.folder), "read_only": s.read_only}
            for s in syncs
        ],
        "synced": False,
    }
    if args.once:
        data["synced"] = _sync_all(syncs, deadline=None)
        return _result(data, "the sync did not complete: local changes may not be on the server")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("%s: final sync, then exit", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.is_set():
        _sync_all(syncs, deadline=None, stop=stop)
        stop.wait(args.interval)
    deadline = time.monotonic() + FINAL_SYNC_SECONDS
    data["synced"] = _sync_all(syncs, deadline=deadline)
    if data["synced"]:
        log.info("final sync done")
    else:
        log.error("final sync did not complete: local changes may not be on the server")
    return _result(data, "final sync did not complete: local changes may not be on the server")


def _result(data: dict[str, Any], failure: str) -> Output:
    if data["synced"]:
        return Output(data, None)
    return Output(data, failure, exit_code=1)


def _prepare(client: StoreClient, args: argparse.Namespace) -> list[StoreSync]:
    from .sync import DELETE_DELAY, STATE_DIR, Deletions, MountError, StoreSync

    root: Path = args.dir
    root.mkdir(parents=True, exist_ok=True)
    delete_delay = _env_float(TEST_DELETE_DELAY_ENV, DELETE_DELAY)
    syncs: list[StoreSync] = []
    # Every store and its folder first: a clash refuses the mount before any folder is
    # prepared (a prepared folder is marked as its store's, and adopted by the next mount).
    slugs: dict[str, str] = {}
    stores: list[tuple[str, dict[str, Any], str]] = []
    for store_id in dict.fromkeys(args.stores):
        store = client.get_store(store_id)
        slug = slugify(store["name"]) or store_id
        if slug in slugs:
            raise MountError(
                f"{store_id} and {slugs[slug]} would both mount at {root / slug}"
                " (their names give the same slug): rename one"
            )
        slugs[slug] = store_id
        stores.append((store_id, store, slug))
    for store_id, store, slug in stores:
        read_only = args.read_only
        if store.get("archived_at") and not read_only:
            log.info("[%s] the store is archived: mounted read-only", slug)
            read_only = True
        sync = StoreSync(
            client,
            store_id,
            root / slug,
            state_file=root / STATE_DIR / f"{store_id}.json",
            read_only=read_only,
            deletions=Deletions(args.deletions),
            delete_delay=delete_delay,
        )
        sync.prepare()
        syncs.append(sync)
        log.info(
            "[%s] %s mounted at %s (%s, deletions %s)",
            slug,
            store_id,
            root / slug,
            "read-only" if read_only else "read-write",
            args.deletions,
        )
    return syncs


def _sync_all(
    syncs: list[StoreSync], *, deadline: float | None, stop: threading.Event | None = None
) -> bool:
    ok = True
    for sync in syncs:
        if stop is not None and stop.is_set():
            return ok  # the final sync follows at once
        try:
            report = sync.sync_once(deadline=deadline, stop=stop.is_set if stop else None)
            ok = report.ok and ok
        except Exception:
            # A bug must not end the mount without its final sync: log it, go on.
            log.exception("[%s] sync failed unexpectedly", sync.folder.name)
            ok = False
    return ok
