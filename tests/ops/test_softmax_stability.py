"""The softmax family is stable for any finite logits, forward and backward.

Every implementation (the numpy reference op, the C kernels behind the cpu backend,
and the end-to-end graph on both backends) is compared with an extended-precision
reference at logits up to 1e30 (float32) and 1e300 (float64). The old formula
x - (m + log(sum)) loses the log-sum once |m| dwarfs it: softmax([1e8, 1e8, 0])
came out as [1, 1, 0] and its pickneglogsoftmax as 0.
"""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph.backends import cpu
from dynagraph.ops import OPS

from refcheck import using

TINY = {np.float32: 1e-6, np.float64: 1e-14}
SCALES = {np.float32: [1.0, 1e4, 1e8, 1e20, 1e30], np.float64: [1.0, 1e8, 1e16, 1e100, 1e300]}


def _ref(x):
    """(log_softmax, softmax) in long double, from the same (rounded) logits."""
    z = x.astype(np.longdouble)
    z = z - z.max(axis=1, keepdims=True)
    ls = np.log(np.exp(z).sum(axis=1, keepdims=True))
    return z - ls, np.exp(z - ls)


def _logits(dt, scale, rows=6, n=7, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (rows, n)) * scale
    x[0, :3] = [scale, scale, 0.0]          # the probe, scaled
    x[1, 2] = x[1, 5] = x[1].max()          # ties at the maximum
    x[2] = -scale                           # all equal, all very negative
    return x.astype(dt)


def _close(got, want, dt, what):
    want = want.astype(np.float64)
    tol = TINY[dt] * np.maximum(1.0, np.abs(want))
    bad = np.abs(np.asarray(got, np.float64) - want) > tol
    assert not bad.any(), f"{what}: got {np.asarray(got)[bad][:4]}, want {want[bad][:4]}"


IMPLS = {
    "numpy": (lambda x: OPS["softmax"].forward(np, (0,), None, x),
              lambda x: OPS["log_softmax"].forward(np, (None,), None, x),
              lambda x, lab: OPS["pickneglogsoftmax"].forward(np, (), lab, x),
              lambda y, g: OPS["softmax"].backward(np, (0,), None, None, y, g, (True,))[0],
              lambda y, g: OPS["log_softmax"].backward(np, (None,), None, None, y, g, (True,))[0],
              lambda x, lab, g: OPS["pickneglogsoftmax"].backward(np, (), lab, (x,), None, g, (True,))[0]),
    "C": (cpu.softmax_forward, cpu.log_softmax_forward, cpu.pickneglogsoftmax_forward,
          cpu.softmax_backward, cpu.log_softmax_backward, cpu.pickneglogsoftmax_backward),
}


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("dt", [np.float32, np.float64], ids=["f32", "f64"])
def test_forward_and_backward_match_extended_precision(impl, dt):
    sm, lsm, pnls, sm_b, lsm_b, pnls_b = IMPLS[impl]
    for scale in SCALES[dt]:
        x = _logits(dt, scale)
        want_l, want_p = _ref(x)
        labels = np.arange(x.shape[0]) % x.shape[1]
        y = sm(x)
        _close(y, want_p, dt, f"softmax at {scale}")
        np.testing.assert_allclose(y.astype(np.float64).sum(axis=1), 1.0, rtol=0, atol=8 * TINY[dt])
        _close(lsm(x), want_l, dt, f"log_softmax at {scale}")
        _close(pnls(x, labels)[:, 0], -want_l[np.arange(len(labels)), labels], dt, f"pnls at {scale}")
        # backward from the (exact) forward outputs, against long-double formulas
        g = np.random.default_rng(1).uniform(-1, 1, x.shape).astype(dt)
        pr = want_p.astype(dt)
        gl = g.astype(np.longdouble)
        pl = pr.astype(np.longdouble)
        _close(sm_b(pr, g), pl * (gl - (gl * pl).sum(axis=1, keepdims=True)), dt, f"softmax bwd at {scale}")
        _close(lsm_b(want_l.astype(dt), g), gl - np.exp(want_l.astype(dt).astype(np.longdouble))
               * gl.sum(axis=1, keepdims=True), dt, f"log_softmax bwd at {scale}")
        gr = g[:, :1].copy()
        onehot = np.eye(x.shape[1])[labels]
        _close(pnls_b(x, labels, gr), (want_p - onehot) * gr.astype(np.longdouble), dt, f"pnls bwd at {scale}")


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("dtype,big", [("float32", 1e30), ("float64", 1e300)])
def test_graph_end_to_end(backend, dtype, big):
    """The issue's probes through the graph (batched, so the cpu backend's kernels run)."""
    saved = dy.config.config.backend
    dy.config.config.backend = backend
    try:
        with using(dtype=dtype):
            for scale in (1e8, big):
                dy.renew_cg()
                xs = [dy.inputVector([scale, scale, 0.0] + [0.0] * 61) for _ in range(40)]
                sm = [dy.softmax(x) for x in xs]
                nl = [dy.pickneglogsoftmax(x, 0) for x in xs]
                lsm = [dy.log_softmax(x) for x in xs]
                loss = dy.esum(nl)
                np.testing.assert_allclose(sm[0].npvalue()[:3], [0.5, 0.5, 0.0], rtol=1e-6)
                np.testing.assert_allclose(nl[3].value(), np.log(2), rtol=1e-6)
                np.testing.assert_allclose(lsm[5].npvalue()[:2], [-np.log(2)] * 2, rtol=1e-6)
                loss.backward(full=True)
                np.testing.assert_allclose(xs[0].gradient()[:3], [-0.5, 0.5, 0.0], atol=1e-6)
    finally:
        dy.config.config.backend = saved
