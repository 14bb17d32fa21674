"""The FSM scheduler (dy.fsm): encodings, the n-step update, training, save/load,
fallback counting, and scheduler invariance (values and gradients equal to "none")."""
from __future__ import annotations

import json
import os
import sys

import pytest

import dynagraph as dy
import dynagraph.fsm as fsm
from dynagraph.schedulers import base as sbase
from dynagraph.schedulers.fsm import FSMScheduler, Policy, chain_first, encode, most_common
from dynagraph.schedulers.typewise import Simulation

from ._util import check_schedule, compare_with_none

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # examples.workloads
from examples.workloads import WORKLOADS  # noqa: E402


def pending(cg) -> list[int]:
    cg._sync_values()
    return [i for i in range(cg.done, len(cg)) if not cg.op[i].leaf]


def two_type_graph(n: int = 6, seed: int = 1, hidden: int = 2):
    """TreeLSTM-2Type: its two internal cells compete, so the policy has decisions to make."""
    w = WORKLOADS["treelstm2type"](hidden=hidden, seed=0)
    return w, w.graph(w.instances(n, seed=seed))


@pytest.fixture(scope="module")
def trained():
    """One policy for the module: training is the slow part."""
    _, cg = two_type_graph()
    return fsm.train(cg, encoding="base", episodes=60, eval_every=20, seed=0, progress=False)


# ------------------------------------------------------------------ encodings
READY = {0: [10, 11, 12], 1: [13], 2: [14, 15]}


def test_encodings():
    vmap = [5, 3, 7]
    assert encode("base", READY, vmap) == (3, 5, 7)
    assert encode("max", READY, vmap) == (3, 5, 7, 5)       # type 0 (id 5) has 3 ready nodes
    assert encode("sort", READY, vmap) == (5, 7, 3)         # by ready count, descending
    assert encode("sort", {0: [1], 1: [2]}, [4, 2]) == (2, 4)  # ties: lower vocabulary id first
    assert encode("max", {0: [1], 1: [2]}, [4, 2]) == (2, 4, 2)
    assert encode("base", READY, [5, -1, 7]) is None         # a type outside the vocabulary
    with pytest.raises(ValueError):
        encode("nope", READY, vmap)
    # ratio: 2 id + (at least half of the G_a frontier ready); F_a sizes 3, 3, 5
    assert encode("ratio", READY, vmap, [3, 3, 5]) == (6, 11, 14)
    assert encode("ratio", READY, [5, -1, 7], [3, 3, 5]) is None
    with pytest.raises(ValueError, match="fcount"):
        encode("ratio", READY, vmap)


def test_chain_encoding_and_fallback():
    chain = {0: False, 1: True, 2: False}.get
    assert encode("chain", READY, [5, 3, 7], chain_ready=chain) == (7, 10, 14)  # 2 id + chain_ready
    assert encode("chain", READY, [5, -1, 7], chain_ready=chain) is None
    with pytest.raises(ValueError, match="chain_ready"):
        encode("chain", READY, [5, 3, 7])
    # chain_ready first; then |ready| / |F_a|, then ready count, then the first recorded type
    assert chain_first(READY, [3, 3, 5], chain) == 1
    assert chain_first(READY, [4, 3, 2], lambda t: False) == 2
    assert chain_first(READY, [6, 2, 4], lambda t: False) == 0
    # none chain_ready, path lengths known: the type holding the ready node farthest from a sink
    crit = {n: 1 for n in range(10, 16)} | {13: 9, 15: 9}
    assert chain_first(READY, [3, 3, 5], lambda t: False, crit) == 1      # ties: first recorded
    assert chain_first(READY, [3, 3, 5], chain, crit) == 1                 # a chain_ready type first
    crit[14] = 12
    assert chain_first(READY, [3, 3, 5], lambda t: False, crit) == 2


def test_bound_rewards_sum_to_the_gap_to_the_lower_bound():
    """The bound reward is minus the rise of batches + remaining bound: an episode's rewards sum to
    (bound after the first settling) - batches, and a greedy episode ends on the schedule's count."""
    _, cg = two_type_graph()
    tr = fsm.Trainer(cg, encoding="chain", seed=3)
    assert tr.reward == "bound" and fsm.Trainer(cg, encoding="base").reward == "ratio"
    S, A, R = tr.episode(0.5)
    sim = tr.sim
    assert sim.left == 0 and not sim.ready and len(R) == len(A) > 0
    sim.reset(record=False)
    sim.settle()
    start = sim.steps + sim.left
    assert start <= tr.lower_bound
    tr.sim.reset(record=False)
    S2, A2, R2 = tr.episode(0.5)
    assert sum(R2) == start - tr.sim.steps
    with pytest.raises(ValueError, match="reward"):
        fsm.Trainer(cg, encoding="base", reward="bogus")


