"""app/storage/tree/fs/walk.py: every walk, scan, removal and rename refuses a link, whether the
kernel's openat2 or the component-by-component fallback does the lookup."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.storage.core.errors import UnsafePath
from app.storage.tree.fs.walk import Tree
from tests.storage._helpers import snapshot


@pytest.fixture(params=["openat2", "fallback"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tree]:
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("inside")
    (root / "a" / "g.txt").write_text("g")
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep.txt").write_text("outside")
    (outside / "sub" / "deep.txt").write_text("outside deep")
    os.symlink(outside, root / "a" / "linked")
    os.symlink(outside / "keep.txt", root / "a" / "linked.txt")
    tree = Tree(root)
    if request.param == "fallback":
        tree._beneath.available = False
    elif not tree._beneath.available:
        pytest.skip("openat2 is not available on this kernel")
    before = snapshot(outside)
    yield tree
    assert snapshot(outside) == before, "something outside the root changed"


def test_entries_type_links_as_links_and_refuse_a_linked_directory(tree: Tree) -> None:
    entries = {e.name: e for e in tree.entries(tree.root / "a")}
    assert entries["b"].is_dir and entries["g.txt"].is_file
    assert entries["linked"].is_link and not entries["linked"].is_dir
    assert entries["linked.txt"].is_link and not entries["linked.txt"].is_file
    with pytest.raises(UnsafePath):
        tree.entries(tree.root / "a" / "linked")
    with pytest.raises(UnsafePath):
        tree.entries(tree.root / "a" / "linked" / "sub")
    assert tree.entries(tree.root / "missing") == []
    with pytest.raises(NotADirectoryError):
        tree.entries(tree.root / "a" / "g.txt")


def test_subdir_names_stream_plain_directories_and_refuse_a_linked_one(tree: Tree) -> None:
    assert list(tree.subdir_names(tree.root / "a")) == ["b"]  # not the linked directory
    with pytest.raises(UnsafePath):
        list(tree.subdir_names(tree.root / "a" / "linked"))
    with pytest.raises(UnsafePath):
        list(tree.subdir_names(tree.root / "a" / "linked" / "sub"))
    assert list(tree.subdir_names(tree.root / "missing")) == []


@pytest.mark.parametrize("batch", [1, 3, 7, 1000])
def test_sorted_subdir_names_give_every_directory_once_in_order_in_batches(
    tree: Tree, batch: int
) -> None:
    big = tree.root / "big"
    names = [f"t{i:03d}" for i in range(60)] + ["Z", "_own", ".hidden", "é", "a b"]
    for name in reversed(names):
        (big / name).mkdir(parents=True)
    (big / "t000.txt").write_text("a file is not a directory")
    os.symlink(big / "t001", big / "t001-link")
    assert list(tree.sorted_subdir_names(big, batch=batch)) == sorted(names)
    assert [e.name for e in tree.non_dirs(big)] == ["t000.txt", "t001-link"]
    assert tree.non_dirs(big)[1].is_link


def test_sorted_subdir_names_see_what_is_created_ahead_and_refuse_a_linked_directory(
    tree: Tree,
) -> None:
    big = tree.root / "big"
    for i in range(0, 20, 2):
        (big / f"t{i:02d}").mkdir(parents=True)
    seen = []
    for name in tree.sorted_subdir_names(big, batch=3):
        seen.append(name)
        if name == "t04":  # one created ahead of the walk is given, one behind it is not
            (big / "t15").mkdir()
            (big / "t01").mkdir()
            (big / "t16").rmdir()
    assert seen == ["t00", "t02", "t04", "t06", "t08", "t10", "t12", "t14", "t15", "t18"]
    with pytest.raises(UnsafePath):
        list(tree.sorted_subdir_names(tree.root / "a" / "linked"))
    with pytest.raises(UnsafePath):
        tree.non_dirs(tree.root / "a" / "linked")
    assert list(tree.sorted_subdir_names(tree.root / "missing")) == []
    assert tree.non_dirs(tree.root / "missing") == []


def test_walk_lists_links_and_never_enters_them(tree: Tree) -> None:
    steps = list(tree.walk(tree.root))
    visited = [str(step.path.relative_to(tree.root)) for step in steps]
    assert visited == [".", "a", "a/b"]
    links = {str(e.path.relative_to(tree.root)) for step in steps for e in step.links}
    assert links == {"a/linked", "a/linked.txt"}
    with pytest.raises(UnsafePath):
        list(tree.walk(tree.root / "a" / "linked"))


def test_remove_never_follows(tree: Tree) -> None:
    assert tree.remove(tree.root / "a" / "linked") is False  # a planted link is left alone
    assert os.path.islink(tree.root / "a" / "linked")
    with pytest.raises(UnsafePath):
        tree.remove(tree.root / "a" / "linked" / "keep.txt")
    # A directory that holds links is removed with them (as links).
    assert tree.remove(tree.root / "a") is True
    assert not os.path.lexists(tree.root / "a")


def test_unlink_rmdir_rename_and_size_refuse_a_linked_parent(tree: Tree) -> None:
    with pytest.raises(UnsafePath):
        tree.unlink(tree.root / "a" / "linked" / "keep.txt")
    with pytest.raises(UnsafePath):
        tree.rmdir(tree.root / "a" / "linked" / "sub")
    with pytest.raises(UnsafePath):
        tree.rename(tree.root / "a" / "g.txt", tree.root / "a" / "linked" / "g.txt")
    with pytest.raises(UnsafePath):
        tree.rename(tree.root / "a" / "linked" / "keep.txt", tree.root / "a" / "k.txt")
    assert tree.size(tree.root / "a" / "b") == len("inside")
    assert tree.size(tree.root / "a" / "linked") == len(os.readlink(tree.root / "a" / "linked"))
    tree.unlink(tree.root / "a" / "linked.txt")  # the link itself goes, its target stays
    assert not os.path.lexists(tree.root / "a" / "linked.txt")


def test_paths_outside_the_root_are_refused(tree: Tree) -> None:
    for path in (tree.root.parent / "outside", tree.root / ".." / "outside", Path("/etc")):
        with pytest.raises(UnsafePath):
            tree.entries(path)
