"""Keep freed block memory in the process heap for the next graph (glibc only).

Every graph allocates its value and gradient blocks afresh. glibc serves an allocation
above its mmap threshold (dynamic, at most 32 MB) from fresh pages that the kernel
zero-fills on first touch and unmaps on free, so a workload with large blocks pays page
faults for every block of every step: MV-RNN at H=64 (36 MB blocks) took ~4,500 faults and
12-16 ms of system time per 64-sample step, ~10% of its CPU time. Raising the mmap
threshold and the trim threshold keeps freed memory in the heap for reuse, as DyNet's
preallocated pools do; the process keeps its peak heap (up to TRIM bytes) after a step.

`DYNAGRAPH_KEEP_HEAP=0` leaves glibc's defaults alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
MMAP = 256 << 20  # blocks up to this size come from the heap and are reused
TRIM = 512 << 20  # free memory at the heap's top kept up to this size

_done: list = []


def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process; False where not glibc or turned off."""
    if _done:
        return _done[0]
    ok = False
    if sys.platform.startswith("linux") and os.environ.get("DYNAGRAPH_KEEP_HEAP", "1") not in ("0", ""):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (musl has no mallopt)
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM))
    _done.append(ok)
    return ok
