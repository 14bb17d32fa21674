"""dy.autobatch_map: samples with data-dependent control flow run concurrently on one graph.

Reference: the same function run one sample after another (`concurrent=False`) under the
unbatched scheduler. Concurrent runs under every scheduler give the same values and
gradients, 1e-10 in float64, with teacher-forced and argmax decisions, early exit and dropout."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from refcheck import memory_growth

import dynagraph as dy
from dynagraph.errors import DynagraphError

pytest.importorskip("greenlet")

H, V = 6, 7
SCHEDULERS = ["none", "depth", "agenda", "typewise", "fsm"]


def _model():
    pc = dy.ParameterCollection()
    rng = np.random.default_rng(4)
    p = {n: pc.add_parameters(s, init=rng.normal(0, 0.6, s))
         for n, s in [("W", (H, H)), ("U", (H, H)), ("b", (H,)), ("O", (V, H)), ("v", (H,))]}
    p["E"] = pc.add_lookup_parameters((V, H), init=rng.normal(0, 0.6, (V, H)))
    return pc, p


def _decoder(p, dropout: float):
    """A decoder that feeds back its argmax (or the gold word) and exits early when a gate fires."""
    def decode(sample):
        words, gold = sample
        h = dy.zeros(H)
        losses, w = [], words[0]
        for t in range(len(words)):
            x = p["E"][w]
            if dropout:
                x = dy.dropout(x, dropout)
            h = dy.tanh(p["W"] * x + p["U"] * h + p["b"])
            s = p["O"] * h
            if gold:                                  # teacher forced
                y = words[t]
                w = y
            else:                                     # sampled: the model's own argmax
                y = int(np.argmax(s.npvalue()))
                w = y
            losses.append(dy.pickneglogsoftmax(s, y))
            if float(dy.logistic(dy.dot_product(p["v"], h))) > 0.8 and t >= 1:  # early exit
                break
        return dy.esum(losses)
    return decode


def _samples(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [([int(w) for w in rng.integers(0, V, rng.integers(1, 9))], bool(i % 2)) for i in range(n)]


def _run(pc, p, samples, scheduler: str, concurrent: bool, dropout: float):
    dy.reset_random_seed(11)
    dy.renew_cg(scheduler=scheduler)
    pc.reset_gradient()
    losses = dy.autobatch_map(_decoder(p, dropout), samples, concurrent=concurrent)
    total = dy.esum(losses)
    total.backward()
    grads = {n: q.grad_as_array() for n, q in p.items()}
    return [l.value() for l in losses], grads, dy.cg()


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_values_and_gradients_equal_one_by_one(float64, scheduler, dropout):
    pc, p = _model()
    samples = _samples(12)
    ref_vals, ref_grads, ref_cg = _run(pc, p, samples, "none", False, dropout)
    vals, grads, cg = _run(pc, p, samples, scheduler, True, dropout)
    np.testing.assert_allclose(vals, ref_vals, rtol=0, atol=1e-10)
    for n in ref_grads:
        np.testing.assert_allclose(grads[n], ref_grads[n], rtol=0, atol=1e-10, err_msg=n)
    assert any(abs(g).sum() > 0 for g in grads.values())
    if scheduler != "none":  # the point: samples' ops share batches
        assert cg.stats.batches < ref_cg.stats.batches / 3


def test_dropout_masks_follow_the_sample_not_the_schedule(float64):
    pc, p = _model()
    samples = _samples(6)
    a, _, _ = _run(pc, p, samples, "agenda", True, 0.5)
    b, _, _ = _run(pc, p, samples[:3], "agenda", True, 0.5)  # fewer neighbours: same first three
    np.testing.assert_allclose(a[:3], b, rtol=0, atol=1e-12)
    c, _, _ = _run(pc, p, samples, "agenda", True, 0.0)
    assert not np.allclose(a, c)  # dropout is on


def test_reads_park_every_sample_and_one_chunk_serves_them():
    pc, p = _model()
    chunks: list = []

    def f(k):
        h = dy.zeros(H)
        for _ in range(k):
            h = dy.tanh(p["W"] * h + p["b"])
            chunks.append(dy.cg().done)
            h.value()
        return k

    dy.renew_cg(scheduler="agenda")
    assert dy.autobatch_map(f, [3, 1, 2, 3]) == [3, 1, 2, 3]
    # three rounds of reads, each served by one evaluation: zeros, then matmul, add, tanh a round
    assert dy.cg().stats.batches == 1 + 3 * 3
    assert chunks[:4] == [0, 0, 0, 0]  # every sample recorded its first step before any ran
    dy.renew_cg(scheduler="agenda")
    dy.autobatch_map(f, [3, 1, 2, 3], concurrent=False)
    assert dy.cg().stats.batches == 9 * 3 + 4  # one by one: every step and every zeros alone


def test_every_way_of_reading_parks():
    pc, p = _model()
    reads = [lambda e: e.value(), lambda e: e.npvalue(), lambda e: e.scalar_value(), lambda e: float(e),
             lambda e: e.value() > 0, lambda e: e.vec_value(), lambda e: dy.cg().evaluate_pending()]

    def f(k):
        e = dy.sum_elems(dy.tanh(p["W"] * p["E"][k] + p["b"]))
        before = dy.cg().done
        reads[k](e)
        return before, dy.cg().done

    dy.renew_cg(scheduler="agenda")
    out = dy.autobatch_map(f, list(range(len(reads))))
    assert all(after > before for before, after in out)
    assert dy.cg().stats.batches <= 6  # lookup, matmul, add, tanh, sum: once for all samples


def test_exception_names_the_sample_and_stops_the_others():
    stopped = []

    def f(i):
        try:
            x = dy.inputVector([1.0, 2.0])
            x.value()
            if i == 2:
                raise ValueError("bad sample")
            x.value()
            dy.tanh(x).value()
        finally:
            stopped.append(i)
        return i

    with pytest.raises(ValueError, match="bad sample") as info:
        dy.autobatch_map(f, range(5))
    assert info.value.sample_index == 2
    assert any("sample 2" in n for n in info.value.__notes__)
    assert sorted(stopped) == [0, 1, 2, 3, 4]  # every sample's finally ran


def test_workers_are_reused_across_maps_errors_and_threads(monkeypatch):
    """Samples run on pooled worker greenlets: a second map starts none; a sample that raised, or
    was stopped, leaves its worker usable; each thread has its own pool."""
    import threading

    from dynagraph import concurrent

    def f(i):
        x = dy.inputVector([float(i)])
        for _ in range(i % 3):
            x = x * 2
            x.value()
        return float(x)

    expected = [float(i) * 2 ** (i % 3) for i in range(40)]
    assert dy.autobatch_map(f, range(40)) == expected
    made = []
    real = concurrent.greenlet
    monkeypatch.setattr(concurrent, "greenlet", lambda *a, **k: made.append(1) or real(*a, **k))
    assert dy.autobatch_map(f, range(40)) == expected and not made

    stopped = []

    def g(i):
        try:
            dy.inputVector([1.0]).value()
            if i == 3:
                raise KeyError(i)
            dy.inputVector([2.0]).value()
        finally:
            stopped.append(i)

    with pytest.raises(KeyError):
        dy.autobatch_map(g, range(8))
    assert sorted(stopped) == list(range(8))
    assert dy.autobatch_map(f, range(40)) == expected and not made

    out = []
    t = threading.Thread(target=lambda: out.append(dy.autobatch_map(f, range(5))))
    t.start()
    t.join()
    assert out == [expected[:5]]


def test_record_time_error_in_one_sample_keeps_its_type(pc):
    W = pc.add_parameters((3, 4))

    def f(n):
        return (W * dy.inputVector([1.0] * n)).value()

    with pytest.raises(DynagraphError) as info:
        dy.autobatch_map(f, [4, 4, 5, 4])
    assert info.value.sample_index == 2


def test_samples_that_never_read_do_not_deadlock():
    def f(i):
        return dy.inputVector([float(i)]) * 2 if i % 2 else i

    out = dy.autobatch_map(f, range(6))
    assert [o if isinstance(o, int) else o.value() for o in out] == [0, 2.0, 2, 6.0, 4, 10.0]
    assert dy.autobatch_map(f, []) == []


def test_nested_maps_and_plain_value_outside():
    pc, p = _model()

    def inner(k):
        return dy.sum_elems(dy.tanh(p["E"][k])).value()

    def outer(ks):
        first = dy.autobatch_map(inner, ks)
        return first, dy.autobatch_map(inner, [k + 1 for k in ks], concurrent=False)

    dy.renew_cg(scheduler="agenda")
    got = dy.autobatch_map(outer, [[0, 1], [2], [3, 4, 5]])
    expected = [([inner(k) for k in ks], [inner(k + 1) for k in ks]) for ks in [[0, 1], [2], [3, 4, 5]]]
    np.testing.assert_allclose(np.concatenate([a + b for a, b in got]),
                               np.concatenate([a + b for a, b in expected]), rtol=0, atol=1e-6)
    e = dy.tanh(p["E"][1])  # outside any map: evaluates at once, as before
    assert dy.cg().done == 0 or e.i >= dy.cg().done
    e.value()
    assert dy.cg().done == e.i + 1


def test_decorator_form():
    @dy.autobatch_map
    def square(x):
        return (dy.scalarInput(x) * dy.scalarInput(x)).value()

    assert square([1.0, 2.0, 3.0]) == [1.0, 4.0, 9.0]
    assert square([2.0], concurrent=False) == [4.0]


def test_backward_inside_a_concurrent_sample_raises():
    def f(x):
        dy.scalarInput(x).backward()

    with pytest.raises(DynagraphError, match="after the map"):
        dy.autobatch_map(f, [1.0, 2.0])
    dy.renew_cg()
    dy.autobatch_map(f, [1.0], concurrent=False)  # one by one it is allowed


def test_thousand_samples_do_not_grow_memory():
    pc, p = _model()

    def f(k):
        h = dy.tanh(p["E"][k % V])
        if h.value()[0] > 0:
            h = dy.tanh(p["W"] * h)
        return float(dy.sum_elems(h))

    def round_():
        dy.renew_cg(scheduler="agenda")
        out = dy.autobatch_map(f, range(1000))
        assert len(out) == 1000

    first, last = memory_growth(round_)
    assert last - first < 200_000, (first, last)


@pytest.mark.parametrize("kind,scheduler", [(k, "agenda") for k in ["nestedrnn", "drnn", "earlyexit", "stackrnn",
                                                                     "treelstm", "birnn"]]
                         + [("stackrnn", "depth"), ("drnn", "depth")])  # ghosts and per-round depths
def test_acrobat_bench_models_equal_one_by_one(float64, kind, scheduler, monkeypatch):
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.acrobat_models import Model
    from dynagraph.config import config
    monkeypatch.setattr(config, "scheduler", scheduler)
    seeds = [3, 8, 13, 21]
    for train in (False, True):
        dy.reset_random_seed(2)
        a = Model(dy, kind, 8).step(seeds, train, concurrent=True)
        dy.reset_random_seed(2)
        b = Model(dy, kind, 8).step(seeds, train, concurrent=False)
        assert a == pytest.approx(b, abs=1e-10)


def test_stack_parser_example_concurrent_equals_one_by_one(monkeypatch, tmp_path):
    import importlib
    import os
    import sys
    monkeypatch.setenv("DYNAGRAPH_DATA", str(tmp_path))  # synthetic trees: tests never read ../shared
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    sys.path.insert(0, examples)
    try:
        ex = importlib.import_module("stack_parser")
    finally:
        sys.path.remove(examples)
    from dynagraph import schedulers
    from dynagraph.config import config
    monkeypatch.setattr(config, "schedule_cache", False)  # every chunk scheduled, so counted
    scheduled, get = [0], schedulers.get

    class Counting:  # the scheduler's batches (stats.batches counts kernel launches: the executor
        def __init__(self, inner):  # may run a batch of a few nodes node by node)
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def schedule(self, cg, pending):
            batches = self.inner.schedule(cg, pending)
            scheduled[0] += len(batches)
            return batches

    monkeypatch.setattr(schedulers, "get", lambda spec: Counting(get(spec)))
    args = ["--quiet", "--train", "24", "--dev", "12", "--epochs", "2", "--batch-size", "8", "--hidden", "8"]
    a = ex.main(args)
    b = ex.main(args + ["--sequential", "1"])
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=1e-4)
    assert a["root_acc"] == b["root_acc"] and a["exact_trees"] == b["exact_trees"]
    assert a["dev_batches"] < b["dev_batches"] / 2
    counts = []
    for sequential in ("0", "1"):  # parsing only: the argmax steps of the parsers batched together
        scheduled[0] = 0
        ex.main(args[:5] + ["--epochs", "0"] + args[7:] + ["--sequential", sequential])
        counts.append(scheduled[0])
    assert counts[0] < counts[1] / 3, counts
    assert a["losses"][-1] < a["losses"][0]


def _phased_decoder(p, use_phase: bool):
    """Reads only the exit gate; the output layer and loss of every step sit in phase 1."""
    def decode(sample):
        words, _ = sample
        h, losses = dy.zeros(H), []
        for t, w in enumerate(words):
            h = dy.tanh(p["W"] * p["E"][w] + p["U"] * h + p["b"])
            with dy.phase(1 if use_phase else 0):
                losses.append(dy.pickneglogsoftmax(p["O"] * h, words[(t + 1) % len(words)]))
            if float(dy.logistic(dy.dot_product(p["v"], h))) > 0.8 and t >= 1:
                break
        return dy.esum(losses)
    return decode


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_phase_defers_output_layers_to_one_batch(float64, scheduler):
    pc, p = _model()
    samples = _samples(10, seed=3)
    out = {}
    for name, phased, concurrent in [("ref", False, False), ("plain", False, True), ("phased", True, True)]:
        dy.renew_cg(scheduler="none" if name == "ref" else scheduler)
        pc.reset_gradient()
        losses = dy.autobatch_map(_phased_decoder(p, phased), samples, concurrent=concurrent)
        total = dy.esum(losses)
        total.backward()
        out[name] = ([l.value() for l in losses], {n: q.grad_as_array() for n, q in p.items()},
                     dy.cg().stats.by_op())
    for name in ("plain", "phased"):
        np.testing.assert_allclose(out[name][0], out["ref"][0], rtol=0, atol=1e-10)
        for n in out["ref"][1]:
            np.testing.assert_allclose(out[name][1][n], out["ref"][1][n], rtol=0, atol=1e-10, err_msg=n)
    phased, plain = (out[k][2]["pickneglogsoftmax"][1] for k in ("phased", "plain"))
    if scheduler in ("agenda", "typewise"):
        # every step's loss of every sample: one batch at the end instead of one per read round
        assert phased == 1 and plain > 3
    # depth batches only equal depths (7 batches here, phased or not): phases cannot help it


def test_phase_outside_a_map_and_a_read_inside_a_phase():
    pc, p = _model()
    with dy.phase(2):  # no map: nothing changes
        assert dy.tanh(p["E"][1]).value()

    def f(k):
        with dy.phase(1):
            e = dy.tanh(p["E"][k])
            v = e.npvalue()  # a read of a deferred node evaluates it
        return float(v.sum())

    dy.renew_cg(scheduler="agenda")
    got = dy.autobatch_map(f, [0, 1, 2])
    np.testing.assert_allclose(got, [np.tanh(p["E"].as_array()[k]).sum() for k in range(3)], rtol=1e-5)


def _example(name, monkeypatch, tmp_path):
    import importlib
    import os
    import sys
    monkeypatch.setenv("DYNAGRAPH_DATA", str(tmp_path))  # synthetic data: tests never read ../shared
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    sys.path.insert(0, examples)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(examples)


def test_lstm_decoder_example_concurrent_equals_one_by_one(monkeypatch, tmp_path):
    ex = _example("lstm_decoder", monkeypatch, tmp_path)
    args = ["--quiet", "--train", "48", "--prompts", "6", "--epochs", "2", "--batch-size", "16", "--hidden", "8",
            "--vocab", "40", "--max-len", "6"]
    a, b = ex.main(args), ex.main(args + ["--sequential", "1"])
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=1e-4)
    assert a["losses"][-1] < a["losses"][0]
    for name in ("greedy", "beam"):
        assert a[name]["texts"] == b[name]["texts"]
        assert a[name]["batches"] < b[name]["batches"] / 2


def test_early_exit_example_concurrent_equals_one_by_one(monkeypatch, tmp_path):
    ex = _example("early_exit", monkeypatch, tmp_path)
    args = ["--quiet", "--train", "64", "--dev", "24", "--epochs", "2", "--batch-size", "16", "--hidden", "8",
            "--layers", "4", "--threshold", "0.3"]
    a, b = ex.main(args), ex.main(args + ["--sequential", "1"])
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=1e-4)
    assert a["preds"] == b["preds"]
    assert a["batches"] < b["batches"] / 3


def test_drnn_example_concurrent_equals_one_by_one(monkeypatch, tmp_path):
    ex = _example("drnn", monkeypatch, tmp_path)
    args = ["--quiet", "--train", "32", "--generate", "8", "--epochs", "2", "--batch-size", "16", "--hidden", "8",
            "--max-depth", "3"]
    a, b = ex.main(args), ex.main(args + ["--sequential", "1"])
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=1e-4)
    assert a["losses"][-1] < a["losses"][0]
    assert a["trees"] == b["trees"]
    assert a["batches"] < 0.7 * b["batches"]  # depth-first recursions only partly align


def _random_program(p, steps):
    """A per-sample program from hypothesis: each step applies an op, maybe in phase 1, maybe reads."""
    def fn(k):
        h, acc = p["E"][k % V], []
        for op, phased, read in steps[k % len(steps)]:
            with dy.phase(1 if phased else 0):
                if op == 0:
                    h = dy.tanh(p["W"] * h + p["b"])
                elif op == 1:
                    h = dy.logistic(p["U"] * h) + h
                elif op == 2:
                    acc.append(dy.pickneglogsoftmax(p["O"] * h, k % V))
                else:  # scratch nodes between cg_checkpoint() and cg_revert(), read or not
                    dy.cg_checkpoint()
                    s = dy.tanh(p["U"] * h)
                    square = read and float(dy.sum_elems(s)) > 0  # parks inside the checkpoint
                    dy.cmult(h, h)  # recorded after the read: the revert drops it
                    dy.pickneglogsoftmax(p["O"] * s, 0)
                    dy.cg_revert()
                    if square:
                        h = dy.cmult(h, h)
            if read and float(dy.sum_elems(h)) > 0:  # a data-dependent branch after the read
                h = dy.cmult(h, h)
        return dy.esum(acc + [dy.sum_elems(h)])
    return fn


_step = st.tuples(st.integers(0, 3), st.booleans(), st.booleans())


@settings(max_examples=25, deadline=None)
@given(programs=st.lists(st.lists(_step, min_size=1, max_size=6), min_size=1, max_size=4),
       n=st.integers(1, 7), scheduler=st.sampled_from(["agenda", "depth", "typewise"]))
def test_random_programs_with_reads_and_phases_equal_one_by_one(programs, n, scheduler):
    with _Float64():
        pc, p = _model()
        out = []
        for sched, concurrent in [("none", False), (scheduler, True)]:
            dy.renew_cg(scheduler=sched)
            pc.reset_gradient()
            losses = dy.autobatch_map(_random_program(p, programs), range(n), concurrent=concurrent)
            dy.esum(losses).backward()
            out.append(([l.value() for l in losses], [q.grad_as_array() for q in p.values()]))
        np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-12, atol=1e-10)  # squares reach 1e6
        for a, b in zip(out[1][1], out[0][1]):
            # a gradient sums terms up to ~1e7 (the squares' chain rule): a small entry among them
            # carries rounding of the large ones, so 1e-10 is relative to the array's scale
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-10 * max(1.0, float(np.abs(b).max(initial=0.0))))


class _Float64:
    """float64 inside a hypothesis example (function-scoped fixtures do not reset between examples)."""

    def __enter__(self):
        from refcheck import using
        self._ctx = using(dtype="float64", seed=0)
        self._ctx.__enter__()

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


def test_acrobat_bench_driver_prints_its_table(capsys):
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench import acrobat_bench
    acrobat_bench.main(["--models", "earlyexit", "--batches", "2", "--modes", "infer", "--rounds", "1",
                        "--systems", "concurrent,one-by-one", "--hidden", "8"])
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.startswith("earlyexit")]
    assert len(row) == 1 and len(row[0].split()) == 3 + 2 + 1 + 6, out  # 3 keys, 2 systems, 1 ratio, bounds, launches
    batches, bound, _, rounds, _, launches = map(float, row[0].split()[6:])
    assert bound <= rounds <= batches <= launches


class _Nodes:
    """What _Deferred.split reads of a graph: each node's argument ids."""

    def __init__(self):
        self.args = []


