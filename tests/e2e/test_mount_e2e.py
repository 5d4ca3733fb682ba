"""``project-memory mount`` as a real process against a real gunicorn.

Short intervals through the test-only floor (PROJECT_MEMORY_TEST_MIN_INTERVAL); every wait
has a deadline; every process is stopped by its own pid.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.client.mount.helpers import Remote, local_tree
from tests.e2e.conftest import Server, serving, start_server

pytestmark = pytest.mark.e2e

CLI = str(Path(sys.executable).parent / "project-memory")
INTERVAL = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving(tmp_path_factory, "mount-e2e")


class Mounted:
    """One ``project-memory mount`` process."""

    def __init__(self, proc: subprocess.Popen[bytes], root: Path, log: Path) -> None:
        self.proc = proc
        self.root = root
        self.log_path = log

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 40, signum: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``check`` until true; return the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def mount(server: Server, token: str, tmp_path: Path) -> Iterator[Callable[..., Mounted]]:
    started: list[Mounted] = []

    def run(
        store_id: str,
        name: str,
        *extra: str,
        interval: float = INTERVAL,
        srv: Server = server,
        secret: str = token,
    ) -> Mounted:
        root = tmp_path / name
        log = tmp_path / f"{name}.log"
        env = {
            **os.environ,
            "PROJECT_MEMORY_TOKEN": secret,
            "PROJECT_MEMORY_TEST_MIN_INTERVAL": "0.1",
            "PROJECT_MEMORY_TEST_DELETE_DELAY": "1",
        }
        args = [CLI, "mount", "--server", srv.url, "--store", store_id]
        args += ["--interval", str(interval), *extra, str(root)]
        with open(log, "wb") as fh:
            proc = subprocess.Popen(args, env=env, stdout=fh, stderr=subprocess.STDOUT)
        mounted = Mounted(proc, root, log)
        started.append(mounted)
        return mounted

    yield run
    for mounted in started:
        if mounted.proc.poll() is None:
            mounted.proc.kill()
            mounted.proc.wait()


def test_two_mounts_of_one_store_converge_within_two_intervals(
    mount: Callable[..., Mounted], remote: Remote
) -> None:
    store_id = remote.store("Team Notes")
    remote.put(store_id, "/shared.md", "v1\n")
    a = mount(store_id, "a")
    b = mount(store_id, "b")
    fa, fb = a.root / "team-notes", b.root / "team-notes"
    for folder in (fa, fb):
        wait_for(lambda f=folder: local_tree(f) == {"/shared.md": "v1\n"}, 15, "first download")
    # Edits on both sides and on the server, each to its own file.
    (fa / "from-a.md").write_text("written in a\n")
    (fb / "sub").mkdir()
    (fb / "sub" / "from-b.md").write_text("written in b\n")
    (fa / "shared.md").write_text("v2 from a\n")
    remote.put(store_id, "/from-api.md", "api\n")
    expected = {
        "/from-a.md": "written in a\n",
        "/from-api.md": "api\n",
        "/shared.md": "v2 from a\n",
        "/sub/from-b.md": "written in b\n",
    }
    # a uploads at its next sync (<= 1 interval), b downloads at its next (<= 1 more);
    # a little slack for the syncs themselves on a busy machine.
    wait_for(
        lambda: local_tree(fa) == expected and local_tree(fb) == expected,
        2 * INTERVAL + 2,
        "convergence within two intervals",
    )
    assert remote.tree(store_id) == expected
    # A delete on one side reaches the other once the (test-shortened) delay has passed.
    os.unlink(fb / "from-a.md")
    expected.pop("/from-a.md")
    wait_for(lambda: local_tree(fa) == expected, 1 + 3 * INTERVAL + 3, "delete to propagate")
    assert remote.tree(store_id) == expected
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_runs_a_final_sync_and_exits_0(
    mount: Callable[..., Mounted], remote: Remote, signum: int
) -> None:
    store_id = remote.store("Final")
    remote.put(store_id, "/a.md", "a")
    m = mount(store_id, "m", interval=600)  # no periodic sync will happen in this test
    folder = m.root / "final"
    wait_for(lambda: local_tree(folder) == {"/a.md": "a"}, 15, "first download")
    (folder / "late.md").write_text("written just before shutdown")
    assert m.stop(signum=signum) == 0
    assert remote.tree(store_id) == {"/a.md": "a", "/late.md": "written just before shutdown"}
    assert "final sync done" in m.log()


def test_a_final_sync_that_fails_exits_1(mount: Callable[..., Mounted], tmp_path: Path) -> None:
    (tmp_path / "doomed").mkdir()
    doomed = start_server(tmp_path / "doomed", workers=1)
    try:
        secret = doomed.token("writer")
        remote = Remote(doomed, secret)
        store_id = remote.store("Doomed")
        remote.put(store_id, "/a.md", "a")
        m = mount(store_id, "m", interval=600, srv=doomed, secret=secret)
        folder = m.root / "doomed"
        wait_for(lambda: local_tree(folder) == {"/a.md": "a"}, 15, "first download")
        remote.close()
    finally:
        doomed.stop()
    (folder / "lost.md").write_text("cannot be uploaded")
    assert m.stop() == 1
    assert "final sync did not complete" in m.log()


def test_read_only_mount_never_uploads(mount: Callable[..., Mounted], remote: Remote) -> None:
    store_id = remote.store("Reference")
    remote.put(store_id, "/a.md", "a")
    m = mount(store_id, "ro", "--read-only", interval=0.5)
    folder = m.root / "reference"
    wait_for(lambda: local_tree(folder) == {"/a.md": "a"}, 15, "first download")
    versions = remote.versions(store_id)
    (folder / "a.md").write_text("local edit")
    (folder / "new.md").write_text("new")
    time.sleep(3 * 0.5)  # three syncs at least
    remote.put(store_id, "/b.md", "b")
    wait_for(lambda: "/b.md" in local_tree(folder), 10, "a remote change to arrive")
    assert m.stop() == 0  # the final sync too uploads nothing
    assert remote.tree(store_id) == {"/a.md": "a", "/b.md": "b"}
    assert len(remote.versions(store_id)) == len(versions) + 1  # only the API's own write
    assert "read-only: the local change to /a.md is not uploaded" in m.log()


def test_mount_refuses_to_start_over_a_folder_it_did_not_create(
    server: Server, token: str, remote: Remote, tmp_path: Path
) -> None:
    store_id = remote.store("Busy Folder")
    (tmp_path / "root" / "busy-folder").mkdir(parents=True)
    (tmp_path / "root" / "busy-folder" / "keep.txt").write_text("mine")
    env = {**os.environ, "PROJECT_MEMORY_TOKEN": token}
    base = [CLI, "mount", "--server", server.url, "--store", store_id]
    run = subprocess.run(
        [*base, str(tmp_path / "root")], env=env, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 2
    assert "was not created by project-memory mount" in run.stderr
    assert remote.tree(store_id) == {}
    # The interval floor is 5 s without the test-only variable.
    run = subprocess.run(
        [*base, "--interval", "1", str(tmp_path / "other")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2 and "--interval must be at least 5 seconds" in run.stderr


def test_two_stores_of_one_slug_are_refused_before_any_folder_is_made(
    server: Server, token: str, remote: Remote, tmp_path: Path
) -> None:
    first, second = remote.store("Same Name"), remote.store("same  name")
    env = {**os.environ, "PROJECT_MEMORY_TOKEN": token}
    args = [CLI, "mount", "--server", server.url, "--store", first, "--store", second, "--once"]
    run = subprocess.run(
        [*args, str(tmp_path / "root")], env=env, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 2 and "give the same slug" in run.stderr
    # No folder was made and marked as the first store's, to be adopted by a later mount.
    assert not (tmp_path / "root" / "same-name").exists()


def test_once_syncs_and_exits(server: Server, token: str, remote: Remote, tmp_path: Path) -> None:
    store_id = remote.store("One Shot")
    remote.put(store_id, "/x/y.md", "y")
    env = {**os.environ, "PROJECT_MEMORY_TOKEN": token}
    args = [CLI, "mount", "--server", server.url, "--store", store_id, "--once"]
    run = subprocess.run(
        [*args, str(tmp_path)], env=env, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, run.stderr
    assert local_tree(tmp_path / "one-shot") == {"/x/y.md": "y"}
    assert "downloaded /x/y.md" in run.stderr


def test_tenant_and_project_let_a_broader_token_mount_another_projects_store(
    server: Server, remote: Remote, tmp_path: Path
) -> None:
    store_id = remote.store("Web Notes")  # a store of acme/web
    remote.put(store_id, "/a.md", "from web")
    # An admin token whose own scope is default/default, like the first token.
    admin = server.token("admin", tenant="default", project="default")
    env = {**os.environ, "PROJECT_MEMORY_TOKEN": admin}
    base = [CLI, "mount", "--once", "--server", server.url, "--store", store_id]
    run = subprocess.run(
        [*base, str(tmp_path / "plain")], env=env, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 2
    assert "404" in run.stderr and "--tenant/--project" in run.stderr
    folder = tmp_path / "scoped" / "web-notes"
    scoped = [*base, "--tenant", "acme", "--project", "web", str(tmp_path / "scoped")]
    run = subprocess.run(scoped, env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert local_tree(folder) == {"/a.md": "from web"}
    (folder / "b.md").write_text("written through the admin token")
    run = subprocess.run(scoped, env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert remote.tree(store_id) == {
        "/a.md": "from web",
        "/b.md": "written through the admin token",
    }


@pytest.mark.soak
def test_soak_random_edits_on_both_sides_and_the_api_converge(
    mount: Callable[..., Mounted], remote: Remote
) -> None:
    """Twenty seconds of random creates, edits and deletes in two mounts and through the API;
    once the edits stop, both folders and the store agree within a few intervals."""
    rng = random.Random(6)
    store_id = remote.store("Soak")
    a = mount(store_id, "a", interval=0.5)
    b = mount(store_id, "b", interval=0.5)
    folders = [a.root / "soak", b.root / "soak"]
    for folder in folders:
        wait_for(lambda f=folder: (f / ".anthropic-memory-store").exists(), 15, "mount")
    names = [f"/n{i}.md" for i in range(6)] + [f"/d{i}/x.md" for i in range(3)]
    end = time.monotonic() + 20
    while time.monotonic() < end:
        path = rng.choice(names)
        side = rng.randrange(3)
        text = f"{side} {rng.random()}\n"
        if side < 2:
            target = folders[side] / path.lstrip("/")
            if rng.random() < 0.2:
                target.unlink(missing_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        elif rng.random() < 0.2:
            if path in remote.memories(store_id):
                remote.delete(store_id, path)
        else:
            remote.put(store_id, path, text)
        time.sleep(rng.uniform(0.01, 0.2))

    def agreed() -> bool:
        server = remote.tree(store_id)
        return local_tree(folders[0]) == server == local_tree(folders[1])

    wait_for(agreed, 30, "convergence after the edits stop")
    assert a.stop() == 0 and b.stop() == 0
    assert "Traceback" not in a.log() + b.log()
