"""Keep freed graph memory in the process heap for the next graph (glibc only).

Every training step builds a graph, fills value and gradient blocks, and frees them all at
the next renew_cg(). With glibc's defaults that memory leaves the process and comes back
zero-filled page by page on first touch:
- an allocation above the mmap threshold (dynamic, at most 32 MB) gets fresh pages and is
  unmapped on free: MV-RNN at H=64 (36 MB blocks) took ~4,500 faults and 12-16 ms of system
  time per 64-sample step, ~10% of its CPU time;
- the freed top of the heap is returned once more than 128 KB is free there, and the heap
  grows again by exactly what the next request needs: TreeLSTM training at H=128, batch 64,
  32.4 -> 23.4 ms CPU a step once it stays (NestedRNN 17.7 -> 14.0 ms).
Raising the mmap and trim thresholds and padding each growth of the heap keeps the memory for
reuse, as DyNet's preallocated pools do; the catch is that the process keeps its peak heap
(up to TRIM bytes) after a step.

`DYNAGRAPH_KEEP_HEAP=0` leaves glibc's defaults alone; so does any of glibc's own MALLOC_*_
tunables set in the environment, which then win.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# glibc's mallopt() parameter numbers (malloc.h) and the values set
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
TRIM = 512 << 20  # free memory at the heap's top kept up to this size
PAD = 64 << 20    # each growth of the heap asks for this much more (touched only when used)
MMAP = 256 << 20  # blocks up to this size come from the heap and are reused
_GLIBC_OWN = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")

_done: list = []


def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process; False where not glibc or turned off."""
    if _done:
        return _done[0]
    ok = False
    wanted = os.environ.get("DYNAGRAPH_KEEP_HEAP", "1") not in ("0", "")
    if wanted and sys.platform.startswith("linux") and not any(k in os.environ for k in _GLIBC_OWN):
        try:
            mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
        except (OSError, AttributeError):  # not glibc (musl has no mallopt)
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = all(mallopt(k, v) == 1 for k, v in
                     ((M_MMAP_THRESHOLD, MMAP), (M_TRIM_THRESHOLD, TRIM), (M_TOP_PAD, PAD)))
    _done.append(ok)
    return ok