@settings(max_examples=60, deadline=None)
@given(rounds=st.lists(st.lists(st.tuples(st.booleans(), st.lists(st.integers(1, 40), max_size=3),
                                          st.booleans()), min_size=1, max_size=12), min_size=1, max_size=8),
       poke=st.booleans())
def test_incremental_phase_split_keeps_the_chunk_contract(rounds, poke):
    """dy.phase's split, kept from round to round, against engine's stateless one: run and left
    partition the chunk; nothing run reads a node left; every read's value and what it needs run;
    every deferred node no read needs is left; it leaves at least what the stateless split leaves.
    `poke`: something else evaluates a left node between rounds (the split starts over)."""
    from dynagraph.concurrent import _Deferred
    from dynagraph.engine import _split_deferred
    g, d = _Nodes(), _Deferred()
    done, left = set(), []
    for nodes in rounds:
        new, targets = [], []
        for deferred, back, read in nodes:
            n = len(g.args)
            g.args.append(tuple(sorted({n - b for b in back if n - b >= 0})))
            if deferred:
                d.add(n, n + 1)
            if read:
                targets.append(n)
            new.append(n)
        pending = left + new
        ids = d.ids()
        ref_run, ref_left = _split_deferred(g, list(pending), ids, targets)
        run, left = d.split(g, list(pending), targets)
        assert run == sorted(run) and left == sorted(left) and sorted(run + left) == pending
        assert set(ref_left) <= set(left) and set(run) <= set(ref_run)
        assert not any(set(g.args[n]) & set(left) for n in run)
        needed, stack = set(), list(targets)
        while stack:
            n = stack.pop()
            if n not in done and n not in needed:
                needed.add(n)
                stack.extend(g.args[n])
        assert needed <= set(run)
        assert {n for n in pending if n in ids} - needed <= set(left)
        done |= set(run)
        if poke and left:  # e.g. a nested map's own evaluation
            done.add(left[0])
            left = left[1:]


