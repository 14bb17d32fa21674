"""DyNet's reusable inputs (vecInput, matInput, Expression.set), dy.forward(list), DynetParams,
dy.init and the --dynet-* command-line flags (dynagraph/dynet_api.py).

The parity tests run one program text on `dynet` and on `dynagraph` (import swap only) and
are skipped without dynet38; the rest pin our own semantics (re-evaluation recomputes only
the nodes that depend on a changed input, and gives the values and gradients of a fresh
graph to 1e-10 in float64).
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from types import ModuleType

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import dynet_api
from refcheck import using

try:
    import dynet as dn
except ImportError:  # the parity tests skip; our own semantics are still tested
    dn = None

needs_dynet = pytest.mark.skipif(dn is None, reason="dynet38 is not installed")
RTOL = 1e-4
XOR = [((0, 0), 0), ((0, 1), 1), ((1, 0), 1), ((1, 1), 0)]


def xor_program(m: ModuleType, init: list, epochs: int = 5):
    """DyNet's xor example: build the graph once, change its inputs with set(), train."""
    pc = m.ParameterCollection()
    W, b, V, a = (pc.add_parameters(s) for s in ((8, 2), 8, (1, 8), 1))
    for p, w in zip((W, b, V, a), init):
        p.set_value(w)
    trainer = m.SimpleSGDTrainer(pc, 0.2)
    m.renew_cg()
    x = m.vecInput(2)
    y = m.scalarInput(0)
    h = m.tanh(m.parameter(W) * x + m.parameter(b))
    out = m.logistic(m.parameter(V) * h + m.parameter(a))
    loss = m.binary_log_loss(out, y)
    losses = []
    for _ in range(epochs):
        for (x1, x2), label in XOR:
            x.set([x1, x2])
            y.set(label)
            losses.append(loss.scalar_value())
            loss.backward()
            trainer.update()
    return losses, [p.as_array() for p in (W, b, V, a)]


def _xor_init():
    rng = np.random.default_rng(3)
    return [rng.uniform(-1, 1, s).astype(np.float32).astype(np.float64) for s in ((8, 2), (8,), (1, 8), (1,))]


@needs_dynet
def test_xor_with_set_matches_dynet():
    with using(dtype="float32", seed=0):
        theirs_l, theirs_w = xor_program(dn, _xor_init())
        ours_l, ours_w = xor_program(dy, _xor_init())
    np.testing.assert_allclose(ours_l, theirs_l, rtol=RTOL)
    for o, t in zip(ours_w, theirs_w):
        np.testing.assert_allclose(o, t, rtol=RTOL, atol=1e-6)


def _mat_program(m: ModuleType, M: np.ndarray):
    pc = m.ParameterCollection()
    P = pc.parameters_from_numpy(M)
    m.renew_cg()
    x = m.vecInput(3)
    values = []
    for v in ([1.0, 2.0, 3.0], [-0.5, 0.25, 4.0]):
        x.set(v)
        e = m.sum_elems(m.parameter(P) * x)
        values.append(e.value())
        e.backward()
    return values, P.grad_as_array()


@needs_dynet
def test_vecinput_set_values_and_gradients_match_dynet():
    M = np.arange(6.0).reshape(2, 3) / 7
    with using(dtype="float32", seed=0):
        theirs = _mat_program(dn, M)
        ours = _mat_program(dy, M)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=RTOL)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=RTOL)


@needs_dynet
def test_forward_list_and_lookup_set_match_dynet():
    table = np.random.default_rng(0).uniform(-1, 1, (5, 3)).astype(np.float32).astype(np.float64)
    got = []
    for m in (dn, dy):
        pc = m.ParameterCollection()
        E = pc.lookup_parameters_from_numpy(table)
        m.renew_cg()
        e1, e2 = m.lookup(E, 1), m.tanh(m.lookup(E, 4))
        assert m.forward([e1, e2]) is None
        first = (e1.npvalue(), e2.npvalue())
        e1.set(3)
        got.append(first + (e1.npvalue(),))
    for o, t in zip(*got):
        np.testing.assert_allclose(o, t, rtol=RTOL)


@needs_dynet
def test_values_and_npvalues_match_dynet():
    got = []
    for m in (dn, dy):
        m.renew_cg()
        a, b = m.inputVector([1.0, 2.0]), m.scalarInput(3.0)
        got.append((m.values([a, b]), m.npvalues([a, m.tanh(a)])))
    assert got[0][0] == got[1][0]
    for o, t in zip(got[1][1], got[0][1]):
        np.testing.assert_allclose(o, t, rtol=RTOL)


