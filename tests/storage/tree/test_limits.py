"""<root>/.limits.json: the rate sections the CLI writes, and every other section kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.storage.core.errors import LockTimeout, UnsafePath
from app.storage.core.limits import (
    InvalidLimit,
    LimitsFileError,
    Quotas,
    RateOverride,
    format_bytes,
    parse_bytes,
)
from app.storage.core.names import LIMITS_FILE, Scope
from app.storage.tree.fs.locks import locked
from app.storage.tree.limits import LimitsFile


@pytest.mark.parametrize(
    ("text", "count"),
    [
        (0, 0),
        (1048576, 1048576),
        ("1048576", 1048576),
        ("10MiB", 10 << 20),
        ("10mib", 10 << 20),
        ("1.5GiB", 3 << 29),
        ("512k", 512_000),
        ("2 MB", 2_000_000),
        ("64KiB", 65536),
        ("7b", 7),
    ],
)
def test_byte_counts_take_units(text: object, count: int) -> None:
    assert parse_bytes(text) == count


@pytest.mark.parametrize("text", ["", "-1", -1, "10 MiBs", "ten", "1e9", True, None, "1..5k"])
def test_bad_byte_counts_are_refused(text: object) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_format_bytes_uses_the_largest_exact_unit() -> None:
    assert [format_bytes(n) for n in (0, 1000, 1024, 1536 << 10, 10 << 20, 3 << 30)] == [
        "0",
        "1000",
        "1KiB",
        "1536KiB",
        "10MiB",
        "3GiB",
    ]


def test_no_file_means_no_overrides(tmp_path: Path) -> None:
    limits = LimitsFile(tmp_path / "root")
    assert limits.stamp() == (0, 0, 0)
    rates = limits.rates()
    assert rates.tenants == {} and rates.projects == {}


def test_set_merges_fields_and_the_file_reads_back(tmp_path: Path) -> None:
    limits = LimitsFile(tmp_path / "root")
    limits.set_rate("acme", "web", RateOverride(rps=100, burst=200))
    written = limits.set_rate("acme", "web", RateOverride(upload_bps=10 << 20))
    limits.set_rate("acme", None, RateOverride(rps=5))
    assert written == RateOverride(rps=100, burst=200, upload_bps=10 << 20)
    rates = limits.rates()
    assert rates.projects == {("acme", "web"): written}
    assert rates.tenants == {"acme": RateOverride(rps=5)}
    doc = json.loads((tmp_path / "root" / LIMITS_FILE).read_text())
    assert doc == {
        "version": 1,
        "projects": {"acme/web": {"rate": {"rps": 100, "burst": 200, "upload_bps": 10485760}}},
        "tenants": {"acme": {"rate": {"rps": 5}}},
    }


def test_other_sections_and_keys_survive_set_and_clear(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / LIMITS_FILE).write_text(
        json.dumps(
            {
                "version": 1,
                "projects": {"acme/web": {"quota": {"bytes": 1000}, "rate": {"rps": 1}}},
                "tenants": {},
                "note": "kept",
            }
        )
    )
    limits = LimitsFile(root)
    limits.set_rate("acme", "web", RateOverride(burst=3))
    assert limits.clear_rate("acme", "web") is True
    doc = json.loads((root / LIMITS_FILE).read_text())
    assert doc["projects"] == {"acme/web": {"quota": {"bytes": 1000}}}
    assert doc["note"] == "kept"
    assert limits.clear_rate("acme", "web") is False


def test_clearing_the_last_section_drops_the_entry(tmp_path: Path) -> None:
    limits = LimitsFile(tmp_path / "root")
    limits.set_rate("acme", "web", RateOverride(rps=1))
    assert limits.clear_rate("acme", "web") is True
    assert limits.document()["projects"] == {}


def test_a_change_replaces_the_file_and_moves_its_stamp(tmp_path: Path) -> None:
    limits = LimitsFile(tmp_path / "root")
    limits.set_rate("acme", "web", RateOverride(rps=1))
    before = limits.stamp()
    limits.set_rate("acme", "web", RateOverride(rps=2))
    assert limits.stamp() != before
    leftovers = [p.name for p in (tmp_path / "root").iterdir() if p.name.startswith(".~tmp-")]
    assert leftovers == []


def test_a_change_that_writes_nothing_new_leaves_the_file_alone(tmp_path: Path) -> None:
    limits = LimitsFile(tmp_path / "root")
    limits.set_rate("acme", "web", RateOverride(rps=1))
    before = limits.stamp()
    assert limits.clear_rate("acme", "other") is False
    assert limits.stamp() == before


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not valid JSON"),
        ("[]", "JSON object"),
        ('{"version": 2}', "unsupported version"),
        ('{"version": 1, "tenants": []}', "must be an object"),
        ('{"version": 1, "projects": "a/b"}', "must be an object"),
    ],
)
def test_a_file_that_cannot_be_read_is_refused_with_a_message_naming_the_fault(
    tmp_path: Path, content: str, message: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / LIMITS_FILE).write_text(content)
    limits = LimitsFile(root)
    with pytest.raises(LimitsFileError, match=message):
        limits.rates()
    # ... and no change is written over it.
    with pytest.raises(LimitsFileError):
        limits.set_rate("acme", "web", RateOverride(rps=1))
    assert (root / LIMITS_FILE).read_text() == content


BAD_ENTRIES = [
    ('"projects": {"acme": {"rate": {}}}', "tenant/project"),
    ('"projects": {"acme/../x": {"rate": {}}}', "bad name"),
    ('"projects": {"a/b": {"rate": {"rsp": 1}}}', "unknown rate field"),
    ('"projects": {"a/b": {"rate": {"rps": -1}}}', ">= 0"),
    ('"projects": {"a/b": {"rate": {"rps": true}}}', "number"),
    ('"projects": {"a/b": {"rate": {"burst": 1.5, "rps": 1}}}', "whole"),
    ('"projects": {"a/b": {"rate": {"burst": 5}}}', "burst needs rps"),
    ('"projects": {"a/b": {"rate": {"rps": 1e-320}}}', "refill within 86,400 s"),
    ('"projects": {"a/b": {"rate": {"rps": 1e-300}}}', "refill within 86,400 s"),
    ('"projects": {"a/b": {"rate": {"rps": 1e300}}}', "at most 1,000,000"),
    ('"projects": {"a/b": {"rate": {"rps": 0.5, "burst": 50000}}}', "refill"),
    ('"tenants": {"a": {"rate": {"upload_burst": 5}}}', "needs upload_bps"),
    ('"tenants": {"a": {"rate": {"upload_bps": 2e12}}}', "at most 1,099,511,627,776"),
    ('"tenants": {"a": 3}', "must be an object"),
]


@pytest.mark.parametrize(("entry", "message"), BAD_ENTRIES)
def test_an_entry_that_breaks_the_rules_is_skipped_and_named(
    tmp_path: Path, entry: str, message: str
) -> None:
    """One bad entry, edited in by hand, limits nothing and keeps no other entry from being
    read or changed."""
    root = tmp_path / "root"
    root.mkdir()
    section = entry.split('"')[1]
    other = "tenants" if section == "projects" else "projects"
    good = '"ok"' if other == "tenants" else '"ok/web"'
    content = f'{{"version": 1, {entry}, "{other}": {{{good}: {{"rate": {{"rps": 2}}}}}}}}'
    (root / LIMITS_FILE).write_text(content)
    limits = LimitsFile(root)
    rates = limits.rates()
    assert len(rates.skipped) == 1 and message in rates.skipped[0], rates.skipped
    assert {**rates.tenants, **rates.projects} == {
        ("ok" if other == "tenants" else ("ok", "web")): RateOverride(rps=2)
    }
    assert ("a", "b") not in rates.projects and "a" not in rates.tenants
    # Another entry changes; the bad one is kept as it was, for whoever clears it.
    limits.set_rate("acme", "web", RateOverride(rps=1))
    doc = json.loads((root / LIMITS_FILE).read_text())
    for key, kept in json.loads(content)[section].items():
        assert json.dumps(doc[section][key]) == json.dumps(kept)
    assert limits.rates().projects[("acme", "web")] == RateOverride(rps=1)


def test_a_change_replaces_a_section_that_breaks_the_rules(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / LIMITS_FILE).write_text(
        '{"version": 1, "projects": {"a/b": {"rate": {"rps": 1e-300}, "quota": {"tasks": 3}},'
        ' "c/d": 7}}'
    )
    limits = LimitsFile(root)
    assert limits.set_rate("a", "b", RateOverride(rps=5)) == RateOverride(rps=5)
    assert limits.clear_rate("c", "d") is True
    doc = json.loads((root / LIMITS_FILE).read_text())
    assert doc["projects"] == {"a/b": {"rate": {"rps": 5}, "quota": {"tasks": 3}}}
    assert limits.rates().skipped == ()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (RateOverride(rps=1e-320), "refill within 86,400 s"),
        (RateOverride(rps=1e-300), "refill within 86,400 s"),
        (RateOverride(rps=0.001, burst=100), "takes 1e\\+05 s to refill"),
        (RateOverride(rps=2e6), "rps must be at most 1,000,000"),
        (RateOverride(rps=10, burst=2_000_000), "burst must be at most 1,000,000"),
        (RateOverride(upload_bps=1 << 41), "upload_bps must be at most"),
        (RateOverride(upload_bps=1, upload_burst=1 << 20), "to refill"),
    ],
)
def test_a_rate_out_of_range_is_refused_and_nothing_is_written(
    tmp_path: Path, change: RateOverride, message: str
) -> None:
    limits = LimitsFile(tmp_path / "root")
    with pytest.raises(InvalidLimit, match=message):
        limits.set_rate("acme", "web", change)
    assert not (tmp_path / "root" / LIMITS_FILE).exists()


def test_the_edges_of_the_ranges_are_kept(tmp_path: Path) -> None:
    limits = LimitsFile(tmp_path / "root")
    for change in (
        RateOverride(rps=1 / 86_400),  # one request a day
        RateOverride(rps=0.001, burst=86),
        RateOverride(rps=1_000_000, burst=1_000_000),
        RateOverride(upload_bps=1 << 40, upload_burst=1 << 40),
        RateOverride(rps=0),  # no limit
    ):
        assert limits.set_rate("acme", "web", change) == change
        assert limits.rates().projects[("acme", "web")] == change
        limits.clear_rate("acme", "web")


def test_set_refuses_bad_names_and_a_burst_without_its_rate(tmp_path: Path) -> None:
    limits = LimitsFile(tmp_path / "root")
    with pytest.raises(LimitsFileError, match="tenant"):
        limits.set_rate("../etc", None, RateOverride(rps=1))
    with pytest.raises(LimitsFileError, match="project"):
        limits.set_rate("acme", "a/b", RateOverride(rps=1))
    with pytest.raises(LimitsFileError, match="burst needs rps"):
        limits.set_rate("acme", "web", RateOverride(burst=10))
    assert not (tmp_path / "root" / LIMITS_FILE).exists()


def test_a_planted_symlink_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside.json"
    outside.write_text('{"version": 1, "projects": {"a/b": {"rate": {"rps": 1}}}}')
    os.symlink(outside, root / LIMITS_FILE)
    with pytest.raises(UnsafePath):
        LimitsFile(root).rates()


def test_a_limits_document_that_cannot_be_read_is_logged_once_per_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from app.storage.core.limits import QuotaOverride
    from app.storage.core.quota import QuotaSource

    root = tmp_path / "root"
    limits = LimitsFile(root)
    limits.set_quota("acme", "web", QuotaOverride(bytes=1 << 20))
    source = QuotaSource(limits)
    scope = Scope("acme", "web")
    assert source.of(scope)[0] == QuotaOverride(bytes=1 << 20)

    (root / LIMITS_FILE).rename(tmp_path / "aside.json")
    os.symlink(tmp_path / "aside.json", root / LIMITS_FILE)
    for _ in range(3):
        source.forget()
        # The quotas read before stay in force: a planted link does not lift them.
        assert source.of(scope)[0] == QuotaOverride(bytes=1 << 20)
    warnings = [r.getMessage() for r in caplog.records if r.name == "app.storage.quota"]
    assert len(warnings) == 1 and "limits document not read" in warnings[0], warnings
    assert "quotas read before stay in force" in warnings[0]

    (root / LIMITS_FILE).unlink()
    limits.set_quota("acme", "web", QuotaOverride(bytes=2 << 20))
    source.forget()
    assert source.of(scope)[0] == QuotaOverride(bytes=2 << 20)
    (root / LIMITS_FILE).unlink()
    os.symlink(tmp_path / "aside.json", root / LIMITS_FILE)
    source.forget()
    source.of(scope)
    warnings = [r.getMessage() for r in caplog.records if r.name == "app.storage.quota"]
    assert len(warnings) == 2, warnings  # the same cause again, after a good look between


def test_changes_wait_for_the_lock_and_time_out(tmp_path: Path) -> None:
    limits = LimitsFile(tmp_path / "root", lock_timeout=0.2)
    limits.set_rate("acme", "web", RateOverride(rps=1))
    with locked(limits.lock_path, 1.0), pytest.raises(LockTimeout):
        limits.set_rate("acme", "web", RateOverride(rps=2))
    assert limits.rates().projects[("acme", "web")].rps == 1


def test_concurrent_writers_lose_no_change(tmp_path: Path) -> None:
    """Eight processes each set their own project: every entry is in the file afterwards."""
    root = tmp_path / "root"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from app.storage.core.limits import RateOverride\n"
        "from app.storage.tree.limits import LimitsFile\n"
        "f = LimitsFile(Path(sys.argv[1]))\n"
        "for i in range(5):\n"
        "    f.set_rate('acme', f'p{sys.argv[2]}-{i}', RateOverride(rps=float(sys.argv[2])))\n"
    )
    repo = Path(__file__).resolve().parents[3]
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(root), str(n)], cwd=repo)
        for n in range(8)
    ]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    projects = LimitsFile(root).rates().projects
    assert len(projects) == 40
    assert all(rate.rps == float(key[1][1:].split("-")[0]) for key, rate in projects.items())


def test_the_module_imports_no_flask() -> None:
    code = (
        "import sys, app.storage.core.limits\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'werkzeug'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_no_thread_is_served_the_quotas_of_before_while_another_reads_the_file(
    tmp_path: Path,
) -> None:
    """The first look at the file in a process is slow (a loaded machine); a thread that
    arrives while it is under way waits for it, never admitting a write with no quota."""
    import threading
    import time

    from app.storage.core.limits import QuotaOverride
    from app.storage.core.quota import QuotaSource

    limits = LimitsFile(tmp_path / "root")
    limits.set_quota("acme", "race", QuotaOverride(bytes=2 << 20))
    reading = threading.Event()

    class SlowFile:
        def stamp(self) -> tuple[int, int, int]:
            return limits.stamp()

        def quotas(self) -> Quotas:
            reading.set()
            time.sleep(0.3)
            return limits.quotas()

    source = QuotaSource(SlowFile())
    first = threading.Thread(target=source.of, args=(Scope("acme", "race"),))
    first.start()
    assert reading.wait(5)
    project, _ = source.of(Scope("acme", "race"))  # while the first read is under way
    first.join()
    assert project is not None and project.bytes == 2 << 20
