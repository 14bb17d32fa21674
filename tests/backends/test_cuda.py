"""The cuda backend (backends/cuda.py) against the numpy reference. Runs only where
CuPy and a CUDA device are present; skips cleanly everywhere else."""
from __future__ import annotations

import numpy as np
import pytest

from backend_params import unavailable

if unavailable("cuda"):
    pytest.skip(f"cuda backend unavailable: {unavailable('cuda')}", allow_module_level=True)

import cupy  # noqa: E402

import dynagraph as dy  # noqa: E402
from dynagraph.backends import contract, get_backend, optable  # noqa: E402
from dynagraph.fusion import ARITY, FusedChain  # noqa: E402
from dynagraph.ops.base import OPS  # noqa: E402

CUDA = get_backend("cuda") if not unavailable("cuda") else None
NUMPY = get_backend("numpy")


def test_cuda_satisfies_the_contract():
    assert isinstance(CUDA, contract.Backend)
    assert isinstance(CUDA.fused_chains, contract.FusedChains)
    assert isinstance(CUDA.optimizer_rules, contract.OptimizerRules)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_multi_block_gather_and_scatter_match_numpy(dt):
    rng = np.random.default_rng(0)
    blocks = [rng.standard_normal((r, 3, 2)).astype(dt) for r in (4, 1, 6)]
    blks, rows = [2, 0, 2, 1, 0, 2], [5, 3, 0, 0, 3, 5]
    dev = [cupy.asarray(b) for b in blocks]
    ix = CUDA.row_index(dev, blks, rows)
    got = CUDA.gather_indexed(dev, ix)
    want = NUMPY.gather_rows(blocks, blks, rows)
    np.testing.assert_array_equal(cupy.asnumpy(got), want)
    grads = [cupy.zeros_like(b) for b in dev]
    CUDA.scatter_indexed(lambda b: grads[b], ix, got)
    ref = [np.zeros_like(b) for b in blocks]
    NUMPY.scatter_rows(lambda b: ref[b], blks, rows, want)
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(cupy.asnumpy(g), r, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(ARITY))
def test_generated_chain_matches_the_reference(name):
    rng = np.random.default_rng(1)
    k = ARITY[name] or 3
    attrs = (0.7,) if name in optable.WITH_CONST else ()
    chain = FusedChain([(OPS[name], attrs, list(range(k))), (OPS["tanh"], (), [k])], n_inputs=k)
    lo = 0.2 if name in ("log", "sqrt", "powc", "rdivc", "pow", "cdiv") else -2.0
    ins = [rng.uniform(lo, 2.0, (5, 4)) for _ in range(k)]
    if k > 1:
        ins[-1] = ins[-1][:1]  # one shared input: its gradient is summed over the batch
    ref = chain.forward(NUMPY, ins)
    dev_ins = [cupy.asarray(x) for x in ins]
    got = chain.forward(CUDA, dev_ins)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(cupy.asnumpy(a), b, rtol=1e-10, atol=1e-12)
    gouts = [None, np.ones((5, 4))]
    need = [True] * k
    gref = chain.backward(NUMPY, ins, ref, gouts, need)
    ggot = chain.backward(CUDA, dev_ins, got, [None, cupy.asarray(gouts[1])], need)
    for a, b in zip(ggot, gref):
        np.testing.assert_allclose(cupy.asnumpy(a), b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("trainer", ["SimpleSGDTrainer", "MomentumSGDTrainer", "AdagradTrainer", "AdamTrainer"])
def test_training_on_cuda_matches_numpy(trainer, float64):
    def train(backend):
        dy.config.set(backend=backend, random_seed=0)  # the same initial weights on both
        try:
            pc = dy.ParameterCollection()
            W, E = pc.add_parameters((4, 3)), pc.add_lookup_parameters((7, 3))
            tr = getattr(dy, trainer)(pc)
            for step in range(3):
                dy.renew_cg()
                loss = dy.esum([dy.pickneglogsoftmax(dy.tanh(W * E[w]), w % 4) for w in (1, 5, 1, 6)])
                loss.value()
                loss.backward()
                tr.update()
            return W.as_array(), E.as_array()
        finally:
            dy.config.set(backend="numpy")
    for a, b in zip(train("cuda"), train("numpy")):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scheduler", ["none", "agenda"])
def test_cuda_matches_numpy(scheduler):
    def run(backend):
        dy.config.set(backend=backend, random_seed=0)
        pc = dy.ParameterCollection()
        E, W, b = pc.add_lookup_parameters((10, 4)), pc.add_parameters((3, 4)), pc.add_parameters(3)
        dy.renew_cg(scheduler=scheduler)
        loss = dy.esum([dy.pickneglogsoftmax(dy.tanh(W * E[w] + b), w % 3) for w in range(6)])
        value = loss.value()
        loss.backward()
        return value, W.grad_as_array()

    old = dy.config.config.backend
    try:
        v_ref, g_ref = run("numpy")
        v, g = run("cuda")
    finally:
        dy.config.set(backend=old)
    assert v == pytest.approx(v_ref, rel=1e-5)
    np.testing.assert_allclose(np.asarray(g), g_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("N", [0, 1, 3])
def test_generated_tree_cell_kernel_matches_the_xp_cell(dt, N):
    """fused_cells: the TreeLSTM cell kernel generated from the op table, against the same
    program evaluated with numpy (tests/backends/test_tree_cell.py checks that against the C
    cell): dense children, then children as rows of a table with outputs in place."""
    from dynagraph.backends.tree_cell import XpCells
    assert isinstance(CUDA.fused_cells, contract.FusedCells)
    ref, fc = XpCells(np), CUDA.fused_cells
    rng = np.random.default_rng(N)
    B, H, R = 5, 7, 16
    tol = dict(rtol=1e-12, atol=1e-14) if dt == np.float64 else dict(rtol=1e-5, atol=1e-6)
    pre = rng.standard_normal((B, (N + 3) * H)).astype(dt)
    bias = rng.standard_normal((N + 3) * H).astype(dt)
    kids = rng.standard_normal((N, B, H)).astype(dt)
    want = ref.treelstm_forward(pre, kids, bias=bias)
    got = fc.treelstm_forward(cupy.asarray(pre), cupy.asarray(kids), bias=cupy.asarray(bias))
    for a, b in zip(got, want):
        np.testing.assert_allclose(cupy.asnumpy(a), b, **tol)
    dh, dc = rng.standard_normal((B, H)).astype(dt), rng.standard_normal((B, H)).astype(dt)
    want_b = ref.treelstm_backward(want[2], kids, dh, dc)
    got_b = fc.treelstm_backward(cupy.asarray(want[2]), cupy.asarray(kids), cupy.asarray(dh), cupy.asarray(dc))
    for a, b in zip(got_b, want_b):
        if b is not None:
            np.testing.assert_allclose(cupy.asnumpy(a), b, **tol)
    if N:
        table = rng.standard_normal((R, H)).astype(dt)
        rows = rng.integers(0, 6, (N, B))
        rows[0, 1] = rows[0, 0]  # a repeated child: atomicAdd
        t_ref, t_dev = table.copy(), cupy.asarray(table)
        h0, c0, _ = ref.treelstm_forward(pre, t_ref, kid_rows=ref.KidRows(rows, R), out=(t_ref[8:8 + B], None, None))
        h1, c1, a1 = fc.treelstm_forward(cupy.asarray(pre), t_dev, kid_rows=fc.KidRows(rows, R),
                                         out=(t_dev[8:8 + B], None, None))
        np.testing.assert_allclose(cupy.asnumpy(t_dev), t_ref, **tol)
        g_ref, g_dev = np.zeros((R, H), dt), cupy.zeros((R, H), dt)
        ref.treelstm_backward(cupy.asnumpy(a1), t_ref, dh, kid_rows=ref.KidRows(rows, R), dc_table=g_ref)
        fc.treelstm_backward(a1, t_dev, cupy.asarray(dh), kid_rows=fc.KidRows(rows, R), dc_table=g_dev)
        np.testing.assert_allclose(cupy.asnumpy(g_dev), g_ref, **tol)
