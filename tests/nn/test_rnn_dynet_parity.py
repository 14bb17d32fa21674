"""The RNN builders against DyNet itself: same layout, same outputs, same gradients.

DyNet's weights are copied into ours in `parameters_list()` order (shapes and,
where DyNet and we agree on them, names checked pair by pair), then 3 steps run
on the same inputs in float32 and a scalar loss is differentiated.
"""
import numpy as np
import pytest

dn = pytest.importorskip("dynet")
import dynagraph as dy  # noqa: E402

IN, HID, LAYERS, STEPS = 3, 4, 2, 3
RTOL, ATOL = 1e-4, 1e-5

CASES = [
    ("SimpleRNNBuilder", ()),
    ("GRUBuilder", ()),
    ("VanillaLSTMBuilder", ()),
    ("VanillaLSTMBuilder", (False, 0.0)),
    ("VanillaLSTMBuilder", (True, 1.0)),
    ("LSTMBuilder", ()),
    ("CompactVanillaLSTMBuilder", ()),
    ("CoupledLSTMBuilder", ()),
]
IDS = [f"{n}{a}" for n, a in CASES]


def copy_weights(theirs, ours, check_names: bool = True) -> None:
    """DyNet values (set to random numbers first, so biases are non-zero) -> ours, in list order."""
    ps, qs = theirs.parameters_list(), ours.parameters_list()
    assert len(ps) == len(qs)
    rng = np.random.default_rng(0)
    for p, q in zip(ps, qs):
        assert tuple(p.shape()) == q.shape(), (p.name(), q.name())
        if check_names:
            assert p.name() == q.name()
        p.set_value(rng.uniform(-0.6, 0.6, p.shape()))
        q.set_value(p.as_array())


def run(lib, builder, xs, init):
    """Outputs of 3 steps and the loss; backward() leaves gradients in the parameters."""
    lib.renew_cg()
    s0 = builder.initial_state([lib.inputVector(v) for v in init] if init else None)
    states = s0.add_inputs([lib.inputVector(x) for x in xs])
    weights = lib.inputVector(np.linspace(-1.0, 1.0, HID))
    terms = [lib.dot_product(s.output(), weights) for s in states]
    terms += [lib.sum_elems(lib.cmult(e, e)) for e in states[-1].s()]  # reach every layer and c
    loss = lib.esum(terms)
    value = loss.value()
    loss.backward()
    return np.array([s.output().npvalue() for s in states]), value


def compare(m_dn, m_dy, out_dn, out_dy):
    np.testing.assert_allclose(out_dy[0], out_dn[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out_dy[1], out_dn[1], rtol=RTOL, atol=ATOL)
    for p, q in zip(m_dn.parameters_list(), m_dy.parameters_list()):
        g = p.grad_as_array()
        assert np.abs(g).max() > 0, p.name()
        np.testing.assert_allclose(q.grad_as_array(), g, rtol=RTOL, atol=ATOL * max(1.0, np.abs(g).max()),
                                   err_msg=q.name())


@pytest.mark.parametrize("with_init", [False, True])
@pytest.mark.parametrize("name,args", CASES, ids=IDS)
def test_builder_matches_dynet(name, args, with_init):
    m_dn, m_dy = dn.ParameterCollection(), dy.ParameterCollection()
    b_dn = getattr(dn, name)(LAYERS, IN, HID, m_dn, *args)
    b_dy = getattr(dy, name)(LAYERS, IN, HID, m_dy, *args)
    ln = bool(args and args[0])
    copy_weights(m_dn, m_dy, check_names=not ln)  # ln_lstm: see the layout note in rnn.py
    assert [[tuple(p.shape()) for p in ps] for ps in b_dn.get_parameters()] == \
           [[p.shape() for p in ps] for ps in b_dy.get_parameters()]
    assert b_dy.param_collection().name() == b_dn.param_collection().name()
    assert tuple(b_dy.spec) == tuple(b_dn.spec)
    rng = np.random.default_rng(1)
    xs = [rng.uniform(-1, 1, IN) for _ in range(STEPS)]
    n_init = 2 * LAYERS if "LSTM" in name else LAYERS
    init = [rng.uniform(-1, 1, HID) for _ in range(n_init)] if with_init else None
    compare(m_dn, m_dy, run(dn, b_dn, xs, init), run(dy, b_dy, xs, init))


@pytest.mark.parametrize("factory", ["VanillaLSTMBuilder", "GRUBuilder"])
def test_birnn_matches_dynet(factory):
    m_dn, m_dy = dn.ParameterCollection(), dy.ParameterCollection()
    bi_dn = dn.BiRNNBuilder(2, IN, 2 * HID, m_dn, getattr(dn, factory))
    bi_dy = dy.BiRNNBuilder(2, IN, 2 * HID, m_dy, getattr(dy, factory))
    copy_weights(m_dn, m_dy)
    rng = np.random.default_rng(2)
    xs = [rng.uniform(-1, 1, IN) for _ in range(STEPS)]
    results = []
    for lib, bi in ((dn, bi_dn), (dy, bi_dy)):
        lib.renew_cg()
        outs = bi.transduce([lib.inputVector(x) for x in xs])
        pairs = bi.add_inputs([lib.inputVector(x) for x in xs])
        w = lib.inputVector(np.linspace(-1.0, 1.0, 2 * HID))
        loss = lib.esum([lib.dot_product(o, w) for o in outs] + [lib.sum_elems(f.output() - b.output())
                                                                 for f, b in pairs])
        value = loss.value()
        loss.backward()
        results.append((np.array([o.npvalue() for o in outs]), value))
    compare(m_dn, m_dy, *results)


def test_initialisers_match_dynet():
    """Zero biases and Glorot-scaled weights, as DyNet draws them."""
    m_dn, m_dy = dn.ParameterCollection(), dy.ParameterCollection()
    dn.VanillaLSTMBuilder(1, 30, 40, m_dn, True)
    dy.VanillaLSTMBuilder(1, 30, 40, m_dy, True)
    for p, q in zip(m_dn.parameters_list(), m_dy.parameters_list()):
        a, b = p.as_array(), q.as_array()
        if a.ndim == 1:
            np.testing.assert_array_equal(b, a)  # constant inits: zeros and the layer-norm ones
        else:
            bound = np.sqrt(6.0 / sum(a.shape))
            assert np.abs(a).max() <= bound and np.abs(b).max() <= bound
            assert np.abs(b).max() > 0.8 * bound


def test_parameters_list_order_with_builder_between_parameters():
    names = []
    for lib in (dn, dy):
        m = lib.ParameterCollection()
        m.add_parameters((2,))
        lib.SimpleRNNBuilder(1, IN, HID, m)
        m.add_parameters((5,))
        names.append([p.name() for p in m.parameters_list()])
    assert names[1] == names[0]
