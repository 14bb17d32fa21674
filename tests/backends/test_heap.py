"""The cpu backend keeps freed block memory in the heap (backends/cpu/heap.py): set once
per process on glibc, off with DYNAGRAPH_KEEP_HEAP=0."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ._util import kernels

kernels()
from dynagraph.backends.cpu import heap  # noqa: E402


def test_set_once_and_answers_the_same():
    first = heap.keep_freed_memory()
    assert isinstance(first, bool)
    assert heap.keep_freed_memory() is first
    if sys.platform.startswith("linux") and os.environ.get("DYNAGRAPH_KEEP_HEAP", "1") not in ("0", ""):
        import ctypes.util
        if "libc.so" in (ctypes.util.find_library("c") or ""):
            assert first  # glibc accepts both thresholds


@pytest.mark.parametrize("env, want", [("0", "False"), ("1", None)])
def test_environment_turns_it_off(env, want):
    code = "from dynagraph.backends.cpu import heap; import dynagraph as dy; print(heap.keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "DYNAGRAPH_KEEP_HEAP": env}).stdout.strip()
    assert out in ("True", "False")
    if want is not None:
        assert out == want


def test_glibc_own_tunable_wins():
    code = "from dynagraph.backends.cpu import heap; print(heap.keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "DYNAGRAPH_KEEP_HEAP": "1", "MALLOC_TOP_PAD_": "1048576"}).stdout.strip()
    assert out == "False"
