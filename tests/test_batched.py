"""DyNet's minibatch dimension (dynagraph/batched.py): a batched program gives exactly
the numbers of the same computation written per sample, under every scheduler, and
matches DyNet's layout and values when DyNet is installed."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from refcheck import assert_same_run, batch_sizes, run_graph, using

SCHEDULERS = ["none", "agenda"]
B, V, D, H, C = 3, 7, 4, 5, 3
IDS, IDS2, LABELS = [1, 4, 6], [2, 2, 0], [0, 2, 1]


def _arr(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape)


class P:
    """Parameters with fixed values, created in the same order in every run."""

    def __init__(self, pc):
        self.E = pc.add_lookup_parameters((V, D), init=_arr((V, D), 1))
        self.W = pc.add_parameters((H, D), init=_arr((H, D), 2))
        self.b = pc.add_parameters(H, init=_arr(H, 3))
        self.W2 = pc.add_parameters((H, 2 * D), init=_arr((H, 2 * D), 4))
        self.u = pc.add_parameters(D, init=_arr(D, 5))
        self.M = pc.add_parameters((2, 3), init=_arr((2, 3), 6))


X = _arr((D, B), 10)  # an input batch: the last axis is the batch, as in DyNet


def unbatch(e) -> list:
    """The samples of a batched program's output, as ordinary expressions."""
    n = e.dim()[1]
    return [dy.pick_batch_elem(e, k) for k in range(n)]


# Each case: (batched program, the same computation per sample); both take P and return
# a list of ordinary expressions (the batched one through pick_batch_elem).
def _mlp_b(p):
    return unbatch(dy.tanh(p.W * dy.lookup_batch(p.E, IDS) + p.b))


def _mlp_s(p):
    return [dy.tanh(p.W * dy.lookup(p.E, i) + p.b) for i in IDS]


def _ops_b(p):
    x, y, u = p.E.batch(IDS), dy.lookup_batch(p.E, IDS2), dy.parameter(p.u)
    return unbatch(dy.concatenate([x * 2 + (1 - y), x / 2 - u, -x, x ** 2, dy.cmult(x, u), dy.cdiv(u, y + 3.0),
                                   u + x, u - y, dy.logistic(x) + dy.rectify(y)]))


def _ops_s(p):
    out, u = [], dy.parameter(p.u)
    for i, j in zip(IDS, IDS2):
        x, y = dy.lookup(p.E, i), dy.lookup(p.E, j)
        out.append(dy.concatenate([x * 2 + (1 - y), x / 2 - u, -x, x ** 2, dy.cmult(x, u), dy.cdiv(u, y + 3.0),
                                   u + x, u - y, dy.logistic(x) + dy.rectify(y)]))
    return out


def _input_b(p):
    x = dy.inputTensor(X, batched=True)
    return unbatch(dy.softmax(p.W * x + p.b) + dy.log_softmax(dy.parameter(p.W) * x))


def _input_s(p):
    xs = [dy.inputTensor(X[:, k]) for k in range(B)]
    return [dy.softmax(p.W * x + p.b) + dy.log_softmax(dy.parameter(p.W) * x) for x in xs]


def _pick_b(p):
    x = dy.lookup_batch(p.E, IDS)
    h = p.W * x
    return unbatch(dy.concatenate([dy.pick_batch(x, LABELS), dy.pick_batch(dy.parameter(p.u), LABELS),
                                   dy.pickneglogsoftmax_batch(h, LABELS), dy.hinge_batch(h, LABELS, 0.5),
                                   x[1], x[-1], dy.pick_range(h, 1, 3), dy.pick(h, 2), dy.sum_elems(x),
                                   dy.dot_product(x, dy.parameter(p.u)), dy.squared_distance(x, dy.parameter(p.u)),
                                   dy.l2_norm(h), dy.max_dim(x), dy.logsumexp([x, h[0:D]])]))


def _pick_s(p):
    out, u = [], dy.parameter(p.u)
    for i, l in zip(IDS, LABELS):
        x = dy.lookup(p.E, i)
        h = p.W * x
        out.append(dy.concatenate([dy.pick(x, l), dy.pick(u, l), dy.pickneglogsoftmax(h, l), dy.hinge(h, l, 0.5),
                                   x[1], x[-1], dy.pick_range(h, 1, 3), dy.pick(h, 2), dy.sum_elems(x),
                                   dy.dot_product(x, u), dy.squared_distance(x, u), dy.l2_norm(h), dy.max_dim(x),
                                   dy.logsumexp([x, h[0:D]])]))
    return out