def test_maps_raise_the_collection_threshold_and_restore_it():
    """While any map runs the cyclic collector runs less often (its young threshold raised); the
    caller's thresholds come back after the map, after a nested map, after an error, and a
    caller that turned collection off (threshold 0) keeps it off."""
    import gc

    from dynagraph import concurrent

    seen = []

    def f(x):
        seen.append(gc.get_threshold()[0])
        if x == 2:
            dy.autobatch_map(lambda y: seen.append(gc.get_threshold()[0]), [0, 1])
        v = dy.scalarInput(float(x)).value()
        if x == 3:
            raise ValueError("three")
        return v

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert dy.autobatch_map(f, [0, 1, 2]) == [0.0, 1.0, 2.0]
        assert dy.autobatch_map(f, [1, 2], concurrent=False) == [1.0, 2.0]
        assert set(seen) == {concurrent.GC_THRESHOLD} and gc.get_threshold() == (700, 10, 10)
        with pytest.raises(ValueError):
            dy.autobatch_map(f, [1, 3])
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(0)
        seen.clear()
        dy.autobatch_map(f, [0, 1])
        assert seen == [0, 0] and gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*saved)


@settings(max_examples=80, deadline=None)
@given(backs=st.lists(st.lists(st.integers(1, 12), max_size=3), min_size=1, max_size=40),
       tainted=st.sets(st.integers(0, 39), max_size=8), lo=st.integers(0, 39), targets=st.lists(st.integers(0, 39)))
