"""Regenerate storage_root.example/ with the storage engine itself.

    .venv/bin/python tools/make_example_tree.py            # rewrites storage_root.example/
    .venv/bin/python tools/make_example_tree.py --out DIR  # writes a fresh tree into DIR

The clock is fixed in 2099 so nothing in the example expires. Left out of the result, on
purpose: ``.locks/`` (lock side files the engine creates on its first write), ``.trash/``
(empty) and ``.cursor-key`` (a per-root secret that signs list cursors: a key published in
git would let anyone forge cursors for a root copied from the example; the engine makes a
fresh one when it opens a root without one).
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.storage.core.names import LOCKS_DIR, TRASH_DIR, Scope  # noqa: E402
from app.storage.tree.sqlite.ledger import Ledger  # noqa: E402
from app.storage.tree.sqlite.listing import Listing  # noqa: E402
from app.storage.tree.tasks import TaskStore  # noqa: E402

START = datetime(2099, 1, 1, 9, 0, tzinfo=UTC)
SCOPE = Scope("acme", "webshop")
LEFT_OUT = (LOCKS_DIR, TRASH_DIR, ".cursor-key")


class _Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now

    def tick(self, minutes: int) -> None:
        self.now += timedelta(minutes=minutes)


def build(dest: Path) -> None:
    """Write the example tree into ``dest`` (which must not exist yet)."""
    clock = _Clock()
    store = TaskStore(dest, clock=clock, lock_timeout=5.0)
    agent = "tok_example_agent"

    store.put_turn(
        SCOPE,
        "fix-login-bug",
        0,
        meta={"agent": "coder", "status": "investigating"},
        summary_md="Login fails for emails with a `+`: the form URL-encodes it twice.\n",
        actor=agent,
    )
    clock.tick(12)
    store.put_turn(
        SCOPE,
        "add-dark-mode",
        0,
        meta={"agent": "coder", "status": "planned"},
        summary_md="Plan: CSS variables for colours, a toggle in the header, remember the choice.\n",
        actor=agent,
    )
    clock.tick(30)
    store.put_turn(
        SCOPE,
        "fix-login-bug",
        1,
        meta={"agent": "coder", "status": "fixed", "files": ["web/login.js"]},
        summary_md=(
            "## Fix\n\nEncode the email once, in `submitLogin()`.\n\n"
            "## Tests\n\n- added `login_plus_address`\n- all 214 tests pass\n"
        ),
        actor=agent,
    )
    clock.tick(1)
    store.put_artifact(
        SCOPE,
        "fix-login-bug",
        1,
        "test-output.txt",
        io.BytesIO(b"214 passed in 3.02s\n"),
        content_type="text/plain; charset=utf-8",
    )
    clock.tick(20)
    store.put_turn(
        SCOPE,
        "upgrade-deps",
        0,
        meta={"agent": "maintainer", "status": "done"},
        summary_md="Bumped flask 3.1.2 -> 3.1.3 and werkzeug 3.1.8 -> 3.1.9; no API changes.\n",
        actor="tok_example_maintainer",
    )
    clock.tick(45)
    store.put_turn(
        SCOPE,
        "add-dark-mode",
        1,
        meta={"agent": "coder", "status": "in-progress"},
        summary_md="Toggle done; the chart colours still ignore the theme.\n",
        actor=agent,
    )
    fh, _ = store.open_digest(SCOPE)  # render _project.md now, as a first read would
    fh.close()
    # Close the listing and the ledger so SQLite checkpoints their WALs into the one file
    # of each that is kept.
    Listing.forget(store.layout.listing(SCOPE))
    Ledger.forget(store.layout.ledger(SCOPE))
    for name in LEFT_OUT:
        path = dest / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "storage_root.example")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
        fresh = Path(tmp) / "tree"
        build(fresh)
        if args.out.exists():
            shutil.rmtree(args.out)
        shutil.move(str(fresh), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
