"""The VanillaLSTMBuilder fast path (_plain_step, _transduce): the cell as the fused ops
lstm_c/lstm_h gives the values and gradients of the thirteen-node cell (the general
path, DyNet's formulation) to 1e-10 in float64, under every scheduler; and everything it
does not cover (dropout, layer norm, weight noise, blocks, odd inputs) still takes the
general path."""
from __future__ import annotations

import numpy as np
import pytest
from refcheck import assert_same_run, run_graph

import dynagraph as dy
from dynagraph.nn import rnn

SCHEDULERS = dy.schedulers.available()


def _model(pc, layers=2, fb=1.0, hidden=4):
    E = pc.lookup_parameters_from_numpy(np.random.default_rng(5).uniform(-1, 1, (20, 5)))
    lstm = rnn.VanillaLSTMBuilder(layers, 5, hidden, pc, forget_bias=fb)
    rng = np.random.default_rng(3)
    for ps in lstm.get_parameters():
        for p in ps:
            p.set_value(rng.uniform(-0.5, 0.5, p.shape()))
    return E, lstm


def _program(how: str, layers: int, fb: float):
    words = [[3, 1, 4, 1, 5, 9, 2], [6, 5, 3], [5]]

    def build(pc):
        E, lstm = _model(pc, layers, fb)
        outs = []
        for sent in words:  # several sentences in one graph: their steps batch together
            xs = [E[w] for w in sent]
            if how == "transduce":
                outs += lstm.initial_state().transduce(x for x in xs)  # any iterable, as in DyNet
            elif how == "add_input":
                s = lstm.initial_state()
                for x in xs:
                    s = s.add_input(x)
                    outs.append(s.output())
                outs += list(s.s())
            else:
                init = [dy.inputVector(np.linspace(-1, 1, 4) * (k + 1)) for k in range(2 * layers)]
                outs += lstm.initial_state(init).transduce(xs)
        return outs
    return build