def test_phase_split_twins_agree(backs, tainted, lo, targets):
    """kernels/cpython/phase_split.c against its Python twins (concurrent._users_split_py,
    graph.needed_within): the same (run, left), the same tainted set after, the same needed nodes."""
    from dynagraph import concurrent
    from dynagraph.graph import needed_within
    from dynagraph.recording import NATIVE
    if getattr(NATIVE, "users_split", None) is None:
        pytest.skip("the compiled _bookkeeping module is not built")
    args = [tuple(sorted({n - b for b in back if n - b >= 0})) for n, back in enumerate(backs)]
    tainted = {t for t in tainted if t < len(args)}
    nodes = list(range(min(lo, len(args) - 1), len(args)))
    t_py, t_c = set(tainted), set(tainted)
    assert NATIVE.users_split(args, t_c, nodes) == tuple(concurrent._users_split_py(args, t_py, nodes))
    assert t_c == t_py
    targets = [t for t in targets if t < len(args)]
    assert NATIVE.needed_within(args, t_c, targets) == needed_within(args, t_c, targets)
    with pytest.raises(IndexError):
        NATIVE.users_split(args, set(), [len(args)])
    with pytest.raises(TypeError):
        NATIVE.users_split(args, frozenset(), nodes)


def test_map_chunks_skip_the_schedule_cache_and_plain_evaluations_keep_it(monkeypatch):
    """A concurrent map's chunks are cut where the samples' reads fell and hardly ever repeat:
    they are neither looked up nor stored; a plain evaluation of the same graph still is."""
    from dynagraph.config import config
    from dynagraph.schedule_cache import SCHEDULES
    monkeypatch.setattr(config, "schedule_cache", True)
    _, p = _model()

    def f(k):
        h = dy.tanh(p["W"] * p["E"][k % V])
        for _ in range(3):
            if h.value()[0] > 0:
                h = dy.tanh(p["U"] * h + p["b"])
        return dy.sum_elems(h)

    SCHEDULES.clear()
    dy.renew_cg(scheduler="agenda")
    out = dy.autobatch_map(f, range(6))
    assert SCHEDULES.hits == SCHEDULES.misses == 0 and not SCHEDULES.entries
    dy.esum(out).value()  # after the map: a plain evaluation, cached as before
    assert SCHEDULES.misses == 1 and len(SCHEDULES.entries) == 1
    SCHEDULES.clear()