@needs_dynet
def test_vecinput_starts_at_zero_like_dynet():
    dn.renew_cg()
    dy.renew_cg()
    np.testing.assert_array_equal(dy.vecInput(4).npvalue(), dn.vecInput(4).npvalue())


# ------------------------------------------------------------------------ our semantics
def test_matinput_set_is_column_major():
    dy.renew_cg()
    m = dy.matInput(2, 3)
    assert m.npvalue().shape == (2, 3) and not m.npvalue().any()
    m.set([1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(m.npvalue(), [[1, 3, 5], [2, 4, 6]])
    np.testing.assert_array_equal(m.npvalue(), dy.inputMatrix([1, 2, 3, 4, 5, 6], (2, 3)).npvalue())


def _graph(x_vals, z_val):
    """A graph with a branch that does not depend on x (only on z), and one that does."""
    pc = dy.ParameterCollection()
    W = pc.parameters_from_numpy(np.arange(12.0).reshape(4, 3) / 10)
    c = pc.parameters_from_numpy(np.array([0.3, -0.2, 0.1, 0.5]))
    dy.renew_cg()
    x = dy.vecInput(3)
    x.set(x_vals)
    z = dy.inputTensor(np.array([z_val, 1.0, 2.0, 3.0]))
    side = dy.tanh(dy.exp(z) * 0.1)  # independent of x
    loss = dy.sum_elems(dy.cmult(dy.tanh(dy.parameter(W) * x), side)) + dy.squared_norm(dy.const_parameter(c))
    return x, z, loss, W


@pytest.mark.parametrize("scheduler", ["none", "agenda", "depth"])
def test_set_gives_the_values_and_gradients_of_a_fresh_graph(scheduler):
    with using(dtype="float64", seed=0, scheduler=scheduler):
        x, z, loss, W = _graph([1.0, 2.0, 3.0], 0.5)
        loss.value()
        loss.backward()
        W.grad[...] = 0
        x.set([-1.0, 0.5, 0.25])
        z.set([0.1, 1.0, 2.0, 3.0])
        got_v = loss.value()
        loss.backward()
        got_g = W.grad_as_array().copy()
        _, _, fresh, W2 = _graph([-1.0, 0.5, 0.25], 0.1)
        want_v = fresh.value()
        fresh.backward()
        np.testing.assert_allclose(got_v, want_v, rtol=1e-10)
        np.testing.assert_allclose(got_g, W2.grad_as_array(), rtol=1e-10)


def test_set_recomputes_only_the_affected_nodes():
    with using(dtype="float64", seed=0, scheduler="none"):
        x, z, loss, _ = _graph([1.0, 2.0, 3.0], 0.5)
        loss.value()
        before = loss.cg.stats.nodes
        x.set([3.0, 2.0, 1.0])
        loss.value()
        recomputed = loss.cg.stats.nodes - before
        # x, W*x, tanh, cmult, sum_elems, the final add: 6 nodes. Not z's branch (exp, *0.1, tanh),
        # nor the constant parameter's squared_norm.
        assert recomputed == 6, recomputed


def test_set_after_update_reads_the_new_weights():
    """Nodes computed from a trained parameter recompute even when the input does not feed
    them, as in DyNet (whose set() invalidates the whole graph)."""
    with using(dtype="float64", seed=0):
        pc = dy.ParameterCollection()
        b = pc.parameters_from_numpy(np.array([1.0, 2.0]))
        dy.renew_cg()
        x = dy.vecInput(2)
        bias_only = dy.tanh(dy.parameter(b))
        loss = dy.sum_elems(x + bias_only)
        loss.value()
        loss.backward()
        dy.SimpleSGDTrainer(pc, 0.5).update()
        x.set([0.0, 0.0])
        np.testing.assert_allclose(loss.value(), np.tanh(b.as_array()).sum(), rtol=1e-12)


def test_set_rejects_bad_values():
    dy.renew_cg()
    x = dy.vecInput(3)
    with pytest.raises(dy.DynagraphError, match="3 values for an input|2 values"):
        x.set([1.0, 2.0])
    with pytest.raises(dy.DynagraphError, match="NaN"):
        x.set([1.0, float("nan"), 0.0])
    with pytest.raises(dy.DynagraphError, match="set\\(\\) works on inputs"):
        dy.tanh(x).set([1.0, 2.0, 3.0])
    E = dy.ParameterCollection().add_lookup_parameters((4, 2))
    e = dy.lookup(E, 1)
    with pytest.raises(dy.DynagraphIndexError, match="out of range"):
        e.set(9)
    with pytest.raises(dy.DynagraphError, match="positive int"):
        dy.vecInput(0)
    dy.renew_cg()
    with pytest.raises(dy.StaleExpressionError):
        x.set([1.0, 2.0, 3.0])


def test_pick_set_index():
    dy.renew_cg()
    v = dy.inputVector([1.0, 5.0, 7.0])
    p = dy.pick(v, 0)
    assert p.value() == 1.0
    p.set_index(2)
    assert p.value() == 7.0


def test_forward_list_evaluates_as_one_chunk():
    with using(dtype="float64", scheduler="agenda"):
        dy.renew_cg()
        W = dy.ParameterCollection().add_parameters((3, 3))
        outs = [dy.tanh(W * dy.inputVector([float(i), 1.0, 2.0])) for i in range(4)]
        dy.forward(outs)
        cg = outs[0].cg
        # the four tanh nodes were computed in one batch, not one by one
        assert ("tanh", 4) in cg.stats.batch_log or cg.stats.batches <= 4
        for i, o in enumerate(outs):
            assert o.npvalue().shape == (3,)


# ------------------------------------------------------------------- flags and params
def test_parse_argv_reads_dynet_flags_like_dynet():
    argv = ["prog", "--dynet-seed", "7", "--foo", "1", "--dynet_autobatch", "1", "--dynet-mem", "512,256",
            "--dynet-gpu", "--dynet-weight-decay", "1e-6", "x"]
    assert dynet_api.parse_argv(argv) == {"random_seed": 7, "autobatch": 1, "mem": "512,256",
                                          "requested_gpus": 1, "weight_decay": 1e-6}
    with pytest.raises(ValueError, match="--dynet-seed expects an argument"):
        dynet_api.parse_argv(["prog", "--dynet-seed"])
    with pytest.raises(ValueError, match="integer"):
        dynet_api.parse_argv(["prog", "--dynet-autobatch", "yes"])


def test_dynet_params_honour_seed_and_autobatch_and_warn_once_about_the_rest():
    with using(dtype="float64", seed=0):
        params = dy.DynetParams()
        params.set_random_seed(11)
        params.set_autobatch(0)
        params.set_mem(2048)
        dynet_api._warned.discard(("mem",))
        with pytest.warns(RuntimeWarning, match="mem are accepted and ignored"):
            params.init()
        assert dy.config.config.scheduler == "none" and dy.config.config.seed == 11
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            params.init()  # said once
        a = dy.ParameterCollection().add_parameters(3).as_array()
        dy.init_from_params(params)
        np.testing.assert_array_equal(dy.ParameterCollection().add_parameters(3).as_array(), a)
        params.set_autobatch(1)
        params.init()
        assert dy.config.config.scheduler == "lookahead"  # the agenda, with lookahead


_PROBE = ("import sys; argv = list(sys.argv); import dynagraph as dy; "
          "print(dy.config.config.scheduler, dy.config.config.seed, sys.argv == argv, sys.argv[1:])")


def _run_probe(*flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="default")
    env.pop("DYNAGRAPH_SCHEDULER", None)
    return subprocess.run([sys.executable, "-c", _PROBE, *flags], capture_output=True, text=True, env=env,
                          timeout=120)


def test_flags_are_read_at_import_and_argv_is_left_alone():
    r = _run_probe("--dynet-autobatch", "0", "--dynet-seed", "5", "--dynet-mem", "1024", "--dynet-mem", "64")
    assert r.returncode == 0, r.stderr
    scheduler, seed, unchanged, _ = r.stdout.split(maxsplit=3)
    assert (scheduler, seed, unchanged) == ("none", "5", "True")
    assert r.stderr.count("accepted and ignored") == 1
    r = _run_probe("--dynet-autobatch", "1", "--dynet-viz")
    assert r.stdout.strip() == "lookahead 0 False ['--dynet-autobatch', '1']", r.stdout  # --dynet-viz removed, as dynet.py does
    r = _run_probe("--dynet-seed")
    assert r.returncode != 0 and "--dynet-seed expects an argument" in r.stderr


@needs_dynet
def test_argv_after_import_matches_dynet():
    flags = ["--dynet-autobatch", "1", "--dynet-seed", "3", "--dynet-mem", "64", "rest", "--dynet-viz"]
    probe = "import sys; import {} ; print(sys.argv[1:])"
    outs = [subprocess.run([sys.executable, "-c", probe.format(mod), *flags], capture_output=True, text=True,
                           timeout=120).stdout.strip().splitlines()[-1] for mod in ("dynet", "dynagraph")]
    assert outs[0] == outs[1]
