"""Name rules and paths: everything invalid is refused before a path exists."""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from app.storage.core.errors import InvalidName, UnsafePath
from app.storage.core.names import (
    ARTIFACT_NAME_PATTERN,
    ID_PATTERN,
    PROJECT_DIGEST,
    PROJECT_LISTING,
    TASK_INDEX,
    TASK_RECORD,
    TMP_PREFIX,
    Scope,
    validate_artifact_name,
    validate_id,
    validate_turn,
)
from app.storage.tree.fs.layout import Layout
from app.storage.tree.tasks import TaskStore

BAD_IDS: list[object] = [
    "",
    ".",
    "..",
    "a/b",
    "/etc",
    "a\\b",
    "..\\x",
    "a\x00b",
    "\x00",
    "\u2025",  # ‥ : NFKC gives ".."
    "\uff0e\uff0e",  # ．． : NFKC gives ".."
    "\u2024\u2024",  # ․․
    "a\uff0fb",  # ／ : NFKC gives "/"
    "\uff0fetc",
    "x" * 129,
    "a" + "b" * 128,
    ".hidden",
    "_project",
    "-dash",
    "~tmp",
    "a~b",
    "a b",
    " a",
    "a ",
    "a,b",
    "alpha,beta",
    "a\nb",
    "a\n",
    "é",
    "caf\u00e9",
    "%2e%2e",
    "a%2fb",
    None,
    1,
    1.5,
    b"abc",
    ["a"],
]

GOOD_IDS = [
    "a",
    "0",
    "A",
    "task-1",
    "task_1",
    "v1.2.3",
    "a.b-c_d",
    "project.md",
    "index.json",
    "task.json",
    "meta.json",
    "summary.md",
    "artifacts",
    "0000-turn",
    "x" * 128,
    "a" + "-" * 127,
    "a" + "." * 126 + "b",
    "task.",
    "a..",
    "a" + "." * 127,
]

BAD_ARTIFACT_NAMES: list[object] = [
    "",
    ".",
    "..",
    "a/b",
    "../x",
    "a\\b",
    "a\x00b",
    "\u2025",
    "\uff0e\uff0e",
    "a\uff0fb",
    "x" * 129,
    "a b",
    "a~b",
    "a,b",
    "é.txt",
    None,
    7,
    b"x",
]

GOOD_ARTIFACT_NAMES = [
    "a",
    "report.txt",
    ".env",
    "_x",
    "-x",
    "..a",
    ".a.b",
    "x" * 128,
    "meta.json",
    "summary.md",
    "report.",
    "...",
    "x..",
]


@pytest.mark.parametrize("value", BAD_IDS, ids=repr)
def test_invalid_ids_are_refused(value: object) -> None:
    with pytest.raises(InvalidName):
        validate_id("task_id", value)


@pytest.mark.parametrize("value", GOOD_IDS)
def test_valid_ids_pass(value: str) -> None:
    assert validate_id("task_id", value) == value


@pytest.mark.parametrize("value", BAD_ARTIFACT_NAMES, ids=repr)
def test_invalid_artifact_names_are_refused(value: object) -> None:
    with pytest.raises(InvalidName):
        validate_artifact_name(value)


@pytest.mark.parametrize("value", GOOD_ARTIFACT_NAMES)
def test_valid_artifact_names_pass(value: str) -> None:
    assert validate_artifact_name(value) == value


@pytest.mark.parametrize("value", [-1, 10000, 10**9, True, False, "1", 1.0, None])
def test_invalid_turns_are_refused(value: object) -> None:
    with pytest.raises(InvalidName):
        validate_turn(value)


@pytest.mark.parametrize("value", [0, 1, 42, 9999])
def test_valid_turns_pass(value: int) -> None:
    assert validate_turn(value) == value


@pytest.mark.parametrize("value", BAD_IDS, ids=repr)
def test_scope_refuses_invalid_tenant_and_project(value: object) -> None:
    with pytest.raises(InvalidName):
        Scope(value, "web")  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        Scope("acme", value)  # type: ignore[arg-type]


