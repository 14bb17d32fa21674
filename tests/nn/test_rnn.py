"""RNN builders against hand-written numpy cells (float64), plus state, dropout,
BiRNN, spec and error behaviour."""
import json

import numpy as np
import pytest

import dynagraph as dy
from dynagraph.nn.rnn import BUILDER_TYPES

IN, HID, LAYERS, STEPS = 3, 4, 2, 4


@pytest.fixture
def f64():
    dy.config.set(dtype="float64")
    dy.renew_cg()
    yield
    dy.config.set(dtype="float32")
    dy.renew_cg()


def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def layer_norm(x, g, b):
    return g * (x - x.mean()) / (x.std() + 1e-8) + b


# ------------------------------------------------------------- numpy reference cells
# Each takes one layer's parameter arrays, the input and the previous (h, c) or None.
def np_simple(P, x, prev):
    Wx, Wh, b = P
    return np.tanh(Wx @ x + b + (Wh @ prev[0] if prev else 0)), None


def np_gru(P, x, prev):
    Wzx, Wzh, bz, Wrx, Wrh, br, Whx, Whh, bh = P
    h = prev[0] if prev else np.zeros(len(bz))
    z = sig(Wzx @ x + Wzh @ h + bz)
    r = sig(Wrx @ x + Wrh @ h + br)
    cand = np.tanh(Whx @ x + Whh @ (r * h) + bh)
    return (1 - z) * h + z * cand, None


def np_vanilla(P, x, prev, forget_bias=1.0, ln=None):
    Wx, Wh, b = P
    n = len(b) // 4
    h, c = prev if prev else (np.zeros(n), np.zeros(n))
    if ln is None:
        a = Wx @ x + Wh @ h + b
    else:
        gh, bh, gx, bx, gc, bc = ln
        a = b + layer_norm(Wx @ x, gx, bx) + (layer_norm(Wh @ h, gh, bh) if prev else 0)
    i, f, o, g = sig(a[:n]), sig(a[n:2 * n] + forget_bias), sig(a[2 * n:3 * n]), np.tanh(a[3 * n:])
    c = f * c + i * g
    return o * np.tanh(c if ln is None else layer_norm(c, gc, bc)), c


def np_coupled(P, x, prev):
    Wix, Wih, Wic, bi, Wox, Woh, Woc, bo, Wcx, Wch, bc = P
    h, c = prev if prev else (np.zeros(len(bi)), np.zeros(len(bi)))
    i = sig(Wix @ x + Wih @ h + Wic @ c + bi)
    c = (1 - i) * c + i * np.tanh(Wcx @ x + Wch @ h + bc)
    o = sig(Wox @ x + Woh @ h + Woc @ c + bo)
    return o * np.tanh(c), c


def np_run(cell, params, xs, init=None):
    """All layers' (h, c) after each step; init: per-layer (h, c) or None."""
    prev, out = init, []
    for x in xs:
        cur = []
        for i, P in enumerate(params):
            h, c = cell(P, x, prev[i] if prev else None)
            cur.append((h, c))
            x = h
        out.append(cur)
        prev = cur
    return out


def randomize(model, rng):
    """Random values everywhere (biases too, so every bias path is exercised)."""
    for p in model.parameters_list():
        p.set_value(rng.uniform(-0.6, 0.6, p.shape()))


def arrays(builder):
    return [[p.as_array() for p in ps] for ps in builder.get_parameters()]


CASES = [
    ("SimpleRNNBuilder", (), np_simple),
    ("GRUBuilder", (), np_gru),
    ("VanillaLSTMBuilder", (), np_vanilla),
    ("VanillaLSTMBuilder", (False, 0.0), lambda P, x, p: np_vanilla(P, x, p, 0.0)),
    ("VanillaLSTMBuilder", (False, 0.7), lambda P, x, p: np_vanilla(P, x, p, 0.7)),
    ("LSTMBuilder", (), np_vanilla),
    ("CoupledLSTMBuilder", (), np_coupled),
]
IDS = [f"{n}{a}" for n, a, _ in CASES]


