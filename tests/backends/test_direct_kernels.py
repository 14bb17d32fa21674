"""Direct kernels (backends/cpu/direct.py, kernels/cpython/batch_run.c): small unary, binary
and esum batches run through a kernel pointer from the compiled batch step.

The compiled step and its Python twin must decide alike and compute alike: the graph's
values, blocks and records are bit-identical whichever runs (tests/test_native_batches.py
covers random graphs); here, that the pointer path is really taken where the operands fit
(the twin is never called), that it is not taken where they do not (a broadcast shape,
above the size bound, a non-contiguous operand), and that its values agree with the numpy
reference backend.
"""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import executor
from dynagraph.backends import get_backend
from refcheck import run_graph, using

from ._util import kernels

kernels()
from dynagraph.backends.cpu import direct  # noqa: E402

H = 8


def _native_with_direct():
    be = get_backend("cpu")
    if be.direct_kernels is None or executor._run_batch_native is None:
        pytest.skip("dynagraph._bookkeeping is not built")
    return be


def _graph(pc, n: int = H, shared_row: bool = True):
    """lookup; tanh, logistic, rectify, square, neg; add/sub/cmult/cdiv (one operand a shared row);
    esum; lstm_step; lstm_c, lstm_h; concatenate; affine, matmul; pickneglogsoftmax."""
    W = dy.parameter(pc.add_parameters((n, n), init=dy.UniformInitializer(0.5)))
    b = dy.parameter(pc.add_parameters(n, init=dy.UniformInitializer(0.5)))
    E = pc.add_lookup_parameters((5, n), init=dy.UniformInitializer(0.5))
    xs = [dy.inputVector([0.1 * (k + 1) * (i - n / 2) for i in range(n)]) + dy.lookup(E, k + 1) for k in range(3)]
    hs = [dy.tanh(W * x + b) if shared_row else dy.tanh(W * x + x) for x in xs]
    hs += [dy.logistic(h) - dy.rectify(h) for h in hs]
    hs += [dy.cmult(h, dy.square(h)) for h in hs[:2]]
    hs += [dy.cdiv(h, dy.exp(h)) for h in hs[:2]]
    hs += dy.VanillaLSTMBuilder(1, n, n, pc).initial_state().transduce(xs)  # lstm_step (whole steps)
    cells = dy.VanillaLSTMBuilder(1, n, n, pc)
    cells.fused_step = False
    hs += cells.initial_state().transduce(xs)  # lstm_c, lstm_h
    hs += [dy.pick_range(h, 0, n) for h in dy.BiRNNBuilder(1, n, 2 * n, pc, dy.VanillaLSTMBuilder).transduce(xs)]
    hs += [dy.affine_transform([b, W, h, W, hs[0]]) for h in hs[-2:]]
    hs += [W * dy.concatenate([dy.pick_range(h, 0, n // 2), dy.pick_range(h, n // 2, n)]) for h in hs[-2:]]
    losses = [dy.pickneglogsoftmax(h, k % n) for k, h in enumerate(hs[:3])]
    return dy.esum([dy.sum_elems(dy.esum(hs)), dy.sum_elems(-hs[0])] + losses)


class _Refusing:
    """direct_kernels whose twins fail: a batch that reaches one was not run through its pointer."""

    def __init__(self, real):
        self.real, self.called = real, []

    def get(self, name):
        entry = self.real.get(name)
        if entry is None:
            return None

        def twin(*a):
            self.called.append(name)
            return entry[1](*a)
        return entry[0], twin, entry[2]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fitting_batches_take_the_pointer_path(monkeypatch, dtype):
    be = _native_with_direct()
    refusing = _Refusing(be.direct_kernels)
    monkeypatch.setattr(be, "direct_kernels", refusing)
    monkeypatch.setattr(dy.config.config, "backend", "cpu")
    with using(dtype, 0):
        pc = dy.ParameterCollection()
        dy.renew_cg(scheduler="agenda")
        _graph(pc).value()
    assert refusing.called == []


def test_batches_that_do_not_fit_take_the_twin(monkeypatch):
    """Above the bound, broadcast shapes (dy.cmult of a vector and a column) and float64
    transcendentals above their own bound go to the twin, which runs the backend's kernel."""
    be = _native_with_direct()
    refusing = _Refusing(be.direct_kernels)
    monkeypatch.setattr(be, "direct_kernels", refusing)
    monkeypatch.setattr(dy.config.config, "backend", "cpu")
    with using("float64", 0):
        dy.renew_cg(scheduler="agenda")
        scores = dy.inputVector(list(np.linspace(-1, 1, direct.TRANSCENDENTAL_F64_MAX + 1)))
        dy.pickneglogsoftmax(scores, 2).value()  # above the bound: the twin decides
        assert refusing.called == ["pickneglogsoftmax"]
        refusing.called.clear()
        dy.renew_cg(scheduler="agenda")
        big = dy.inputVector(list(np.linspace(-1, 1, direct.TRANSCENDENTAL_F64_MAX + 1)))
        dy.tanh(big).value()
        assert refusing.called == ["tanh"]
        dy.renew_cg(scheduler="agenda")
        m = dy.inputTensor(np.ones((3, 2)))
        c = dy.inputTensor(np.full((3, 1), 2.0))
        dy.cmult(m, c).value()  # (3, 2) * (3, 1): a broadcast the kernel does not take
        assert refusing.called[-1] == "cmult"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shared_row", [True, False])
def test_direct_values_match_the_numpy_backend(monkeypatch, dtype, shared_row):
    _native_with_direct()
    got = {}
    for name in ("cpu", "numpy"):
        monkeypatch.setattr(dy.config.config, "backend", name)
        with using(dtype, 0):
            pc = dy.ParameterCollection()
            dy.renew_cg(scheduler="agenda")
            loss = _graph(pc, shared_row=shared_row)
            got[name] = (loss.value(), loss)
            loss.backward()
            got[name] += ([p.grad_as_array().copy() for p in pc.parameters_list() + pc.lookup_parameters_list()],)
    _assert_close(got["cpu"][0], got["cpu"][2], got["numpy"][0], got["numpy"][2], dtype)


def _assert_close(value, grads, ref_value, ref_grads, dtype: str) -> None:
    """A loss and its parameters' gradients against the numpy backend's, at the dtype's tolerance."""
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(value, ref_value, rtol=tol)
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_twins_match_the_ops_numpy_code():
    """Each twin on fitting operands (one shared row included) against the op's own numpy code."""
    from dynagraph.ops.base import OPS
    rng = np.random.default_rng(1)
    dk = direct.DirectKernels({})
    for dt, tol in ((np.float32, 1e-6), (np.float64, 1e-13)):
        x, y, s = (rng.uniform(0.5, 1.5, shape).astype(dt) for shape in ((4, 5), (4, 5), (1, 5)))
        for name in ("neg", "tanh", "logistic", "rectify", "exp", "log", "square", "sqrt"):
            np.testing.assert_allclose(dk.get(name)[1](np, (), None, x), OPS[name].forward(np, (), None, x),
                                       rtol=tol, err_msg=name)
        for name in ("add", "sub", "cmult", "cdiv"):
            for a, b in ((x, y), (x, s), (s, y)):
                np.testing.assert_allclose(dk.get(name)[1](np, (), None, a, b), OPS[name].forward(np, (), None, a, b),
                                           rtol=tol, err_msg=name)
        np.testing.assert_allclose(dk.get("esum")[1](np, (), None, x, s, y), OPS["esum"].forward(np, (), None, x, s, y),
                                   rtol=tol)


@pytest.mark.parametrize("dt,tol", [(np.float32, 2e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("n,r,c", [(1, 8, 5), (2, 16, 9), (4, 64, 128), (1, 256, 128), (5, 8, 5), (1, 512, 128),
                                   (2, 512, 128), (4, 96, 1000)])
def test_small_products_match_the_ops_numpy_code(dt, tol, n, r, c):
    """affine (two products, b of 1 or n rows) and matmul through the small-rows kernel where
    2 <= n <= PRODUCT_ROWS_MAX, or n = 1 and the multiply-adds fit PRODUCT_MACS_MAX, the op's
    numpy code beyond; forward and the input gradients of the backward override against the
    op's own code."""
    from dynagraph.ops.base import OPS
    rng = np.random.default_rng(n * 1000 + r + c)
    W1, W2 = (rng.uniform(-1, 1, (1, r, c)).astype(dt) for _ in range(2))
    x1, x2 = (rng.uniform(-1, 1, (n, c)).astype(dt) for _ in range(2))
    g = rng.uniform(-1, 1, (n, r)).astype(dt)
    few = 2 <= n <= direct.PRODUCT_ROWS_MAX  # any size: the kernel reads the shared W once for them all
    assert direct._small_products((W1, x1), 0) == (n if few or n == 1 and r * c <= direct.PRODUCT_MACS_MAX else 0)
    assert direct._small_products((g, W1, x1, W2, x2), 1) == (n if few or n == 1 and 2 * r * c <= direct.PRODUCT_MACS_MAX
                                                              else 0)
    dk = direct.DirectKernels({})
    for b in (rng.uniform(-1, 1, (1, r)).astype(dt), rng.uniform(-1, 1, (n, r)).astype(dt)):
        args = (b, W1, x1, W2, x2)
        np.testing.assert_allclose(dk.get("affine")[1](np, (), None, *args), OPS["affine"].forward(np, (), None, *args),
                                   rtol=tol, atol=tol * c)
        need = (True, False, True, False, True)
        got = direct.PRODUCT_BACKWARD["affine"](np, (), None, args, None, g, need)
        want = OPS["affine"].backward(np, (), None, args, None, g, need)
        for a, w in zip(got, want):
            assert (a is None) == (w is None)
            if a is not None:
                np.testing.assert_allclose(a, w, rtol=tol, atol=tol * r)
    np.testing.assert_allclose(dk.get("matmul")[1](np, (), None, W1, x1), OPS["matmul"].forward(np, (), None, W1, x1),
                               rtol=tol, atol=tol * c)
    got = direct.PRODUCT_BACKWARD["matmul"](np, (), None, (W1, x1), None, g, (True, True))
    want = OPS["matmul"].backward(np, (), None, (W1, x1), None, g, (True, True))
    for a, w in zip(got, want):
        np.testing.assert_allclose(a, w, rtol=tol, atol=tol * max(r, c))


@pytest.mark.parametrize("dt,tol", [(np.float32, 3e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("nA,nX,r,k,c", [
    (1, 1, 1, 64, 14),     # v times a score matrix: fewer than four rows, along y's rows
    (1, 1, 128, 14, 1),    # a matrix times a column: dg_dot per row
    (1, 1, 64, 64, 14),    # four rows or more: X^T in the scratch, dg_dot4
    (1, 1, 4, 100, 100),   # X past the scratch (k * c > 8192): the plain loops
    (3, 3, 5, 7, 9),       # per-node matrices, three nodes
    (3, 1, 6, 4, 2),       # one X shared by three A
    (1, 3, 2, 3, 17),      # one A shared by three X
])
def test_matrix_products_match_the_ops_numpy_code(dt, tol, nA, nX, r, k, c):
    """Products of per-node matrices (attention's v * tanh(...) and enc * alpha) by dg_small_matmul
    and its gradients, every loop order of the kernels, against the op's own numpy code; a shared
    operand's gradient is left to the op (it sums over the batch)."""
    from dynagraph.ops.base import OPS
    rng = np.random.default_rng(nA * 100 + r * 10 + c)
    A, X = rng.uniform(-1, 1, (nA, r, k)).astype(dt), rng.uniform(-1, 1, (nX, k, c)).astype(dt)
    B = max(nA, nX)
    g = rng.uniform(-1, 1, (B, r, c)).astype(dt)
    assert direct.matrix_products(A, X) == (B if B * r * k * c <= direct.PRODUCT_MACS_MAX else 0)
    np.testing.assert_allclose(direct.DirectKernels({}).get("matmul")[1](np, (), None, A, X),
                               OPS["matmul"].forward(np, (), None, A, X), rtol=tol, atol=tol * k)
    need = (nA == B, nX == B)
    got = direct.small_matmul_grads(A, X, g, need)
    want = OPS["matmul"].backward(np, (), None, (A, X), None, g, need)
    for a, w, n in zip(got, want, need):
        assert (a is None) == (not n)
        if n:
            np.testing.assert_allclose(a, w, rtol=tol, atol=tol * max(r, c))
    if B > 1 and min(nA, nX) == 1:  # a shared operand's gradient sums over the batch: the op's own
        assert direct.small_matmul_grads(A, X, g, (True, True)) is None
    assert direct.matrix_products(A, X[:, ::-1]) == 0                         # not contiguous
    assert direct.matrix_products(A, X.astype(np.float16)) == 0               # mixed dtypes


def test_small_products_refuse_what_the_kernel_does_not_take():
    W = np.ones((1, 4, 3))
    x = np.ones((2, 3))
    assert direct._small_products((W, x), 0) == 2
    assert direct._small_products((W, np.ones((2, 6))[:, ::2]), 0) == 0          # not contiguous
    assert direct._small_products((W, x.astype(np.float32)), 0) == 0             # mixed dtypes
    assert direct._small_products((np.ones((2, 4, 3)), x), 0) == 0               # per-sample matrices
    assert direct._small_products((np.ones((3, 4)), W, x), 1) == 0               # b of neither 1 nor n rows
    assert direct._small_products((W, np.ones((direct.PRODUCT_ROWS_MAX + 1, 3))), 0) == 0


def test_set_direct_kernels_checks_its_arguments():
    native = pytest.importorskip("dynagraph._bookkeeping")
    with pytest.raises(TypeError):
        native.set_direct_kernels(1, 2)
    with pytest.raises(TypeError):
        native.set_direct_kernels(*[1] * 20)  # the two small-matmul kernels missing
    with pytest.raises(ValueError):
        native.set_direct_kernels(*[0] * 22)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("split_max,group_max", [(executor.SPLIT_MAX, executor.GROUP_MAX), (1, executor.GROUP_MAX),
                                                 (1, 1)])
def test_batches_that_would_gather_run_in_parts(monkeypatch, native, split_max, group_max):
    """tanh over two products with different weights (two blocks): a gather would cost more than
    the batch saves, so the two tanh nodes run as two batches reading in place, node by node
    (executor.SPLIT_MAX) or block by block (GROUP_MAX), in the compiled and in the Python batch
    step alike; the values are the unbatched ones. With neither (1, 1), the batch gathers."""
    _native_with_direct()
    monkeypatch.setattr(dy.config.config, "backend", "cpu")
    if not native:
        monkeypatch.setattr(executor, "_run_batch_native", None)
    monkeypatch.setattr(executor, "SPLIT_MAX", split_max)
    monkeypatch.setattr(executor, "GROUP_MAX", group_max)
    with using("float64", 0):
        pc = dy.ParameterCollection()
        W1, W2 = (pc.parameters_from_numpy(np.arange(4.0).reshape(2, 2) * s) for s in (0.1, -0.2))
        dy.renew_cg(scheduler="agenda")
        x = dy.inputVector([1.0, 2.0])
        ys = [dy.tanh(dy.parameter(W) * x) for W in (W1, W2)]
        out = dy.concatenate(ys)
        got = out.npvalue()
        stats = dy.cg().stats
        assert (stats.gathers == 0) == (split_max >= 2 or group_max >= 2)
    A1, A2 = np.arange(4.0).reshape(2, 2) * 0.1, np.arange(4.0).reshape(2, 2) * -0.2
    want = np.concatenate([np.tanh(A1 @ [1.0, 2.0]), np.tanh(A2 @ [1.0, 2.0])])
    np.testing.assert_allclose(got, want, rtol=1e-13)


@pytest.mark.parametrize("native", [True, False])
def test_large_batches_from_a_few_blocks_run_block_by_block(monkeypatch, native):
    """Five tanh nodes over products from two weight matrices (two blocks, five rows): one batch
    per block instead of a gather: each part reads its rows as a slice; the values are the same."""
    _native_with_direct()
    monkeypatch.setattr(dy.config.config, "backend", "cpu")
    if not native:
        monkeypatch.setattr(executor, "_run_batch_native", None)
    with using("float64", 0):
        pc = dy.ParameterCollection()
        Ws = [pc.parameters_from_numpy(np.arange(4.0).reshape(2, 2) * s) for s in (0.1, -0.2)]
        dy.renew_cg(scheduler="agenda")
        xs = [dy.inputVector([1.0 + k, 2.0]) for k in range(5)]
        ys = [dy.tanh(dy.parameter(Ws[k % 2]) * x) for k, x in enumerate(xs)]
        got = dy.concatenate(ys).npvalue()
        tanh_batches = [r for r in dy.cg().executed if type(r) is executor.ExecutedBatch
                        and dy.cg().op[r.nodes[0]].name == "tanh"]
        assert sorted(len(r.nodes) for r in tanh_batches) == [2, 3]
        assert all(plan[0] == executor.SLICE for r in tanh_batches for plan in r.plans)
    want = np.concatenate([np.tanh((np.arange(4.0).reshape(2, 2) * (0.1, -0.2)[k % 2]) @ [1.0 + k, 2.0])
                           for k in range(5)])
    np.testing.assert_allclose(got, want, rtol=1e-13)


def _levels(pc, n: int, rows: int, levels: int):
    """`levels` rounds of tanh(W1 h + W2 g + b) over `rows` samples: every round is one affine
    batch of `rows` rows reading the same two shared weights (of one shape)."""
    W1, W2 = (dy.parameter(pc.add_parameters((n, n), init=dy.UniformInitializer(0.5))) for _ in range(2))
    b = dy.parameter(pc.add_parameters(n, init=dy.UniformInitializer(0.5)))
    hs = [dy.inputVector([0.1 * (k + 1) * (i - n / 2) for i in range(n)]) for k in range(rows)]
    gs = [dy.tanh(h) for h in hs]
    for _ in range(levels):
        hs, gs = [dy.tanh(dy.affine_transform([b, W1, h, W2, g])) for h, g in zip(hs, gs)], hs
    return dy.esum([dy.sum_elems(h) for h in hs])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_wide_products_read_one_transposed_copy_per_weight_and_evaluation(monkeypatch, dtype):
    """Above PRODUCT_ROWS_MAX rows a product runs as x @ Wt with Wt = W[0].T made C-contiguous
    (direct_products.c's transposed_weight, the twin's _transposed_product): the compiled step
    makes each weight's copy once per evaluation, however many batches read it, and leaves the
    twin's values bit for bit; both agree with the numpy backend."""
    _native_with_direct()
    rows, n, levels = direct.PRODUCT_ROWS_MAX + 3, 12, 4
    made = []
    real = executor._NativeBatches

    class Watched(real):
        def __init__(self, cg, b):
            super().__init__(cg, b)
            made.append(self.ctx[-2])  # the evaluation's transposed-weight dict (the graph is last)

    got = {}
    for name, native, backend in (("compiled", True, "cpu"), ("twin", False, "cpu"), ("numpy", True, "numpy")):
        with monkeypatch.context() as m:
            m.setattr(dy.config.config, "backend", backend)
            m.setattr(executor, "_NativeBatches", Watched)
            if not native:
                m.setattr(executor, "_run_batch_native", None)
            with using(dtype, 0):
                pc = dy.ParameterCollection()
                dy.renew_cg(scheduler="depth")
                loss = _levels(pc, n, rows, levels)
                value = loss.value()
                loss.backward()
                got[name] = (value, [p.grad_as_array().copy() for p in pc.parameters_list()],
                             [p.as_array().copy() for p in pc.parameters_list()])
        if name == "compiled":
            copies = made[-1]
            weights = got[name][2][:2]
            assert len(copies) == 2  # W1 and W2: one copy each for the `levels` batches
            for w, wt in copies.values():
                assert wt.flags.c_contiguous and wt.shape == (n, n)
                np.testing.assert_array_equal(wt, w[0].T)
                assert any(np.array_equal(w[0], x) for x in weights)
    assert got["compiled"][0] == got["twin"][0]
    for a, b in zip(got["compiled"][1], got["twin"][1]):
        np.testing.assert_array_equal(a, b)
    _assert_close(got["compiled"][0], got["compiled"][1], got["numpy"][0], got["numpy"][1], dtype)


def test_transposed_products_match_the_ops_numpy_code():
    """The twin above PRODUCT_ROWS_MAX rows (x @ W[0].T C-contiguous, + b) against the op's own code."""
    from dynagraph.ops.base import OPS
    rng = np.random.default_rng(3)
    for dt, tol in ((np.float32, 2e-6), (np.float64, 1e-13)):
        W1, W2 = (rng.uniform(-1, 1, (1, 24, 16)).astype(dt) for _ in range(2))
        x1, x2 = (rng.uniform(-1, 1, (direct.PRODUCT_ROWS_MAX + 4, 16)).astype(dt) for _ in range(2))
        b = rng.uniform(-1, 1, (1, 24)).astype(dt)
        dk = direct.DirectKernels({})
        np.testing.assert_allclose(dk.get("affine")[1](np, (), None, b, W1, x1, W2, x2),
                                   OPS["affine"].forward(np, (), None, b, W1, x1, W2, x2), rtol=tol, atol=tol)
        np.testing.assert_allclose(dk.get("matmul")[1](np, (), None, W1, x1), OPS["matmul"].forward(np, (), None, W1, x1),
                                   rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_transposed_weights_are_exact_copies_at_any_shape(monkeypatch, dtype):
    """Products of more than PRODUCT_ROWS_MAX rows read W transposed into a copy (4 x 4 blocks of
    registers for float32, element by element at the edges): weights whose sides are and are not
    multiples of 4 and of the tile give the twin's values bit for bit (numpy's own copy of W.T)."""
    _native_with_direct()
    shapes = [(4, 4), (13, 7), (16, 12), (37, 21), (64, 33), (5, 64)]
    n = direct.PRODUCT_ROWS_MAX + 3

    def build(pc):
        rng = np.random.default_rng(7)
        outs = []
        for r, c in shapes:
            W = dy.parameter(pc.parameters_from_numpy(rng.uniform(-1, 1, (r, c))))
            outs += [dy.sum_elems(W * dy.inputVector(list(rng.uniform(-1, 1, c)))) for _ in range(n)]
        return outs
    runs = []
    for native in (True, False):
        with monkeypatch.context() as m:
            m.setattr(dy.config.config, "backend", "cpu")
            if not native:
                m.setattr(executor, "_run_batch_native", None)
            runs.append(run_graph("agenda", build, dtype=dtype))
    for a, b in zip(runs[0].values, runs[1].values):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(runs[0].cg.blocks, runs[1].cg.blocks):
        np.testing.assert_array_equal(a, b)
