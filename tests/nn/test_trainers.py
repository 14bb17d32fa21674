"""Trainers against hand-computed DyNet updates (dynet/training.cc)."""
import math

import numpy as np
import pytest

import dynagraph as dy


def _model(seed=0):
    rng = np.random.default_rng(seed)
    pc = dy.ParameterCollection()
    W = pc.add_parameters((2, 3), init=rng.normal(size=(2, 3)))
    b = pc.add_parameters(2, init=rng.normal(size=2))
    E = pc.add_lookup_parameters((5, 3), init=rng.normal(size=(5, 3)))
    return pc, {"W": W, "b": b, "E": E}


def _set_grads(ps, rng, scale, rows):
    """Dense gradients for W, b; sparse rows (duplicates add up) for E."""
    g = {k: (rng.normal(size=ps[k].values.shape) * scale).astype(np.float32) for k in ("W", "b")}
    for k in g:
        ps[k].grad[...] = g[k]
    vals = (rng.normal(size=(len(rows), 3)) * scale).astype(np.float32)
    ps["E"].add_sparse_grad(np.array(rows), vals)
    gE = np.zeros((5, 3))
    np.add.at(gE, np.array(rows), vals)
    g["E"] = gE
    return g


# ------------------------------------------------------- one parameter, by hand
def _one(trainer_cls, **kw):
    pc = dy.ParameterCollection()
    p = pc.add_parameters(1, init=np.array([1.0]))
    return p, trainer_cls(pc, **kw)


def _steps(p, t, grads):
    out = []
    for g in grads:
        p.grad[...] = g
        t.update()
        out.append(float(p.values[0]))
    return out


def test_sgd_by_hand():
    p, t = _one(dy.SimpleSGDTrainer, learning_rate=0.1)
    assert _steps(p, t, [0.5, -1.0]) == pytest.approx([0.95, 1.05])
    assert p.grad[0] == 0


def test_momentum_by_hand():
    p, t = _one(dy.MomentumSGDTrainer, learning_rate=0.1, mom=0.9)
    # v1 = -0.05, w = 0.95; v2 = 0.9 * -0.05 - 0.05 = -0.095, w = 0.855
    assert _steps(p, t, [0.5, 0.5]) == pytest.approx([0.95, 0.855], rel=1e-6)


def test_adagrad_by_hand():
    p, t = _one(dy.AdagradTrainer, learning_rate=0.1)
    # h1 = 0.25: w = 1 - 0.1 * 0.5 / 0.5; h2 = 0.5: w -= 0.1 * 0.5 / sqrt(0.5)
    assert _steps(p, t, [0.5, 0.5]) == pytest.approx([0.9, 0.9 - 0.05 / math.sqrt(0.5)], rel=1e-6)


def test_adagrad_eps_inside_sqrt():
    # A zero gradient on a zero accumulator: DyNet's sqrt(h + eps) keeps it finite (0 / 1e-10).
    p, t = _one(dy.AdagradTrainer, learning_rate=0.1)
    assert _steps(p, t, [0.0]) == [1.0]


def test_adam_by_hand():
    p, t = _one(dy.AdamTrainer, alpha=0.1)
    # With a constant gradient the bias-corrected step is exactly alpha (eps negligible).
    assert _steps(p, t, [0.5, 0.5, 0.5]) == pytest.approx([0.9, 0.8, 0.7], rel=1e-5)
    # A gradient change, with the moments written out as recurrences.
    m = v = 0.0
    for g in (0.5, 0.5, 0.5, -1.0):
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    lr_t = 0.1 * math.sqrt(1 - 0.999 ** 4) / (1 - 0.9 ** 4)
    assert _steps(p, t, [-1.0]) == pytest.approx([0.7 - lr_t * m / (math.sqrt(v) + 1e-8)], rel=1e-5)