def _tree(root: Path) -> list[str]:
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("value", BAD_IDS, ids=repr)
def test_store_refuses_invalid_task_ids_before_touching_disk(
    store: TaskStore, scope: Scope, value: object
) -> None:
    before = _tree(store.layout.root)
    calls = [
        lambda: store.put_turn(scope, value, 0, meta={}, summary_md="x"),  # type: ignore[arg-type]
        lambda: store.get_turn(scope, value, 0),  # type: ignore[arg-type]
        lambda: store.get_task(scope, value),  # type: ignore[arg-type]
        lambda: store.delete_task(scope, value),  # type: ignore[arg-type]
        lambda: store.put_artifact(scope, value, 0, "a.txt", _never_read(), content_type="x"),  # type: ignore[arg-type]
        lambda: store.open_artifact(scope, value, 0, "a.txt"),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(InvalidName):
            call()
    assert _tree(store.layout.root) == before


@pytest.mark.parametrize("value", BAD_ARTIFACT_NAMES, ids=repr)
def test_store_refuses_invalid_artifact_names_before_reading_the_body(
    store: TaskStore, scope: Scope, value: object
) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="x")
    before = _tree(store.layout.root)
    with pytest.raises(InvalidName):
        store.put_artifact(scope, "t1", 0, value, _never_read(), content_type="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        store.open_artifact(scope, "t1", 0, value)  # type: ignore[arg-type]
    assert _tree(store.layout.root) == before


@pytest.mark.parametrize("turn", [-1, 10000, True, "0"])
def test_store_refuses_invalid_turns(store: TaskStore, scope: Scope, turn: object) -> None:
    with pytest.raises(InvalidName):
        store.put_turn(scope, "t1", turn, meta={}, summary_md="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        store.get_turn(scope, "t1", turn)  # type: ignore[arg-type]
    assert not store.layout.project_dir(scope).exists()


def test_turn_9999_is_stored_as_a_four_digit_directory(store: TaskStore, scope: Scope) -> None:
    store.put_turn(scope, "t1", 9999, meta={}, summary_md="last")
    assert (store.layout.task_dir(scope, "t1") / "9999-turn" / "summary.md").read_text() == "last"
    assert store.get_turn(scope, "t1", 9999).summary_md == "last"


class _NeverRead:
    def read(self, n: int = -1) -> bytes:
        raise AssertionError("the body was read before the name was validated")


def _never_read() -> _NeverRead:
    return _NeverRead()


# -- reserved names ---------------------------------------------------------------------------
RESERVED_LOOKING = [TASK_INDEX, TASK_RECORD, "project.md", "meta.json", "summary.md", "artifacts"]


@pytest.mark.parametrize("task_id", RESERVED_LOOKING)
def test_tasks_named_like_reserved_files_work(store: TaskStore, scope: Scope, task_id: str) -> None:
    store.put_turn(scope, "plain", 0, meta={"n": 0}, summary_md="plain")
    store.put_turn(scope, task_id, 0, meta={"n": 1}, summary_md=f"I am {task_id}")
    assert store.get_turn(scope, task_id, 0).summary_md == f"I am {task_id}"
    assert store.get_task(scope, task_id).task_id == task_id
    listed = {t.task_id for t in store.list_tasks(scope).tasks}
    assert listed == {"plain", task_id}
    digest_file, _ = store.open_digest(scope)
    with digest_file:
        text = digest_file.read().decode()
    assert f"## {task_id}\n" in text and f"I am {task_id}" in text
    assert store.get_task(scope, "plain").turns[0].meta == {"n": 0}
    store.delete_task(scope, task_id)
    assert store.get_turn(scope, "plain", 0).summary_md == "plain"
    assert {t.task_id for t in store.list_tasks(scope).tasks} == {"plain"}


@pytest.mark.parametrize(
    "name", [PROJECT_DIGEST, PROJECT_LISTING, ".locks", ".trash", ".cursor-key"]
)
def test_engine_file_names_can_never_be_ids(name: str) -> None:
    # The engine's own names beside ids start with '_' or '.', which no id may.
    with pytest.raises(InvalidName):
        validate_id("task_id", name)


def test_temp_prefix_can_never_be_an_id_or_artifact_name() -> None:
    probe = TMP_PREFIX + "abc"
    with pytest.raises(InvalidName):
        validate_id("task_id", probe)
    with pytest.raises(InvalidName):
        validate_artifact_name(probe)


# -- containment ------------------------------------------------------------------------------
def test_check_inside_refuses_paths_outside_the_root(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "root")
    for outside in [tmp_path, tmp_path / "elsewhere", Path("/etc/hosts"), tmp_path / "root2"]:
        with pytest.raises(UnsafePath):
            layout.check_inside(outside)
    with pytest.raises(UnsafePath):
        layout.check_inside(layout.root / "a" / ".." / "b")
    assert layout.check_inside(layout.root / "a" / "b") == layout.root / "a" / "b"


def test_check_inside_below_a_checked_dir_walks_the_rest_and_refuses_the_same(
    tmp_path: Path,
) -> None:
    """``below=``: only the components after an already checked directory are looked at,
    and everything the full walk refuses after it is still refused."""
    layout = Layout(tmp_path / "root")
    task = layout.root / "t" / "p" / "task"
    (task / "0000-turn").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (task / "0001-turn").symlink_to(tmp_path / "outside")
    meta = task / "0000-turn" / "meta.json"
    assert layout.check_inside(meta, below=task) == meta
    assert layout.check_inside(task / "9999-turn" / "meta.json", below=task)  # absent: fine
    for bad, below in [
        (task / "0001-turn" / "meta.json", task),  # a link after below
        (task / "0001-turn", task),
        (layout.root / "t" / "other" / "x", task),  # not under below
        (task, task),  # below itself is no component
        (task / ".." / "x", task),
        (tmp_path / "outside" / "x", tmp_path),  # below outside the root
    ]:
        with pytest.raises(UnsafePath):
            layout.check_inside(bad, below=below)
    assert layout.check_inside(meta, below=layout.root) == meta


# -- properties -------------------------------------------------------------------------------
_ID_ALPHABET = string.ascii_letters + string.digits + "._-"
_candidates = st.one_of(
    st.text(max_size=140),
    st.text(alphabet=_ID_ALPHABET + "/\\\x00~ ,\u2025\uff0e\uff0f", max_size=140),
    st.from_regex(re.compile(ID_PATTERN), fullmatch=True),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_candidates)
def test_accepted_ids_match_the_rule_and_stay_under_the_root(value: str) -> None:
    root = Path("/srv/memory-root")
    layout = Layout(root)
    try:
        validate_id("task_id", value)
    except InvalidName:
        assert not (re.fullmatch(ID_PATTERN, value) and value.isascii())
        return
    assert re.fullmatch(ID_PATTERN, value, flags=re.ASCII)
    assert value not in (".", "..") and "/" not in value and "\x00" not in value
    scope = Scope(value, value)
    for path in (
        layout.task_dir(scope, value),
        layout.turn_dir(scope, value, 9999),
        layout.artifact(scope, value, 0, "a"),
        layout.project_lock(scope),
    ):
        normalized = Path(os.path.normpath(path))
        assert normalized == path
        assert normalized.is_relative_to(root) and normalized != root
        assert layout.check_inside(path) == path


@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.text(max_size=140), st.from_regex(ARTIFACT_NAME_PATTERN, fullmatch=True)))
def test_accepted_artifact_names_match_the_rule_and_stay_in_the_artifacts_dir(value: str) -> None:
    layout = Layout(Path("/srv/memory-root"))
    scope = Scope("acme", "web")
    try:
        validate_artifact_name(value)
    except InvalidName:
        return
    assert re.fullmatch(ARTIFACT_NAME_PATTERN, value, flags=re.ASCII)
    assert value not in (".", "..")
    path = layout.artifact(scope, "t", 0, value)
    assert Path(os.path.normpath(path)) == path
    assert path.parent == layout.turn_dir(scope, "t", 0) / "artifacts"


