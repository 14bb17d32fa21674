"""The VanillaLSTMBuilder fast path (_plain_step, _transduce) records exactly the nodes
the general path records, in the same order, so values and gradients are the same; and
everything it does not cover (dropout, layer norm, weight noise, blocks, odd inputs)
still takes the general path."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph.nn import rnn

COLUMNS = ("op", "args", "attrs", "data", "shape", "depth", "sig", "needs_grad")


def _record(build, general: bool, monkeypatch):
    with monkeypatch.context() as m:
        if general:
            m.setattr(rnn.VanillaLSTMBuilder, "_plain", lambda self, seq: False)
        cg = dy.renew_cg()
        loss = build()
        cols = {c: list(getattr(cg, c)) for c in COLUMNS}
        # a leaf's attrs hold its parameter: compare the parameter's name (two equal models)
        cols["attrs"] = [tuple(a.name() if hasattr(a, "name") else a for a in at) for at in cols["attrs"]]
        cols["data"] = [d.tolist() if isinstance(d, np.ndarray) else d for d in cols["data"]]  # input values
        value = loss.value()
        loss.backward()
    return cols, value


def _model(layers=2, fb=1.0, cls=rnn.VanillaLSTMBuilder, **kw):
    pc = dy.ParameterCollection()
    E = pc.lookup_parameters_from_numpy(np.random.default_rng(5).uniform(-1, 1, (20, 5)))
    lstm = cls(layers, 5, 4, pc, **kw) if cls is not rnn.VanillaLSTMBuilder else cls(layers, 5, 4, pc, forget_bias=fb)
    rng = np.random.default_rng(3)
    for ps in lstm.get_parameters():
        for p in ps:
            p.set_value(rng.uniform(-0.5, 0.5, p.shape()))
    return pc, E, lstm


@pytest.mark.parametrize("layers, fb", [(1, 1.0), (2, 1.0), (1, 0.0), (3, 0.5)])
@pytest.mark.parametrize("how", ["transduce", "add_input", "initial_vecs"])
def test_fast_path_records_the_general_paths_nodes(monkeypatch, layers, fb, how):
    dy.config.set(dtype="float64")
    pc, E, lstm = _model(layers, fb)
    words = [3, 1, 4, 1, 5, 9, 2]

    def build():
        xs = [E[w] for w in words]
        if how == "transduce":
            hs = lstm.initial_state().transduce(x for x in xs)  # any iterable, as in DyNet
        elif how == "add_input":
            s, hs = lstm.initial_state(), []
            for x in xs:
                s = s.add_input(x)
                hs.append(s.output())
        else:
            init = [dy.inputVector(np.linspace(-1, 1, 4) * (k + 1)) for k in range(2 * layers)]
            hs = lstm.initial_state(init).transduce(xs)
        return dy.esum([dy.sum_elems(dy.cmult(h, h)) for h in hs])

    fast, v_fast = _record(build, False, monkeypatch)
    g_fast = [p.grad.copy() for ps in lstm.get_parameters() for p in ps] + [E.grad_as_array().copy()]
    pc2, E2, lstm2 = _model(layers, fb)
    lstm, E = lstm2, E2
    general, v_general = _record(build, True, monkeypatch)
    g_general = [p.grad.copy() for ps in lstm.get_parameters() for p in ps] + [E.grad_as_array().copy()]
    assert fast == general
    assert v_fast == v_general
    for a, b in zip(g_fast, g_general):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_fast_path_matches_the_cell_formula():
    """h and c by hand (DyNet's VanillaLSTM, forget bias 1) in float64."""
    dy.config.set(dtype="float64")
    _, E, lstm = _model(1, 1.0)
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


def test_what_the_fast_path_does_not_cover_takes_the_general_path(monkeypatch):
    monkeypatch.setattr(rnn.VanillaLSTMBuilder, "_plain_step", lambda self, *a: pytest.fail("fast path taken"))
    _, E, lstm = _model(1, 1.0)
    dy.renew_cg()
    lstm.set_dropouts(0.3, 0.2)
    lstm.initial_state().transduce([E[1], E[2]])  # dropout
    lstm.disable_dropout()
    pc = dy.ParameterCollection()
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
    _, E, lstm = _model(1, 1.0)
    dy.renew_cg()
    with pytest.raises(dy.DynagraphError, match=r"add_input.*\(3,\)"):
        lstm.initial_state().transduce([E[1], dy.inputVector([1.0, 2.0, 3.0])])
    with pytest.raises(TypeError, match="expected an Expression"):
        lstm.initial_state().transduce([E[1], 3.0])