def test_defaults_match_dynet():
    pc = dy.ParameterCollection()
    assert dy.SimpleSGDTrainer(pc).learning_rate == 0.1
    assert dy.MomentumSGDTrainer(pc).learning_rate == 0.01
    assert dy.MomentumSGDTrainer(pc).momentum == 0.9
    assert (dy.AdagradTrainer(pc).learning_rate, dy.AdagradTrainer(pc).epsilon) == (0.1, 1e-20)
    a = dy.AdamTrainer(pc)
    assert (a.learning_rate, a.beta_1, a.beta_2, a.epsilon) == (0.001, 0.9, 0.999, 1e-8)
    assert a.get_clip_threshold() == 5.0 and a.get_sparse_updates() is True


# --------------------------------------------------- a reference over a model
class Ref:
    """DyNet's rules written out in float64 over (rows of) whole arrays."""

    def __init__(self, kind, ps, **hp):
        self.kind, self.hp, self.t = kind, hp, 0
        self.w = {k: p.values.astype(np.float64) for k, p in ps.items()}
        self.s = {k: [np.zeros_like(w) for _ in range(2)] for k, w in self.w.items()}

    def step(self, g, rows, clip=5.0):
        sq = sum(float(np.sum(g[k] ** 2)) for k in ("W", "b")) + float(np.sum(g["E"][np.unique(rows)] ** 2))
        scale = clip / math.sqrt(sq) if clip and math.sqrt(sq) > clip else 1.0
        self.t += 1
        for k in self.w:
            idx = np.unique(rows) if k == "E" else slice(None)
            w, s0, s1 = self.w[k][idx], self.s[k][0][idx], self.s[k][1][idx]
            w, s0, s1 = self.rule(w, g[k][idx] * scale, s0, s1)
            self.w[k][idx], self.s[k][0][idx], self.s[k][1][idx] = w, s0, s1

    def rule(self, w, g, a, b):
        hp, t = self.hp, self.t
        if self.kind == "sgd":
            return w - hp["lr"] * g, a, b
        if self.kind == "momentum":
            a = hp["mom"] * a - hp["lr"] * g
            return w + a, a, b
        if self.kind == "adagrad":
            a = a + g * g
            return w - hp["lr"] * g / np.sqrt(a + 1e-20), a, b
        a = 0.9 * a + 0.1 * g
        b = 0.999 * b + 0.001 * g * g
        return w - hp["lr"] * math.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * a / (np.sqrt(b) + 1e-8), a, b


def _trainer(kind, pc, lr):
    return {"sgd": lambda: dy.SimpleSGDTrainer(pc, lr),
            "momentum": lambda: dy.MomentumSGDTrainer(pc, lr, mom=0.8),
            "adagrad": lambda: dy.AdagradTrainer(pc, lr),
            "adam": lambda: dy.AdamTrainer(pc, alpha=lr)}[kind]()


ROWS = [[0, 2, 2], [1], [2, 4], [0, 0]]  # row 3 is never touched


@pytest.mark.parametrize("clip", [5.0, 0.0])
@pytest.mark.parametrize("kind", ["sgd", "momentum", "adagrad", "adam"])
def test_several_steps_match_reference(kind, clip):
    pc, ps = _model()
    trainer = _trainer(kind, pc, 0.05)
    trainer.set_clip_threshold(clip)
    ref = Ref(kind, ps, lr=0.05, mom=0.8)
    rng = np.random.default_rng(1)
    untouched = ps["E"].values[3].copy()
    for step, rows in enumerate(ROWS):
        g = _set_grads(ps, rng, 4.0 if step % 2 else 0.3, rows)  # odd steps exceed the threshold
        ref.step(g, rows, clip)
        trainer.update()
        for k, p in ps.items():
            np.testing.assert_allclose(p.values, ref.w[k], rtol=1e-5, atol=1e-6, err_msg=f"{kind} step {step} {k}")
            assert not p.grad.any(), "gradients are cleared after the update"
    np.testing.assert_array_equal(ps["E"].values[3], untouched)
    assert trainer.clips == (2 if clip else 0)
    assert ps["E"].touched_rows().size == 0


