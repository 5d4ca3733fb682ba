"""A 100,000-task project round-trips through export and import, each in bounded memory: a
peak at most a little above the same command's on a 1,000-task project.

Built fast through the engine (bench/loader.py: the same tree the server writes, without
fsync while loading), exported and imported by the CLI as an operator would, each command a
process of its own whose peak RSS the kernel reports. The restored records are the source's,
byte for byte. ``MEMORY_SOAK_TASKS`` changes the size.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.storage._helpers import record_files

REPO = Path(__file__).resolve().parents[3]
TASKS = int(os.environ.get("MEMORY_SOAK_TASKS", "100000"))
# The same commands on a project this small give each one's peak with (nearly) nothing to
# hold: what the process is before any task (its modules, the app). The project's size may
# add at most RSS_GROWTH_KIB to it (a list of the task names fsck compares, ~130 bytes a
# task), whatever the process's own size.
SMALL_TASKS = 1_000
RSS_GROWTH_KIB = 20 * 1024

pytestmark = pytest.mark.soak


# Runs a module as ``python -m`` would, and at exit writes the process's own peak RSS
# (VmHWM: the high-water mark of its address space since exec; the rusage figures would also
# count the pytest process it was forked from).
_PEAK = """
import atexit, runpy, sys
def peak(out):
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            open(out, "w").write(line.split()[1])
atexit.register(peak, sys.argv[1])
module = sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _run(module: str, args: list[str], env: dict[str, str], tmp_path: Path) -> int:
    """Run ``python -m module args`` to its end; return its peak RSS in KiB."""
    peak = tmp_path / "peak"
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, str(peak), module, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"{module} {args}: {done.stdout}\n{done.stderr}"
    return int(peak.read_text())


def _round_trip(tasks: int, tmp_path: Path) -> tuple[int, int, int]:
    """Build a project of ``tasks`` tasks, export it, import it into a new root and fsck
    that, each command a process; their peak RSS (KiB), after checking the restored records
    are the source's, byte for byte."""
    tmp_path.mkdir()
    source, target = tmp_path / "source", tmp_path / "target"
    backup = tmp_path / "web.tar.gz"
    env = {**os.environ, "MEMORY_TOKENS_FILE": str(tmp_path / "tokens.json")}
    flask = ["--app", "wsgi"]
    _run("bench.loader", [str(source), "acme", "web", str(tasks)], env, tmp_path)
    export_kib = _run(
        "flask",
        [*flask, "export", "--tenant", "acme", "--project", "web", str(backup)],
        {**env, "MEMORY_STORAGE_ROOT": str(source)},
        tmp_path,
    )
    into_target = {**env, "MEMORY_STORAGE_ROOT": str(target)}
    import_kib = _run("flask", [*flask, "import", str(backup)], into_target, tmp_path)
    fsck_kib = _run("flask", [*flask, "fsck"], into_target, tmp_path)
    print(
        f"{tasks} tasks: export {export_kib / 1024:.0f} MiB, import {import_kib / 1024:.0f} "
        f"MiB, fsck {fsck_kib / 1024:.0f} MiB peak RSS; backup {backup.stat().st_size} bytes"
    )
    restored = record_files(target)
    assert len(restored) == 2 * tasks
    assert restored == record_files(source)
    return export_kib, import_kib, fsck_kib


def test_a_project_of_100k_tasks_round_trips_in_bounded_memory(tmp_path: Path) -> None:
    small = _round_trip(SMALL_TASKS, tmp_path / "small")
    large = _round_trip(TASKS, tmp_path / "large")
    for command, base, peak in zip(("export", "import", "fsck"), small, large, strict=True):
        assert peak - base < RSS_GROWTH_KIB, (command, base, peak)
