"""dynagraph.heap: glibc's top pad set at import, turned off by the environment."""
import os
import subprocess
import sys

import pytest

from dynagraph import heap


def _glibc() -> bool:
    import ctypes
    import ctypes.util
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "mallopt")
    except OSError:
        return False


def _applied(env: dict) -> int:
    code = "import dynagraph, sys; sys.stdout.write(str(dynagraph.heap.applied_bytes))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                         text=True, check=True)
    return int(out.stdout)


def test_pad_is_off_when_asked_and_when_glibc_is_told_directly():
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_TOP_PAD_", "DYNAGRAPH_HEAP_TOP_PAD_MB")}
    assert _applied({**env, "DYNAGRAPH_HEAP_TOP_PAD_MB": "0"}) == 0
    assert _applied({**env, "MALLOC_TOP_PAD_": "1048576"}) == 0
    assert heap.apply(0) == 0 and heap.apply(-5) == 0


@pytest.mark.skipif(not _glibc(), reason="mallopt is glibc's")
def test_pad_is_set_at_import_on_glibc():
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_TOP_PAD_", "DYNAGRAPH_HEAP_TOP_PAD_MB")}
    assert _applied(env) == heap.DEFAULT_MB << 20
    assert _applied({**env, "DYNAGRAPH_HEAP_TOP_PAD_MB": "8"}) == 8 << 20
    assert heap.apply(heap.DEFAULT_MB) == heap.DEFAULT_MB << 20
