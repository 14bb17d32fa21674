"""dy.ghost (dynagraph/ghosts.py): ACROBAT's ghost operators keep both arms of a data-dependent branch at one depth.

Reference: the same per-sample code run one sample after another under the unbatched
scheduler. With ghosts, under every scheduler, values and gradients are the same (1e-10 in
float64): ghosts only raise depths. Under the depth-grouping scheduler they cut batches."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from refcheck import memory_growth

import dynagraph as dy
from dynagraph import ghosts as ghost_mod
from dynagraph.config import config

pytest.importorskip("greenlet")

H = 5
SCHEDULERS = ["none", "depth", "agenda", "typewise", "fsm"]


def _model():
    pc = dy.ParameterCollection()
    rng = np.random.default_rng(7)
    p = {n: pc.add_parameters(s, init=rng.normal(0, 0.5, s))
         for n, s in [("A", (H, H)), ("B", (H, H)), ("C", (H, H)), ("b", (H,)), ("O", (3, H))]}
    p["E"] = pc.add_lookup_parameters((9, H), init=rng.normal(0, 0.5, (9, H)))
    return pc, p


def _program(p, use_ghost: bool, steps: int = 4, read_in_arm: bool = False):
    """Each step reads a value and takes a short arm (one op) or a long one (three ops); the
    step after a branch reads the arm's output, so unaligned arms split every later batch."""
    branch = dy.ghost if use_ghost else _no_ghost

    def fn(k):
        h, losses = p["E"][k % 9], []
        for t in range(steps):
            go_long = dy.sum_elems(p["C"] * h).value() > 0 if (k + t) % 3 else (k + t) % 2 == 0
            with branch(site="step"):
                if go_long:
                    h = dy.tanh(p["A"] * h + p["b"])
                    if read_in_arm:
                        dy.sum_elems(h).value()  # a read inside the arm parks the sample mid-arm
                    h = dy.tanh(p["B"] * h)
                else:
                    h = dy.logistic(h)
            losses.append(dy.pickneglogsoftmax(p["O"] * h, (k + t) % 3))
        return dy.esum(losses)
    return fn


