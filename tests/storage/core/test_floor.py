"""The free-space floor on a small real filesystem: a loop-mounted ext4 image (or, where loop
devices are missing, a tmpfs), mounted by the test as root. Writes stop with 507 before the
disk is full; reads and deletes go on; nothing is torn; freeing space lets writes in again.

Without root nothing can be mounted: the test then measures a fixed-size budget through an
injected statvfs (``FreeSpace(measure=...)``), which checks the same refusals but not that a
disk never filled, and prints ``FLOOR_FS=injected`` (``-s``) to say so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

from app import create_app
from app.storage.core.quota import FreeSpace
from tests.conftest import BufferedClient
from tests.storage._helpers import temp_files

MiB = 1 << 20
PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"
SIZE = 24 * MiB
FLOOR = 6 * MiB


def _mount(target: Path, image: Path) -> str | None:
    """Mount a fresh ext4 (else a tmpfs) of SIZE at ``target``; the kind, or None."""
    if os.geteuid() != 0:
        return None
    with image.open("wb") as fh:
        fh.truncate(SIZE)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, check=False)
    if made.returncode == 0 and (
        subprocess.run(
            ["mount", "-o", "loop", str(image), str(target)], capture_output=True, check=False
        ).returncode
        == 0
    ):
        return "ext4"
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(target)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    ):
        return "tmpfs"
    return None


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    target = tmp_path / "mnt"
    target.mkdir()
    kind = _mount(target, tmp_path / "fs.img")
    try:
        yield target, kind or "injected"
    finally:
        if kind is not None:
            subprocess.run(["umount", "-l", str(target)], check=False)


def _du(path: Path) -> int:
    total = 0
    for dirpath, dirnames, files in os.walk(path):
        total += 4096 * (len(dirnames) + 1)
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _app(tmp_path: Path, where: tuple[Path, str]) -> Flask:
    mount, kind = where
    app = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(mount / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "MIN_FREE_BYTES": FLOOR,
            "LOCK_TIMEOUT": 5.0,
        }
    )
    if kind == "injected":
        # No filesystem of our own: a budget of SIZE bytes, less what the root holds.
        storage = app.extensions["storage"]
        root = storage.layout.root

        def measure(_: Path) -> os.statvfs_result:
            real = os.statvfs(root)
            free = max(0, SIZE - _du(root)) // real.f_frsize
            fields = list(real)
            fields[2], fields[4] = SIZE // real.f_frsize, free  # f_blocks, f_bavail
            return os.statvfs_result(fields)

        storage.usage_counters.floor = FreeSpace(root, FLOOR, measure=measure)
        storage.tasks.usage.floor = storage.stores.usage.floor = storage.usage_counters.floor
    return app


def test_writes_stop_at_the_floor_reads_and_deletes_go_on(
    tmp_path: Path, small_fs: tuple[Path, str]
) -> None:
    print(f"FLOOR_FS={small_fs[1]}")
    app = _app(tmp_path, small_fs)
    _, secret = app.extensions["token_registry"].create(role="writer", tenant="acme", project="web")
    h = {"Authorization": f"Bearer {secret}"}
    app.test_client_class = BufferedClient
    client = app.test_client()
    store = client.post(MS, headers=h, json={"name": "s"}).json["id"]
    memory = client.post(
        f"{MS}/{store}/memories", headers=h, json={"path": "/m.md", "content": "m"}
    )
    assert memory.status_code == 200
    assert (
        client.put(f"{PM}/tasks/t/turns/0", headers=h, json={"summary_md": "kept"}).status_code
        == 200
    )
    blob = os.urandom(MiB // 2)
    stored: dict[str, bytes] = {}
    refused = []
    # Fill up to the floor with halving sizes, until even 4 KiB is refused.
    size = len(blob)
    while size >= 4096 and len(stored) < 200:
        name = f"a{len(stored)}"
        r = client.put(f"{PM}/tasks/t/turns/0/artifacts/{name}", headers=h, data=blob[:size])
        if r.status_code == 200:
            stored[name] = blob[:size]
            continue
        assert r.status_code == 507, r.json
        refused.append(r.json["detail"])
        size //= 2
    assert refused[0].startswith(
        "insufficient storage: the server's disk is at its free-space floor"
    )
    assert len(stored) >= 8
    free = os.statvfs(app.extensions["storage"].layout.root)
    if small_fs[1] != "injected":
        # Stopped before the disk filled: the floor, less at most what one write overshoots.
        assert free.f_bavail * free.f_frsize > FLOOR - MiB // 4, free.f_bavail * free.f_frsize
    # Every other write is refused too, a body of unknown length included, leaving nothing.
    chunked = client.put(
        f"{PM}/tasks/t/turns/0/artifacts/chunked",
        headers={**h, "Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input": _Stream(blob * 4), "wsgi.input_terminated": True},
    )
    assert chunked.status_code == 507
    assert (
        client.put(
            f"{PM}/tasks/u/turns/0", headers=h, json={"summary_md": "x" * 200_000}
        ).status_code
        == 507
    )
    r = client.post(MS, headers=h, json={"name": "another"})
    assert r.status_code == 507 and r.json["error"]["type"] == "insufficient_storage_error"
    r = client.post(
        f"{MS}/{store}/memories", headers=h, json={"path": "/n.md", "content": "n" * 90_000}
    )
    assert r.status_code == 507
    assert temp_files(app.extensions["storage"].layout.root) == []
    # Reads go on, and every stored byte is whole.
    for name, data in stored.items():
        got = client.get(f"{PM}/tasks/t/turns/0/artifacts/{name}", headers=h)
        assert got.status_code == 200 and got.data == data
    assert client.get(f"{PM}/tasks", headers=h).json["total"] == 1
    assert client.get(f"{PM}/project.md", headers=h).status_code == 200
    assert client.get(f"{PM}/usage", headers=h).json["usage"]["artifacts"] == len(stored)
    # Deletes go on, and free room for writes again.
    deleted = client.delete(f"{MS}/{store}/memories/{memory.json['id']}", headers=h)
    assert deleted.status_code == 200
    assert client.delete(f"{PM}/tasks/t", headers=h).status_code == 204
    storage = app.extensions["storage"]
    assert (
        client.put(f"{PM}/tasks/u/turns/0", headers=h, json={"summary_md": "back"}).status_code
        == 200
    )
    report = storage.fsck()
    assert report.clean, report.problems
    shutil.rmtree(storage.layout.root)


class _Stream:
    """A body without a length (sent chunked)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int = -1) -> bytes:
        chunk, self.data = (
            self.data[: size if size > 0 else None],
            self.data[size if size > 0 else len(self.data) :],
        )
        return chunk
