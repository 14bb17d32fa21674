"""The schedule cache (dynagraph/schedule_cache.py): a small graph structured like one
scheduled before replays that schedule; one that differs in any op, attribute, shape or
wiring does not. Near-identical graph pairs are generated with hypothesis: a random
program and a copy with one detail changed. Whether the cache hit is checked against an
independent oracle (the two recorded graphs compared node by node), and the second graph's
values and gradients against unbatched execution (scheduler "none", no cache), 1e-10 in
float64."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from refcheck import using

import dynagraph as dy
from dynagraph import schedulers
from dynagraph.config import config
from dynagraph.schedule_cache import SCHEDULES, ScheduleCache

N = 4  # elements per vector
UNARY = ["tanh", "logistic", "rectify", "square"]


@contextlib.contextmanager
def cache_on(on: bool = True):
    saved = config.schedule_cache
    config.schedule_cache = on
    SCHEDULES.clear()
    try:
        yield
    finally:
        config.schedule_cache = saved
        SCHEDULES.clear()


class Model:
    """Parameters shared by every graph of a test (a program's weights outlive its graphs)."""

    def __init__(self):
        rng = np.random.default_rng(3)
        self.pc = dy.ParameterCollection()
        self.W = [self.pc.parameters_from_numpy(rng.uniform(-0.5, 0.5, (N, N))) for _ in range(2)]
        self.W2 = self.pc.parameters_from_numpy(rng.uniform(-0.5, 0.5, (N, 2 * N)))
        self.b = self.pc.parameters_from_numpy(rng.uniform(-0.5, 0.5, N))
        self.E = self.pc.lookup_parameters_from_numpy(rng.uniform(-0.5, 0.5, (10, N)))


def build(m: Model, prog: list, words: list) -> dy.Expression:
    """A per-sentence program: each step reads earlier values by position."""
    xs = [dy.lookup(m.E, w) for w in words]
    for kind, a, b, c in prog:
        x, y = xs[a % len(xs)], xs[b % len(xs)]
        if kind in UNARY:
            xs.append(getattr(dy, kind)(x))
        elif kind == "affine":
            xs.append(dy.affine_transform([dy.parameter(m.b), dy.parameter(m.W[c % 2]), x]))
        elif kind == "cat":
            xs.append(dy.parameter(m.W2) * dy.concatenate([x, y]))
        elif kind == "pick":
            xs.append(dy.concatenate([dy.pick_range(x, c % 2, c % 2 + 2), dy.pick_range(y, 0, 2)]))
        elif kind == "cmult":
            xs.append(dy.cmult(x, y))
        else:
            xs.append(x + y)
    return dy.esum([dy.squared_norm(x) for x in xs[len(words):]] or [dy.squared_norm(xs[0])])


def evaluate(m: Model, prog: list, words: list, scheduler: str):
    """(loss, parameter gradients, graph structure, schedule hits) of one graph."""
    m.pc.reset_gradient()
    dy.renew_cg(scheduler=scheduler)
    hits = SCHEDULES.hits
    loss = build(m, prog, words)
    value = loss.value()
    loss.backward()
    grads = [p.grad_as_array().copy() for p in m.pc.parameters_list() + m.pc.lookup_parameters_list()]
    cg = dy.cg()
    structure = [(cg.op[i].name, cg.args[i], cg.shape[i], repr(cg.attrs[i]), cg.sig_part[i] if cg.op[i].leaf else None)
                 for i in range(len(cg.op))]
    return value, grads, structure, SCHEDULES.hits - hits


def _pending(cg) -> list:
    """The nodes an evaluation would schedule (value slots are allocated at evaluation)."""
    cg._sync_values()
    return [i for i in range(len(cg.op)) if cg.blk[i] < 0]


STEP = st.tuples(st.sampled_from(UNARY + ["affine", "cat", "pick", "cmult", "add"]),
                 st.integers(0, 30), st.integers(0, 30), st.integers(0, 3))


@st.composite
def near_pairs(draw):
    """A program and a copy with at most one detail changed (or none)."""
    prog = draw(st.lists(STEP, min_size=2, max_size=10))
    words = draw(st.lists(st.integers(0, 9), min_size=2, max_size=6))
    other, other_words = list(prog), list(words)
    change = draw(st.sampled_from(["none", "op", "wiring", "attr", "length", "words"]))
    k = draw(st.integers(0, len(prog) - 1))
    kind, a, b, c = prog[k]
    if change == "op":
        other[k] = (draw(st.sampled_from(UNARY + ["affine", "cat", "pick", "cmult", "add"])), a, b, c)
    elif change == "wiring":
        other[k] = (kind, draw(st.integers(0, 30)), draw(st.integers(0, 30)), c)
    elif change == "attr":  # the pick_range's start, or which weight matrix
        other[k] = (kind, a, b, draw(st.integers(0, 3)))
    elif change == "length":
        other_words = words + [draw(st.integers(0, 9))]
    elif change == "words":  # per-node data only: the same structure
        other_words = [draw(st.integers(0, 9)) for _ in words]
    return prog, words, other, other_words


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=near_pairs())
def test_a_schedule_is_replayed_only_for_an_equal_structure(pair, scheduler):
    prog, words, other, other_words = pair
    with using("float64"), cache_on():
        m = Model()
        _, _, first, _ = evaluate(m, prog, words, scheduler)
        value, grads, second, hits = evaluate(m, other, other_words, scheduler)
        assert hits == (1 if second == first else 0)
        event("replayed" if hits else "scheduled afresh")
    with using("float64"), cache_on(False):
        ref_value, ref_grads, _, _ = evaluate(m, other, other_words, "none")
    np.testing.assert_allclose(value, ref_value, rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)