def _lists_b(p):
    x, y, u = dy.lookup_batch(p.E, IDS), dy.lookup_batch(p.E, IDS2), dy.parameter(p.u)
    return unbatch(dy.concatenate([dy.esum([x, y, u]), dy.average([u, x]), dy.emax([x, y]),
                                   dy.affine_transform([dy.parameter(p.b), p.W, x, dy.parameter(p.W), u]),
                                   p.W2 * dy.concatenate([x, u]), dy.cadd(x, u)]))


def _lists_s(p):
    out, u = [], dy.parameter(p.u)
    for i, j in zip(IDS, IDS2):
        x, y = dy.lookup(p.E, i), dy.lookup(p.E, j)
        out.append(dy.concatenate([dy.esum([x, y, u]), dy.average([u, x]), dy.emax([x, y]),
                                   dy.affine_transform([dy.parameter(p.b), p.W, x, dy.parameter(p.W), u]),
                                   p.W2 * dy.concatenate([x, u]), dy.cadd(x, u)]))
    return out


def _reshape_b(p):
    x = dy.lookup_batch(p.E, IDS)
    kept = dy.reshape(x, (2, 2))  # batch_size=1 with a per-sample shape keeps the batch
    cols = dy.concatenate_cols([kept, dy.transpose(kept)])
    whole = dy.reshape(x, (D * B,), batch_size=1)  # the batch folded into one vector
    split = dy.reshape(dy.concatenate([dy.parameter(p.u), dy.parameter(p.b)]), (3,), batch_size=3)
    regroup = dy.reshape(dy.inputTensor(np.arange(12.0).reshape(2, 2, 3), batched=True) + kept, (3, 2),
                         batch_size=2)
    return unbatch(dy.reshape(cols, (8,))) + [whole] + unbatch(split) + unbatch(regroup)


def _reshape_s(p):
    xs = [dy.lookup(p.E, i) for i in IDS]
    cols = [dy.concatenate_cols([dy.reshape(x, (2, 2)), dy.transpose(dy.reshape(x, (2, 2)))]) for x in xs]
    ub = dy.concatenate([dy.parameter(p.u), dy.parameter(p.b)])
    a = np.arange(12.0).reshape(2, 2, 3)
    m = [dy.inputTensor(a[..., k]) + dy.reshape(x, (2, 2)) for k, x in enumerate(xs)]
    flat = dy.concatenate([dy.reshape(e, (4,)) for e in m])  # column-major, sample after sample
    return ([dy.reshape(c, (8,)) for c in cols] + [dy.concatenate(xs)] + [dy.pick_range(ub, 3 * k, 3 * k + 3)
                                                                             for k in range(3)]
            + [dy.reshape(dy.pick_range(flat, 6 * k, 6 * k + 6), (3, 2)) for k in range(2)])


def _reduce_b(p):
    x = dy.tanh(p.W * dy.lookup_batch(p.E, IDS))
    both = dy.concatenate_to_batch([x, dy.parameter(p.b), dy.pick_batch_elems(x, [2, 0])])
    return [dy.sum_batches(x), dy.mean_batches(x), dy.std_batches(x), dy.moment_batches(x, 3),
            dy.sum_dim(x, [0], True), dy.mean_dim(x, [0], True), dy.sum_dim(x, [], True), dy.sum_batches(both),
            dy.pick_batch_elem(both, 3), dy.sum_batches(dy.zeros(H, batch_size=B) + x)]


def _reduce_s(p):
    xs = [dy.tanh(p.W * dy.lookup(p.E, i)) for i in IDS]
    mu = dy.esum(xs) * (1.0 / B)
    both = xs + [dy.parameter(p.b), xs[2], xs[0]]
    return [dy.esum(xs), dy.average(xs), dy.sqrt(dy.average([dy.square(x - mu) for x in xs])),
            dy.average([dy.cube(x) for x in xs]), dy.esum([dy.sum_elems(x) for x in xs]),
            dy.average([dy.mean_elems(x) for x in xs]), dy.esum(xs), dy.esum(both), both[3], dy.esum(xs)]


CASES = {"mlp": (_mlp_b, _mlp_s), "operators": (_ops_b, _ops_s), "inputTensor": (_input_b, _input_s),
         "pick": (_pick_b, _pick_s), "lists": (_lists_b, _lists_s), "reshape": (_reshape_b, _reshape_s),
         "reduce": (_reduce_b, _reduce_s)}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_equals_per_sample(case, scheduler):
    batched, per_sample = CASES[case]
    a = run_graph(scheduler, lambda pc: batched(P(pc)))
    b = run_graph(scheduler, lambda pc: per_sample(P(pc)))
    assert a.grads and any(np.abs(g).sum() > 0 for g in a.grads.values())
    assert_same_run(a, b, rtol=1e-10, atol=1e-10)


def test_the_autobatcher_batches_the_samples_back_together():
    r = run_graph("agenda", lambda pc: _mlp_b(P(pc)))
    assert batch_sizes(r.cg, "tanh") == [B]
    assert batch_sizes(r.cg, "lookup") == [B]


