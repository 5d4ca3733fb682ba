"""A worker bounds its allocator: its threads share two arenas, and what they freed among live
blocks leaves its RSS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a process of its own (the trimmer starts once per process): a thread allocates ~90 MB of
# 3 KB blocks and frees all but one in a hundred, which pins its arena's top; the freed pages
# stay resident until something trims them.
_CHURN = r"""
import sys, threading, time
from app.ops.heap import start_trimmer

def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10

keep = []

def churn():
    blocks = [b"x" * 3000 + bytes([i % 256]) for i in range(30000)]
    keep.extend(blocks[::100])
    blocks.clear()

thread = threading.Thread(target=churn)
thread.start()
thread.join()
freed = rss()
time.sleep(0.5)
untrimmed = rss()
start_trimmer(0.1)
time.sleep(1.0)
print(freed, untrimmed, rss())
"""

MB = 1 << 20


def test_freed_pages_in_the_middle_of_an_arena_leave_the_rss() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHURN], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    freed, untrimmed, trimmed = map(int, out.split())
    assert untrimmed > freed - 10 * MB  # nothing gives it back by itself
    assert trimmed < untrimmed - 50 * MB, (freed, untrimmed, trimmed)


# Sixteen threads allocate at once (blocks past pymalloc's 512 bytes go to malloc) and hold
# their blocks until all have; then malloc_info's XML says how many arenas the process has.
_THREADS = r"""
import ctypes, sys, tempfile, threading
from app.ops.heap import limit_arenas

if sys.argv[1] == "limit":
    assert limit_arenas()
ready = threading.Barrier(17)
done = threading.Event()

def hold():
    blocks = [bytes(2000) for _ in range(100)]
    ready.wait()
    done.wait()

threads = [threading.Thread(target=hold) for _ in range(16)]
for thread in threads:
    thread.start()
ready.wait()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    stream = libc.fopen(out.name.encode(), b"w")
    assert libc.malloc_info(0, stream) == 0
    libc.fclose(stream)
    print(out.read().count(b"<heap nr="))
done.set()
"""


def _arenas(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _THREADS, mode], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return int(out)


def test_a_workers_threads_share_two_arenas() -> None:
    assert _arenas("default") > 2  # glibc's own rule: an arena per thread, up to 8 per core
    assert _arenas("limit") <= 2
