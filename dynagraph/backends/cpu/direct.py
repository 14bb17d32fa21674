"""Direct kernels: the commonest small batches run from C without the op's Python frame.

Per sentence most batches hold one node of H = 64-512 elements. Through the op's numpy
code such a batch costs a Python frame, argument padding and a ufunc call (1-2 us);
through cffi, building the pointers costs more than the arithmetic. The compiled batch
step (kernels/cpython/batch_run.c, direct_batch.c) instead calls these kernels through
function pointers handed to it once (`register`), after checking every operand's type,
dtype, layout, shape and indices itself: unary maps, binary maps whose operands share a
row shape (one of them may be a shared row), esum, pickneglogsoftmax, lookup and the
fused LSTM cell ops (lstm_c, lstm_h) and whole LSTM steps (lstm_step). Concatenate along the first per-node axis is copied
there, and affine/matmul with shared weights make the op's own numpy calls there. An
attention step's reshape and transpose of columns, softmax over a column, colwise_add and
products of per-node matrices (dg_small_matmul) run there too (direct_shaped.c).

Each op's entry is (descriptor, twin, split). The descriptor tells direct_batch.c which
kernel and up to how many elements it takes the C path; the twin is the same decision and
the same kernel in Python (through cffi, or the op's own code where the C side makes the
same numpy calls or an exact copy), the kernel executor.run_batch calls. So the compiled
and the Python batch step leave bit-identical values; above the size bound, or for any
other operand (a broadcast shape, another dtype, a backend's in-place operand), both run
the backend's usual kernel for the op. `split`: see DirectKernels.

The bounds: numpy's AVX-512 loops win on long vectors; exp/tanh/log in float64 call libm
per element (bench/kernels.py), so those take the C path on short vectors only.
"""
from __future__ import annotations

import numpy as np

from ..._kernels import ffi, lib
from ...ops.base import OPS
from .elementwise import binary_forward, pickneglogsoftmax_forward, sum_args
from .ffi import BINARY, F32, F64, UNARY, _fn, _p, _pi
from .overrides import LSTM_F64_MAX, _lstm_c_forward, _lstm_h_forward, _softmax_forward
from .rows import RowIndex

# descriptor kinds (the DIRECT_* enum in batch_run.c)
(DIRECT_UNARY, DIRECT_BINARY, DIRECT_SUM, DIRECT_PNLS, DIRECT_TAKE, DIRECT_LSTMC, DIRECT_LSTMH, DIRECT_CONCAT,
 DIRECT_AFFINE, DIRECT_MATMUL, DIRECT_LSTM_STEP, DIRECT_COPY, DIRECT_SOFTMAX, DIRECT_COLWISE) = range(1, 15)

SIMPLE_MAX = 16384        # output elements: neg, rectify, square, sqrt, add, sub, cmult, cdiv, esum
TRANSCENDENTAL_F32_MAX = 2048  # vectorized dg_expf; numpy's loop is faster beyond
TRANSCENDENTAL_F64_MAX = 64    # libm per element: about even with numpy's call at 64
_TRANSCENDENTAL = frozenset({"tanh", "logistic", "exp", "log", "pickneglogsoftmax"})  # bounds on x's size
TAKE_MAX = 1 << 62        # lookup: a copy, as exact as numpy's; any table size


def _bounds(name: str) -> tuple:
    if name in _TRANSCENDENTAL:
        return TRANSCENDENTAL_F32_MAX, TRANSCENDENTAL_F64_MAX
    return SIMPLE_MAX, SIMPLE_MAX


def _fits(x, limits: tuple) -> bool:
    """A real C-contiguous numpy array of at most the bound's elements for its dtype."""
    if type(x) is not np.ndarray or not x.flags.c_contiguous or x.ndim < 1 or x.size == 0:
        return False
    dt = x.dtype
    return x.size <= (limits[0] if dt == F32 else limits[1] if dt == F64 else -1)