def test_values_use_dynets_layout(float64):
    x = dy.inputTensor(X, batched=True)
    assert isinstance(x, dy.BatchedExpression) and x.dim() == ((D,), B)
    np.testing.assert_array_equal(x.npvalue(), X)
    assert x.value() == X.flatten(order="F").tolist() == x.vec_value()
    s = dy.sum_elems(x)
    assert s.dim() == ((1,), B) and s.npvalue().shape == (1, B)
    np.testing.assert_allclose(s.value(), X.sum(axis=0), rtol=1e-12)
    m = dy.inputTensor(np.arange(12.0).reshape(2, 3, 2), batched=True)
    assert m.dim() == ((2, 3), 2) and isinstance(m.value(), np.ndarray) and m.value().shape == (2, 3, 2)
    one = dy.inputTensor(X[:, :1], batched=True)  # DyNet's batch size 1 is an ordinary expression
    assert type(one) is dy.Expression and one.dim() == ((D,), 1)
    assert dy.inputTensor([1.0, 2.0, 3.0], batched=True).dim() == ((1,), 3)
    assert dy.zeros(3, batch_size=4).dim() == ((3,), 4)
    r = dy.random_normal((2,), batch_size=3).npvalue()
    assert r.shape == (2, 3) and len({tuple(c) for c in r.T}) == 3  # an independent draw per sample


def test_gradient_and_backward(float64):
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((V, D), init=_arr((V, D), 1))
    x = dy.lookup_batch(E, IDS)
    loss = dy.sum_elems(dy.square(x))
    with pytest.raises(dy.DynagraphError, match="sum_batches"):  # DyNet refuses it too
        loss.backward()
    with pytest.raises(dy.DynagraphError, match="batch size 3"):
        loss.scalar_value()
    dy.sum_batches(loss).backward()
    want = np.zeros((V, D))
    for i in IDS:
        want[i] += 2 * E.as_array()[i]
    np.testing.assert_allclose(E.grad_as_array(), want, rtol=1e-12)
    assert x.gradient().shape == (D, B)


