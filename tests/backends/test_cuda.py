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
        dy.config.set(backend=backend)
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
            return W.npvalue(), E.npvalue()
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