class _no_ghost:
    def __init__(self, site=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _run(pc, p, n, scheduler, concurrent, use_ghost, read_in_arm=False):
    dy.renew_cg(scheduler=scheduler)
    pc.reset_gradient()
    losses = dy.autobatch_map(_program(p, use_ghost, read_in_arm=read_in_arm), range(n), concurrent=concurrent)
    dy.esum(losses).backward()
    return [l.value() for l in losses], {k: q.grad_as_array() for k, q in p.items()}, dy.cg()


@pytest.fixture(autouse=True)
def _fresh_sites():
    ghost_mod.reset_sites()
    yield
    ghost_mod.reset_sites()


@pytest.mark.parametrize("read_in_arm", [False, True])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_ghosts_change_no_value_or_gradient(float64, scheduler, read_in_arm):
    pc, p = _model()
    ref_vals, ref_grads, _ = _run(pc, p, 10, "none", False, False, read_in_arm)
    for concurrent in (True, False):
        vals, grads, _ = _run(pc, p, 10, scheduler, concurrent, True, read_in_arm)
        np.testing.assert_allclose(vals, ref_vals, rtol=0, atol=1e-10)
        for k in ref_grads:
            np.testing.assert_allclose(grads[k], ref_grads[k], rtol=0, atol=1e-10, err_msg=k)
    assert any(abs(g).sum() > 0 for g in ref_grads.values())


def _assert_depths_consistent(cg):
    """Every node deeper than each argument recorded in the same round (what the depth
    scheduler relies on); checked on the whole graph where no rebasing happened."""
    for n, ids in enumerate(cg.args):
        for a in ids:
            assert cg.depth[n] > cg.depth[a] or cg.op[a].leaf, (n, a)


def test_ghosts_cut_depth_batches_inside_a_map(float64):
    pc, p = _model()
    counts = {}
    for use_ghost in (False, True):
        ghost_mod.reset_sites()
        _run(pc, p, 16, "depth", True, use_ghost)  # the first call learns the longest arm
        _, _, cg = _run(pc, p, 16, "depth", True, use_ghost)
        counts[use_ghost] = cg.stats.batches
    assert counts[True] < counts[False], counts
    assert ghost_mod.site_lengths()["step"] >= 2


def test_ghosts_outside_a_map_pad_at_the_end_of_the_arm(float64):
    """DyNet-style: samples recorded one after another into one graph, evaluated once."""
    pc, p = _model()

    def record(use_ghost):
        dy.renew_cg(scheduler="depth")
        branch = dy.ghost if use_ghost else _no_ghost
        outs = []
        for k in range(8):
            h = p["E"][k]
            for t in range(3):
                with branch(site="plain"):
                    if (k + t) % 2:
                        h = dy.tanh(p["B"] * dy.tanh(p["A"] * h + p["b"]))
                    else:
                        h = dy.logistic(h)
            outs.append(dy.sum_elems(p["O"] * h))
        total = dy.esum(outs)
        v = total.value()
        _assert_depths_consistent(dy.cg())
        return v, dy.cg().stats.batches, [dy.cg().depth[o.i] for o in outs]

    ghost_mod.reset_sites()
    record(True)  # learn the site's longest arm (four levels: matmul, add, tanh, matmul, tanh)
    v1, b1, d1 = record(True)
    v0, b0, d0 = record(False)
    assert v1 == pytest.approx(v0, abs=1e-12)
    assert len(set(d1)) == 1 and len(set(d0)) > 1  # aligned with ghosts, scattered without
    assert b1 < b0


def test_ghost_depths_only_grow_and_keep_arguments_first(float64):
    pc, p = _model()
    dy.renew_cg(scheduler="depth")  # one by one, no rebasing: the whole graph keeps one depth frame
    losses = dy.autobatch_map(_program(p, True, read_in_arm=True), range(12), concurrent=False)
    dy.esum(losses).value()
    _assert_depths_consistent(dy.cg())
    assert ghost_mod.site_lengths()["step"] >= 2


def test_signature_schedulers_need_no_ghosts():
    pc, p = _model()
    dy.renew_cg(scheduler="agenda")
    x = p["E"][1]
    with dy.ghost(site="agenda"):
        y = dy.logistic(x)
    assert "agenda" not in ghost_mod.site_lengths()
    assert dy.cg().depth[y.i] == dy.cg().depth[x.i] + 1


def test_an_exception_inside_a_ghost_block_propagates_and_closes_it(float64):
    pc, p = _model()

    def fn(k):
        with dy.ghost():
            h = dy.tanh(p["A"] * p["E"][k])
            h.value()
            if k == 2:
                raise KeyError("boom")
        return h

    dy.renew_cg()
    with pytest.raises(KeyError) as info:
        dy.autobatch_map(fn, range(4))
    assert info.value.sample_index == 2
    out = dy.autobatch_map(fn, [0, 1])  # the map and its graph still work
    assert len(out) == 2


def test_sites_default_to_the_with_line_and_can_be_shared():
    pc, p = _model()
    dy.renew_cg(scheduler="depth")
    x = p["E"][1]
    with dy.ghost():
        y = dy.tanh(p["A"] * x)
    with dy.ghost(site="s"):
        z = dy.logistic(x)
    with dy.ghost(site="s"):
        z = dy.tanh(p["B"] * dy.tanh(p["A"] * x))
    sites = ghost_mod.site_lengths()
    assert sites["s"] == 4 and sum(1 for k in sites if isinstance(k, tuple)) == 1
    assert dy.cg().depth[y.i] == dy.cg().depth[x.i] + 2
    (y + z).value()


_arm = st.lists(st.integers(0, 2), min_size=0, max_size=3)


@settings(max_examples=20, deadline=None)
@given(arms=st.lists(st.tuples(_arm, _arm), min_size=1, max_size=3), n=st.integers(1, 6),
       scheduler=st.sampled_from(["depth", "agenda", "typewise"]))
def test_random_branches_with_ghosts_equal_one_by_one(arms, n, scheduler):
    from refcheck import using
    with using(dtype="float64", seed=0):
        pc, p = _model()

        def apply(h, ops):
            for op in ops:
                h = dy.tanh(p["A"] * h) if op == 0 else dy.logistic(h) if op == 1 else h + p["b"]
            return h

        def fn(k):
            h = p["E"][k]
            for left, right in arms:
                take_left = dy.sum_elems(h).value() > 0
                with dy.ghost():
                    h = apply(h, left if take_left else right)
            return dy.sum_elems(p["O"] * h)

        out = []
        for sched, concurrent in [("none", False), (scheduler, True)]:
            dy.renew_cg(scheduler=sched)
            pc.reset_gradient()
            losses = dy.autobatch_map(fn, range(n), concurrent=concurrent)
            dy.esum(losses).backward()
            out.append(([l.value() for l in losses], [q.grad_as_array() for q in p.values()]))
        np.testing.assert_allclose(out[1][0], out[0][0], rtol=0, atol=1e-10)
        for a, b in zip(out[1][1], out[0][1]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)


def test_depth_scheduler_validates_under_debug(float64):
    """The rebased and padded depths give valid schedules (checked on every evaluation)."""
    pc, p = _model()
    old = config.debug
    config.debug = 1
    try:
        _run(pc, p, 9, "depth", True, True, read_in_arm=True)
    finally:
        config.debug = old


def test_thousand_samples_with_ghosts_do_not_grow_memory():
    pc, p = _model()

    def f(k):
        h = dy.tanh(p["E"][k % 9])
        with dy.ghost():
            if h.value()[0] > 0:
                h = dy.tanh(p["A"] * h)
            else:
                h = dy.logistic(h)
        return float(dy.sum_elems(h))

    def round_():
        dy.renew_cg(scheduler="depth")
        assert len(dy.autobatch_map(f, range(1000))) == 1000

    first, last = memory_growth(round_)
    assert last - first < 200_000, (first, last)


def test_nested_ghost_blocks_equal_one_by_one(float64):
    pc, p = _model()

    def fn(k):
        h = p["E"][k]
        for _ in range(3):
            outer = dy.sum_elems(h).value() > 0
            with dy.ghost(site="outer"):
                if outer:
                    inner = dy.sum_elems(p["A"] * h).value() > 0  # a read inside the outer arm
                    with dy.ghost(site="inner"):
                        h = dy.tanh(p["B"] * h) if inner else dy.logistic(h)
                    h = dy.tanh(p["A"] * h + p["b"])
                else:
                    h = dy.logistic(h)
        return dy.sum_elems(p["O"] * h)

    out = []
    for sched, concurrent in [("none", False), ("depth", True), ("depth", False)]:
        dy.renew_cg(scheduler=sched)
        pc.reset_gradient()
        losses = dy.autobatch_map(fn, range(9), concurrent=concurrent)
        dy.esum(losses).backward()
        out.append(([l.value() for l in losses], [q.grad_as_array() for q in p.values()]))
    for vals, grads in out[1:]:
        np.testing.assert_allclose(vals, out[0][0], rtol=0, atol=1e-10)
        for a, b in zip(grads, out[0][1]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    assert {"outer", "inner"} <= set(ghost_mod.site_lengths())


def test_one_context_object_shared_by_samples_raises():
    """A phase or ghost object remembers the sample inside it: sharing one across samples that
    park inside it would restore the wrong state, so entering it twice says so."""
    from dynagraph.errors import DynagraphError
    _, p = _model()
    later, branch = dy.phase(1), dy.ghost()

    def with_phase(k):
        with later:
            h = dy.tanh(p["A"] * p["E"][k])
            h.value()  # parks inside the phase: the next sample enters the same object
        return h

    def with_ghost(k):
        with branch:
            h = dy.tanh(p["A"] * p["E"][k])
            h.value()
        return h

    for fn, scheduler in [(with_phase, "agenda"), (with_ghost, "depth")]:
        dy.renew_cg(scheduler=scheduler)
        with pytest.raises(DynagraphError, match="entered"):
            dy.autobatch_map(fn, range(3))
        dy.renew_cg(scheduler=scheduler)
        assert len(dy.autobatch_map(fn, [0])) == 1  # one at a time, again and again, is fine
        assert len(dy.autobatch_map(fn, [1])) == 1
