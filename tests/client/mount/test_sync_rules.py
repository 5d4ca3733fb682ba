"""Each sync rule of the mount, one sync at a time against a real gunicorn.

The sync object runs in the test process so each step is explicit; its clock for the
30-second delete delay is a counter the test moves. Files, HTTP and the server are real.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from project_memory_client.mount.http import StoreClient
from project_memory_client.mount.sync import (
    MARKER,
    Conflicts,
    Deletions,
    MountError,
    StoreSync,
    marker_text,
)

from tests.client.mount.helpers import Remote, local_tree, sha
from tests.e2e.conftest import Server, serving

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving(tmp_path_factory, "mount", workers=2, threads=4)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


class Mount:
    """A store mounted in tmp_path, synced by hand."""

    def __init__(
        self, server: Server, token: str, store_id: str, root: Path, clock: Clock, **kw: object
    ) -> None:
        self.client = StoreClient(server.url, token)
        self.root = root
        self.folder = root / "notes"
        self.sync = StoreSync(
            self.client,
            store_id,
            self.folder,
            state_file=root / ".project-memory" / f"{store_id}.json",
            monotonic=clock,
            **kw,  # type: ignore[arg-type]
        )
        self.sync.prepare()

    def __call__(self) -> dict[str, int]:
        report = self.sync.sync_once()
        assert report.ok
        return report.actions

    def write(self, rel: str, text: str | bytes) -> None:
        path = self.folder / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)

    def tree(self) -> dict[str, str]:
        return local_tree(self.folder)


MakeMount = Callable[..., Mount]


@pytest.fixture
def make(
    server: Server, token: str, remote: Remote, tmp_path: Path, clock: Clock
) -> Iterator[MakeMount]:
    mounts: list[Mount] = []

    def factory(store_id: str | None = None, root: Path | None = None, **kw: object) -> Mount:
        mount = Mount(
            server, token, store_id or remote.store("Notes"), root or tmp_path / "mnt", clock, **kw
        )
        mounts.append(mount)
        return mount

    yield factory
    for mount in mounts:
        mount.client.close()


def test_first_sync_downloads_the_store_and_stamps_the_marker(
    make: MakeMount, remote: Remote
) -> None:
    store_id = remote.store("Notes")
    remote.put(store_id, "/a.md", "alpha\n")
    remote.put(store_id, "/deep/er/b.md", "beta")
    m = make(store_id)
    assert (m.folder / MARKER).read_text() == marker_text(store_id)
    m()
    assert m.tree() == {"/a.md": "alpha\n", "/deep/er/b.md": "beta"}
    assert list(m.folder.rglob(".~tmp-*")) == []  # writes are atomic: no temp file left


def test_a_sync_that_finds_nothing_changed_moves_no_content(
    make: MakeMount, remote: Remote
) -> None:
    m = make()
    remote.put(m.sync.store_id, "/a.md", "a")
    m.write("/b.md", "b")
    m()
    assert m.client.calls["retrieve"] == 1 and m.client.calls["create"] == 1
    before = dict(m.client.calls)
    state = m.sync.state_file.stat().st_mtime_ns
    assert m() == {"in_sync": 2}
    assert m.sync.state_file.stat().st_mtime_ns == state  # nor writes its state file
    after = dict(m.client.calls)
    assert {k: after[k] - before.get(k, 0) for k in after} == {
        "list": 1,
        "retrieve": 0,
        "create": 0,
    }


def test_local_changes_are_uploaded_on_a_precondition(make: MakeMount, remote: Remote) -> None:
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "v1")
    m()
    m.write("/a.md", "v2 local")
    m.write("/new/c.md", "new")
    actions = m()
    assert (actions["upload"], actions["create"]) == (1, 1)
    assert remote.tree(store_id) == {"/a.md": "v2 local", "/new/c.md": "new"}
    modified = remote.versions(store_id, operation="modified")
    assert [v["content_sha256"] for v in modified] == [sha("v2 local")]


def test_remote_changes_are_written_locally(make: MakeMount, remote: Remote) -> None:
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "v1")
    m()
    remote.put(store_id, "/a.md", "v2 remote")
    remote.put(store_id, "/b/c.md", "c")
    actions = m()
    assert actions["download"] == 2
    assert m.tree() == {"/a.md": "v2 remote", "/b/c.md": "c"}


def test_conflict_keeps_the_servers_version_and_warns(
    make, remote: Remote, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="project_memory.mount")
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "base")
    m()
    versions = len(remote.versions(store_id))
    remote.put(store_id, "/a.md", "server edit")
    m.write("/a.md", "local edit")
    assert m()["conflict"] == 1
    assert m.tree() == {"/a.md": "server edit"}
    assert remote.tree(store_id) == {"/a.md": "server edit"}
    assert len(remote.versions(store_id)) == versions + 1  # only the server's own edit
    assert "conflict on /a.md" in caplog.text and "keeping the server's version" in caplog.text
    # The local version is kept in the state folder, outside the store folder, and the log
    # line names the file.
    kept = kept_copies(m)
    assert [p.read_text() for p in kept] == ["local edit"]
    assert kept[0].name == "a.md" and m.folder not in kept[0].parents
    assert f"the local version is kept in {kept[0]}" in caplog.text
    assert m() == {"in_sync": 1}
    assert remote.tree(store_id) == {"/a.md": "server edit"}  # the copy is never synced


def kept_copies(m: Mount) -> list[Path]:
    return sorted(p for p in (m.root / ".project-memory" / "conflicts").rglob("*") if p.is_file())


def test_a_read_only_edit_of_a_file_deleted_on_the_server_is_kept(
    make, remote: Remote, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="project_memory.mount")
    m = make(read_only=True)
    store_id = m.sync.store_id
    remote.put(store_id, "/d/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    m()
    m.write("/d/a.md", "edited here")
    remote.delete(store_id, "/d/a.md")
    m()
    assert m.tree() == {"/b.md": "b"}
    kept = kept_copies(m)
    assert [p.read_text() for p in kept] == ["edited here"]
    assert kept[0].relative_to(m.sync.conflicts).parts[1:] == ("d", "a.md")
    assert f"the local edits are kept in {kept[0]}" in caplog.text


class ListingWithOddPaths(StoreClient):
    """This server refuses these paths, so the test plays one that sends them anyway: the
    listing of the real server, with the paths of some real memories replaced."""

    def __init__(self, *args: Any, odd: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.odd = odd

    def list_memories(self, store_id: str, **kwargs: Any) -> list[dict[str, Any]]:
        items = super().list_memories(store_id, **kwargs)
        return [{**m, "path": self.odd.get(m["path"], m["path"])} for m in items]


def test_a_server_path_no_local_file_can_hold_skips_that_memory_only(
    server: Server, token: str, remote: Remote, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="project_memory.mount")
    store_id = remote.store("Odd")
    odd = {
        "/nul.md": "/with\x00nul.md",
        "/long.md": "/" + "x" * 300 + ".md",
        "/up.md": "/../outside.md",
        "/surrogate.md": "/\udcff.md",
        "/number.md": 42,
    }
    for path in [*odd, "/fine.md", "/sub/also-fine.md"]:
        remote.put(store_id, path, f"content of {path}")
    client = ListingWithOddPaths(server.url, token, odd=odd)
    root = tmp_path / "mnt"
    sync = StoreSync(client, store_id, root / "odd", state_file=root / ".project-memory" / "s.json")
    try:
        sync.prepare()
        report = sync.sync_once()
        assert report.ok
        assert local_tree(root / "odd") == {
            "/fine.md": "content of /fine.md",
            "/sub/also-fine.md": "content of /sub/also-fine.md",
        }
        assert not (tmp_path / "outside.md").exists() and not (root / "outside.md").exists()
        for why in (
            "contains a NUL",
            "longer than 255 bytes",
            ". or .. segment",
            "not valid UTF-8",
        ):
            assert caplog.text.count(why) == 1, why
        assert "its path is not a string" in caplog.text
        assert sync.sync_once().ok
        assert caplog.text.count("contains a NUL") == 1  # said once, not every sync
    finally:
        client.close()


def test_a_refused_file_is_skipped_with_one_warning_until_it_changes(
    make, remote: Remote, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="project_memory.mount")
    m = make()
    store_id = m.sync.store_id
    m.write("/big.md", "x" * 102_401)  # over the store's 100 kB: the server says 400
    m.write("/latin1.md", "caf\xe9".encode("latin-1"))  # not UTF-8: cannot be a memory
    m.write("/ok.md", "fine")
    m()
    assert remote.tree(store_id) == {"/ok.md": "fine"}
    assert caplog.text.count("/big.md refused") == 1
    assert caplog.text.count("/latin1.md refused (not UTF-8 text)") == 1
    creates = m.client.calls["create"]
    m()
    m()
    assert m.client.calls["create"] == creates  # not sent again
    assert caplog.text.count("/big.md refused") == 1  # and not warned again
    m.write("/big.md", "small now")
    m()
    assert remote.tree(store_id) == {"/big.md": "small now", "/ok.md": "fine"}


def test_a_local_delete_is_sent_only_after_30_seconds_missing(
    make, remote: Remote, clock: Clock
) -> None:
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    m()
    os.unlink(m.folder / "a.md")
    m()
    assert "/a.md" in remote.tree(store_id)
    clock.now += 29
    m()
    assert "/a.md" in remote.tree(store_id)
    clock.now += 2
    assert m()["delete_remote"] == 1
    assert remote.tree(store_id) == {"/b.md": "b"}
    (deleted,) = remote.versions(store_id, operation="deleted")
    assert deleted["path"] == "/a.md"


def test_a_file_back_before_the_delay_is_not_deleted(
    make: MakeMount, remote: Remote, clock: Clock
) -> None:
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    m()
    os.unlink(m.folder / "a.md")
    m()
    clock.now += 20
    m.write("/a.md", "a")  # an editor's delete-and-rewrite
    m()
    clock.now += 20
    os.unlink(m.folder / "a.md")
    m()  # missing again: the 30 s start over
    clock.now += 20
    m()
    assert remote.tree(store_id) == {"/a.md": "a", "/b.md": "b"}


def test_a_delayed_delete_loses_to_a_change_on_the_server(
    make, remote: Remote, clock: Clock
) -> None:
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    m()
    os.unlink(m.folder / "a.md")
    m()
    clock.now += 31
    remote.put(store_id, "/a.md", "edited on the server")
    m()
    assert remote.tree(store_id)["/a.md"] == "edited on the server"
    assert m.tree()["/a.md"] == "edited on the server"


@pytest.mark.parametrize("mode", [Deletions.LOG_ONLY, Deletions.DISABLED])
def test_deletions_log_only_and_disabled_keep_the_server_copy(
    make, remote: Remote, clock: Clock, caplog: pytest.LogCaptureFixture, mode: Deletions
) -> None:
    caplog.set_level(logging.INFO, logger="project_memory.mount")
    m = make(deletions=mode)
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    m()
    os.unlink(m.folder / "a.md")
    m()
    clock.now += 60
    m()
    m()
    assert remote.tree(store_id) == {"/a.md": "a", "/b.md": "b"}
    assert m.tree() == {"/b.md": "b"}
    expected = (
        "would delete it on the server" if mode is Deletions.LOG_ONLY else "deletions are disabled"
    )
    assert caplog.text.count(expected) == 1


def test_a_remote_delete_removes_the_local_file(make: MakeMount, remote: Remote) -> None:
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/d/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    m()
    remote.delete(store_id, "/d/a.md")
    assert m()["remove_local"] == 1
    assert m.tree() == {"/b.md": "b"}
    assert not (m.folder / "d").exists()  # the directory it emptied goes too


def test_a_remote_delete_of_a_locally_edited_file_re_creates_it(
    make, remote: Remote, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="project_memory.mount")
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    m()
    remote.delete(store_id, "/a.md")
    m.write("/a.md", "edited here")
    assert m()["recreate"] == 1
    assert remote.tree(store_id) == {"/a.md": "edited here", "/b.md": "b"}
    assert "re-creating it" in caplog.text


def test_a_wipe_is_never_propagated_and_is_restored(
    make, remote: Remote, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="project_memory.mount")
    m = make()
    store_id = m.sync.store_id
    for name in ("a", "b", "c"):
        remote.put(store_id, f"/{name}/{name}.md", name)
    m()
    for child in m.folder.iterdir():
        if child.name != MARKER:
            shutil.rmtree(child)
    clock.now += 3600
    m()
    assert "treating it as a wipe" in caplog.text
    assert remote.tree(store_id) == {"/a/a.md": "a", "/b/b.md": "b", "/c/c.md": "c"}
    assert remote.versions(store_id, operation="deleted") == []
    assert m.tree() == {"/a/a.md": "a", "/b/b.md": "b", "/c/c.md": "c"}


def test_a_wiped_folder_without_its_marker_syncs_nothing(
    make, remote: Remote, clock: Clock
) -> None:
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    m()
    shutil.rmtree(m.folder)
    clock.now += 3600
    assert not m.sync.sync_once().ok
    assert not m.folder.exists()
    assert remote.tree(store_id) == {"/a.md": "a", "/b.md": "b"}
    # another store's marker is not ours either
    m.folder.mkdir()
    (m.folder / MARKER).write_text(marker_text("memstore_01JABCDEFGHJKMNPQRSTVWXYZ0"))
    (m.folder / "x.md").write_text("x")
    assert not m.sync.sync_once().ok
    assert remote.tree(store_id) == {"/a.md": "a", "/b.md": "b"}


def test_read_only_never_uploads_and_remote_changes_overwrite(
    make, remote: Remote, clock: Clock
) -> None:
    m = make(read_only=True)
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    m()
    versions = remote.versions(store_id)
    m.write("/a.md", "local edit")
    m.write("/new.md", "new")
    os.unlink(m.folder / "b.md")
    clock.now += 3600
    m()
    m()
    assert remote.versions(store_id) == versions
    assert remote.tree(store_id) == {"/a.md": "a", "/b.md": "b"}
    assert m.client.calls["create"] + m.client.calls["update"] + m.client.calls["delete"] == 0
    remote.put(store_id, "/a.md", "server again")
    m()
    assert m.tree()["/a.md"] == "server again"
    assert [p.read_text() for p in kept_copies(m)] == ["local edit"]


def test_mount_refuses_a_folder_it_did_not_create(
    make: MakeMount, remote: Remote, tmp_path: Path
) -> None:
    root = tmp_path / "other"
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "mine.txt").write_text("not yours")
    with pytest.raises(MountError, match="not created by project-memory mount"):
        make(root=root)
    (root / "notes" / MARKER).write_text(marker_text("memstore_01JABCDEFGHJKMNPQRSTVWXYZ0"))
    with pytest.raises(MountError, match="names another store"):
        make(root=root)
    assert (root / "notes" / "mine.txt").read_text() == "not yours"
    empty = tmp_path / "empty"
    (empty / "notes").mkdir(parents=True)
    m = make(root=empty)  # an empty folder is adopted
    assert (m.folder / MARKER).exists()


def test_a_restarted_mount_resumes_from_its_state(
    make: MakeMount, remote: Remote, tmp_path: Path
) -> None:
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "a")
    m()
    remote.delete(store_id, "/a.md")
    again = make(store_id)  # same folder, state file and marker: resumes
    again()
    assert again.tree() == {}  # the baseline says a.md was synced: the remote delete wins
    assert remote.tree(store_id) == {}


def test_symlinks_are_never_synced_or_followed(
    make: MakeMount, remote: Remote, tmp_path: Path
) -> None:
    m = make()
    store_id = m.sync.store_id
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    (m.folder / "link.md").symlink_to(secret)
    (m.folder / "dirlink").symlink_to(tmp_path)
    m.write("/real.md", "real")
    m()
    assert remote.tree(store_id) == {"/real.md": "real"}


def test_read_only_works_with_a_reader_token(
    server: Server, remote: Remote, tmp_path: Path, clock: Clock
) -> None:
    store_id = remote.store("Reference")
    remote.put(store_id, "/a.md", "a")
    m = Mount(server, server.token("reader"), store_id, tmp_path / "ro", clock, read_only=True)
    try:
        m.write("/local.md", "never uploaded")
        m()
        assert m.tree() == {"/a.md": "a", "/local.md": "never uploaded"}
        assert remote.tree(store_id) == {"/a.md": "a"}
    finally:
        m.client.close()


def test_a_stop_request_ends_a_sync_between_files(make: MakeMount, remote: Remote) -> None:
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    asked: list[int] = []

    def stop_after_one() -> bool:
        asked.append(1)
        return len(asked) > 1

    report = m.sync.sync_once(stop=stop_after_one)
    assert not report.ok
    assert m.tree() == {"/a.md": "a"}  # the first path only
    m()  # the next (final) sync does the rest
    assert m.tree() == {"/a.md": "a", "/b.md": "b"}


def test_a_settled_file_is_hashed_from_cache_yet_a_later_edit_is_seen(
    make: MakeMount, remote: Remote
) -> None:
    m = make()
    store_id = m.sync.store_id
    m.write("/old.md", "same size 1")
    past = os.stat(m.folder / "old.md").st_mtime - 60
    os.utime(m.folder / "old.md", (past, past))
    m()
    m()  # the second scan takes its hash from the cache (the file is 60 s still)
    assert "/old.md" in m.sync._hash_cache
    m.write("/old.md", "same size 2")  # same size, same inode, a new mtime
    assert m()["upload"] == 1
    assert remote.tree(store_id) == {"/old.md": "same size 2"}


def test_many_files_to_write_are_read_20_a_page(make: MakeMount, remote: Remote) -> None:
    store_id = remote.store("Big")
    expected = {f"/f{i:02d}.md": f"file {i}\n" for i in range(45)}
    for path, text in expected.items():
        remote.put(store_id, path, text)
    m = make(store_id)
    m()
    assert m.tree() == expected
    assert m.client.calls["retrieve"] == 0
    assert m.client.calls["list_full"] == 3  # 45 memories, 20 a page
    remote.put(store_id, "/f00.md", "one change")
    m()  # a few changes: fetched one by one, as before
    assert m.client.calls["retrieve"] == 1 and m.client.calls["list_full"] == 3
    assert m.tree()["/f00.md"] == "one change"


# -- Conflicts.MERGE: Claude Code's shared memory (agents/shared_memory.py) ------------------
def history(remote: Remote, store_id: str, path: str) -> list[str]:
    """The contents of every version of the memory at ``path``, oldest first."""
    memory_id = remote.memories(store_id)[path]["id"]
    found = remote.versions(store_id, memory_id=memory_id, view="full")
    return [v["content"] for v in reversed(found)]


def test_merging_puts_both_versions_in_the_history_and_both_in_the_file(
    make, remote: Remote, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="project_memory.mount")
    m = make(conflicts=Conflicts.MERGE)
    store_id = m.sync.store_id
    base = "- [a](a.md) — A\n"
    remote.put(store_id, "/MEMORY.md", base)
    m()
    remote.put(store_id, "/MEMORY.md", base + "- [theirs](t.md) — T\n")
    m.write("/MEMORY.md", base + "- [mine](m.md) — M\n")
    assert m()["conflict"] == 1
    merged = base + "- [mine](m.md) — M\n- [theirs](t.md) — T\n"
    assert m.tree() == {"/MEMORY.md": merged} and remote.tree(store_id) == {"/MEMORY.md": merged}
    assert history(remote, store_id, "/MEMORY.md") == [
        base,
        base + "- [theirs](t.md) — T\n",
        base + "- [mine](m.md) — M\n",
        merged,
    ]
    assert "both versions are whole in the store's history" in caplog.text
    assert "the file now holds both" in caplog.text
    assert kept_copies(m) == []  # nothing left outside the store
    assert m() == {"in_sync": 1}


def test_a_first_merging_sync_unites_both_sides(make, remote: Remote, tmp_path: Path) -> None:
    store_id = remote.store("Notes")
    remote.put(store_id, "/MEMORY.md", "- [server](s.md)\n")
    remote.put(store_id, "/s.md", "from the server\n")
    root = tmp_path / "first"
    folder = root / "notes"
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(marker_text(store_id))
    (folder / "MEMORY.md").write_text("- [local](l.md)\n")
    (folder / "l.md").write_text("from here\n")
    m = make(store_id, root=root, conflicts=Conflicts.MERGE)
    actions = m()
    assert actions == {"conflict": 1, "create": 1, "download": 1}
    expected = {
        "/MEMORY.md": "- [local](l.md)\n- [server](s.md)\n",
        "/l.md": "from here\n",
        "/s.md": "from the server\n",
    }
    assert m.tree() == expected and remote.tree(store_id) == expected
    assert history(remote, store_id, "/MEMORY.md") == [
        "- [server](s.md)\n",
        "- [local](l.md)\n",
        expected["/MEMORY.md"],
    ]


def test_a_version_the_store_cannot_take_falls_back_to_the_server_wins(
    make, remote: Remote
) -> None:
    m = make(conflicts=Conflicts.MERGE)
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "base")
    m()
    remote.put(store_id, "/a.md", "server edit")
    m.write("/a.md", b"\xff not UTF-8")
    m()
    assert m.tree() == {"/a.md": "server edit"}
    assert [p.read_bytes() for p in kept_copies(m)] == [b"\xff not UTF-8"]
    # Refused by the server (over its 100 kB): the same, in the same sync.
    remote.put(store_id, "/a.md", "server again")
    m.write("/a.md", "x" * 200_000)
    m()
    assert m.tree() == {"/a.md": "server again"}
    assert len(kept_copies(m)) == 2


def test_a_file_replaced_by_a_link_is_not_deleted_on_the_server(
    make, remote: Remote, clock: Clock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="project_memory.mount")
    m = make()
    store_id = m.sync.store_id
    remote.put(store_id, "/a.md", "a")
    remote.put(store_id, "/b.md", "b")
    m()
    outside = tmp_path / "outside.md"
    outside.write_text("not for the store")
    (m.folder / "a.md").unlink()
    (m.folder / "a.md").symlink_to(outside)
    remote.put(store_id, "/b.md", "b changed")  # and a change there is not written through it
    (m.folder / "b.md").unlink()
    (m.folder / "b.md").symlink_to(outside)
    for _ in range(2):
        clock.now += 3600
        m()
    assert remote.tree(store_id) == {"/a.md": "a", "/b.md": "b changed"}
    assert outside.read_text() == "not for the store"
    assert remote.versions(store_id, operation="deleted") == []
    assert "/a.md is not a regular file here" in caplog.text


def test_hidden_names_are_skipped_when_asked(make, remote: Remote) -> None:
    m = make(conflicts=Conflicts.MERGE, skip_hidden=True)
    store_id = m.sync.store_id
    remote.put(store_id, "/.hidden.md", "theirs")
    m.write("/.consolidate-lock", "lock")
    m.write("/.cache/x.md", "x")
    m.write("/notes.md", "notes")
    m()
    assert remote.tree(store_id) == {"/.hidden.md": "theirs", "/notes.md": "notes"}
    assert not (m.folder / ".hidden.md").exists()
