"""project.md on the tree: the file a person reads, rendered on the first read after a change
(behaviour: tests/conformance/test_digest.py)."""

from __future__ import annotations

from app.storage import Scope, TaskStore
from tests.conftest import FixedClock
from tests.storage._helpers import assert_consistent, expected_digest, read_digest


def test_the_digest_file_is_what_is_served(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    store.put_turn(scope, "alpha", 0, meta={}, summary_md="alpha zero")
    clock.advance(minutes=1)
    store.put_turn(scope, "beta", 0, meta={}, summary_md="beta zero\n\n- item\n")
    served = read_digest(store, scope)
    assert store.layout.digest(scope).read_text() == served  # the file a person reads
    assert expected_digest(store, scope) == served  # computed from the records alone
    assert_consistent(store, scope)


def test_digest_is_not_rewritten_by_a_turn_write(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    # A turn write costs O(1) in the project size: it must not render the whole digest.
    store.put_turn(scope, "a", 0, meta={}, summary_md="a")
    read_digest(store, scope)
    path = store.layout.digest(scope)
    inode = path.stat().st_ino
    for i in range(5):
        clock.advance(seconds=1)
        store.put_turn(scope, f"t{i}", 0, meta={}, summary_md=str(i))
    assert path.stat().st_ino == inode
    assert "## t4" in read_digest(store, scope)
    assert path.stat().st_ino != inode