def test_per_sentence_graphs_of_one_length_share_a_schedule():
    prog = [("affine", 0, 0, 0), ("tanh", 2, 0, 0), ("cat", 3, 1, 0), ("logistic", 4, 0, 0)]
    with using("float64"), cache_on():
        m = Model()
        evaluate(m, prog, [1, 2, 3], "agenda")
        for words in ([4, 5, 6], [7, 8, 9], [0, 0, 0]):
            assert evaluate(m, prog, words, "agenda")[3] == 1
            assert dy.cg().stats.batches > 0
        assert evaluate(m, prog, [1, 2, 3, 4], "agenda")[3] == 0  # another length: scheduled afresh


def test_what_is_not_cached():
    prog = [("affine", 0, 0, 0), ("tanh", 2, 0, 0)]
    with using("float64"), cache_on():
        m = Model()
        for scheduler in ("none", "typewise", "fsm"):  # trivial, or a policy that may change while it trains
            evaluate(m, prog, [1, 2], scheduler)
            assert evaluate(m, prog, [1, 2], scheduler)[3] == 0
    with using("float64"), cache_on(False):
        evaluate(m, prog, [1, 2], "agenda")
        assert evaluate(m, prog, [1, 2], "agenda")[3] == 0 and not SCHEDULES.entries
    small = ScheduleCache(capacity=2, max_nodes=5)
    with using("float64"):
        dy.renew_cg(scheduler="agenda")
        build(m, prog, [1, 2, 3])
        cg = dy.cg()
        pending = _pending(cg)
        small.put(cg, pending, schedulers.get("agenda").schedule(cg, pending))
        assert not small.entries and small.get(cg, pending) is None  # larger than max_nodes


def test_the_cache_is_bounded_and_forgets_the_oldest():
    m = Model()
    cache = ScheduleCache(capacity=2)
    with using("float64"):
        graphs = []
        for n in (2, 3, 4):
            dy.renew_cg(scheduler="agenda")
            build(m, [("tanh", 0, 0, 0)], list(range(n)))
            cg = dy.cg()
            pending = _pending(cg)
            batches = schedulers.get("agenda").schedule(cg, pending)
            kept = cache.put(cg, pending, batches)
            assert kept == batches
            graphs.append((cg, pending, kept))
        assert len(cache.entries) == 2
        assert cache.get(*graphs[0][:2]) is None
        assert cache.get(*graphs[2][:2]) is graphs[2][2]


def test_replayed_schedules_pass_validation():
    """A replayed schedule is a valid schedule of the new graph (each node once, one signature
    per batch, arguments first), checked with the schedulers' own validator."""
    m = Model()
    prog = [("affine", 0, 1, 1), ("pick", 2, 0, 1), ("cat", 3, 2, 0), ("cmult", 4, 3, 0), ("add", 5, 1, 0)]
    with using("float64"), cache_on():
        evaluate(m, prog, [1, 2, 3], "agenda")
        dy.renew_cg(scheduler="agenda")
        build(m, prog, [3, 2, 1])
        cg = dy.cg()
        pending = _pending(cg)
        batches = SCHEDULES.get(cg, pending)
        assert batches is not None
        schedulers.validate(cg, pending, batches, "agenda (replayed)")


def test_graphs_of_one_span_and_size_are_kept_side_by_side():
    """Two structures with the same pending span and size (a tanh or a logistic at one place)
    sit under one first-level key: each replays its own schedule, neither evicts the other."""
    m = Model()
    progs = [[("tanh", 0, 0, 0), ("add", 1, 0, 0)], [("logistic", 0, 0, 0), ("add", 1, 0, 0)]]
    with using("float64"), cache_on():
        for prog in progs:
            evaluate(m, prog, [1, 2], "agenda")
        assert len(SCHEDULES.entries) == 1
        for prog in progs * 2:
            assert evaluate(m, prog, [3, 4], "agenda")[3] == 1


@settings(max_examples=60, deadline=None)
@given(items=st.lists(st.one_of(st.integers(-3, 1 << 40), st.tuples(st.integers(0, 1 << 20), st.integers(0, 300)),
                                st.tuples(), st.tuples(st.integers(0, 3))), max_size=12),
       lo=st.integers(-1, 13), cut=st.integers(0, 12), flip=st.integers(-1, 11))
def test_same_slice_matches_its_twin(items, lo, cut, flip):
    from dynagraph import schedule_cache
    was = [x if not isinstance(x, int) else int(str(x)) for x in items[max(lo, 0):max(lo, 0) + cut]]
    if 0 <= flip < len(was):
        was[flip] = (was[flip], 1) if isinstance(was[flip], int) else 7
    want = schedule_cache._same_slice_py(items, lo, was) if lo >= 0 else False
    assert schedule_cache._same_slice(items, lo, was) == want
