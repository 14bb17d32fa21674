"""Elementwise, reduction and softmax-family kernels against the ops' numpy code,
forward and backward, float32 and float64, including batches of one and shared
(leading axis 1) operands."""
from __future__ import annotations

import numpy as np
import pytest

from dynagraph.ops.base import OPS

from ._util import DTYPES, close, kernels

kernels()
from dynagraph.backends import cpu  # noqa: E402

FWD = cpu.all_forward_kernels()  # min_size 0: every batch takes the C path
BWD = cpu.all_backward_kernels()


def _patch_fn(monkeypatch, fake) -> None:
    """Replace the kernel lookup cpu._fn where each module of the cpu package calls it."""
    for mod in (cpu.rows, cpu.elementwise, cpu.cells, cpu.optim, cpu.overrides):
        monkeypatch.setattr(mod, "_fn", fake)


def _arg(rng, name, shape, dt):
    x = rng.standard_normal(shape)
    if name in ("log", "sqrt"):
        x = np.abs(x) + 0.1
    return x.astype(dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", sorted(cpu.UNARY))
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (5, 33), (3, 2, 17), (0, 4)])
def test_unary_matches_op(dt, name, shape):
    rng = np.random.default_rng(0)
    op = OPS[name]
    x = _arg(rng, name, shape, dt)
    y_ref = op.forward(np, (), None, x)
    y = cpu.unary_forward(name, x)
    close(y, y_ref.astype(dt), dt)
    g = rng.standard_normal(shape).astype(dt)
    (gx_ref,) = op.backward(np, (), None, (x,), y_ref, g, (True,))
    close(cpu.unary_backward(name, x, y_ref, g), gx_ref.astype(dt), dt)
    # the op-level adapters give the same, forward and backward
    close(FWD[name](np, (), None, x), y_ref.astype(dt), dt)
    close(BWD[name](np, (), None, (x,), y_ref, g, (True,))[0], gx_ref.astype(dt), dt)


def test_unary_specials_follow_numpy():
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -100.0, 100.0, 1e-30, -1e-30]], np.float32)
    with np.errstate(all="ignore"):
        for name in ("tanh", "logistic", "exp", "rectify"):
            np.testing.assert_allclose(cpu.unary_forward(name, x), OPS[name].forward(np, (), None, x),
                                       rtol=2e-6, atol=1e-37)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", sorted(cpu.BINARY))
@pytest.mark.parametrize("leads", [(1, 1), (4, 4), (4, 1), (1, 4)])
@pytest.mark.parametrize("tail", [(6,), (2, 3)])
def test_binary_matches_op_with_shared_operands(dt, name, leads, tail):
    rng = np.random.default_rng(1)
    op = OPS[name]
    x = rng.standard_normal((leads[0],) + tail).astype(dt)
    y = (rng.standard_normal((leads[1],) + tail) + (3 if name == "cdiv" else 0)).astype(dt)
    out_ref = op.forward(np, (), None, x, y)
    close(cpu.binary_forward(name, x, y), out_ref, dt)
    close(FWD[name](np, (), None, x, y), out_ref, dt)
    B = max(leads) if max(leads) > 1 else 3  # both shared: a batch of 3 nodes computed the same
    out = np.ascontiguousarray(np.broadcast_to(out_ref, (B,) + tail))
    g = rng.standard_normal((B,) + tail).astype(dt)
    for need in ((True, True), (True, False), (False, True)):
        ref = op.backward(np, (), None, (x, y), out, g, need)
        got = BWD[name](np, (), None, (x, y), out, g, need)
        for r, c in zip(ref, got):
            assert (r is None) == (c is None)
            if r is not None:
                close(c, r, dt)


def test_binary_general_broadcast_falls_back_to_numpy():
    x = np.ones((2, 3, 4))
    y = np.full((2, 3, 1), 2.0)  # a per-node broadcast the kernel does not take
    np.testing.assert_array_equal(FWD["cmult"](np, (), None, x, y), OPS["cmult"].forward(np, (), None, x, y))
    with pytest.raises(ValueError):
        cpu.binary_forward("cmult", x, y)


@pytest.mark.parametrize("dt", DTYPES)
def test_esum_and_average(dt):
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((5, 3)).astype(dt), rng.standard_normal((1, 3)).astype(dt),
          rng.standard_normal((5, 3)).astype(dt)]
    close(FWD["esum"](np, (), None, *xs), OPS["esum"].forward(np, (), None, *xs), dt)
    close(cpu.sum_args(xs, 1 / 3), OPS["average"].forward(np, (), None, *xs), dt)
    close(cpu.sum_args(xs[:1]), xs[0], dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (4, 7), (3, 130), (2, 1000), (2, 3, 5)])