def _rows_of(xs: tuple, limits: tuple) -> int:
    """The batch size B of a binary or n-ary op over xs that batch_run.c takes: each a fitting
    array (_fits) of one dtype and one row shape (at least 2 axes), leading axis 1 or B, and
    B rows within the bound; 0 otherwise."""
    x0 = xs[0]
    if not all(_fits(x, limits) for x in xs) or x0.ndim < 2:
        return 0
    B = max(x.shape[0] for x in xs)
    tail, dt = x0.shape[1:], x0.dtype
    if not all(x.dtype == dt and x.shape[1:] == tail and x.shape[0] in (1, B) for x in xs):
        return 0
    return B if B * (x0.size // x0.shape[0]) <= limits[0 if dt == F32 else 1] else 0


def _unary_twin(name: str, fallback):
    code, limits = UNARY[name], _bounds(name)

    def forward(xp, a, data, x):
        if not _fits(x, limits):
            return fallback(name)(xp, a, data, x)
        y = np.empty_like(x)
        _fn("dg_unary_fwd", x.dtype)(code, _p(y), _p(x), x.size)
        return y
    return forward


def _binary_twin(name: str, fallback):
    limits = _bounds(name)

    def forward(xp, a, data, x, y):
        if not _rows_of((x, y), limits):
            return fallback(name)(xp, a, data, x, y)
        return binary_forward(name, x, y)
    return forward


def _esum_twin(fallback):
    limits = _bounds("esum")

    def forward(xp, a, data, *xs):
        if not _rows_of(xs, limits):
            return fallback("esum")(xp, a, data, *xs)
        return sum_args(xs)
    return forward


def _indices(data, bound: int) -> bool:
    """A non-empty list of exact ints each in [0, bound) (batch_run.c's index_array)."""
    return type(data) is list and bool(data) and all(type(d) is int and 0 <= d < bound for d in data)


def _pnls_twin(fallback):
    limits = _bounds("pickneglogsoftmax")

    def forward(xp, a, data, x):
        if not (_fits(x, limits) and x.ndim == 2 and _indices(data, x.shape[1]) and x.shape[0] in (1, len(data))):
            return fallback("pickneglogsoftmax")(xp, a, data, x)
        return pickneglogsoftmax_forward(x, data)
    return forward


# Products of a shared matrix with two to PRODUCT_ROWS_MAX rows, or one row and at most
# PRODUCT_MACS_MAX multiply-adds, take dg_rows_matvec (rowmm.inc: 8-lane dots, four rows of W
# at a time, each block of W used by every row while it is in cache) instead of numpy's
# matmul, whose ufunc machinery, operand views and bias add cost ~20k instructions a call:
# per sentence most products have one row and a small W. With two to four rows the kernel
# wins at every size (2560 x 1024 W, two rows: 0.27-0.37 ms against 1.9 for BLAS's x @ W.T,
# which repacks W); with one row and a large W, BLAS's gemv ties.
PRODUCT_ROWS_MAX = 4          # direct_products.c's MATVEC_ROWS_MAX, backward_batch.h's NB_PRODUCT_ROWS_MAX
PRODUCT_MACS_MAX = 1 << 16    # e.g. one row against a 256 x 256 W; backward_batch.h's NB_PRODUCT_MACS_MAX
_ZERO_ROWS = np.zeros(PRODUCT_ROWS_MAX, np.int64)  # every row reads matrix 0, row 0 (direct_products.c's ZERO_ROWS)


def _shared_products(args: tuple, first: int) -> tuple:
    """(rows n, multiply-adds) when every argument is an exact C-contiguous ndarray of one real dtype,
    every product is W (1, r, c) times x (n, c) with one n and r and affine's b is (1 or n, r)
    (direct_products.c's dg_direct_products checks the same); (0, 0) otherwise."""
    k = len(args)
    if k < first + 2 or (k - first) % 2:
        return 0, 0
    dt = args[0].dtype if type(args[0]) is np.ndarray else None
    if dt != F32 and dt != F64:
        return 0, 0
    for x in args:
        if type(x) is not np.ndarray or x.dtype != dt or not x.flags.c_contiguous:
            return 0, 0
    W, X = args[first], args[first + 1]
    if W.ndim != 3 or X.ndim != 2:
        return 0, 0
    r, n = W.shape[1], X.shape[0]
    for i in range(first, k, 2):
        W, X = args[i], args[i + 1]
        if W.ndim != 3 or W.shape[0] != 1 or W.shape[1] != r or X.ndim != 2 or X.shape[0] != n \
                or X.shape[1] != W.shape[2]:
            return 0, 0
    if first and (args[0].ndim != 2 or args[0].shape[1] != r or args[0].shape[0] not in (1, n)):
        return 0, 0
    return n, sum(n * r * args[i].shape[2] for i in range(first, k, 2))


def _kernel_takes(n: int, macs: int) -> bool:
    """Whether dg_rows_matvec takes n rows of macs multiply-adds: two to PRODUCT_ROWS_MAX rows
    at any size, one row up to PRODUCT_MACS_MAX (direct_products.c decides the same)."""
    return 1 <= n <= PRODUCT_ROWS_MAX and (n > 1 or macs <= PRODUCT_MACS_MAX)


def _small_products(args: tuple, first: int) -> int:
    """Rows n where the small-rows kernel takes the products (_shared_products' shapes and
    _kernel_takes); 0 otherwise."""
    n, macs = _shared_products(args, first)
    return n if _kernel_takes(n, macs) else 0


def _summed_products(args: tuple, first: int, product) -> np.ndarray:
    """product(W, x), a fresh array, for each pair in order, y = p1; y += p2 ...; then y += b:
    the order of direct_products.c, so that both leave the same bits."""
    y = None
    for i in range(first, len(args), 2):
        p = product(args[i], args[i + 1])
        if y is None:
            y = p
        else:
            y += p
    if first:
        y += args[0]
    return y


def _transposed_product(W: np.ndarray, X: np.ndarray) -> np.ndarray:
    """x @ Wt with Wt = W[0].T made C-contiguous: BLAS runs plain row-major operands 1.1-2.5x
    faster than x @ W[0].T on a few dozen rows (it repacks the transposed W on every call).
    direct_products.c makes the same product, each weight's copy once per evaluation
    (transposed_weight)."""
    return X @ np.ascontiguousarray(W[0].T)


def matrix_products(A, X) -> int:
    """Rows B where matmul's operands are per-node matrices that dg_small_matmul takes: exact
    C-contiguous arrays of one real dtype, A (1 or B, r, k), X (1 or B, k, c), at most
    PRODUCT_MACS_MAX multiply-adds (direct_shaped.c and backward_shaped.c check the same); else 0."""
    if type(A) is not np.ndarray or type(X) is not np.ndarray or A.ndim != 3 or X.ndim != 3:
        return 0
    dt = A.dtype
    if (dt != F32 and dt != F64) or X.dtype != dt or not (A.flags.c_contiguous and X.flags.c_contiguous):
        return 0
    B, (_, r, k), c = max(A.shape[0], X.shape[0]), A.shape, X.shape[2]
    if X.shape[1] != k or A.shape[0] not in (1, B) or X.shape[0] not in (1, B) or min(r, k, c) < 1:
        return 0
    return B if B * r * k * c <= PRODUCT_MACS_MAX else 0


def _strides(A, X) -> tuple:
    return (0 if A.shape[0] == 1 else A.shape[1] * A.shape[2]), (0 if X.shape[0] == 1 else X.shape[1] * X.shape[2])


def small_matmul(A, X, B: int) -> np.ndarray:
    """A_j X_j for matrix_products' operands by dg_small_matmul: (B, r, c)."""
    y = np.empty((B, A.shape[1], X.shape[2]), A.dtype)
    a_s, x_s = _strides(A, X)
    _fn("dg_small_matmul", A.dtype)(_p(y), _p(A), a_s, _p(X), x_s, B, A.shape[1], A.shape[2], X.shape[2])
    return y


def _products_twin(name: str, first: int):
    """affine (first 1: b, W1, x1, ...) and matmul (first 0: W, x): the small-rows kernel where
    _small_products says so, transposed weights above PRODUCT_ROWS_MAX rows, else the op's own
    numpy code (which direct_products makes from C)."""
    own = OPS[name].forward

    def forward(xp, a, data, *args):
        B = matrix_products(*args) if not first and len(args) == 2 else 0
        if B:
            return small_matmul(args[0], args[1], B)
        n, macs = _shared_products(args, first)
        if n > PRODUCT_ROWS_MAX:
            return _summed_products(args, first, _transposed_product)
        if not _kernel_takes(n, macs):
            return own(xp, a, data, *args)
        dt, r = args[first].dtype, args[first].shape[1]
        fn = _fn("dg_rows_matvec", dt)

        def small(W, X):
            p = np.empty((n, r), dt)
            c = W.shape[2]
            fn(_p(p), ffi.new(_BASES[dt], [_p(W)]), _pi(_ZERO_ROWS), _pi(_ZERO_ROWS), _p(X), c, n, r, c)
            return p
        return _summed_products(args, first, small)
    return forward


_BASES = {F32: "float *[1]", F64: "double *[1]"}


def _tgrad_fits(W, g) -> bool:
    """g @ W[0] by the small-rows kernel: both exact C-contiguous arrays of one real dtype, W (1, r, c),
    g (n, r), n <= PRODUCT_ROWS_MAX and n*r*c <= PRODUCT_MACS_MAX (backward_ops.c's small_product_grad)."""
    if type(W) is not np.ndarray or type(g) is not np.ndarray or W.dtype != g.dtype or (W.dtype != F32 and W.dtype != F64):
        return False
    if W.ndim != 3 or g.ndim != 2 or W.shape[0] != 1 or W.shape[1] != g.shape[1]:
        return False
    if not (W.flags.c_contiguous and g.flags.c_contiguous):
        return False
    n = g.shape[0]
    return 1 <= n <= PRODUCT_ROWS_MAX and n * W.shape[1] * W.shape[2] <= PRODUCT_MACS_MAX


def small_product_grad(W: np.ndarray, g: np.ndarray) -> np.ndarray:
    """g @ W[0] by dg_rows_matvec_tgrad (rowmm.inc: the rows of W added in order), for operands
    that _tgrad_fits; backward_products.c's dg_nb_tgrad_into calls the same kernel."""
    n, r, c = g.shape[0], W.shape[1], W.shape[2]
    gx = np.empty((n, c), W.dtype)
    _fn("dg_rows_matvec_tgrad", W.dtype)(_p(gx), ffi.new(_BASES[W.dtype], [_p(W)]), _pi(_ZERO_ROWS), _pi(_ZERO_ROWS),
                                         _p(g), n, r, c)
    return gx


def small_matmul_grads(A, X, g, need) -> tuple | None:
    """(gA, gX) of matrix_products' operands by dg_small_matmul_grads, where g is a C-contiguous
    (B, r, c) array of their dtype and no needed gradient is of a shared operand (B > 1 would sum
    it); None otherwise (backward_shaped.c decides the same)."""
    B = matrix_products(A, X)
    if not B or type(g) is not np.ndarray or g.dtype != A.dtype or not g.flags.c_contiguous \
            or g.shape != (B, A.shape[1], X.shape[2]) or (need[0] and A.shape[0] != B) or (need[1] and X.shape[0] != B):
        return None
    gA = np.empty(A.shape, A.dtype) if need[0] else None
    gX = np.empty(X.shape, X.dtype) if need[1] else None
    a_s, x_s = _strides(A, X)
    _fn("dg_small_matmul_grads", A.dtype)(ffi.NULL if gA is None else _p(gA), ffi.NULL if gX is None else _p(gX), _p(A),
                                          a_s, _p(X), x_s, _p(g), B, A.shape[1], A.shape[2], X.shape[2])
    return gA, gX


def _products_backward(name: str, first: int):
    """The op's own backward, with each fitting product's input gradient g @ W[0] made by
    dg_rows_matvec_tgrad (rowmm.inc: the rows of W added in order) instead of numpy's matmul;
    backward_ops.c's NB_MATMUL/NB_AFFINE make the same decision with the same kernel."""
    own = OPS[name].backward

    def backward(xp, a, data, xs, y, g, need):
        if not first and len(xs) == 2:
            grads = small_matmul_grads(xs[0], xs[1], g, need)
            if grads is not None:
                return grads
        fit = [i for i in range(first, len(xs), 2)
               if need[i + 1] and xs[i + 1].ndim == 2 and xs[i + 1].shape[0] == g.shape[0] and _tgrad_fits(xs[i], g)]
        if not fit:
            return own(xp, a, data, xs, y, g, need)
        rest = list(need)
        for i in fit:
            rest[i + 1] = False
        out = list(own(xp, a, data, xs, y, g, tuple(rest)))
        for i in fit:
            out[i + 1] = small_product_grad(xs[i], g)
        return tuple(out)
    return backward


# installed by CpuBackend; backend/cpu/backward.py offers NB_MATMUL/NB_AFFINE only where these are in place
PRODUCT_BACKWARD = {"matmul": _products_backward("matmul", 0), "affine": _products_backward("affine", 1)}


def _own_twin(name: str, fallback):
    """The backend's usual kernel for the op, looked up per call: where the C path's result is
    exact (copies, one rounded add per element) it is its own twin."""
    def forward(xp, a, data, *xs):
        return fallback(name)(xp, a, data, *xs)
    return forward


def _address(name: str) -> int:
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))


