"""Random ops: statistics of the draws, dropout's mask and scaling, noise, and
counter-based determinism (a node's draws depend only on its graph key and id)."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from refcheck import loss_weights, weighted_loss

N = 20000
SIGMAS = 5.0  # bounds below are 5 standard errors: deterministic seeds, and no flakiness


def _draw(make) -> np.ndarray:
    dy.renew_cg()
    return make().npvalue()


def test_random_normal_mean_and_std():
    v = _draw(lambda: dy.random_normal(N, mean=1.5, stddev=2.0))
    assert v.shape == (N,)
    assert abs(v.mean() - 1.5) < SIGMAS * 2.0 / np.sqrt(N)
    assert abs(v.std() - 2.0) < SIGMAS * 2.0 / np.sqrt(2 * N)
    assert abs(((v - 1.5) / 2.0 > 1.0).mean() - 0.158655) < 0.01   # a normal tail, not just two moments


def test_random_uniform_range_and_mean():
    v = _draw(lambda: dy.random_uniform((100, 200), -1.0, 3.0))
    assert v.shape == (100, 200)
    assert v.min() >= -1.0 and v.max() < 3.0
    assert abs(v.mean() - 1.0) < SIGMAS * 4.0 / np.sqrt(12 * v.size)
    hist = np.histogram(v, bins=4, range=(-1, 3))[0] / v.size
    np.testing.assert_allclose(hist, 0.25, atol=0.01)


def test_random_bernoulli_values_and_rate():
    v = _draw(lambda: dy.random_bernoulli(N, 0.3, scale=2.0))
    assert set(np.unique(v)) <= {0.0, 2.0}
    assert abs((v == 2.0).mean() - 0.3) < SIGMAS * np.sqrt(0.3 * 0.7 / N)


def test_dropout_mask_statistics_and_inverted_scaling():
    x = np.random.default_rng(0).uniform(0.5, 1.5, N)
    dy.renew_cg()
    y = dy.dropout(dy.inputTensor(x), 0.25).npvalue()
    kept = y != 0
    assert abs(1 - kept.mean() - 0.25) < SIGMAS * np.sqrt(0.25 * 0.75 / N)
    np.testing.assert_allclose(y[kept], x[kept] / 0.75, rtol=1e-12)   # kept entries scaled by 1/(1-p)
    assert abs(y.mean() - x.mean()) < 0.02                            # expectation preserved


def test_dropout_gradient_is_mask_times_scale(pc):
    x0 = np.random.default_rng(1).uniform(0.5, 1.5, 400)
    p = pc.add_parameters(x0.shape, init=x0.copy())
    dy.renew_cg()
    y = dy.dropout(dy.parameter(p), 0.5)
    w = loss_weights((400,))
    weighted_loss(y, w).backward()
    mask = (y.npvalue() != 0) * 2.0
    np.testing.assert_allclose(p.grad_as_array(), w * mask, rtol=1e-12)
    assert 0 < (mask == 0).sum() < 400


def test_dropout_zero_is_identity():
    dy.renew_cg()
    x = dy.inputVector([1.0, 2.0])
    assert dy.dropout(x, 0.0) is x


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_dropout_rejects_bad_rate(p):
    dy.renew_cg()
    with pytest.raises(dy.DynagraphError):
        dy.dropout(dy.inputVector([1.0]), p)


def test_noise_statistics_and_identity_gradient(pc):
    x0 = np.linspace(-1, 1, N)
    p = pc.add_parameters(x0.shape, init=x0.copy())
    dy.renew_cg()
    y = dy.noise(dy.parameter(p), 0.3)
    d = y.npvalue() - x0
    assert abs(d.mean()) < SIGMAS * 0.3 / np.sqrt(N)
    assert abs(d.std() - 0.3) < SIGMAS * 0.3 / np.sqrt(2 * N)
    w = loss_weights((N,))
    weighted_loss(y, w).backward()
    np.testing.assert_allclose(p.grad_as_array(), w, rtol=1e-12)


def test_draws_fixed_within_a_graph_and_fresh_across_graphs():
    dy.renew_cg()
    a, b = dy.random_normal(50), dy.random_normal(50)
    va, vb = a.npvalue(), b.npvalue()
    assert not np.allclose(va, vb)                       # two nodes draw independently
    np.testing.assert_array_equal(a.npvalue(recalculate=True), va)   # re-evaluation replays the draw
    dy.renew_cg()
    assert not np.allclose(dy.random_normal(50).npvalue(), va)       # a new graph draws afresh


def test_same_seed_same_draws():
    values = []
    for _ in range(2):
        dy.reset_random_seed(42)
        dy.renew_cg()
        values.append(dy.dropout(dy.inputTensor(np.ones(100)), 0.5).npvalue())
    np.testing.assert_array_equal(*values)


# ------------------------------------------------ dropout_dim / dropout_batch (DyNet's)
@pytest.mark.parametrize("d", [0, 1])
def test_dropout_dim_shares_one_draw_per_slice(d):
    x = np.random.default_rng(2).uniform(0.5, 1.5, (60, 500) if d == 0 else (500, 60))
    dy.renew_cg()
    y = dy.dropout_dim(dy.inputTensor(x), d, 0.3).npvalue()
    kept = y != 0
    # one draw per slice along d: every element along d shares its slice's fate
    assert (kept == kept.take([0], axis=d)).all()
    np.testing.assert_allclose(y[kept], x[kept] / 0.7, rtol=1e-12)
    slices = kept.take(0, axis=d)
    assert abs(1 - slices.mean() - 0.3) < SIGMAS * np.sqrt(0.3 * 0.7 / slices.size)


def test_dropout_batch_keeps_or_drops_whole_samples():
    x = np.random.default_rng(3).uniform(0.5, 1.5, (4, 3, 2000))   # 2000 samples of shape (4, 3)
    dy.renew_cg()
    y = dy.dropout_batch(dy.inputTensor(x, batched=True), 0.4).npvalue()
    kept = y != 0
    assert (kept == kept[:1, :1, :]).all()
    np.testing.assert_allclose(y[kept], x[kept] / 0.6, rtol=1e-12)
    assert abs(1 - kept[0, 0].mean() - 0.4) < SIGMAS * np.sqrt(0.4 * 0.6 / 2000)


def test_dropout_dim_and_batch_gradients_follow_the_mask(pc):
    x0 = np.random.default_rng(4).uniform(0.5, 1.5, (3, 40))
    p = pc.add_parameters(x0.shape, init=x0.copy())
    dy.renew_cg()
    y = dy.dropout_dim(dy.parameter(p), 0, 0.5) + dy.dropout_batch(dy.parameter(p), 0.5)
    w = loss_weights((3, 40))
    weighted_loss(y, w).backward()
    mask = y.npvalue() / x0   # the two masks' sum: 0, 2 or 4
    np.testing.assert_allclose(p.grad_as_array(), w * mask, rtol=1e-10)


@pytest.mark.parametrize("make", [lambda x: dy.dropout_dim(x, 1, 0.0), lambda x: dy.dropout_batch(x, 0.0)])
def test_dropout_dim_and_batch_at_zero_are_identity(make):
    dy.renew_cg()
    x = dy.inputVector([1.0, 2.0])
    assert make(x) is x


@pytest.mark.parametrize("bad", [lambda x: dy.dropout_dim(x, 0, 1.0), lambda x: dy.dropout_batch(x, -0.1),
                                 lambda x: dy.dropout_dim(x, 1, 0.5), lambda x: dy.dropout_dim(x, 0.5, 0.5)])
def test_dropout_dim_and_batch_reject_bad_arguments(bad):
    dy.renew_cg()
    with pytest.raises((dy.DynagraphError, TypeError), match="dropout_dim|dropout_batch"):
        bad(dy.inputVector([1.0, 2.0]))


def test_dropout_dim_and_batch_identical_under_every_scheduler():
    from refcheck import assert_same_run, run_graph

    def build(pc):
        W = pc.add_parameters((4, 3))
        outs = []
        for k in range(6):
            h = dy.parameter(W) * dy.inputVector([0.1 * k, -0.2, 0.3 + k])
            outs.append(dy.dropout_batch(dy.dropout_dim(dy.reshape(h, (2, 2)), k % 2, 0.5), 0.3))
        return outs

    runs = {s: run_graph(s, build) for s in dy.schedulers.available()}
    base = runs.pop("none")
    for run in runs.values():
        assert_same_run(base, run, rtol=1e-10, atol=1e-12)
    assert any((v == 0).any() for v in base.values) and any((v != 0).any() for v in base.values)
