"""train.memory: what a training process gives back to the system, in a fresh process each."""

from __future__ import annotations

import json
import subprocess
import sys

# 2,000 tensors of 64 KiB (below the mmap threshold: the heap's), all freed but the last, which
# keeps the freed ones below the top of the heap where glibc does not trim on its own; the
# resident MB after the free and after release_free_heap.
_FRAGMENTED = """
import json, torch
from progress_sql.train.memory import map_large_blocks, release_free_heap
def rss():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) / 1024
assert map_large_blocks()
blocks = [torch.ones(16384) for _ in range(2000)]
last = blocks[-1]
del blocks
freed = rss()
released = release_free_heap()
print(json.dumps({"freed": freed, "after": rss(), "released": released}))
"""


def test_release_free_heap_gives_a_steps_freed_blocks_back():
    out = subprocess.run([sys.executable, "-c", _FRAGMENTED], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    # 125 MB were freed inside the heap: resident until trimmed, then given back
    assert got["released"] and got["freed"] - got["after"] > 100, got
