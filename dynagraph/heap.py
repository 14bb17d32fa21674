"""The C heap's top pad: keep freed graph memory in the process between steps (glibc).

Every training step builds a graph, fills value and gradient blocks, and frees them all at the
next renew_cg(). glibc returns the freed top of its heap to the kernel once more than 128 KB is
free there (`M_TRIM_THRESHOLD`) and grows it again by exactly what the next request needs, so
every step faults its memory back in page by page, zeroed by the kernel. Measured at H=128,
batch 64, one thread (bench/acrobat_models.py, CPU time a step): NestedRNN training 17.7 ->
13.2 ms, TreeLSTM training 32.3 -> 23.1 ms, StackRNN training 34.6 -> 32.7 ms. A 64 MB top pad
(`M_TOP_PAD`) makes each growth of the heap ask for 64 MB more and each trim keep 64 MB, so a
steady step reuses its pages. DyNet avoids the same cost with its own preallocated pools.

Applied once at import, on glibc only. `DYNAGRAPH_HEAP_TOP_PAD_MB=0` leaves the allocator alone
(any other value: the pad in MB); glibc's own MALLOC_TOP_PAD_ set in the environment wins.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TOP_PAD = -2  # glibc's mallopt() parameter number (malloc.h)
DEFAULT_MB = 64

applied_bytes = 0  # the pad set at import, 0 when none was


def apply(megabytes: int | None = None) -> int:
    """Set glibc's top pad to `megabytes` (default: DYNAGRAPH_HEAP_TOP_PAD_MB, else 64). Returns
    the pad in bytes, 0 where nothing was set (not glibc, turned off, or MALLOC_TOP_PAD_ given)."""
    global applied_bytes
    if megabytes is None:
        if "MALLOC_TOP_PAD_" in os.environ:
            return 0
        megabytes = int(os.environ.get("DYNAGRAPH_HEAP_TOP_PAD_MB", DEFAULT_MB))
    if megabytes <= 0:
        return 0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows): nothing to tune
        return 0
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    pad = megabytes << 20
    if mallopt(M_TOP_PAD, pad) != 1:
        return 0
    applied_bytes = pad
    return pad


apply()