@pytest.mark.parametrize("disturb", ["recalculate", "set", "revert", "plain"])
def test_phase_chunks_survive_invalidate_set_and_revert_between_reads(float64, disturb):
    """The map's chunks take the nodes its split left pending from the split itself instead of
    scanning the graph; a sample that re-evaluates everything (value(recalculate=True)), changes
    an input (set()) or reverts to a checkpoint between reads makes the next chunk scan again:
    values and gradients stay those of the samples run one by one."""
    pc, p = _model()

    def f(k):
        h = dy.tanh(p["W"] * p["E"][k % V])
        x = dy.inputVector([0.1 * k] * H)
        losses = []
        for t in range(4):
            with dy.phase(1):
                losses.append(dy.pickneglogsoftmax(p["O"] * h, (k + t) % V))
            if k == 1 and t == 1:
                if disturb == "recalculate":
                    h.value(recalculate=True)
                elif disturb == "set":
                    x.set([0.2 * k] * H)
                elif disturb == "revert":  # no read in between: other samples' nodes would go too
                    dy.cg_checkpoint()
                    dy.tanh(p["U"] * h)
                    dy.cg_revert()
            if h.value()[0] > -0.5:
                h = dy.tanh(p["U"] * h + dy.cmult(x, p["v"]) + p["b"])
        return dy.esum(losses)

    out = []
    for concurrent in (False, True):
        dy.renew_cg(scheduler="agenda")
        pc.reset_gradient()
        losses = dy.autobatch_map(f, range(5), concurrent=concurrent)
        dy.esum(losses).backward()
        out.append(([l.value() for l in losses], {n: q.grad_as_array() for n, q in p.items()}))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=0, atol=1e-10)
    for n in out[0][1]:
        np.testing.assert_allclose(out[1][1][n], out[0][1][n], rtol=0, atol=1e-10, err_msg=n)


