"""Graphs are context-local: each thread (and greenlet) has its own `with cg:` stack and default graph.

Parameters may be shared across threads read-only (values, not updates): every thread here
reads the same ParameterCollection."""
import threading

import numpy as np
import pytest

import dynagraph as dy

THREADS, ITERS = 8, 500


def _model():
    pc = dy.ParameterCollection()
    dy.config.set(random_seed=3)
    return pc, pc.add_parameters((6, 5)), pc.add_lookup_parameters((20, 5))


def _iteration(W, E, t: int, k: int, use_with: bool) -> float:
    """One small graph, evaluated and differentiated; a different path on each parity."""
    if use_with:
        g = dy.ComputationGraph(scheduler="agenda")
        with g:
            h = dy.tanh(W * (E[(t + k) % 20] + E[(3 * k) % 20]))
            loss = dy.pickneglogsoftmax(h, (t * k) % 6)
            assert dy.cg() is g
            return loss.value()
    dy.renew_cg(scheduler="depth")
    h = dy.logistic(W * E[(t * 7 + k) % 20])
    return dy.sum_elems(h).value()


def _serial(W, E, t: int) -> list:
    return [_iteration(W, E, t, k, k % 2 == 0) for k in range(ITERS)]


def test_threads_each_with_their_own_graphs_equal_serial_runs():
    pc, W, E = _model()
    expected = [_serial(W, E, t) for t in range(THREADS)]
    got, errors = [None] * THREADS, []
    start = threading.Barrier(THREADS)

    def work(t):
        try:
            start.wait()
            got[t] = _serial(W, E, t)
        except BaseException as e:  # reported below: a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    for t in range(THREADS):
        np.testing.assert_allclose(got[t], expected[t], rtol=0, atol=1e-12)


def test_with_graph_and_default_graph_do_not_leak_between_threads():
    main_default = dy.renew_cg()
    mine = dy.ComputationGraph()
    seen = {}
    with mine:
        def other():
            seen["current"] = dy.cg()
            seen["renewed"] = dy.renew_cg()
        th = threading.Thread(target=other)
        th.start()
        th.join()
        assert dy.cg() is mine
    assert seen["current"] is not mine and seen["current"] is not main_default
    assert dy.cg() is main_default and not main_default.retired  # the thread renewed only its own
    assert seen["renewed"] is not main_default


def test_nested_with_and_exit_in_any_order():
    a, b = dy.ComputationGraph(), dy.ComputationGraph()
    with a:
        with b:
            assert dy.cg() is b
            with a:
                assert dy.cg() is a
            assert dy.cg() is b
        assert dy.cg() is a


def test_graph_versions_unique_across_threads():
    versions, lock = [], threading.Lock()

    def make():
        mine = [dy.ComputationGraph().version for _ in range(200)]
        with lock:
            versions.extend(mine)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(set(versions)) == len(versions)


def test_greenlets_have_their_own_graph_stack():
    greenlet = pytest.importorskip("greenlet")
    g1 = dy.ComputationGraph()
    seen = []

    def body():
        seen.append(dy.cg())
        with dy.ComputationGraph() as inner:
            greenlet.getcurrent().parent.switch()
            seen.append(dy.cg() is inner)

    let = greenlet.greenlet(body)
    with g1:
        let.switch()              # body entered its own `with`, then switched back here
        assert dy.cg() is g1      # ... which this greenlet does not see
        let.switch()
    assert seen[0] is not g1 and seen[1] is True