def test_sparse_update_leaves_state_of_untouched_rows():
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((3, 1), init=np.zeros((3, 1)))
    t = dy.AdamTrainer(pc, alpha=0.1)
    E.add_sparse_grad(np.array([0]), np.array([[1.0]], np.float32))
    t.update()
    after1 = E.values.copy()
    E.add_sparse_grad(np.array([1]), np.array([[1.0]], np.float32))
    t.update()
    # Row 0 has a nonzero first moment, so any state update would have moved it.
    assert E.values[0, 0] == after1[0, 0] and E.values[2, 0] == 0
    E.add_sparse_grad(np.array([0]), np.array([[1.0]], np.float32))
    t.update()
    # Row 0's moments advanced twice (steps 1 and 3) but the bias correction uses t = 3.
    m = 0.9 * 0.1 + 0.1
    v = 0.999 * 0.001 + 0.001
    lr_t = 0.1 * math.sqrt(1 - 0.999 ** 3) / (1 - 0.9 ** 3)
    assert E.values[0, 0] == pytest.approx(after1[0, 0] - lr_t * m / (math.sqrt(v) + 1e-8), rel=1e-5)


def test_dense_lookup_updates_move_rows_with_momentum():
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((3, 1), init=np.zeros((3, 1)))
    t = dy.MomentumSGDTrainer(pc, learning_rate=0.1, mom=0.5)
    t.set_sparse_updates(False)
    assert t.get_sparse_updates() is False
    E.add_sparse_grad(np.array([0]), np.array([[1.0]], np.float32))
    t.update()
    t.update()  # no gradient: the velocity keeps moving row 0 (DyNet's dense update)
    assert E.values[:, 0] == pytest.approx([-0.1 - 0.05, 0, 0])


def test_learning_rate_change_and_restart():
    p, t = _one(dy.MomentumSGDTrainer, learning_rate=0.1, mom=0.5)
    _steps(p, t, [1.0])                      # v = -0.1, w = 0.9
    t.learning_rate = 0.2
    assert _steps(p, t, [1.0]) == pytest.approx([0.9 - 0.05 - 0.2])  # v = -0.25
    t.restart(0.01)                          # zero velocity, new rate
    assert t.learning_rate == 0.01
    assert _steps(p, t, [1.0]) == pytest.approx([0.65 - 0.01])
    t.set_learning_rate(0.5)
    assert t.learning_rate == 0.5
    with pytest.raises(ValueError):
        t.learning_rate = float("nan")


def test_clip_threshold_settings_and_status(capsys):
    p, t = _one(dy.SimpleSGDTrainer, learning_rate=1.0)
    t.set_clip_threshold(2.0)
    assert t.get_clip_threshold() == 2.0
    assert _steps(p, t, [-10.0]) == pytest.approx([3.0])   # clipped to norm 2
    t.set_clip_threshold(-1)                               # off, as in DyNet
    assert t.get_clip_threshold() == 0.0
    assert _steps(p, t, [-10.0]) == pytest.approx([13.0])
    t.status()
    assert capsys.readouterr().err == "[lr=1 clips=1 updates=2] "
    t.status()
    assert capsys.readouterr().err == "[lr=1 clips=0 updates=0] "
    t.update_epoch(1.0)
    assert "deprecated" in capsys.readouterr().err and t.learning_rate == 1.0
    assert t.whoami() == "SimpleSGDTrainer"


def test_clipping_uses_global_norm_over_all_parameters():
    pc = dy.ParameterCollection()
    a = pc.add_parameters(1, init=np.array([0.0]))
    E = pc.add_lookup_parameters((4, 1), init=np.zeros((4, 1)))
    t = dy.SimpleSGDTrainer(pc, learning_rate=1.0)
    a.grad[...] = 6.0
    E.add_sparse_grad(np.array([1, 1]), np.array([[4.0], [4.0]], np.float32))  # row 1: 8
    t.update()  # norm 10 > 5: everything scaled by 0.5
    assert a.values[0] == pytest.approx(-3.0) and E.values[1, 0] == pytest.approx(-4.0)