def build(name, args=(), layers=LAYERS, seed=0):
    m = dy.ParameterCollection()
    b = getattr(dy, name)(layers, IN, HID, m, *args)
    randomize(m, np.random.default_rng(seed))
    return m, b


def inputs(rng, n=STEPS, dim=IN):
    return [rng.uniform(-1, 1, dim) for _ in range(n)]


@pytest.mark.parametrize("name,args,cell", CASES, ids=IDS)
@pytest.mark.parametrize("with_init", [False, True])
def test_matches_numpy_cell(f64, name, args, cell, with_init):
    m, b = build(name, args)
    rng = np.random.default_rng(1)
    xs = inputs(rng)
    lstm = b._has_cell
    init = [(rng.uniform(-1, 1, HID), rng.uniform(-1, 1, HID) if lstm else None) for _ in range(LAYERS)]
    if with_init:
        vecs = [c for _, c in init] + [h for h, _ in init] if lstm else [h for h, _ in init]
        s0 = b.initial_state([dy.inputVector(v) for v in vecs])
    else:
        s0 = b.initial_state()
    states = s0.add_inputs([dy.inputVector(x) for x in xs])
    want = np_run(cell, arrays(b), xs, init if with_init else None)
    for st, ref in zip(states, want):
        for layer, (h, c) in enumerate(ref):
            np.testing.assert_allclose(st.h()[layer].npvalue(), h, rtol=1e-10, atol=1e-12)
            if lstm:
                np.testing.assert_allclose(st.s()[layer].npvalue(), c, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(st.output().npvalue(), ref[-1][0], rtol=1e-10, atol=1e-12)


def test_layer_norm_lstm_matches_numpy(f64):
    m, b = build("VanillaLSTMBuilder", (True, 1.0))
    rng = np.random.default_rng(2)
    xs = inputs(rng)
    lns = [[p.as_array() for p in ps] for ps in b.ln_params]
    prev, want = None, []
    for x in xs:
        cur = []
        for i, P in enumerate(arrays(b)):
            cur.append(np_vanilla(P, x, prev[i] if prev else None, 1.0, lns[i]))
            x = cur[-1][0]
        want.append(cur)
        prev = cur
    outs = b.initial_state().transduce([dy.inputVector(x) for x in xs])
    for o, ref in zip(outs, want):
        np.testing.assert_allclose(o.npvalue(), ref[-1][0], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name,args,cell", CASES, ids=IDS)
def test_transduce_equals_add_inputs(f64, name, args, cell):
    _, b = build(name, args)
    xs = [dy.inputVector(x) for x in inputs(np.random.default_rng(3))]
    s0 = b.initial_state()
    a = [o.npvalue() for o in s0.transduce(xs)]
    c = [s.output().npvalue() for s in s0.add_inputs(xs)]
    step, chained = s0, []
    for x in xs:
        step = step.add_input(x)
        chained.append(step.output().npvalue())
    np.testing.assert_array_equal(np.array(c), np.array(chained))
    if getattr(b, "hoist_inputs", False):  # the same sums, added in another order (rnn.py)
        np.testing.assert_allclose(np.array(a), np.array(c), rtol=1e-12, atol=1e-14)
    else:
        np.testing.assert_array_equal(np.array(a), np.array(c))


def test_state_accessors():
    _, b = build("VanillaLSTMBuilder")
    s0 = b.initial_state()
    assert s0.h() == () and s0.s() == () and s0.output() is None and s0.prev() is None
    s1 = s0.add_input(dy.inputVector([1.0, 2.0, 3.0]))
    assert s1.prev() is s0 and s1.b() is b
    assert len(s1.h()) == LAYERS and len(s1.s()) == 2 * LAYERS
    assert s1.s()[LAYERS:] == s1.h()  # (c_1..c_L, h_1..h_L)
    assert s1.output() is s1.h()[-1]


@pytest.mark.parametrize("name", ["VanillaLSTMBuilder", "CoupledLSTMBuilder"])
def test_lstm_set_s_equals_initial_state(name):
    _, b = build(name)
    rng = np.random.default_rng(4)
    vecs = [dy.inputVector(rng.uniform(-1, 1, HID)) for _ in range(2 * LAYERS)]
    x = dy.inputVector(rng.uniform(-1, 1, IN))
    via_init = b.initial_state(vecs).add_input(x).output().npvalue()
    s = b.initial_state().set_s(vecs)
    assert s.s() == tuple(vecs)
    np.testing.assert_allclose(s.add_input(x).output().npvalue(), via_init, rtol=1e-6)
    # set_h keeps the cell: here zeros, so it equals an initial state with c = 0
    z = [dy.zeros(HID) for _ in range(LAYERS)]
    via_h = b.initial_state(z + vecs[LAYERS:]).add_input(x).output().npvalue()
    np.testing.assert_allclose(b.initial_state().set_h(vecs[LAYERS:]).add_input(x).output().npvalue(),
                               via_h, rtol=1e-6)


@pytest.mark.parametrize("name", ["SimpleRNNBuilder", "GRUBuilder"])
def test_set_h_equals_initial_state(name):
    _, b = build(name)
    rng = np.random.default_rng(5)
    hs = [dy.inputVector(rng.uniform(-1, 1, HID)) for _ in range(LAYERS)]
    x = dy.inputVector(rng.uniform(-1, 1, IN))
    s = b.initial_state().set_h(hs)
    assert s.h() == tuple(hs) and s.s() == tuple(hs) and s.output() is hs[-1]
    np.testing.assert_allclose(s.add_input(x).output().npvalue(),
                               b.initial_state(hs).add_input(x).output().npvalue(), rtol=1e-6)


# ----------------------------------------------------------------------- batching
@pytest.mark.parametrize("name,args,cell", CASES, ids=IDS)
def test_many_sequences_in_one_graph_equal_one_per_graph(name, args, cell):
    _, b = build(name, args)
    rng = np.random.default_rng(6)
    seqs = [inputs(rng, n) for n in (3, 1, 4)]
    alone = []
    for xs in seqs:
        dy.renew_cg()
        alone.append([o.npvalue() for o in b.initial_state().transduce([dy.inputVector(x) for x in xs])])
    dy.renew_cg()
    outs = [b.initial_state().transduce([dy.inputVector(x) for x in xs]) for xs in seqs]
    dy.esum([o for os_ in outs for o in os_]).forward()
    for got, want in zip(outs, alone):
        np.testing.assert_allclose(np.array([o.npvalue() for o in got]), np.array(want), rtol=1e-5, atol=1e-6)


def test_update_false_gives_no_parameter_gradients():
    m, b = build("VanillaLSTMBuilder")
    dy.renew_cg()
    loss = dy.sum_elems(b.initial_state(update=False).transduce([dy.inputVector([1.0, 2.0, 3.0])] * 2)[-1])
    x = m.add_parameters((1,))
    (loss + dy.parameter(x)).backward()
    assert x.grad_as_array().any()  # the backward pass did run
    assert all(not p.grad_as_array().any() for ps in b.get_parameters() for p in ps)
    dy.renew_cg()
    dy.sum_elems(b.initial_state().transduce([dy.inputVector([1.0, 2.0, 3.0])])[-1]).backward()
    assert any(p.grad_as_array().any() for ps in b.get_parameters() for p in ps)


# ------------------------------------------------------------------------ dropout
def _outs(b, xs, fresh_graph=True):
    if fresh_graph:
        dy.renew_cg()
    return np.array([o.npvalue() for o in b.initial_state().transduce([dy.inputVector(x) for x in xs])])


@pytest.mark.parametrize("name", ["SimpleRNNBuilder", "GRUBuilder",
                                  "VanillaLSTMBuilder", "CoupledLSTMBuilder"])
def test_dropout_disabled_is_identity_and_enabled_changes_outputs(name):
    _, b = build(name)
    xs = inputs(np.random.default_rng(7))
    base = _outs(b, xs)
    b.set_dropout(0.0)
    np.testing.assert_array_equal(_outs(b, xs), base)
    b.set_dropout(0.5)
    dropped = _outs(b, xs)
    assert not np.allclose(dropped, base)
    b.disable_dropout()
    np.testing.assert_array_equal(_outs(b, xs), base)


def test_variational_masks_are_tied_across_steps_and_fresh_per_sequence():
    m = dy.ParameterCollection()
    b = dy.SimpleRNNBuilder(1, 40, 40, m)
    W_x, W_h, bias = b.get_parameters()[0]
    W_x.set_value(np.eye(40))
    W_h.set_value(np.zeros((40, 40)))  # h_t = tanh(mask * x_t): the mask shows through
    b.set_dropouts(0.5, 0.0)
    x = np.full(40, 0.5)
    dy.renew_cg()
    seq1 = np.array([o.npvalue() for o in b.initial_state().transduce([dy.inputVector(x)] * 3)])
    seq2 = b.initial_state().add_input(dy.inputVector(x)).output().npvalue()
    np.testing.assert_array_equal(seq1[0], seq1[1])  # one mask per sequence (Gal & Ghahramani)
    np.testing.assert_array_equal(seq1[0], seq1[2])
    kept = seq1[0] != 0
    np.testing.assert_allclose(seq1[0][kept], np.tanh(1.0), rtol=1e-6)  # scaled by 1/(1-p)
    assert 0 < kept.sum() < 40
    assert not np.array_equal(seq2 != 0, kept)  # each initial_state draws its own masks


def test_gru_dropout_is_standard_dropout_on_output():
    _, b = build("GRUBuilder")
    b.set_dropout(0.5)
    dy.renew_cg()
    s = b.initial_state().add_input(dy.inputVector([1.0, -1.0, 0.5]))
    out, h = s.output().npvalue(), s.h()[-1].npvalue()
    assert not np.array_equal(out, h)
    np.testing.assert_allclose(out[out != 0], 2 * h[out != 0], rtol=1e-6)
    with pytest.raises(dy.DynagraphError, match="GRUBuilder"):
        b.set_dropouts(0.1, 0.1)


def test_dropout_rate_checked():
    _, b = build("VanillaLSTMBuilder")
    with pytest.raises(dy.DynagraphError, match="VanillaLSTMBuilder"):
        b.set_dropout(1.5)
    with pytest.raises(dy.DynagraphError, match="VanillaLSTMBuilder"):
        b.set_dropouts(0.1, -0.1)


def test_set_dropout_masks_resamples():
    m = dy.ParameterCollection()
    b = dy.VanillaLSTMBuilder(1, 30, 30, m)
    b.set_dropouts(0.5, 0.5)
    dy.renew_cg()
    x = dy.inputVector(np.ones(30))
    s0 = b.initial_state()
    first = s0.add_input(x).output().npvalue()
    again = s0.add_input(x).output().npvalue()
    np.testing.assert_array_equal(first, again)
    b.set_dropout_masks()
    assert not np.array_equal(s0.add_input(x).output().npvalue(), first)


# ------------------------------------------------------------------------- BiRNN
def test_birnn_shapes_and_concatenation_order():
    m = dy.ParameterCollection()
    bi = dy.BiRNNBuilder(2, IN, 6, m, dy.VanillaLSTMBuilder)
    assert len(bi.builder_layers) == 2
    xs = [dy.inputVector(x) for x in inputs(np.random.default_rng(8), 3)]
    outs = bi.transduce(xs)
    assert [o.shape for o in outs] == [(6,)] * 3
    # rebuild the two layers by hand: [forward_t ; backward_t], backward run on the reversed input
    es = xs
    for f, bw in bi.builder_layers:
        fs = f.initial_state().transduce(es)
        bs = bw.initial_state().transduce(es[::-1])[::-1]
        es = [dy.concatenate([a, c]) for a, c in zip(fs, bs)]
    np.testing.assert_allclose(np.array([o.npvalue() for o in outs]), np.array([e.npvalue() for e in es]),
                               rtol=1e-6)
    pairs = bi.add_inputs(xs)
    assert len(pairs) == 3
    for (fs, bs), o in zip(pairs, outs):
        np.testing.assert_allclose(np.concatenate([fs.output().npvalue(), bs.output().npvalue()]),
                                   o.npvalue(), rtol=1e-6)
    assert pairs[-1][1].prev().prev() is None  # position T-1 is the backward RNN's first step


def test_birnn_layout_and_errors():
    m = dy.ParameterCollection()
    bi = dy.BiRNNBuilder(2, IN, 4, m, dy.SimpleRNNBuilder)
    names = [p.name() for p in m.parameters_list()]
    assert names[:3] == ["/birnn/simple-rnn-builder/_0", "/birnn/simple-rnn-builder/_1",
                         "/birnn/simple-rnn-builder/_2"]
    assert names[-1] == "/birnn/simple-rnn-builder_3/_2"
    assert [p.shape() for p in m.parameters_list()][6] == (2, 4)  # layer 2 reads 2*(hidden/2)
    assert bi.param_collection().name() == "/birnn/"
    with pytest.raises(dy.DynagraphError, match="BiRNNBuilder"):
        dy.BiRNNBuilder(1, IN, 5, m, dy.SimpleRNNBuilder)
    bi.set_dropout(0.3)
    assert all(b.dropout_rate == 0.3 for fb in bi.builder_layers for b in fb)
    bi.disable_dropout()
    assert all(b.dropout_rate == 0.0 for fb in bi.builder_layers for b in fb)


# ---------------------------------------------------------------- layout and spec
LAYOUT = {
    "SimpleRNNBuilder": ("simple-rnn-builder", [(HID, IN), (HID, HID), (HID,)]),
    "GRUBuilder": ("gru-builder", [(HID, IN), (HID, HID), (HID,)] * 3),
    "VanillaLSTMBuilder": ("vanilla-lstm-builder", [(4 * HID, IN), (4 * HID, HID), (4 * HID,)]),
    "CoupledLSTMBuilder": ("lstm-builder", [(HID, IN), (HID, HID), (HID, HID), (HID,)] * 2
                           + [(HID, IN), (HID, HID), (HID,)]),
}


@pytest.mark.parametrize("name", sorted(LAYOUT))
def test_parameter_layout(name):
    sub, first = LAYOUT[name]
    m = dy.ParameterCollection()
    b = getattr(dy, name)(2, IN, HID, m)
    ps = m.parameters_list()
    assert [p.name() for p in ps] == [f"/{sub}/_{k}" for k in range(len(ps))]
    assert [p.shape() for p in b.get_parameters()[0]] == first
    second = [(s[0], HID) if len(s) == 2 else s for s in first]
    assert [p.shape() for p in b.get_parameters()[1]] == second
    assert b.param_collection().name() == f"/{sub}/"
    assert all(not p.as_array().any() for p in ps if len(p.shape()) == 1)  # biases start at zero
    assert all(p.as_array().any() for p in ps if len(p.shape()) == 2)
    exprs = b.get_parameter_expressions()
    assert [e.shape for e in exprs[0]] == first


def test_lstm_builder_is_vanilla():
    assert dy.LSTMBuilder is dy.VanillaLSTMBuilder
    b = dy.LSTMBuilder(1, IN, HID, dy.ParameterCollection())
    assert b.whoami() == "VanillaLSTMBuilder" and b.spec == (1, IN, HID, False, 1.0)


@pytest.mark.parametrize("name,args", [("SimpleRNNBuilder", ()), ("GRUBuilder", ()),
                                       ("VanillaLSTMBuilder", (True, 0.5)), ("CoupledLSTMBuilder", ())])
def test_spec_round_trip(name, args):
    m, b = build(name, args)
    spec = json.loads(json.dumps(b.spec))
    m2 = dy.ParameterCollection()
    b2 = BUILDER_TYPES[b.whoami()].from_spec(spec, m2)
    assert [(p.name(), p.shape()) for p in m2.parameters_list()] == \
           [(p.name(), p.shape()) for p in m.parameters_list()]
    for p, q in zip(m.parameters_list(), m2.parameters_list()):
        q.set_value(p.as_array())
    xs = inputs(np.random.default_rng(9), 2)
    np.testing.assert_array_equal(_outs(b, xs), _outs(b2, xs))


def test_birnn_spec_round_trip():
    m = dy.ParameterCollection()
    bi = dy.BiRNNBuilder(2, IN, 4, m, lambda l, i, h, pc: dy.VanillaLSTMBuilder(l, i, h, pc, forget_bias=0.0))
    spec = json.loads(json.dumps(bi.spec))
    m2 = dy.ParameterCollection()
    bi2 = dy.BiRNNBuilder.from_spec(spec, m2)
    assert [(p.name(), p.shape()) for p in m2.parameters_list()] == \
           [(p.name(), p.shape()) for p in m.parameters_list()]
    assert all(b.forget_bias == 0.0 for fb in bi2.builder_layers for b in fb)


# ------------------------------------------------------------------------ errors
@pytest.mark.parametrize("name", sorted(LAYOUT))
def test_wrong_input_size_names_the_builder(name):
    _, b = build(name)
    with pytest.raises(dy.DynagraphError, match=f"{name}.*shape \\(2,\\).*expected \\(3,\\)"):
        b.initial_state().add_input(dy.inputVector([1.0, 2.0]))
    with pytest.raises(dy.DynagraphError, match=name):
        b.initial_state([dy.inputVector([1.0] * HID)])
    with pytest.raises(dy.DynagraphError, match=name):
        getattr(dy, name)(0, IN, HID, dy.ParameterCollection())


def test_column_vector_input_is_accepted():
    _, b = build("VanillaLSTMBuilder")
    x = np.array([0.1, 0.2, 0.3])
    a = b.initial_state().add_input(dy.inputVector(x)).output().npvalue()
    c = b.initial_state().add_input(dy.inputTensor(x.reshape(3, 1))).output().npvalue()
    np.testing.assert_array_equal(a, c)


def test_compact_vanilla_lstm_equals_vanilla_and_adds_weight_noise():
    """DyNet's CompactVanillaLSTMBuilder is the vanilla cell (forget bias 1) in its own
    sub-collection; set_weightnoise perturbs the weights at every step, reproducibly."""
    pc = dy.ParameterCollection()
    v, c = dy.VanillaLSTMBuilder(2, IN, HID, pc), dy.CompactVanillaLSTMBuilder(2, IN, HID, pc)
    assert c.param_collection().name().endswith("compact-vanilla-lstm-builder/")
    for p, q in zip(v.param_collection().parameters_list(), c.param_collection().parameters_list()):
        q.set_value(p.as_array())
    xs = [dy.inputVector([0.1 * t, -0.2, 0.3 + t][:IN] + [0.0] * (IN - 3)) for t in range(3)]
    outs_v = [e.npvalue() for e in v.initial_state().transduce(xs)]
    outs_c = [e.npvalue() for e in c.initial_state().transduce(xs)]
    for a, b in zip(outs_v, outs_c):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    c.set_weightnoise(0.5)
    noisy = [e.npvalue() for e in c.initial_state().transduce(xs)]
    assert not np.allclose(noisy[-1], outs_c[-1])
    with pytest.raises(dy.DynagraphError, match="weight noise"):
        c.set_weightnoise(-1.0)