def test_chain_policy_trains_and_schedules():
    _, cg = two_type_graph()
    nodes = pending(cg)
    pol = fsm.train(cg, encoding="chain", episodes=40, eval_every=20, seed=0, progress=False)
    assert pol.meta["hyper"]["reward"] == "bound"
    sched = fsm.Scheduler(pol)
    batches = sched.schedule(cg, nodes)
    check_schedule(cg, nodes, batches)
    assert len(batches) == pol.meta["batches"]
    back = Policy.from_json(json.loads(json.dumps(pol.to_json())))
    assert back.encoding == "chain" and fsm.Scheduler(back).schedule(cg, nodes) == batches


def test_fallback_is_the_most_common_type():
    assert most_common(READY) == 0
    assert most_common({3: [1, 2], 1: [3, 4]}) == 1            # ties: first-recorded type


# ------------------------------------------------------------------- updates
def test_n_step_update_bootstraps_only_from_tried_actions():
    S, A, R = ["a", "b", "c"], [0, 1, 0], [-1.0, -0.5, -1.0]
    q: dict = {}
    fsm.n_step_update(q, S, A, R, n=2, gamma=1.0, alpha=0.4)
    # Backwards: c gets -1; b sees the end (-0.5 - 1); a bootstraps from c's tried action.
    assert q == {"c": {0: -1.0}, "b": {1: -1.5}, "a": {0: -1.5 + -1.0}}
    q["c"][4] = -0.25                                         # a better action tried in c
    fsm.n_step_update(q, S, A, R, n=2, gamma=1.0, alpha=0.4)
    assert q["c"] == {0: -1.0, 4: -0.25}
    assert q["a"][0] == pytest.approx(-2.5 + 0.4 * ((-1.5 - 0.25) - -2.5))
    # Discounting, and the explicit n-step horizon without bootstrap.
    q = {}
    fsm.n_step_update(q, S, A, R, n=2, gamma=0.5, alpha=0.4)
    assert q["a"][0] == pytest.approx(-1.0 + 0.5 * -0.5 + 0.25 * -1.0)
    q = {"c": {0: -7.0}}
    fsm.n_step_update(q, ["a", "b", "c"], A, R, n=2, gamma=1.0, alpha=1.0, bootstrap=False)
    assert q["a"][0] == -1.5


# ------------------------------------------------------------------- training
def test_training_improves_on_the_fallback_and_reports(trained):
    _, cg = two_type_graph()
    nodes = pending(cg)
    meta = trained.meta
    assert meta["lower_bound"] == sbase.lower_bound(cg, nodes)
    assert meta["history"][0][0] == 0 and meta["episodes"] <= 60
    untrained = len(FSMScheduler(Policy("base", [], {})).schedule(cg, nodes))
    assert meta["history"][0][1] == untrained
    assert meta["lower_bound"] <= meta["batches"] < untrained
    sched = fsm.Scheduler(trained)
    batches = sched.schedule(cg, nodes)
    check_schedule(cg, nodes, batches)
    assert len(batches) == meta["batches"]                    # the scheduler replays the best greedy run


def test_training_stops_at_the_lower_bound():
    w = WORKLOADS["bilstm"](hidden=2, seed=0)
    pol = fsm.train(lambda: w.graph(w.instances(4, seed=1)), encoding="sort", episodes=100, progress=False)
    assert pol.meta["episodes"] == 0                          # settling alone reaches the bound
    assert pol.meta["batches"] == pol.meta["lower_bound"]


def test_train_checks_its_arguments():
    with pytest.raises(TypeError):
        fsm.train(42)
    _, cg = two_type_graph(2)
    with pytest.raises(ValueError):
        fsm.train(cg, encoding="bogus")


def test_policy_generalises_to_another_graph_of_the_model(trained):
    _, cg = two_type_graph(n=8, seed=5)
    nodes = pending(cg)
    sched = fsm.Scheduler(trained)
    batches = sched.schedule(cg, nodes)
    check_schedule(cg, nodes, batches)
    assert sched.hits > 0
    assert len(batches) <= 1.25 * sbase.lower_bound(cg, nodes)