def test_row_and_col_sums(dt, shape):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(dt)
    # the pairwise order reproduces numpy's sum exactly
    np.testing.assert_array_equal(FWD["sum_elems"](np, (), None, x), OPS["sum_elems"].forward(np, (), None, x))
    close(FWD["mean_elems"](np, (), None, x), OPS["mean_elems"].forward(np, (), None, x), dt)
    np.testing.assert_array_equal(cpu.col_sums(x), x.sum(axis=0, keepdims=True))


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (6, 5), (3, 300)])
def test_softmax_family(dt, shape):
    rng = np.random.default_rng(4)
    x = (3 * rng.standard_normal(shape)).astype(dt)
    g = rng.standard_normal(shape).astype(dt)
    for name, attrs in (("softmax", (0,)), ("log_softmax", (None,))):
        op = OPS[name]
        y_ref = op.forward(np, attrs, None, x)
        close(FWD[name](np, attrs, None, x), y_ref, dt)
        (gx_ref,) = op.backward(np, attrs, None, (x,), y_ref, g, (True,))
        close(BWD[name](np, attrs, None, (x,), y_ref, g, (True,))[0], gx_ref, dt)


def test_restricted_log_softmax_backward_ignores_excluded_classes():
    x = np.array([[1.0, 2.0, 3.0, 0.5]])
    op = OPS["log_softmax"]
    y = op.forward(np, ((0, 2),), None, x)  # classes 1 and 3 get -inf
    g = np.array([[1.0, 5.0, -2.0, 7.0]])
    (ref,) = op.backward(np, ((0, 2),), None, (x,), y, g, (True,))
    np.testing.assert_allclose(cpu.log_softmax_backward(y, g), ref, rtol=1e-13)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("rows,n,shared", [(1, 1, False), (1, 5, False), (7, 5, False), (7, 5, True),
                                            (3, 200, False), (4, 9, True)])
def test_pickneglogsoftmax(dt, rows, n, shared):
    rng = np.random.default_rng(5)
    op = OPS["pickneglogsoftmax"]
    x = (2 * rng.standard_normal((1 if shared else rows, n))).astype(dt)
    labels = [int(i) for i in rng.integers(0, n, rows)]
    y_ref = op.forward(np, (), labels, x)
    close(FWD["pickneglogsoftmax"](np, (), labels, x), y_ref, dt)
    g = rng.standard_normal((rows, 1)).astype(dt)
    (gx_ref,) = op.backward(np, (), labels, (x,), y_ref, g, (True,))
    close(BWD["pickneglogsoftmax"](np, (), labels, (x,), y_ref, g, (True,))[0], gx_ref, dt)


def test_softmax_family_validation():
    with pytest.raises(IndexError):
        cpu.pickneglogsoftmax_forward(np.zeros((2, 3)), [0, 3])
    with pytest.raises(IndexError):
        cpu.pickneglogsoftmax_backward(np.zeros((2, 3)), [-1, 0], np.ones((2, 1)))
    with pytest.raises(ValueError):
        cpu.pickneglogsoftmax_forward(np.zeros((2, 3)), [0, 1, 2])  # 2 rows of scores, 3 labels
    with pytest.raises(ValueError):
        cpu.softmax_forward(np.zeros((2, 0)))
    with pytest.raises(ValueError):
        cpu.softmax_backward(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(TypeError):
        cpu.unary_forward("tanh", np.zeros(3, np.int64))
    with pytest.raises(ValueError):
        cpu.unary_forward("sin", np.zeros(3))


def test_installed_adapters_keep_small_batches_on_numpy(monkeypatch):
    """Below its measured threshold an installed adapter must not call the kernel."""
    fwd, bwd = cpu.installed_kernels()
    calls = []
    _patch_fn(monkeypatch, lambda *a: calls.append(a))
    x = np.ones((2, 3), np.float32)
    fwd["rectify"](np, (), None, x)
    bwd["tanh"](np, (), None, (x,), x, x, (True,))
    assert calls == []


def test_installed_logistic_forward_is_float32_only(monkeypatch):
    """The float32 logistic kernel beats numpy's three passes; float64 (libm per element)
    does not, so a float64 batch stays on numpy however large."""
    fwd, _ = cpu.installed_kernels()
    calls = []
    real = cpu._fn
    _patch_fn(monkeypatch, lambda *a: calls.append(a) or real(*a))
    x = np.linspace(-8, 8, 64 * 64).reshape(64, 64)
    np.testing.assert_allclose(fwd["logistic"](np, (), None, x.astype(np.float32)),
                               OPS["logistic"].forward(np, (), None, x), rtol=2e-6, atol=1e-7)
    assert [name for name, _ in calls] == ["dg_unary_fwd"]
    fwd["logistic"](np, (), None, x)
    assert len(calls) == 1