def test_phase_chunk_equals_a_full_scan_for_pending_nodes(monkeypatch):
    """_Deferred.chunk (the nodes the last split left, then those recorded since) is the engine's
    scan of every pending node from cg.done, round after round, on the bench's phased models."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.acrobat_models import Model
    from dynagraph import concurrent
    chunk, used = concurrent._Deferred.chunk, []

    def checked(self, cg, upto):
        got = chunk(self, cg, upto)
        assert got == concurrent._pending(cg.blk, cg.done, upto + 1)
        used.append(bool(self.left))
        return got

    monkeypatch.setattr(concurrent._Deferred, "chunk", checked)
    for kind in ("stackrnn", "drnn"):
        m = Model(dy, kind, 8)
        for train in (True, False):
            m.step(list(range(12)), train, True)
    assert any(used)


def _beam_scorer(p, read_inside: bool, phased: bool):
    """A sample that scores throw-away hypotheses between cg_checkpoint() and cg_revert() (as a
    beam search does), reading their scores inside or only before the checkpoint."""
    def f(k):
        h = dy.tanh(p["W"] * p["E"][k % V])
        losses = []
        for t in range(3):
            best = h.value()[0]
            dy.cg_checkpoint()
            for w in range(1 + (k + t) % 3):  # a data-dependent number of hypotheses
                with dy.ghost(site="beam"):  # arms of two lengths: under `depth` both are padded
                    cand = dy.tanh(p["U"] * h + p["E"][w])
                    if w % 2:
                        cand = dy.tanh(p["W"] * cand)
                if phased:
                    with dy.phase(1):
                        dy.pickneglogsoftmax(p["O"] * cand, w)
                if read_inside:
                    best = max(best, cand.value()[0])
            if phased:  # deferred, then dropped: the map's record of deferred nodes forgets it
                with dy.phase(1):
                    dy.pickneglogsoftmax(p["O"] * h, 0)
            dy.cg_revert()
            with dy.phase(1 if phased else 0):
                losses.append(dy.pickneglogsoftmax(p["O"] * h, (k + t) % V))
            h = dy.tanh(p["U"] * h + p["b"] * best)
        return dy.esum(losses)
    return f


@pytest.mark.parametrize("phased", [False, True])
@pytest.mark.parametrize("read_inside", [False, True])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_checkpoint_and_revert_inside_samples(float64, scheduler, read_inside, phased):
    """cg_checkpoint()/cg_revert() inside concurrent samples act per sample: a revert drops only
    that sample's nodes, never another's (with no read since its checkpoint, only its own were
    recorded; after a read, others' nodes interleave, so its throw-away nodes stay in the graph,
    unused). Values and gradients equal the samples run one by one."""
    pc, p = _model()
    f = _beam_scorer(p, read_inside, phased)
    out = []
    for sched, concurrent in (("none", False), (scheduler, True)):
        dy.renew_cg(scheduler=sched)
        pc.reset_gradient()
        losses = dy.autobatch_map(f, range(7), concurrent=concurrent)
        dy.esum(losses).backward()
        out.append(([l.value() for l in losses], {n: q.grad_as_array() for n, q in p.items()}, len(dy.cg())))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=0, atol=1e-10)
    for n in out[0][1]:
        np.testing.assert_allclose(out[1][1][n], out[0][1][n], rtol=0, atol=1e-10, err_msg=n)
    if not read_inside:  # every revert truncated: the graph is as small as the one-by-one run's
        assert out[1][2] == out[0][2]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_revert_after_a_read_drops_what_the_sample_recorded_since(scheduler):
    """After a read, a revert drops the nodes the sample recorded since it resumed (only it
    recorded then); what it recorded before the read stays, evaluated, unused."""
    _, p = _model()

    def f(k, after: bool):
        h = dy.tanh(p["W"] * p["E"][k % V])
        dy.cg_checkpoint()
        a = dy.tanh(p["U"] * h)
        a.value()
        if after:
            for _ in range(k % 3 + 1):
                a = dy.tanh(p["W"] * a)
        dy.cg_revert()
        h = dy.tanh(p["U"] * h + p["b"])
        return h.value()

    sizes, values = [], []
    for after in (False, True):
        dy.renew_cg(scheduler=scheduler)
        values.append(dy.autobatch_map(lambda k, after=after: f(k, after), range(6)))
        sizes.append(len(dy.cg()))
    assert sizes[0] == sizes[1]
    np.testing.assert_allclose(values[1], values[0], rtol=0, atol=0)


def test_revert_inside_a_sample_needs_its_own_checkpoint():
    """A checkpoint taken outside the map (or by another sample) is not a sample's to revert."""
    _, p = _model()
    dy.renew_cg()
    dy.cg_checkpoint()

    def f(k):
        dy.tanh(p["W"] * p["E"][k])
        dy.cg_revert()

    with pytest.raises(DynagraphError, match="cg_checkpoint.*this sample") as info:
        dy.autobatch_map(f, range(3))
    assert info.value.sample_index == 0
    dy.cg_revert()  # the outer checkpoint is still there


def test_acrobat_floor_prints_its_table_and_restores_reads(capsys):
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench import acrobat_floor
    from dynagraph.expression import Expression
    value, npvalue = Expression.value, Expression.npvalue
    rows = acrobat_floor.main(["--models", "earlyexit", "--hidden", "8", "--batch", "4", "--steps", "1",
                               "--rounds", "1"])
    assert [r[:2] for r in rows] == [("earlyexit", "train"), ("earlyexit", "infer")]
    assert all(conc > 0 and floor > 0 for _, _, conc, floor in rows)
    assert Expression.value is value and Expression.npvalue is npvalue
    assert "no rounds" in capsys.readouterr().out
