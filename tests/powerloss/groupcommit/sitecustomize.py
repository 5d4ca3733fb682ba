"""Group commit on the power-loss simulator: imported by every Python process of the server.

The harness (``--group-commit``) puts this directory first on ``PYTHONPATH`` and names the
simulator's command fifo in ``MEMORY_TEST_SIMFS_FIFO``. FUSE does not pass syncfs(2) on to
its server, so app/storage/tree/fs/sync.py would keep per-file fsync there; this makes it take the
mount for ext4 and send each group flush to the simulator as ``simfs::syncfs MARKER``
(tests/powerloss/simfs.py ``--ext4``), returning once the simulator has written every
unsynced change and created ``MARKER``. ``MEMORY_TEST_SIMFS_NO_FLUSH=1`` makes the flush do
nothing, a planted bug the cycles must catch.

A real power cut reboots the machine: the start-up recovery tells it by the boot id, since
under group commit every flush also writes its canary to the disk (docs/guarantees.md). The
simulator's cut reboots nothing, so the harness keeps a boot id of its own in
``MEMORY_TEST_BOOT_ID_FILE`` and changes it at every cut.
"""

from __future__ import annotations

import errno
import itertools
import os
import tempfile
import threading
import time

FIFO = os.environ.get("MEMORY_TEST_SIMFS_FIFO")
TIMEOUT = 120.0

if FIFO:
    from pathlib import Path

    from app.storage.tree import recovery
    from app.storage.tree.fs import sync

    recovery.BOOT_ID = Path(os.environ["MEMORY_TEST_BOOT_ID_FILE"])

    _count = itertools.count()
    _count_mu = threading.Lock()

    def _syncfs_error(fd: int) -> OSError | None:
        if os.environ.get("MEMORY_TEST_SIMFS_NO_FLUSH") == "1":
            return None
        with _count_mu:
            number = next(_count)
        marker = os.path.join(tempfile.gettempdir(), f"simfs-synced-{os.getpid()}-{number}")
        try:
            out = os.open(FIFO, os.O_WRONLY)
            try:
                os.write(out, f"simfs::syncfs {marker}\n".encode())  # one write: atomic
            finally:
                os.close(out)
            deadline = time.monotonic() + TIMEOUT
            while not os.path.exists(marker):
                if time.monotonic() > deadline:
                    return OSError(errno.EIO, "simfs::syncfs: no answer")
                time.sleep(0.0005)
            os.unlink(marker)
        except OSError as exc:
            return exc
        return None

    sync._syncfs_error = _syncfs_error  # type: ignore[assignment]
    sync._filesystem_type = lambda dev: "ext4"  # type: ignore[assignment]