@given(turn=st.integers(min_value=-(10**6), max_value=10**6))
def test_turns_outside_0_to_9999_are_refused(turn: int) -> None:
    if 0 <= turn <= 9999:
        assert validate_turn(turn) == turn
        assert Layout(Path("/r")).turn_dir(Scope("a", "b"), "t", turn).name == f"{turn:04d}-turn"
    else:
        with pytest.raises(InvalidName):
            validate_turn(turn)


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _read_through(layout: Layout, path: Path) -> bytes:
    fd = layout.open_read(str(path))
    assert fd is not None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
def test_open_read_refuses_a_symlink_anywhere_on_the_way(tmp_path: Path, openat2: bool) -> None:
    """Layout.open_read (the read of a turn): one openat2 call where the kernel has it, else
    the lstat walk and an O_NOFOLLOW open; both refuse the same paths."""
    root = tmp_path / "root"
    layout = Layout(root)
    if not openat2:
        layout._beneath.available = False
    elif not layout._beneath.available:
        pytest.skip("this kernel has no openat2")
    meta = root / "a" / "b" / "meta.json"
    _put(meta, '{"inside": 1}')
    assert _read_through(layout, meta) == b'{"inside": 1}'
    assert layout.open_read(str(root / "a" / "b" / "missing.json")) is None
    assert layout.open_read(str(root / "a" / "nodir" / "meta.json")) is None
    assert layout.open_read(str(meta / "under-a-file")) is None
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "meta.json").write_text("OUTSIDE")
    (root / "a" / "b" / "link.json").symlink_to(outside / "meta.json")
    (root / "a" / "c").symlink_to(outside)
    (root / "d").symlink_to(root / "a")  # even a link that stays inside the root
    for path in (
        root / "a" / "b" / "link.json",
        root / "a" / "c" / "meta.json",
        root / "d" / "b" / "meta.json",
    ):
        with pytest.raises(UnsafePath):
            layout.open_read(str(path))


def test_open_read_follows_the_root_path_when_the_root_is_replaced(tmp_path: Path) -> None:
    # An operator moves the root aside and restores a backup in its place while the server
    # runs: reads must come from the directory the path names now, like every write.
    root = tmp_path / "root"
    layout = Layout(root)
    meta = root / "t" / "meta.json"
    _put(meta, "old")
    assert _read_through(layout, meta) == b"old"
    root.rename(tmp_path / "root.old")
    _put(meta, "restored")
    assert _read_through(layout, meta) == b"restored"