# ------------------------------------------------------------------ save/load
def test_save_load_round_trip(trained, tmp_path):
    path = tmp_path / "policy.json"
    trained.save(str(path))
    doc = json.loads(path.read_text())
    assert doc["format"] == "dynagraph.fsm.policy" and doc["version"] == 1
    assert doc["encoding"] == "base" and doc["settle"] is True and doc["types"] == trained.types
    back = fsm.load(str(path))
    assert back.table == trained.table and back.types == trained.types and back.encoding == "base"
    assert back.q.keys() == trained.q.keys()
    _, cg = two_type_graph(n=5, seed=9)
    nodes = pending(cg)
    assert fsm.Scheduler(back).schedule(cg, nodes) == fsm.Scheduler(trained).schedule(cg, nodes)
    same = FSMScheduler.from_file(str(path))
    assert same is FSMScheduler.from_file(str(path))          # one scheduler per file: counts accumulate
    with pytest.raises(ValueError):
        Policy.from_json({"format": "something else"})


def test_registry_names(trained, tmp_path, monkeypatch):
    monkeypatch.delenv("DYNAGRAPH_FSM_POLICY", raising=False)
    plain = sbase.get("fsm")
    assert isinstance(plain, FSMScheduler) and len(plain.policy) == 0
    path = tmp_path / "p.json"
    trained.save(str(path))
    monkeypatch.setenv("DYNAGRAPH_FSM_POLICY", str(path))
    assert sbase.get("fsm").policy.table == trained.table


def test_registry_with_a_path(trained, tmp_path):
    path = tmp_path / "p.json"
    trained.save(str(path))
    assert sbase.get(f"fsm:{path}").policy.table == trained.table


# ------------------------------------------------------------------ fallback
def test_fallback_counting(trained):
    _, cg = two_type_graph()
    nodes = pending(cg)
    # Count the decisions of the fallback rule by hand: settled batches are not decisions.
    sim = Simulation(cg, nodes)
    sim.reset(record=False)
    decisions = 0
    while True:
        sim.settle()
        if sim.done:
            break
        decisions += 1
        sim.step(most_common(sim.ready))
    empty = FSMScheduler(Policy("base", [], {}))
    assert len(empty.schedule(cg, nodes)) == sim.n_batches
    assert (empty.hits, empty.misses) == (0, decisions) and decisions > 0
    sched = fsm.Scheduler(trained)
    sched.schedule(cg, nodes)
    h, m = sched.hits, sched.misses
    assert h > 0 and sched.hit_rate == h / (h + m)
    sched.schedule(cg, nodes)
    assert (sched.hits, sched.misses) == (2 * h, 2 * m)         # deterministic, and counts accumulate
    # A policy that knows one type only: every state holding another type is a miss.
    s2 = FSMScheduler(Policy("base", trained.types[:1], {(0,): 0}))
    s2.schedule(cg, nodes)
    assert s2.hits == 0 and s2.misses == decisions


def test_cg_stats_receive_counts_when_available(trained):
    w, cg = two_type_graph(n=3)
    cg.scheduler = fsm.Scheduler(trained)
    w.last_loss.value()
    st = cg.stats
    assert st.policy_hits + st.policy_misses > 0


# ---------------------------------------------------------------- invariance
def _lattice(pc):
    w = WORKLOADS["latticelstm"](hidden=3, seed=None, pc=pc)
    return [w.loss(x) for x in w.instances(3, seed=4)]


def test_fsm_matches_none_on_lattices():
    w = WORKLOADS["latticelstm"](hidden=3, seed=0)
    pol = fsm.train(w.graph(w.instances(4, seed=2)), encoding="sort", episodes=20, eval_every=10,
                    progress=False)
    sched = fsm.Scheduler(pol)
    _, got = compare_with_none(sched, _lattice)               # float64, 1e-10, every node and gradient
    assert len(got.rec.batches) < sum(len(b) for b in got.rec.batches)
    assert sched.hits + sched.misses > 0


@pytest.mark.parametrize("encoding", ["base", "max"])
def test_fsm_matches_none_on_trees(encoding, trained):
    def build(pc):
        w = WORKLOADS["treelstm2type"](hidden=2, seed=None, pc=pc)
        return [w.loss(x) for x in w.instances(3, seed=7)]
    _, cg = two_type_graph(3)
    pol = fsm.train(cg, encoding=encoding, episodes=10, eval_every=5, progress=False)
    compare_with_none(fsm.Scheduler(pol), build)


