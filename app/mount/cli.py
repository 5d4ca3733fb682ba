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
from typing import Any

from app.storage.core.store_rules import is_store_id, slugify

from .http import ApiError, StoreClient, TransportError
from .sync import DELETE_DELAY, STATE_DIR, Deletions, MountError, StoreSync

log = logging.getLogger("project_memory.mount")

DEFAULT_INTERVAL = 15.0
MIN_INTERVAL = 5.0
FINAL_SYNC_SECONDS = 30.0
# For tests only: lower the interval floor and the delete delay so a suite runs in seconds.
# Not for production use: a shorter delay turns a file an editor briefly replaces into a
# delete on the server.
TEST_MIN_INTERVAL_ENV = "PROJECT_MEMORY_TEST_MIN_INTERVAL"
TEST_DELETE_DELAY_ENV = "PROJECT_MEMORY_TEST_DELETE_DELAY"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="project-memory", description="Project Memory client commands."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    mount = commands.add_parser(
        "mount",
        help="keep a local directory in sync with memory stores",
        description="Keep DIR/<slug> in sync with each --store until SIGINT/SIGTERM, then"
        " sync once more (at most 30 s). Exit 0 if that final sync succeeded.",
    )
    mount.add_argument(
        "--server",
        default=os.environ.get("PROJECT_MEMORY_SERVER"),
        help="server URL, e.g. http://127.0.0.1:8000 (or PROJECT_MEMORY_SERVER)",
    )
    mount.add_argument(
        "--token",
        default=os.environ.get("PROJECT_MEMORY_TOKEN"),
        help="API token (better: PROJECT_MEMORY_TOKEN, which `ps` does not show)",
    )
    mount.add_argument(
        "--tenant",
        default=os.environ.get("PROJECT_MEMORY_TENANT"),
        help="the stores' tenant, for a token that covers several (or PROJECT_MEMORY_TENANT)",
    )
    mount.add_argument(
        "--project",
        default=os.environ.get("PROJECT_MEMORY_PROJECT"),
        help="the stores' project, for a token that covers several (or PROJECT_MEMORY_PROJECT)",
    )
    mount.add_argument(
        "--store",
        dest="stores",
        action="append",
        required=True,
        metavar="memstore_...",
        help="a store to mount; repeat for several",
    )
    mount.add_argument(
        "--read-only", action="store_true", help="download only; never upload or delete"
    )
    mount.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        help=f"seconds between syncs (default {DEFAULT_INTERVAL:g}, at least {MIN_INTERVAL:g})",
    )
    mount.add_argument(
        "--deletions",
        choices=[d.value for d in Deletions],
        default=Deletions.ENABLED.value,
        help="local deletes: sent to the server (enabled, after 30 s missing), only logged,"
        " or ignored",
    )
    mount.add_argument("--once", action="store_true", help="sync once and exit")
    mount.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    mount.add_argument("dir", type=Path, help="the directory the stores are mounted under")
    return parser


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise SystemExit(f"project-memory: {name} must be a number of seconds") from None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    return mount(args)


def mount(args: argparse.Namespace) -> int:
    if not args.server or not args.token:
        log.error(
            "--server and --token (or PROJECT_MEMORY_SERVER/PROJECT_MEMORY_TOKEN) are required"
        )
        return 2
    floor = _env_float(TEST_MIN_INTERVAL_ENV, MIN_INTERVAL)
    if args.interval < floor:
        log.error("--interval must be at least %g seconds", floor)
        return 2
    bad = [s for s in args.stores if not is_store_id(s)]
    if bad:
        log.error("not a memory store id: %s", ", ".join(bad))
        return 2
    client = StoreClient(args.server, args.token, tenant=args.tenant, project=args.project)
    try:
        syncs = _prepare(client, args)
    except ApiError as exc:
        hint = ""
        if exc.status == 404 and not (args.tenant or args.project):
            hint = " (a store of another project? name it with --tenant/--project)"
        log.error("cannot mount: %s%s", exc, hint)
        client.close()
        return 2
    except (MountError, TransportError, OSError) as exc:
        log.error("cannot mount: %s", exc)
        client.close()
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("%s: final sync, then exit", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if args.once:
            return 0 if _sync_all(syncs, deadline=None) else 1
        while not stop.is_set():
            _sync_all(syncs, deadline=None, stop=stop)
            stop.wait(args.interval)
        deadline = time.monotonic() + FINAL_SYNC_SECONDS
        ok = _sync_all(syncs, deadline=deadline)
        if ok:
            log.info("final sync done")
        else:
            log.error("final sync did not complete: local changes may not be on the server")
        return 0 if ok else 1
    finally:
        client.close()


def _prepare(client: StoreClient, args: argparse.Namespace) -> list[StoreSync]:
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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