_REGISTERED = False


def register() -> bool:
    """Hands the kernels' addresses to the compiled batch step (dynagraph._bookkeeping), once
    per process; False where that module was not built or lacks the entry point."""
    global _REGISTERED
    try:
        from ... import _bookkeeping
    except ImportError:
        return False
    setter = getattr(_bookkeeping, "set_direct_kernels", None)
    if setter is None:
        return False
    if not _REGISTERED:
        setter(*(_address(f"dg_{k}_{t}") for k in ("unary_fwd", "binary_fwd", "sum_args", "pnls_fwd", "take_rows",
                                                    "lstmc_fwd", "lstmh_fwd", "rows_matvec", "lstm_fwd", "softmax_fwd",
                                                    "small_matmul")
                 for t in ("f32", "f64")))
        _REGISTERED = True
    return True


class DirectKernels(dict):
    """The `direct_kernels` capability, a dict: op name -> (descriptor, twin, split).
    descriptor = (kind, opcode, bound for float32, bound for float64): batch_run.c takes the
    C path for a batch whose output (for some kinds: whose first argument) has at most that
    many elements. split: whether a small batch whose arguments would need a gather runs node
    by node (executor.SPLIT_MAX): 1 yes, 0 no, 2 where the value per node is a vector. Not
    matmul, nor concatenate of matrices: per-sample matrices from several blocks are read in
    place (rowmm.py), with no gather."""

    def __init__(self, forward_kernels: dict):
        def fallback(name: str):  # the backend's usual kernel for the op, looked up per call
            return forward_kernels.get(name, OPS[name].forward)
        super().__init__()
        # what batch_run.c's gathers (column_gather.c) make this backend's checked row index from, so
        # that a gathered column's backward scatters through it as through row_index's own
        self.row_index_maker = (RowIndex, np.frombuffer, np.dtype(np.int64))
        for name, code in UNARY.items():
            self[name] = ((DIRECT_UNARY, code) + _bounds(name), _unary_twin(name, fallback), 1)
        for name, code in BINARY.items():
            self[name] = ((DIRECT_BINARY, code) + _bounds(name), _binary_twin(name, fallback), 1)
        self["esum"] = ((DIRECT_SUM, 0) + _bounds("esum"), _esum_twin(fallback), 1)
        self["pickneglogsoftmax"] = ((DIRECT_PNLS, 0) + _bounds("pickneglogsoftmax"), _pnls_twin(fallback), 1)
        # a lookup's rows are copied exactly by either path: its twin is the backend's own kernel
        self["lookup"] = ((DIRECT_TAKE, 0, TAKE_MAX, TAKE_MAX), _own_twin("lookup", fallback), 1)
        # the fused LSTM cell ops: their cpu adapters take the C kernel for every batch the pointer
        # path takes (unbroadcast rows; float64 up to LSTM_F64_MAX elements of pre) and are the twins
        self["lstm_c"] = ((DIRECT_LSTMC, 0, TAKE_MAX, LSTM_F64_MAX), _lstm_c_forward, 1)
        self["lstm_h"] = ((DIRECT_LSTMH, 0, TAKE_MAX, LSTM_F64_MAX), _lstm_h_forward, 1)
        # concatenate along the first per-node axis: copied in C, as exact as the op's own code
        self["concatenate"] = ((DIRECT_CONCAT, 0, TAKE_MAX, TAKE_MAX), _own_twin("concatenate", fallback), 2)
        # products with shared weights: up to PRODUCT_ROWS_MAX rows the small-rows kernel, above it
        # the op's own numpy calls made from C without its Python frames (the same calls, so the same
        # values); the twin decides and computes the same way
        rows = (DIRECT_AFFINE, 0, PRODUCT_MACS_MAX, PRODUCT_MACS_MAX)
        self["affine"] = (rows, _products_twin("affine", 1), 1)
        self["matmul"] = ((DIRECT_MATMUL,) + rows[1:], _products_twin("matmul", 0), 0)
        # a whole LSTM step: the affine's products for its gates, then the fused cell kernel
        # (direct_step.c; its twin is the cpu backend's kernel for the op). Never split: the two
        # directions' steps never share a batch (their weights differ)
        from .lstm_step import lstm_step_forward
        self["lstm_step"] = ((DIRECT_LSTM_STEP,) + rows[1:], lstm_step_forward, 0)
        # an attention step's per-node matrices and columns (direct_shaped.c): reshape and transpose
        # that keep the values' order are copies (the op's own code: a view or a copy, the same
        # values); softmax over a column takes the adapter's kernel within the adapter's bounds
        # (_exp_worth: float32 rows under 1000 classes, float64 batches of at most 1024 elements);
        # colwise_add is one add per element, as numpy's
        for code, name in enumerate(("reshape", "transpose")):
            self[name] = ((DIRECT_COPY, code, TAKE_MAX, TAKE_MAX), _own_twin(name, fallback), 1)
        self["softmax"] = ((DIRECT_SOFTMAX, 0, 999, 1024), _softmax_forward, 1)
        self["colwise_add"] = ((DIRECT_COLWISE, 0, SIMPLE_MAX, SIMPLE_MAX), _own_twin("colwise_add", fallback), 1)
