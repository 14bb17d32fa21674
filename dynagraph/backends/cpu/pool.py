"""The `block_pool` capability of backends/contract.py: numpy.empty and numpy.zeros for the
compiled steps' small value and gradient blocks, reusing arrays that nothing holds any more.

A per-sentence program makes the same small blocks for every sentence (a BiRNN tagger at H=64:
~980 arrays of one or a few rows a sentence), and numpy.empty (~1,400 instructions) plus the
array's later deallocation were about a tenth of the sentence's work (callgrind). The pool
(kernels/cpython/block_pool.c) keeps every small array it hands out and gives one out again
once the pool's reference is its only one: no graph, view, buffer export or user variable
holds it then. Its contents are unspecified, as numpy.empty's are.

Bounds: arrays up to MAX_ARRAY_BYTES are kept, at most MAX_TOTAL_BYTES in all (a mini-batch's
large blocks are numpy.empty's own, as before). `DYNAGRAPH_BLOCK_POOL=0` turns the pool off.
"""
from __future__ import annotations

import os

import numpy as np

MAX_ARRAY_BYTES = 64 << 10
MAX_TOTAL_BYTES = 32 << 20

_POOL: list = []  # the process's one pool, made on first use


def block_pool():
    """The process's BlockPool, or None without the compiled module or with DYNAGRAPH_BLOCK_POOL=0."""
    try:
        from ... import _bookkeeping
    except ImportError:
        return None
    make = getattr(_bookkeeping, "BlockPool", None)
    if make is None or os.environ.get("DYNAGRAPH_BLOCK_POOL", "1") == "0":
        return None
    if not _POOL:
        _POOL.append(make(np.empty, np.zeros, np.dtype(np.float32), np.dtype(np.float64), MAX_ARRAY_BYTES, MAX_TOTAL_BYTES))
    return _POOL[0]