def test_train_prints_the_expected_step_against_agenda(capsys):
    w = WORKLOADS["latticegru"](hidden=2, seed=0)
    xs = w.instances(3, seed=1)
    pol = fsm.train(lambda: w.graph(xs), episodes=4, eval_every=2, seed=0, progress=True)
    out = capsys.readouterr().out
    assert "expected step" in out and "against agenda's" in out
    est = pol.meta["expected_step"]
    cg = w.graph(xs)
    nodes = pending(cg)
    assert est["fsm"]["batches"] == len(FSMScheduler(pol).schedule_policy(cg, nodes))
    assert pol.defer_to == fsm.faster_baseline(est)  # measured, and said in the printed line
    assert ("does not pay here" in out) == (pol.defer_to is not None)
    assert est["agenda"]["batches"] == len(sbase.get("agenda").schedule(cg, nodes))
    assert est["fsm"]["step_ms"] > 0 and est["agenda"]["step_ms"] > 0
    recorded = fsm.expected_step(w.graph(xs), pol)  # a recorded graph: nothing runs, scheduling only
    assert "step_ms" not in recorded["fsm"] and recorded["fsm"]["batches"] == est["fsm"]["batches"]


# ------------------------------------------------------------------ deferring
def test_faster_baseline_is_the_measured_rule():
    def est(fsm_ms, agenda_ms, depth_ms):
        return {"fsm": {"step_ms": fsm_ms}, "agenda": {"step_ms": agenda_ms}, "depth": {"step_ms": depth_ms}}
    assert fsm.faster_baseline(est(10.0, 12.0, 15.0)) is None
    assert fsm.faster_baseline(est(10.0, 9.0, 15.0)) == "agenda"
    assert fsm.faster_baseline(est(10.0, 9.0, 8.0)) == "depth"
    # within the margin (a share of the policy's step) the policy is kept: noise does not flip it
    assert fsm.faster_baseline(est(10.0, 9.6, 15.0)) is None
    assert fsm.faster_baseline(est(10.0, 9.6, 15.0), margin=0.0) == "agenda"
    assert fsm.faster_baseline(est(10.0, 10.0 * (1 - fsm.DEFER_MARGIN) - 0.01, 15.0)) == "agenda"
    assert fsm.faster_baseline({"fsm": {"sched_ms": 1.0}, "agenda": {"sched_ms": 0.5},
                                "depth": {"sched_ms": 0.4}}) is None  # steps not timed: no decision


def test_a_baseline_with_no_more_batches_is_deferred_to():
    """Within the margin the policy is kept only where it saves batches: a baseline whose schedule
    has as few batches (a chain, a tree settled to the bound) and a step within the margin wins the
    tie, the faster of such."""
    def est(f, a, d, m, batches):
        names = ("fsm", "agenda", "depth", "agenda+merge")
        return {k: {"step_ms": ms, "batches": b} for k, ms, b in zip(names, (f, a, d, m), batches)}
    assert fsm.faster_baseline(est(10.0, 10.2, 15.0, 9.9, (147, 147, 228, 147))) == "agenda+merge"
    assert fsm.faster_baseline(est(10.0, 9.8, 15.0, 10.4, (147, 147, 228, 147))) == "agenda"
    assert fsm.faster_baseline(est(10.0, 9.8, 15.0, 9.9, (1594, 3072, 7748, 1595))) is None  # it saves one
    assert fsm.faster_baseline(est(10.0, 9.8, 15.0, 10.4, (169, 229, 183, 169))) == "agenda+merge"
    assert fsm.faster_baseline(est(10.0, 9.8, 15.0, 11.0, (169, 229, 183, 169))) is None  # slower past the margin
    assert fsm.faster_baseline(est(10.0, 12.0, 9.0, 11.0, (169, 229, 183, 169))) == "depth"  # the margin rule first


