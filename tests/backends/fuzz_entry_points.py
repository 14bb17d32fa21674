"""Hypothesis fuzz of every Python entry point of dynagraph._kernels (through the
dynagraph.backends.cpu wrappers) and dynagraph._bookkeeping: random shapes (zero-size
included), dtypes, strides, indices and mutating callbacks. Every call must return or
raise a clear exception (ValueError, TypeError, IndexError); a crash kills the process.

Run by tests/backends/test_fuzz.py in a subprocess (so a segfault is a test failure),
quickly in the default suite and, where gcc can, longer under AddressSanitizer:
    python tests/backends/fuzz_entry_points.py [examples per entry point]
"""
from __future__ import annotations

import inspect
import sys

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynagraph.backends import cpu

CLEAR = (ValueError, TypeError, IndexError)
DTYPES = [np.float32, np.float64, np.float64, np.float32, np.int64, np.int32, np.float16, np.complex128, np.bool_]
UNARY = ["tanh", "logistic", "rectify", "exp", "log", "sqrt", "square", "cube", "elu", "selu", "softsign",
         "negate", "abs", "bogus"]
BINARY = ["cmult", "cdiv", "add", "sub", "bmax", "bmin", "pow", "bogus"]


@st.composite
def arrays(draw, ndim=None):
    nd = draw(st.integers(0, 3)) if ndim is None else ndim
    shape = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 5, 8]), min_size=nd, max_size=nd)))
    dt = draw(st.sampled_from(DTYPES))
    a = np.random.default_rng(draw(st.integers(0, 9))).uniform(-3, 3, shape).astype(dt)
    how = draw(st.integers(0, 5))
    if how == 1 and a.ndim >= 2:
        a = a.T                                   # Fortran order
    elif how == 2 and a.ndim >= 1:
        a = np.repeat(a, 2, axis=0)[::2]          # a strided view
    elif how == 3 and a.ndim >= 1 and a.shape[0] > 0:
        a = np.broadcast_to(a[:1], a.shape)       # stride 0, read-only
    elif how == 4:
        a = a.copy()
        a.flags.writeable = False
    elif how == 5:
        return a.tolist()
    return a


def indices(draw):
    n = draw(st.integers(0, 6))
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return [draw(st.integers(-2, 9)) for _ in range(n)]
    if kind == 1:
        dt = draw(st.sampled_from([np.int64, np.int32, np.uint64, np.float64]))
        lo = 0 if dt is np.uint64 else -2
        return np.array([draw(st.integers(lo, 9)) for _ in range(n)], dtype=dt)
    if kind == 2:
        return [draw(st.floats(-2, 9)) for _ in range(n)]
    if kind == 3:
        return np.array([[1, 2], [0, 3]])
    if kind == 4:
        return [2 ** 63 - 1, -2 ** 63][: n % 3]
    return draw(st.sampled_from([None, "0", 3]))


def kid_rows(draw):
    r = np.array([[draw(st.integers(-1, 9)) for _ in range(2)] for _ in range(draw(st.integers(0, 3)))],
                 dtype=np.int64).reshape(-1, 2)
    try:
        return cpu.KidRows(r, draw(st.integers(0, 12)))
    except CLEAR:
        return None


def argument(draw, name: str):
    if name == "name":
        return draw(st.sampled_from(UNARY + BINARY))
    if name in ("rows", "labels", "idx", "blks", "touched"):
        return draw(st.one_of(st.none(), arrays(1))) if name == "touched" else indices(draw)
    if name in ("blocks", "xs", "targets", "outs"):
        return [draw(arrays()) for _ in range(draw(st.integers(0, 3)))]
    if name in ("need",):
        return (draw(st.booleans()), draw(st.booleans()))
    if name == "shape_of":
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        return lambda i: shape
    if name in ("kid_rows",):
        return kid_rows(draw)
    if name == "ix":
        try:
            blocks = [np.zeros((draw(st.integers(0, 4)), 2)) for _ in range(2)]
            return cpu.row_index(lambda i: blocks[i].shape, 2, indices(draw), indices(draw))
        except CLEAR:
            return None
    if name in ("mean", "disjoint", "install"):
        return draw(st.booleans())
    if name in ("N", "H", "n_blocks", "bound", "min_size"):
        return draw(st.integers(-1, 6))
    if name in ("out",):
        return draw(st.one_of(st.none(), st.tuples(arrays(2), arrays(2), arrays(2))))
    if name in ("lr", "eps", "gscale", "beta1", "beta2", "lr_t", "mom", "lr_scaled", "scale", "forget_bias"):
        return draw(st.sampled_from([0.1, 0.0, -1.0, float("nan"), 1e300]))
    if name == "what":
        return "fuzz"
    return draw(st.one_of(arrays(), st.none()))