def test_frozen_parameters_are_skipped():
    pc, ps = _model()
    ps["W"].set_updated(False)
    before = {k: p.values.copy() for k, p in ps.items()}
    t = dy.SimpleSGDTrainer(pc)
    dy.renew_cg()
    x = dy.concatenate([ps["E"][1], dy.inputVector([1.0, 2.0, 3.0])])
    loss = dy.sum_elems(dy.tanh(ps["W"] * ps["E"][0] + ps["b"])) + dy.sum_elems(x)
    loss.backward()
    assert not ps["W"].grad.any()  # a frozen parameter gets no gradient
    t.update()
    np.testing.assert_array_equal(ps["W"].values, before["W"])
    assert not np.array_equal(ps["b"].values, before["b"])
    assert not np.array_equal(ps["E"].values[:2], before["E"][:2])
    np.testing.assert_array_equal(ps["E"].values[2:], before["E"][2:])


def test_update_from_a_real_graph_is_sgd_on_the_gradient():
    pc, ps = _model()
    t = dy.SimpleSGDTrainer(pc, learning_rate=0.1)
    t.set_clip_threshold(0)
    dy.renew_cg()
    h = dy.tanh(ps["W"] * (ps["E"][1] + ps["E"][3]) + ps["b"])
    loss = dy.pickneglogsoftmax(h, 1)
    loss.backward()
    expect = {k: p.values - 0.1 * p.grad for k, p in ps.items()}
    assert sorted(ps["E"].touched_rows()) == [1, 3]
    t.update()
    for k, p in ps.items():
        np.testing.assert_allclose(p.values, expect[k], rtol=1e-6, atol=1e-7)


def test_parameters_added_after_the_trainer_are_trained():
    pc = dy.ParameterCollection()
    t = dy.AdamTrainer(pc, alpha=0.1)
    p = pc.add_parameters(1, init=np.array([1.0]))
    assert _steps(p, t, [0.5]) == pytest.approx([0.9], rel=1e-5)


@pytest.mark.parametrize("clip", [5.0, 0.0])
def test_non_finite_gradient_raises_and_changes_nothing(clip):
    pc, ps = _model()
    t = dy.AdamTrainer(pc)
    t.set_clip_threshold(clip)
    before = {k: p.values.copy() for k, p in ps.items()}
    ps["W"].grad[...] = 1.0
    ps["b"].grad[1] = np.nan
    ps["E"].add_sparse_grad(np.array([2]), np.array([[np.inf, 0, 0]], np.float32))
    with pytest.raises(dy.NonFiniteError) as e:
        t.update()
    assert ps["b"].name() in str(e.value) and ps["E"].name() in str(e.value)
    assert ps["W"].name() not in str(e.value)
    for k, p in ps.items():
        np.testing.assert_array_equal(p.values, before[k])
    assert t.updates == 0


def test_huge_finite_gradient_is_clipped_not_rejected():
    # 1e20 squared overflows float32; the norm must be recomputed, not reported as non-finite.
    p, t = _one(dy.SimpleSGDTrainer, learning_rate=1.0)
    assert _steps(p, t, [1e20]) == pytest.approx([-4.0])


def test_values_arrays_are_updated_in_place():
    pc, ps = _model()
    ids = {k: id(p.values) for k, p in ps.items()}
    t = dy.AdamTrainer(pc)
    _set_grads(ps, np.random.default_rng(0), 1.0, [1])
    t.update()
    assert {k: id(p.values) for k, p in ps.items()} == ids


def test_trainer_needs_a_collection():
    with pytest.raises(TypeError, match="ParameterCollection"):
        dy.SimpleSGDTrainer([1, 2])


def test_dense_use_of_lookup_table_is_trained():
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((2, 1), init=np.zeros((2, 1)))
    t = dy.SimpleSGDTrainer(pc, learning_rate=1.0)
    dy.renew_cg()
    dy.sum_elems(dy.parameter(E)).backward()
    t.update()
    np.testing.assert_allclose(E.values, -1.0)