def test_a_deferring_policy_schedules_like_its_baseline(trained, tmp_path):
    _, cg = two_type_graph(4, seed=2)
    nodes = pending(cg)
    pol = fsm.Policy(trained.encoding, trained.types, trained.table, trained.q, trained.meta, trained.settle,
                     hold_tail=trained.hold_tail, defer_to="depth")
    sched = fsm.Scheduler(pol)
    assert sched.schedule(cg, nodes) == sbase.get("depth").schedule(cg, nodes)
    assert sched.deferred == 1 and sched.hits + sched.misses == 0
    assert sched.schedule_policy(cg, nodes) == fsm.Scheduler(trained).schedule(cg, nodes)
    path = str(tmp_path / "p.json")
    pol.save(path)
    assert fsm.load(path).defer_to == "depth" and "defers to depth" in repr(fsm.load(path))
    pol.defer_to = None  # the policy runs again
    assert sched.schedule(cg, nodes) == fsm.Scheduler(trained).schedule(cg, nodes)
    with pytest.raises(ValueError, match="defers to"):
        fsm.Policy("base", [], {}, defer_to="fsm:other.json")
    bad = fsm.Scheduler(fsm.Policy("base", [], {}, defer_to="nonesuch"))
    with pytest.raises(ValueError, match="unknown scheduler"):
        bad.schedule(cg, nodes)


def test_a_deferring_policy_keeps_values_and_gradients(trained):
    def build(pc):
        w = WORKLOADS["treelstm2type"](hidden=2, seed=None, pc=pc)
        return [w.loss(x) for x in w.instances(3, seed=7)]
    pol = fsm.Policy(trained.encoding, trained.types, trained.table, trained.q, trained.meta, trained.settle,
                     hold_tail=trained.hold_tail, defer_to="agenda")
    compare_with_none(fsm.Scheduler(pol), build)


def test_train_without_a_recorder_or_with_defer_off_never_defers():
    w = WORKLOADS["latticegru"](hidden=2, seed=0)
    xs = w.instances(3, seed=1)
    assert fsm.train(w.graph(xs), episodes=4, eval_every=2, progress=False).defer_to is None
    pol = fsm.train(lambda: w.graph(xs), episodes=4, eval_every=2, progress=False, defer=False)
    assert pol.defer_to is None and "expected_step" not in pol.meta


# ------------------------------------------------------------------ holding the tail
@pytest.mark.parametrize("name", ["latticegru", "treelstm2type", "encdec"])
def test_holding_the_tail_runs_each_tail_type_once(name):
    w = WORKLOADS[name](hidden=2, seed=0)
    cg = w.graph(w.instances(5, seed=2))
    nodes = pending(cg)
    sim = Simulation(cg, nodes, typewise=True, hold_tail=True)
    tail = {sim.type_sig[t] for t in range(sim.n_types) if sim.tail[t]}
    assert tail, "a model with a loss layer has tail types"
    assert not all(sim.tail), "the recurrent cell's types are not tail types"
    names = {cg.op[n].name for n in nodes if cg.op[n].batchable and cg.sig[n] in tail}
    assert "pickneglogsoftmax" in names or "squared_distance" in names or "esum" in names
    for pol in (Policy("base", [], {}, hold_tail=True), fsm.train(cg, episodes=6, eval_every=3, progress=False)):
        batches = FSMScheduler(pol).schedule(cg, nodes)
        sbase.validate(cg, nodes, batches, "fsm")
        per_sig = {}
        for b in batches:
            per_sig[cg.sig[b[0]]] = per_sig.get(cg.sig[b[0]], 0) + 1
        # a tail type takes as many batches as its longest chain: its share of the lower bound
        assert all(per_sig[s] == _longest_chain(cg, nodes, s) for s in tail)
        first_tail = min(k for k, b in enumerate(batches) if cg.sig[b[0]] in tail)
        assert all(cg.sig[b[0]] in tail or not cg.op[b[0]].batchable for b in batches[first_tail:])


def test_tail_types_rule():
    from dynagraph.schedulers.typewise import tail_types
    # 0 -> 1 -> 2 (a chain of types), 3 -> 3 (a type's own chain), 4 -> unbatchable
    typ = [0, 1, 2, 3, 3, 4, -1]
    users = [[1], [2], None, [4], None, [6], None]
    assert tail_types(typ, users, 5) == [True, True, True, True, False]
    assert tail_types([0, 1, 0], [[1], [2], None], 2) == [False, False]  # a cycle of types


def _longest_chain(cg, nodes, sig) -> int:
    """The most signature-`sig` nodes on one path (that signature's share of lower_bound)."""
    depth: dict = {}
    for n in nodes:
        d = max((depth.get(a, 0) for a in cg.args[n]), default=0)
        depth[n] = d + (cg.sig[n] == sig and cg.op[n].batchable)
    return max(depth.values())
