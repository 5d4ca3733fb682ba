"""The three-way rule, path by path, and the marker: pure functions, every combination."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from project_memory_client.mount.cli import DELETIONS
from project_memory_client.mount.sync import (
    Action,
    Deletions,
    decide,
    marker_text,
    remove_file,
    replace_file,
)

from tests.client.mount.helpers import sha

# (local, base, remote) with 'a', 'b', 'c' standing for distinct hashes, None for absent.
CASES = {
    # nothing moved
    ("a", "a", "a"): Action.IN_SYNC,
    (None, None, None): Action.IN_SYNC,
    ("a", None, "a"): Action.IN_SYNC,  # the same file appeared on both sides
    (None, "a", None): Action.IN_SYNC,  # deleted on both sides
    # only the server moved
    ("a", "a", "b"): Action.DOWNLOAD,
    (None, None, "a"): Action.DOWNLOAD,
    ("a", "a", None): Action.REMOVE_LOCAL,
    # only the local side moved
    ("b", "a", "a"): Action.UPLOAD,
    ("a", None, None): Action.CREATE,
    (None, "a", "a"): Action.DELETE_REMOTE,
    # both moved: the server wins, except a remote delete of a locally edited file
    ("b", "a", "c"): Action.CONFLICT,
    ("b", None, "c"): Action.CONFLICT,
    (None, "a", "c"): Action.CONFLICT,
    ("b", "a", None): Action.RECREATE,
}


@pytest.mark.parametrize(("case", "expected"), CASES.items())
def test_decide(case: tuple[str | None, str | None, str | None], expected: Action) -> None:
    assert decide(*case, read_only=False) is expected


def test_read_only_never_uploads_or_deletes() -> None:
    values = ["a", "b", "c", None]
    for local, base, remote in itertools.product(values, repeat=3):
        action = decide(local, base, remote, read_only=True)
        assert action not in (Action.UPLOAD, Action.CREATE, Action.DELETE_REMOTE, Action.RECREATE)
        if remote == base and local != base:
            assert action is Action.IGNORE_LOCAL
        if local == base and remote != base:
            assert action in (Action.DOWNLOAD, Action.REMOVE_LOCAL)


def test_every_combination_has_one_answer_and_server_changes_are_never_lost() -> None:
    values = ["a", "b", "c", None]
    for local, base, remote in itertools.product(values, repeat=3):
        action = decide(local, base, remote, read_only=False)
        if remote != base and remote is not None:
            # a change on the server always ends up locally (or already is)
            assert action in (Action.DOWNLOAD, Action.CONFLICT, Action.IN_SYNC)


def test_marker_is_the_official_workers_format() -> None:
    store_id = "memstore_01JABCDEFGHJKMNPQRSTVWXYZ0"
    assert marker_text(store_id) == sha("version 1\n" + store_id)


def test_replace_file_never_overwrites_an_edit_made_after_the_scan(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("seen")
    assert replace_file(tmp_path, "/a.md", b"server", expected_sha=sha("seen"))
    assert (tmp_path / "a.md").read_text() == "server"
    assert not replace_file(tmp_path, "/a.md", b"again", expected_sha=sha("seen"))
    assert (tmp_path / "a.md").read_text() == "server"
    assert not replace_file(tmp_path, "/new.md", b"x", expected_sha=sha("something"))
    assert not (tmp_path / "new.md").exists()
    assert replace_file(tmp_path, "/d/e/new.md", b"x", expected_sha=None)
    assert (tmp_path / "d" / "e" / "new.md").read_bytes() == b"x"
    assert [p.name for p in tmp_path.rglob(".~tmp-*")] == []


def test_replace_file_never_writes_through_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "link").symlink_to(outside)
    with pytest.raises(OSError):
        replace_file(folder, "/link/x.md", b"x", expected_sha=None)
    (folder / "file-link").symlink_to(outside / "target")
    with pytest.raises(OSError):
        replace_file(folder, "/file-link", b"x", expected_sha=None)
    assert list(outside.iterdir()) == []


def test_remove_file_checks_the_hash_and_prunes_empty_directories(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "x.md").write_text("x")
    assert not remove_file(tmp_path, "/d/e/x.md", expected_sha=sha("other"))
    assert remove_file(tmp_path, "/d/e/x.md", expected_sha=sha("x"))
    assert list(tmp_path.iterdir()) == []


def test_the_cli_offers_the_deletion_modes_the_sync_knows() -> None:
    assert tuple(d.value for d in Deletions) == DELETIONS
