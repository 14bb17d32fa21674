"""C entry points cannot be misused from Python: the fuzz of fuzz_entry_points.py (run in a
subprocess, so a crash is a failure rather than a dead test run), the checked index
objects, and the compiled bookkeeping under callbacks that mutate its inputs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dynagraph.backends import cpu

HERE = Path(__file__).resolve().parent
bk = pytest.importorskip("dynagraph._bookkeeping")


def test_fuzz_every_entry_point_quickly():
    r = subprocess.run([sys.executable, "-X", "faulthandler", str(HERE / "fuzz_entry_points.py"), "8"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, (r.stdout + r.stderr)[-4000:]


@pytest.mark.skipif(not os.environ.get("DYNAGRAPH_ASAN_FUZZ"), reason="set DYNAGRAPH_ASAN_FUZZ=1 (slow: an ASan build)")
def test_fuzz_under_address_sanitizer(tmp_path):
    """Builds both extensions with -fsanitize=address,undefined and runs the fuzz with them."""
    import shutil
    root = HERE.parents[1]
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc not available")
    libasan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libasan):
        pytest.skip("no libasan")
    flags = "-fsanitize=address,undefined -fno-omit-frame-pointer -DDG_NO_CLONES"
    env = dict(os.environ, CFLAGS=flags, LDFLAGS="-fsanitize=address,undefined")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-temp", str(tmp_path / "t"),
                        "--build-lib", str(tmp_path / "lib")], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    pkg = tmp_path / "pkg" / "dynagraph"
    shutil.copytree(root / "dynagraph", pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for so in (tmp_path / "lib" / "dynagraph").glob("*.so"):
        shutil.copy(so, pkg)
    env = dict(os.environ, LD_PRELOAD=libasan, PYTHONPATH=f"{tmp_path / 'pkg'}",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    r = subprocess.run([sys.executable, str(HERE / "fuzz_entry_points.py"), "150"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0 and "ok" in r.stdout, (r.stdout + r.stderr)[-4000:]


def test_pickneglogsoftmax_on_zero_rows():
    for rows in (0, 1):
        x = np.zeros((rows, 5))
        assert cpu.pickneglogsoftmax_forward(x, []).shape == (0, 1)
        np.testing.assert_array_equal(cpu.pickneglogsoftmax_backward(x, [], np.zeros(0)), np.zeros((rows, 5)))


def test_row_index_cannot_be_forged_or_changed():
    blocks = [np.zeros((3, 2)), np.zeros((1, 2))]
    with pytest.raises(TypeError, match="row_index"):
        cpu.RowIndex([0], np.zeros(1, np.int64), np.array([10 ** 9]), ((3, 2),))
    with pytest.raises(IndexError):
        cpu.row_index(lambda i: blocks[i].shape, 2, [0, 1], [2, 1])
    rows = np.array([2, 0])
    ix = cpu.row_index(lambda i: blocks[i].shape, 2, [0, 1], rows)
    rows[0] = 10 ** 9                                     # the caller's array is not the index's
    with pytest.raises(AttributeError):
        ix.rows = np.array([10 ** 9, 0])
    for a in (ix.rows, ix.local):
        with pytest.raises(ValueError):
            a[0] = 10 ** 9
        with pytest.raises(ValueError):
            a.flags.writeable = True
        if a.base is not None and isinstance(a.base, np.ndarray):
            with pytest.raises(ValueError):
                a.base.flags.writeable = True
    np.testing.assert_array_equal(cpu.gather_indexed(blocks, ix), np.zeros((2, 2)))
    with pytest.raises(TypeError, match="RowIndex"):
        cpu.gather_indexed(blocks, (ix.ids, ix.local, ix.rows, ix.shapes))


def test_kid_rows_cannot_be_changed():
    kr = cpu.KidRows(np.array([[0, 1], [1, 3]]), 4)
    for name, value in (("bound", 10 ** 9), ("rows", np.zeros((2, 2))), ("ptr", None), ("N", 9), ("ld", 99)):
        with pytest.raises(AttributeError):
            setattr(kr, name, value)
    with pytest.raises(ValueError):
        kr.rows.flags.writeable = True
    for w in cpu.KidRows.windows(np.array([[0, 1, 2], [1, 3, 0]]), 4, [(0, 2), (2, 3)], 1):
        with pytest.raises(AttributeError):
            w.bound = 100
        with pytest.raises(ValueError):
            w.rows.flags.writeable = True


class _Mutator:
    """A block id or flag whose comparison or truth empties the lists it was found in."""
    def __init__(self, *lists):
        self.lists = lists

    def __eq__(self, other):
        for lst in self.lists:
            del lst[:]
        return False

    __hash__ = object.__hash__

    def __bool__(self):
        self.__eq__(None)
        return True


@pytest.mark.parametrize("rep", range(20))
def test_locate_survives_mutating_eq(rep):
    n = 50
    blk, row = list(range(n)), list(range(n))
    ids = list(range(n))
    m = _Mutator(blk, row, ids)
    blk[1] = m
    blk[0] = 10 ** 20 + rep                    # not the same object as m: __eq__ runs
    with pytest.raises((IndexError, ValueError)):
        bk.locate(blk, row, ids)


def test_any_true_and_run_table_survive_mutating_callbacks():
    n = 20
    flags = [False] * n
    ids = list(range(n))
    flags[0] = _Mutator(flags, ids)
    with pytest.raises(IndexError):
        bk.any_true(flags, ids)
    blk, row = [0] * n, list(range(n))
    args = [(i,) if i else () for i in range(n)]
    flags = [False] * n
    flags[1] = _Mutator(blk, row, args, flags)
    blocks = [np.zeros((n, 2))]
    with pytest.raises(TypeError, match="needs_grad"):
        bk.run_table(blk, row, args, flags, [[1, 2, 3]], blocks, [0], [2], "d")


def test_place_survives_a_finaliser_that_mutates():
    blk, row = [None] * 10, [0] * 10

    class Dies:
        def __del__(self):
            del blk[:]
            del row[:]
    blk[3] = Dies()
    with pytest.raises(IndexError):
        bk.place(blk, row, [3, 4, 5], 7)