def _train(scheduler: str, batched: bool) -> tuple[list, dict]:
    """A DyNet-style hand-batched MLP classifier (or its per-sample twin), 3 SGD steps."""
    data = [([(1, 2), (3, 4), (5, 6)], [0, 2, 1]), ([(6, 0), (2, 2)], [1, 1]), ([(4, 1), (0, 5), (3, 3)], [2, 0, 1])]
    with using("float64", seed=0, scheduler=scheduler):
        pc = dy.ParameterCollection()
        E = pc.add_lookup_parameters((V, D), init=_arr((V, D), 1))
        W1, b1 = pc.add_parameters((H, 2 * D), init=_arr((H, 2 * D), 2)), pc.add_parameters(H, init=_arr(H, 3))
        W2, b2 = pc.add_parameters((C, H), init=_arr((C, H), 4)), pc.add_parameters(C, init=_arr(C, 5))
        trainer, losses = dy.SimpleSGDTrainer(pc, 0.3), []
        for words, labels in data:
            dy.renew_cg()
            if batched:
                x = dy.concatenate([dy.lookup_batch(E, [w[0] for w in words]), E.batch([w[1] for w in words])])
                h = dy.tanh(dy.parameter(W1) * x + dy.parameter(b1))
                loss = dy.sum_batches(dy.pickneglogsoftmax_batch(W2 * h + b2, labels))
            else:
                out = []
                for (w0, w1), y in zip(words, labels):
                    h = dy.tanh(dy.parameter(W1) * dy.concatenate([dy.lookup(E, w0), dy.lookup(E, w1)])
                                + dy.parameter(b1))
                    out.append(dy.pickneglogsoftmax(W2 * h + b2, y))
                loss = dy.esum(out)
            losses.append(loss.value())
            loss.backward()
            trainer.update()
        return losses, {p.name(): p.as_array() for p in pc.parameters_list() + pc.lookup_parameters_list()}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_hand_batched_classifier_trains_like_per_sample(scheduler):
    (la, pa), (lb, pb) = _train(scheduler, True), _train(scheduler, False)
    np.testing.assert_allclose(la, lb, rtol=1e-10)
    assert la[0] != la[2]  # it trained
    for k in pa:
        np.testing.assert_allclose(pa[k], pb[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("build, what", [
    (lambda x, y: x + y, "operator +"),
    (lambda x, y: y * x, "operator *"),
    (lambda x, y: dy.cmult(x, y), "cmult"),
    (lambda x, y: dy.tanh(x) - y, "operator -"),
    (lambda x, y: dy.esum([x, y]), "esum"),
    (lambda x, y: dy.concatenate([y, x]), "concatenate"),
    (lambda x, y: dy.affine_transform([x, dy.inputTensor(np.ones((D, D))), y]), "affine"),
    (lambda x, y: dy.pick_batch(x, [0, 1]), "pick_batch"),
    (lambda x, y: dy.pick_batch_elem(x, 3), "pick_batch_elem"),
    (lambda x, y: dy.reshape(x, (5,), batch_size=2), "reshape"),
])
def test_mismatched_batch_sizes_name_the_op_and_line(build, what):
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((V, D))
    x, y = dy.lookup_batch(E, IDS), dy.lookup_batch(E, [1, 2])
    with pytest.raises(dy.DynagraphError) as e:
        build(x, y)
    assert what in str(e.value) and f"{__file__}:" in str(e.value)
    if what not in ("pick_batch", "pick_batch_elem", "reshape"):
        assert "batch sizes 3 and 2" in str(e.value) or "batch sizes 2 and 3" in str(e.value)


# ---------------------------------------------------------------------- DyNet parity
def _parity_program(m, E, W, b):
    """The same hand-batched DyNet code for both libraries; returns what it observed."""
    x = m.lookup_batch(E, IDS)
    h = m.tanh(W * x + b)
    t = m.inputTensor(np.arange(12.0).reshape(2, 3, 2), batched=True)
    out = {
        "x": x, "h": h, "pick": m.pick_batch(h, LABELS), "nll": m.pickneglogsoftmax_batch(h, LABELS),
        "input": m.inputTensor(X, batched=True), "scalars": m.sum_elems(h), "t": t,
        "keep": m.reshape(t, (3, 2), batch_size=2), "flatten": m.reshape(t, (6,), batch_size=2),
        "fold": m.reshape(x, (D * B,), batch_size=1),
        "split": m.reshape(m.inputTensor(np.arange(6.0)), (3,), batch_size=2),
        "ctb": m.concatenate_to_batch([x, m.lookup(E, 0)]), "elems": m.pick_batch_elems(h, [2, 0]),
        "elem": m.pick_batch_elem(h, 1), "mean": m.mean_batches(h), "std": m.std_batches(h),
        "moment": m.moment_batches(h, 2), "sumdim": m.sum_dim(h, [0], True), "bcast": m.cmult(x, m.lookup(E, 0)),
    }
    loss = m.sum_batches(out["nll"]) + m.sum_batches(m.sum_elems(out["ctb"]))
    seen = {k: (e.dim(), e.npvalue(), e.value()) for k, e in out.items()}
    seen["loss"] = (loss.dim(), loss.npvalue(), loss.value())
    loss.backward()
    return seen


def test_parity_with_dynet():
    dn = pytest.importorskip("dynet")
    with using("float32", seed=0):
        dy.renew_cg()
        theirs, ours = dn.ParameterCollection(), dy.ParameterCollection()
        args = {}
        for m, pc in ((dn, theirs), (dy, ours)):
            dn.renew_cg(), dy.renew_cg()
            E, W, b = pc.add_lookup_parameters((V, D)), pc.add_parameters((H, D)), pc.add_parameters(H)
            E.init_from_array(_arr((V, D), 1)), W.set_value(_arr((H, D), 2)), b.set_value(_arr(H, 3))
            args[m] = (E, W, b)
        dn.renew_cg()
        want = _parity_program(dn, *args[dn])
        dy.renew_cg()
        got = _parity_program(dy, *args[dy])
        for k, (dim, npv, val) in want.items():
            g_dim, g_npv, g_val = got[k]
            assert g_dim == dim, k
            assert g_npv.shape == npv.shape, k
            np.testing.assert_allclose(g_npv, npv, rtol=1e-5, atol=1e-6, err_msg=k)
            assert type(g_val) is type(val), k
            np.testing.assert_allclose(g_val, val, rtol=1e-5, atol=1e-6, err_msg=k)
        for p, q in zip(args[dn], args[dy]):
            np.testing.assert_allclose(q.grad_as_array(), p.grad_as_array(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["VanillaLSTMBuilder", "GRUBuilder", "SimpleRNNBuilder"])
def test_builders_accept_minibatches(name):
    """DyNet's builders take batched inputs: the same states as per-sample sequences."""
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((10, 3))
    rnn = getattr(dy, name)(1, 3, 4, pc)
    ids = [[1, 2, 3], [4, 5, 6]]  # time step t holds the ids of both samples
    dy.renew_cg()
    batched = rnn.initial_state().transduce([dy.lookup_batch(E, step) for step in ids])[-1].npvalue()
    for s in range(3):
        dy.renew_cg()
        single = rnn.initial_state().transduce([E[step[s]] for step in ids])[-1].npvalue()
        np.testing.assert_allclose(batched[:, s], single, rtol=1e-5, atol=1e-7)  # float32, batched GEMMs
