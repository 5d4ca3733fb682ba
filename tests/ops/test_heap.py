"""A worker gives freed memory back: what its threads freed among live blocks leaves its RSS."""

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
