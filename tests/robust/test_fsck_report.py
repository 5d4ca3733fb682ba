"""fsck says what it did and what is: report mode claims no move, and with no server on the
root a temp file is a leftover, whatever its age."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from tests.robust.faultkit import Seeded, flask, lost_found, seed


@pytest.fixture
def seeded(tmp_path: Path) -> Seeded:
    return seed(tmp_path / "root", tmp_path / "tokens.json", memories=False)


def test_report_mode_claims_no_move(seeded: Seeded) -> None:
    (seeded.task("t") / "notes.txt").write_text("a person left this here")
    done = flask(seeded.env(), "fsck")
    (line,) = [x for x in done.stdout.splitlines() if "notes.txt" in x]
    assert done.returncode == 1 and line.startswith("problem:"), done.stdout
    assert "moved to" not in line and "--repair moves it to .lost+found" in line, line
    assert lost_found(seeded.root) == []
    done = flask(seeded.env(), "fsck", "--repair")
    (line,) = [x for x in done.stdout.splitlines() if "notes.txt" in x]
    assert line.startswith("repaired:") and "moved to .lost+found" in line, done.stdout
    assert [p for p in lost_found(seeded.root) if p.endswith("notes.txt")]


def test_with_no_server_a_young_temp_file_is_a_leftover(seeded: Seeded) -> None:
    temp = seeded.turn("t", 0) / ".~tmp-left-by-a-killed-writer"
    temp.write_bytes(b"x" * 1000)
    old = os.stat(temp).st_mtime - 240  # four minutes: inside the grace period
    os.utime(temp, (old, old))
    # A server holds the root: a young temp file may be its write in flight.
    lock_path = seeded.root / ".locks" / "_server.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        done = flask(seeded.env(), "fsck")
        assert done.returncode == 0, done.stdout
        assert any("write in flight" in x and ".~tmp-left" in x for x in done.stdout.splitlines())
    finally:
        os.close(fd)
    # No server: nothing can be in flight, so it is a leftover of a writer that died.
    done = flask(seeded.env(), "fsck")
    (line,) = [x for x in done.stdout.splitlines() if ".~tmp-left" in x]
    assert done.returncode == 1 and "write in flight" not in line, done.stdout
    assert "no server" in line, line
    done = flask(seeded.env(), "fsck", "--repair")
    assert done.returncode == 0 and not temp.exists(), done.stdout
