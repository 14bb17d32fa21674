"""The cpu backend's C adapters for the fused LSTM cell ops (ops/cells.py: lstm_c,
lstm_h) against the ops' numpy code, forward and backward, float32 and float64: the
unbroadcast batches the C path takes, and the shared-row batches it leaves to numpy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from dynagraph.ops.base import OPS

from ._util import DTYPES, close, kernels

kernels()
from dynagraph.backends import cpu  # noqa: E402

FWD, BWD = cpu.installed_kernels()


def _counting(monkeypatch, force: bool = True) -> list:
    """Record the C kernels the adapters call (cpu.overrides._fn); force: every float64
    batch size takes the C path (the installed limit is a speed choice, tested below)."""
    if force:
        monkeypatch.setattr(cpu.overrides, "LSTM_F64_MAX", 1 << 40)
    calls, real = [], cpu.overrides._fn

    def fn(name, dt):
        calls.append(name)
        return real(name, dt)
    monkeypatch.setattr(cpu.overrides, "_fn", fn)
    return calls


def _args(rng, dt, H, rows_pre, rows_c):
    pre = rng.uniform(-3, 3, (rows_pre, 4 * H)).astype(dt)
    c = rng.uniform(-2, 2, (rows_c, H)).astype(dt)
    return pre, c


def _check_grads(got, ref, need, dt):
    assert len(got) == len(ref)
    for gg, rr, nd in zip(got, ref, need):
        if nd:
            close(gg, rr, dt)
        else:
            assert gg is None


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("H,B", [(1, 1), (5, 3), (64, 2), (64, 1), (33, 7)])
@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("fb", [0.0, 1.0, -0.75])
def test_lstm_c_matches_op(monkeypatch, dt, H, B, first, fb):
    calls = _counting(monkeypatch)
    rng = np.random.default_rng(H * 10 + B)
    pre, c = _args(rng, dt, H, B, B)
    xs = (pre,) if first else (pre, c)
    a = (H, fb)
    y = FWD["lstm_c"](np, a, None, *xs)
    close(y, OPS["lstm_c"].forward(np, a, None, *xs), dt)
    g = rng.standard_normal((B, H)).astype(dt)
    for need in itertools.product((True, False), repeat=len(xs)):
        got = BWD["lstm_c"](np, a, None, xs, y, g, need)
        _check_grads(got, OPS["lstm_c"].backward(np, a, None, xs, y, g, need), need, dt)
    assert calls and set(calls) <= {"dg_lstmc_fwd", "dg_lstmc_bwd"}  # the C path ran


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("H,B", [(1, 1), (5, 3), (64, 2), (33, 7)])
def test_lstm_h_matches_op(monkeypatch, dt, H, B):
    calls = _counting(monkeypatch)
    rng = np.random.default_rng(H + B)
    pre, c = _args(rng, dt, H, B, B)
    a = (H,)
    y = FWD["lstm_h"](np, a, None, pre, c)
    close(y, OPS["lstm_h"].forward(np, a, None, pre, c), dt)
    g = rng.standard_normal((B, H)).astype(dt)
    for need in itertools.product((True, False), repeat=2):
        got = BWD["lstm_h"](np, a, None, (pre, c), y, g, need)
        _check_grads(got, OPS["lstm_h"].backward(np, a, None, (pre, c), y, g, need), need, dt)
    assert calls and set(calls) <= {"dg_lstmh_fwd", "dg_lstmh_bwd"}


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("rows_pre,rows_c", [(1, 4), (4, 1)])
def test_shared_rows_take_the_ops_numpy_code(monkeypatch, dt, rows_pre, rows_c):
    """A broadcast (shared) row: the op's own code, which reduces its gradient to one row."""
    calls = _counting(monkeypatch)
    rng = np.random.default_rng(7)
    H = 6
    pre, c = _args(rng, dt, H, rows_pre, rows_c)
    g = rng.standard_normal((4, H)).astype(dt)
    for name, a in (("lstm_c", (H, 1.0)), ("lstm_h", (H,))):
        y = FWD[name](np, a, None, pre, c)
        np.testing.assert_array_equal(y, OPS[name].forward(np, a, None, pre, c))
        got = BWD[name](np, a, None, (pre, c), y, g, (True, True))
        ref = OPS[name].backward(np, a, None, (pre, c), y, g, (True, True))
        for x, r in zip(got, ref):
            np.testing.assert_array_equal(x, r)
        assert got[0].shape == pre.shape and got[1].shape == c.shape
    assert calls == []


def test_non_contiguous_and_large_float64(monkeypatch):
    """Strided views are copied to contiguous rows; float64 batches past LSTM_F64_MAX stay numpy."""
    rng = np.random.default_rng(3)
    H = 4
    wide = rng.standard_normal((3, 8 * H))
    pre, c = wide[:, ::2], rng.standard_normal((3, 2 * H))[:, ::2]
    close(FWD["lstm_c"](np, (H, 1.0), None, pre, c), OPS["lstm_c"].forward(np, (H, 1.0), None, pre, c), np.float64)
    close(FWD["lstm_h"](np, (H,), None, pre, c), OPS["lstm_h"].forward(np, (H,), None, pre, c), np.float64)
    calls = _counting(monkeypatch, force=False)
    B = cpu.overrides.LSTM_F64_MAX // (4 * H) + 1
    pre, c = rng.standard_normal((B, 4 * H)), rng.standard_normal((B, H))
    np.testing.assert_array_equal(FWD["lstm_h"](np, (H,), None, pre, c), OPS["lstm_h"].forward(np, (H,), None, pre, c))
    assert calls == []
    FWD["lstm_h"](np, (H,), None, pre.astype(np.float32), c.astype(np.float32))
    assert calls == ["dg_lstmh_fwd"]