@pytest.mark.parametrize("layers, fb", [(1, 1.0), (2, 1.0), (1, 0.0), (3, 0.5)])
@pytest.mark.parametrize("how", ["transduce", "add_input", "initial_vecs"])
def test_fused_cell_gives_the_thirteen_node_cells_values_and_gradients(monkeypatch, layers, fb, how):
    build = _program(how, layers, fb)
    fused = run_graph("none", build)
    # transduce from the initial state records whole steps (lstm_step); the rest the cell ops
    assert ({"lstm_step"} if how == "transduce" else {"lstm_c", "lstm_h"}) <= {op.name for op in fused.cg.op}
    with monkeypatch.context() as m:
        m.setattr(rnn.VanillaLSTMBuilder, "fused_cell", False)
        general = run_graph("none", build)
    assert not {"lstm_c", "lstm_step"} & {op.name for op in general.cg.op}
    assert len(fused.cg.op) < len(general.cg.op)
    assert_same_run(fused, general, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layers, fb", [(1, 1.0), (2, 0.5)])
def test_whole_steps_give_the_cell_ops_values_and_gradients(monkeypatch, layers, fb):
    """transduce's lstm_step nodes against the same steps as affine_transform, lstm_c and lstm_h."""
    build = _program("transduce", layers, fb)
    steps = run_graph("none", build)
    with monkeypatch.context() as m:
        m.setattr(rnn.VanillaLSTMBuilder, "fused_step", False)
        cells = run_graph("none", build)
    assert "lstm_step" in {op.name for op in steps.cg.op} and "lstm_step" not in {op.name for op in cells.cg.op}
    assert len(steps.cg.op) < len(cells.cg.op)
    assert_same_run(steps, cells, rtol=1e-10, atol=1e-12)


def _birnn_program(layers: int = 2):
    def build(pc):
        E = pc.lookup_parameters_from_numpy(np.random.default_rng(5).uniform(-1, 1, (20, 5)))
        birnn = dy.BiRNNBuilder(layers, 5, 8, pc, dy.VanillaLSTMBuilder)
        rng = np.random.default_rng(3)
        for fb in birnn.builder_layers:
            for b in fb:
                for p in b.get_parameters()[0]:
                    p.set_value(rng.uniform(-0.5, 0.5, p.shape()))
        outs = []
        for sent in ([3, 1, 4, 1, 5, 9, 2], [6, 5, 3], [5]):  # several sentences in one graph
            outs += birnn.transduce([E[w] for w in sent])
        return outs
    return build


@pytest.mark.parametrize("layers", [1, 2])
def test_bidirectional_steps_give_the_cell_ops_values_and_gradients(monkeypatch, layers):
    """BiRNNBuilder's layers as one chain of two-direction lstm_step nodes against each
    direction's own affine_transform, lstm_c and lstm_h nodes."""
    build = _birnn_program(layers)
    paired = run_graph("none", build)
    assert any(op.name == "lstm_step" and len(a) == 3 for op, a in zip(paired.cg.op, paired.cg.attrs))
    with monkeypatch.context() as m:
        m.setattr(rnn.VanillaLSTMBuilder, "fused_step", False)
        cells = run_graph("none", build)
    assert "lstm_step" not in {op.name for op in cells.cg.op}
    assert_same_run(paired, cells, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_bidirectional_steps_are_scheduler_invariant(scheduler):
    build = _birnn_program(2)
    assert_same_run(run_graph(scheduler, build), run_graph("none", build), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_whole_steps_are_scheduler_invariant(scheduler):
    build = _program("transduce", 2, 1.0)
    assert_same_run(run_graph(scheduler, build), run_graph("none", build), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_fused_cell_is_scheduler_invariant(scheduler):
    build = _program("add_input", 2, 1.0)
    assert_same_run(run_graph(scheduler, build), run_graph("none", build), rtol=1e-10, atol=1e-12)


def test_fused_cell_matches_the_cell_formula():
    """h and c by hand (DyNet's VanillaLSTM, forget bias 1) in float64."""
    dy.config.set(dtype="float64")
    E, lstm = _model(dy.ParameterCollection(), 1, 1.0)
    Wx, Wh, b = (p.as_array() for p in lstm.get_parameters()[0])
    dy.renew_cg()
    hs = lstm.initial_state().transduce([E[2], E[7]])
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    h, c = np.zeros(4), np.zeros(4)
    for w, out in zip((2, 7), hs):
        pre = b + Wx @ E.as_array()[w] + Wh @ h
        i, f, o, g = sig(pre[:4]), sig(pre[4:8] + 1.0), sig(pre[8:12]), np.tanh(pre[12:])
        c = f * c + i * g
        h = o * np.tanh(c)
        np.testing.assert_allclose(out.npvalue(), h, rtol=1e-12, atol=1e-14)


def _noisy(what: str, premade_masks: bool = False):
    def build(pc):
        E = pc.lookup_parameters_from_numpy(np.random.default_rng(5).uniform(-1, 1, (20, 5)))
        cls = rnn.CompactVanillaLSTMBuilder if what == "weightnoise" else rnn.VanillaLSTMBuilder
        lstm = cls(2, 5, 4, pc)
        if what == "dropout":
            lstm.set_dropouts(0.3, 0.2)
        else:
            lstm.set_weightnoise(0.1)
        s = lstm.initial_state()
        if premade_masks:  # random nodes before any cell node: the same node ids (keys) in both cells
            for i in range(2):
                s._seq.mask((i, "x"), 5 if i == 0 else 4, 0.3)
                s._seq.mask((i, "h"), 4, 0.2)
        return s.transduce([E[w] for w in (1, 2, 3)])
    return build


def test_the_general_path_uses_the_fused_cell_too(monkeypatch):
    """With dropout the fused cell gives the thirteen-node cell's values and gradients for
    the same masks. (Masks are keyed by node id, so recorded as they come they differ
    between the two cells, as DyNet's own draws differ from run to run.)"""
    build = _noisy("dropout", premade_masks=True)
    fused = run_graph("none", build)
    assert "lstm_c" in {op.name for op in fused.cg.op}
    with monkeypatch.context() as m:
        m.setattr(rnn.VanillaLSTMBuilder, "fused_cell", False)
        general = run_graph("none", build)
    assert "lstm_c" not in {op.name for op in general.cg.op}
    assert_same_run(fused, general, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("what", ["dropout", "weightnoise"])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_the_fused_cell_with_noise_is_scheduler_invariant(what, scheduler):
    build = _noisy(what)
    run = run_graph(scheduler, build)
    assert "lstm_c" in {op.name for op in run.cg.op}
    assert_same_run(run, run_graph("none", build), rtol=1e-10, atol=1e-12)


def test_what_the_fast_path_does_not_cover_takes_the_general_path(monkeypatch):
    monkeypatch.setattr(rnn.VanillaLSTMBuilder, "_plain_step", lambda self, *a: pytest.fail("fast path taken"))
    pc = dy.ParameterCollection()
    E, lstm = _model(pc, 1, 1.0)
    dy.renew_cg()
    lstm.set_dropouts(0.3, 0.2)
    lstm.initial_state().transduce([E[1], E[2]])  # dropout
    ln = rnn.VanillaLSTMBuilder(1, 5, 4, pc, ln_lstm=True)
    ln.initial_state().transduce([E[1]])  # layer norm
    compact = rnn.CompactVanillaLSTMBuilder(1, 5, 4, pc)
    compact.set_weightnoise(0.1)
    compact.initial_state().transduce([E[1]])  # weight noise
    blocked = rnn.VanillaLSTMBuilder(1, 5, 4, pc)
    blocked.set_blocked(True)
    s = blocked.initial_state().add_input(E[1])
    s.add_input(E[2]).output().value()  # a static-subgraph step


def test_bad_inputs_still_raise_through_transduce():
    E, lstm = _model(dy.ParameterCollection(), 1, 1.0)
    dy.renew_cg()
    with pytest.raises(dy.DynagraphError, match=r"add_input.*\(3,\)"):
        lstm.initial_state().transduce([E[1], dy.inputVector([1.0, 2.0, 3.0])])
    with pytest.raises(TypeError, match="expected an Expression"):
        lstm.initial_state().transduce([E[1], 3.0])
    x = dy.reshape(E[1], (5, 1))  # a column vector is reshaped, as before
    assert len(lstm.initial_state().transduce([x, x])) == 2


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("how", ["transduce", "initial_vecs"])
def test_hoisted_inputs_give_the_per_step_values_and_gradients(monkeypatch, layers, how):
    """transduce() records every step's W_x x + b before the recurrence (hoist_inputs): the
    values and gradients of the per-step affine_transform([b, W_x, x, W_h, h]), to 1e-10 in
    float64, with one input product per word and layer either way."""
    build = _program(how, layers, 1.0)
    hoisted = run_graph("none", build)
    with monkeypatch.context() as m:
        m.setattr(rnn.VanillaLSTMBuilder, "hoist_inputs", False)
        per_step = run_graph("none", build)
    def n_products(run):  # affine nodes, and the W_h h_prev inside each later lstm_step
        return sum(op.name == "affine" or (op.name == "lstm_step" and len(run.cg.args[i]) == 3)
                   for i, op in enumerate(run.cg.op))
    assert n_products(hoisted) > n_products(per_step)  # the step's W_h h is a product of its own
    assert_same_run(hoisted, per_step, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_hoisted_inputs_are_scheduler_invariant(scheduler):
    build = _program("transduce", 2, 1.0)
    assert_same_run(run_graph(scheduler, build), run_graph("none", build), rtol=1e-10, atol=1e-12)