ENTRY_POINTS = sorted(n for n, f in vars(cpu).items()
                      if not n.startswith("_") and inspect.isfunction(f) and f.__module__ == cpu.__name__
                      and n not in ("all_forward_kernels", "all_backward_kernels", "installed_kernels"))


def call(fn, draw):
    params = inspect.signature(fn).parameters
    args = {p: argument(draw, p) for p in params if p != "self"}
    try:
        fn(**args)
    except CLEAR:
        pass


def fuzz_bookkeeping(draw):
    from dynagraph import _bookkeeping as bk
    n = draw(st.integers(0, 6))
    blk = [draw(st.integers(-1, 3)) for _ in range(n)]
    row = [draw(st.integers(-1, 4)) for _ in range(n)]
    ids = indices(draw)
    ids = list(ids) if isinstance(ids, (list, np.ndarray)) else ids

    class Evil:
        """A block id / flag whose __eq__ and __bool__ empty every list they can reach."""
        def __eq__(self, other):
            for lst in (blk, row, flags, args):
                del lst[:]
            if isinstance(ids, list):
                del ids[:]
            return False

        __hash__ = object.__hash__

        def __bool__(self):
            self.__eq__(None)
            return True

    flags = [draw(st.sampled_from([True, False, 1, 0, Evil()])) for _ in range(n)]
    if n and draw(st.booleans()):
        blk[draw(st.integers(0, n - 1))] = Evil()
    args = [tuple(draw(st.integers(-1, n)) for _ in range(draw(st.integers(0, 2)))) for _ in range(n)]
    blocks = [np.zeros((draw(st.integers(0, 3)), 2), draw(st.sampled_from([np.float32, np.float64])))
              for _ in range(draw(st.integers(0, 3)))]
    step = [draw(st.integers(-1, n)) for _ in range(draw(st.integers(0, 3)))]
    calls = [
        lambda: bk.locate(blk, row, ids),
        lambda: bk.any_true(flags, ids),
        lambda: bk.columns(args, ids),
        lambda: bk.place(blk, row, ids, 0),
        lambda: bk.addresses(list(blocks) + [None], draw(st.sampled_from(["f", "d", "x"]))),
        lambda: bk.run_table(blk, row, args, flags, [step], blocks, [0] * 4, [draw(st.integers(-1, 3))] * 4,
                             draw(st.sampled_from(["f", "d", "q"]))),
        lambda: bk.grad_addresses([draw(st.sampled_from(list(blocks) + [None])) for _ in blocks], list(blocks),
                                  draw(st.sampled_from(["f", "d", "x"])),
                                  *([np.array([draw(st.integers(-2, 4)) for _ in range(3)], np.int64).tobytes(),
                                     np.array([draw(st.integers(-8, 64)) for _ in range(3)], np.int64).tobytes()]
                                    if draw(st.booleans()) else [])),
    ]
    try:
        draw(st.sampled_from(calls))()
    except CLEAR:
        pass


def run(examples: int) -> None:
    """`examples` random calls per entry point, all in one hypothesis run (one setup)."""
    np.seterr(all="ignore")
    targets = [getattr(cpu, name) for name in ENTRY_POINTS] + [None]

    @settings(max_examples=examples * len(targets), deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def fuzz(data):
        fn = data.draw(st.sampled_from(targets))
        fuzz_bookkeeping(data.draw) if fn is None else call(fn, data.draw)

    fuzz()
    print(f"fuzzed {len(ENTRY_POINTS)} cpu entry points and _bookkeeping, {examples} examples each: ok")


if __name__ == "__main__":
    run(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
