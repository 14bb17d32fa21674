"""Backend selection, the numpy fallback when the extension is missing, and the
model-level check: a TreeLSTM-like graph gives the same loss and gradients on the
numpy and cpu backends under every scheduler."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import backends
from dynagraph.backends.numpy_backend import NumpyBackend

from ._util import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _patch_fn(monkeypatch, fake) -> None:
    """Replace the kernel lookup cpu._fn where each module of the cpu package calls it."""
    from dynagraph.backends import cpu
    for mod in (cpu.rows, cpu.elementwise, cpu.cells, cpu.optim, cpu.overrides):
        monkeypatch.setattr(mod, "_fn", fake)


@pytest.fixture
def fresh_backends(monkeypatch):
    """An empty backend cache (backends are cached per name); the backend set before is set again
    after (setting numpy here left every later test of the session on the numpy backend)."""
    saved = dy.config.get()["backend"]
    monkeypatch.setattr(backends, "_cache", {})
    yield backends._cache
    dy.config.set(backend=saved)


def test_missing_extension_falls_back_to_numpy_with_one_warning(monkeypatch, fresh_backends):
    monkeypatch.setitem(sys.modules, "dynagraph._kernels", None)  # makes the import fail
    monkeypatch.delitem(sys.modules, "dynagraph.backends.cpu", raising=False)
    with pytest.warns(RuntimeWarning, match="compiled kernels unavailable") as record:
        be = backends.get_backend("cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a second request must not warn again
            assert backends.get_backend("cpu") is be
    assert len(record) == 1
    assert type(be) is NumpyBackend and be.name == "numpy"
    dy.config.set(backend="cpu")
    assert dy.get_backend().name == "numpy"  # reports what actually runs
    dy.renew_cg()
    W = dy.ParameterCollection().add_parameters((2, 3))
    assert dy.tanh(W * dy.inputVector([1.0, 2.0, 3.0])).npvalue().shape == (2,)


def test_cpu_backend_is_selected_by_config(fresh_backends):
    kernels()
    dy.config.set(backend="cpu")
    be = dy.get_backend()
    assert be.name == "cpu" and be is dy.get_backend()
    assert "pickneglogsoftmax" in be.forward_kernels


def test_env_var_selects_cpu_backend():
    kernels()
    env = dict(os.environ, DYNAGRAPH_BACKEND="cpu")
    out = subprocess.run([sys.executable, "-c", "import dynagraph as dy; print(dy.get_backend().name)"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cpu"


# ----------------------------------------------------------- model-level parity
def _random_tree(rng, depth=0):
    if depth > 3 or rng.random() < 0.3:
        return int(rng.integers(0, 20))
    return (_random_tree(rng, depth + 1), _random_tree(rng, depth + 1))


TREES = [_random_tree(np.random.default_rng(i)) for i in range(6)]
H = 4


def _model():
    pc = dy.ParameterCollection()
    p = dict(E=pc.add_lookup_parameters((20, 3)), W=pc.add_parameters((3 * H, 3)), bW=pc.add_parameters(3 * H),
             U=pc.add_parameters((5 * H, 2 * H)), b=pc.add_parameters(5 * H), O=pc.add_parameters((5, H)),
             bO=pc.add_parameters(5), v=pc.add_parameters(H))
    return pc, p


def _encode(p, t):
    if isinstance(t, int):
        g = dy.affine_transform([p["bW"], p["W"], dy.lookup(p["E"], t)])
        i, o, u = (dy.logistic(dy.pick_range(g, k * H, (k + 1) * H)) for k in range(3))
        c = dy.cmult(i, dy.tanh(u))
        return dy.cmult(o, dy.tanh(c)), c
    (hl, cl), (hr, cr) = _encode(p, t[0]), _encode(p, t[1])
    g = dy.affine_transform([p["b"], p["U"], dy.concatenate([hl, hr])])
    i, fl, fr, o = (dy.logistic(dy.pick_range(g, k * H, (k + 1) * H)) for k in range(4))
    u = dy.tanh(dy.pick_range(g, 4 * H, 5 * H))
    c = dy.cmult(i, u) + dy.cmult(fl, cl) + dy.cmult(fr, cr)
    return dy.cmult(o, dy.tanh(c)) + dy.cmult(p["v"], dy.rectify(c)), c


def _loss_and_grads(scheduler: str):
    dy.reset_random_seed(7)
    pc, p = _model()
    dy.renew_cg(scheduler=scheduler)
    losses = []
    for k, t in enumerate(TREES):
        h, c = _encode(p, t)
        s = dy.affine_transform([p["bO"], p["O"], h])
        losses.append(dy.pickneglogsoftmax(s, k % 5) + dy.sum_elems(dy.softmax(s)) * 0.5
                      - dy.pick(dy.log_softmax(s), (k + 1) % 5) + dy.mean_elems(dy.square(c)))
    loss = dy.esum(losses)
    value = loss.value()
    loss.backward()
    grads = {q.name(): q.grad_as_array() for q in pc.parameters_list()}
    E = p["E"]
    grads["E"] = E.grad_as_array() * E.touched[:, None]
    _loss_and_grads.runs = loss.cg.stats.runs
    return value, grads


def _all_kernels_backend(monkeypatch):
    """A cpu backend that takes the C path for every batch, whatever its size."""
    from dynagraph.backends import cpu
    monkeypatch.setattr(cpu, "ADD_ROWS_MIN", 0)
    be = cpu.CpuBackend(install=False)
    be.forward_kernels.update(cpu.all_forward_kernels())
    be.backward_kernels.update(cpu.all_backward_kernels())
    return be


@pytest.mark.parametrize("scheduler", dy.schedulers.available())
@pytest.mark.parametrize("variant", ["installed", "all-kernels"])
def test_treelstm_like_graph_same_on_numpy_and_cpu(scheduler, variant, float64, fresh_backends, monkeypatch):
    """"installed": the cpu backend as shipped, elementwise stretches in runs (runs.py);
    "all-kernels": runs off and every op's own C kernel, whatever the batch size."""
    kernels()
    from dynagraph.backends import cpu
    dy.config.set(backend="numpy")
    ref_value, ref_grads = _loss_and_grads(scheduler)
    assert _loss_and_grads.runs == 0  # the reference backend runs op by op
    dy.config.set(fuse=variant == "installed")  # whatever DYNAGRAPH_FUSE says; restored afterwards
    if variant == "all-kernels":
        fresh_backends["cpu"] = _all_kernels_backend(monkeypatch)
    called = []
    real_fn = cpu._fn
    _patch_fn(monkeypatch, lambda name, dt: called.append(name) or real_fn(name, dt))
    dy.config.set(backend="cpu")
    assert dy.get_backend().name == "cpu"
    value, grads = _loss_and_grads(scheduler)
    np.testing.assert_allclose(value, ref_value, rtol=1e-10)
    assert grads.keys() == ref_grads.keys()
    for k in grads:
        np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-10, atol=1e-12, err_msg=k)
    if variant == "installed":
        assert _loss_and_grads.runs > 0
    else:  # the C kernels really ran, forward and backward
        want = {"dg_unary_fwd", "dg_unary_bwd", "dg_binary_fwd", "dg_binary_bwd", "dg_pnls_fwd",
                "dg_pnls_bwd", "dg_softmax_fwd", "dg_log_softmax_bwd", "dg_row_sums"}
        if scheduler != "none":
            want |= {"dg_gather_rows", "dg_scatter_add_rows"}
        if dy.get_backend().native_backward is not None:  # the compiled backward step calls these itself
            want -= {"dg_pnls_bwd", "dg_scatter_add_rows"}
        assert want <= set(called)


def test_float32_model_close_on_both_backends(fresh_backends, monkeypatch):
    kernels()
    dy.config.set(backend="numpy")
    ref_value, ref_grads = _loss_and_grads("agenda")
    fresh_backends["cpu"] = _all_kernels_backend(monkeypatch)
    dy.config.set(backend="cpu")
    value, grads = _loss_and_grads("agenda")
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for k in grads:
        np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-4, atol=1e-5, err_msg=k)
