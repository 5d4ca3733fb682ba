"""A record that cannot be read now is not a damaged one (docs/guarantees.md, "Faults").

Real faults: a record owned by nobody with mode 000, read by the CLI or a server that runs
as root without CAP_DAC_OVERRIDE (setpriv); EIO from the FUSE simulator. What must hold:

- fsck, with or without ``--repair``, reports each file it could not read and goes on
  with the rest of the tree; it moves nothing to lost+found because of it, rewrites nothing
  that depends on it, never says clean and exits 1; once the fault is gone the turn, the
  artifact and the memory version are there, byte for byte;
- the API answers 503 (retry later) for what it cannot read, never "damaged, run
  fsck --repair";
- the start-up full check after a power loss touches nothing it could not read, and
  /readyz then says the check failed, and what to do;
- a record that was read and does not parse (a turn whose ``retain_until`` is "later") is
  reported and, on repair, quarantined: neither fsck, the sweep nor start-up recovery raises
  for the whole root.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.robust.faultkit import (
    ARTIFACT,
    MS,
    PM,
    Seeded,
    eio_mount,
    flask,
    lost_found,
    no_dac,
    power_lost,
    seed,
    unreadable,
)
from tests.robust.helpers import Live

pytestmark = pytest.mark.e2e


@pytest.fixture
def seeded(tmp_path: Path) -> Seeded:
    return seed(tmp_path / "root", tmp_path / "tokens.json")


def _lines(out: str, needle: str) -> list[str]:
    return [line for line in out.splitlines() if needle in line]


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every record and derived JSON file of the tasks, by path (what a repair may change)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.glob("acme/web/*/**/*.json"))
        if "_stores" not in p.parts
    }


# -- fsck ------------------------------------------------------------------------------------
def test_fsck_repair_leaves_a_turn_it_cannot_read_where_it_is(seeded: Seeded) -> None:
    meta = seeded.turn("t", 0) / "meta.json"
    before = _snapshot(seeded.root)
    (seeded.task("u") / "index.json").unlink()  # a problem after it in the walk
    with unreadable(meta):
        for args in (("fsck",), ("fsck", "--repair")):
            done = flask(seeded.env(), *args, prefix=no_dac([]))
            out = done.stdout + done.stderr
            assert done.returncode == 1, out
            assert "Traceback" not in out, out
            assert "fsck: clean" not in out, out
            named = _lines(out, "acme/web/t/0000-turn/meta.json")
            assert named and all("cannot be read" in line for line in named), out
            assert not any("quarantined" in line or "moved" in line for line in named), out
            # The rest of the tree was checked: the missing index is found (and rebuilt).
            assert _lines(out, "acme/web/u/index.json"), out
    assert lost_found(seeded.root) == []
    assert meta.exists()
    after = _snapshot(seeded.root)
    for name, data in before.items():
        if name.startswith("acme/web/t/"):
            assert after.get(name) == data, f"{name} changed while its turn could not be read"
    with seeded.client() as c:
        got = c.get(f"{PM}/tasks/t/turns/0", headers=seeded.headers)
        assert got.status_code == 200 and got.json["summary_md"] == "t turn 0"
        got = c.get(f"{PM}/tasks/t/turns/0/artifacts/a.bin", headers=seeded.headers)
        assert got.status_code == 200 and got.data == ARTIFACT
    done = flask(seeded.env(), "fsck")
    assert done.returncode == 0 and "fsck: clean" in done.stdout, done.stdout + done.stderr


def test_fsck_repair_keeps_a_task_record_it_cannot_read(seeded: Seeded) -> None:
    record = seeded.task("t") / "task.json"
    before = record.read_bytes()
    with unreadable(record):
        done = flask(seeded.env(), "fsck", "--repair", prefix=no_dac([]))
        out = done.stdout + done.stderr
        assert done.returncode == 1, out
        assert "fsck: clean" not in out
        named = _lines(out, "acme/web/t/task.json")
        assert named and all("cannot be read" in line for line in named), out
        assert not any("rewritten" in line for line in named), out
    assert record.read_bytes() == before  # the owner is still the one who wrote it
    assert lost_found(seeded.root) == []
    assert flask(seeded.env(), "fsck").returncode == 0


@pytest.mark.faults
def test_fsck_reads_on_past_eio(tmp_path: Path) -> None:
    """EIO opening an artifact, reading a memory version: each is reported, the rest of
    the tree is still checked, and nothing is moved or dropped."""
    with eio_mount() as fs:
        seeded = seed(fs.mountpoint / "root", tmp_path / "tokens.json")
        artifact = seeded.turn("t", 0) / "artifacts" / "a.bin"
        version = seeded.version(0)
        (seeded.task("u") / "index.json").unlink()  # a problem after them in the walk
        fs.fail("open", artifact)
        fs.fail("read", version)
        try:
            for args in (("fsck",), ("fsck", "--repair")):
                done = flask(seeded.env(), *args)
                out = done.stdout + done.stderr
                assert done.returncode == 1, out
                assert "Traceback" not in out, out
                assert "fsck: clean" not in out, out
                for path in (artifact, version):
                    rel = str(path.relative_to(seeded.root))
                    named = _lines(out, rel)
                    assert named and all("cannot be read" in line for line in named), out
                assert _lines(out, "acme/web/u/index.json"), out
            assert lost_found(seeded.root) == []
            with seeded.client() as c:
                got = c.get(f"{PM}/tasks/t/turns/0/artifacts/a.bin", headers=seeded.headers)
                assert got.status_code == 503, got.data
                assert "fsck --repair" not in got.json["detail"]
                got = c.get(f"{PM}/tasks/t/turns/0", headers=seeded.headers)
                assert [a["name"] for a in got.json["artifacts"]] == ["a.bin"]  # not dropped
        finally:
            fs.heal()
        with seeded.client() as c:
            got = c.get(f"{PM}/tasks/t/turns/0/artifacts/a.bin", headers=seeded.headers)
            assert got.status_code == 200 and got.data == ARTIFACT
            got = c.get(
                f"{MS}/{seeded.store_id}/memory_versions/{seeded.versions[0]}",
                headers=seeded.headers,
                query_string={"view": "full"},
            )
            assert got.status_code == 200 and got.json["content"] == "first"
        done = flask(seeded.env(), "fsck")
        assert done.returncode == 0, done.stdout + done.stderr


# -- the API ----------------------------------------------------------------------------------
@pytest.fixture
def live_no_dac(seeded: Seeded, tmp_path: Path) -> Iterator[Live]:
    server = Live(
        tmp_path=tmp_path,
        root=seeded.root,
        workers=1,
        prefix=no_dac([]),
        env_extra={"MEMORY_TOKENS_FILE": str(seeded.tokens_file)},
    )
    server.tmp_path = tmp_path
    yield server
    server.stop()


def test_the_api_answers_503_for_a_record_it_cannot_read(seeded: Seeded, live_no_dac: Live) -> None:
    server = live_no_dac.start()
    h = seeded.headers
    cases = [
        (seeded.turn("t", 0) / "meta.json", f"{PM}/tasks/t/turns/0"),
        (seeded.task("u") / "index.json", f"{PM}/tasks/u"),
        (
            seeded.version(0),
            f"{MS}/{seeded.store_id}/memory_versions/{seeded.versions[0]}?view=full",
        ),
    ]
    for path, url in cases:
        with unreadable(path):
            got = requests.get(f"{server.url}{url}", headers=h, timeout=30)
            assert got.status_code == 503, (url, got.text)
            assert got.headers.get("Retry-After"), url
            body = got.json()
            message = body["detail"] if url.startswith(PM) else body["error"]["message"]
            assert "cannot be read" in message, message
            assert "fsck --repair" not in message and "lost+found" not in message, message
        assert requests.get(f"{server.url}{url}", headers=h, timeout=30).status_code == 200
    assert lost_found(seeded.root) == []


# -- start-up recovery -------------------------------------------------------------------------
def _ready(server: Live, timeout: float = 60) -> tuple[int, str]:
    """/readyz once the full check has ended (its "running" answer given up waiting)."""
    deadline = time.monotonic() + timeout
    while True:
        got = requests.get(f"{server.url}/readyz", timeout=10)
        detail = got.json()["detail"]
        if "is running" not in detail or time.monotonic() > deadline:
            return got.status_code, detail
        time.sleep(0.2)


def test_the_full_check_after_a_power_loss_touches_nothing_it_cannot_read(
    seeded: Seeded, live_no_dac: Live
) -> None:
    meta = seeded.turn("t", 1) / "meta.json"
    power_lost(seeded.root)
    with unreadable(meta):
        server = live_no_dac.start()
        status, detail = _ready(server)
        assert status == 503, detail
        assert "could not be read" in detail and "fsck --repair" in detail, detail
        assert meta.exists() and lost_found(seeded.root) == []
    # The fault is gone: an operator's repair ends the failed check, and /readyz says so.
    done = flask(seeded.env(), "fsck", "--repair")
    assert done.returncode == 0, done.stdout + done.stderr
    assert requests.get(f"{server.url}/readyz", timeout=10).status_code == 200
    got = requests.get(f"{server.url}{PM}/tasks/t/turns/1", headers=seeded.headers, timeout=10)
    assert got.status_code == 200 and got.json()["summary_md"] == "t turn 1"


# -- a record that parses as JSON but not as a record -----------------------------------------
def _retain_later(seeded: Seeded) -> Path:
    meta = seeded.turn("u", 1) / "meta.json"
    text = meta.read_text()
    start = text.index('"retain_until": "') + len('"retain_until": "')
    meta.write_text(text[:start] + "later" + text[text.index('"', start) :])
    return meta


def test_fsck_and_the_sweep_report_an_unparsable_record(seeded: Seeded) -> None:
    meta = _retain_later(seeded)
    done = flask(seeded.env(), "fsck")
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in out, out
    assert any("not a turn record" in line for line in _lines(out, "u/0001-turn/meta.json")), out
    done = flask(seeded.env(), "sweep", "--dry-run")
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    done = flask(seeded.env(), "fsck", "--repair")
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, out
    assert not meta.exists()
    assert any(name.endswith("u/0001-turn/meta.json") for name in lost_found(seeded.root))
    with seeded.client() as c:
        got = c.get(f"{PM}/tasks/u", headers=seeded.headers)
        assert got.status_code == 200 and [t["turn"] for t in got.json["turns"]] == [0]


@pytest.mark.faults
def test_start_up_recovery_quarantines_an_unparsable_record(seeded: Seeded, tmp_path: Path) -> None:
    meta = _retain_later(seeded)
    power_lost(seeded.root)
    server = Live(
        tmp_path=tmp_path,
        root=seeded.root,
        workers=1,
        env_extra={"MEMORY_TOKENS_FILE": str(seeded.tokens_file)},
    ).start()
    try:
        status, detail = _ready(server)
        assert status == 200, detail
        assert not meta.exists()
        got = requests.get(f"{server.url}{PM}/tasks/u", headers=seeded.headers, timeout=10)
        assert got.status_code == 200, got.text
    finally:
        server.stop()
