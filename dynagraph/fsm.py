"""Learned batching policies (ED-Batch's FSM scheduler): `dy.fsm`.

    policy = dy.fsm.train(record_graph, seed=0)   # encoding="chain"; or a recorded cg
    policy.save("tree.fsm.json");  policy = dy.fsm.load("tree.fsm.json")
    dy.renew_cg(scheduler=dy.fsm.Scheduler(policy))
    dy.renew_cg(scheduler=dy.fsm.Scheduler.from_file("tree.fsm.json"))
    DYNAGRAPH_FSM_POLICY=tree.fsm.json  ->  dy.renew_cg(scheduler="fsm")

`record_graph` is a zero-argument callable that records one graph (a few dozen
sample instances of the model) and returns it, or an already recorded
ComputationGraph; only its pending (unevaluated) nodes are used, nothing runs.
The policy names types by model-level keys, so it applies to any graph of the
same model (schedulers/fsm.py: file format, fallback rule, hit/miss counts).

Training is tabular Q-learning on the scheduling MDP of that graph (ED-Batch,
Chen et al. 2023). A state encodes the frontier's types (base, max, sort, ratio or
chain); an action runs every ready node of one type as a batch; the reward is
-1 + |ready_a| / |F_a| (schedulers/typewise.py), or for the chain encoding the "bound"
reward below. ED-Batch's settings: step size
0.4, epsilon 0.5 decaying x0.9 per episode to 0.05, n-step returns with n = 10,
at most 1000 episodes; every 50 episodes a greedy episode is scored and the best
table kept; training stops once a greedy episode is within 1% of the lower bound
(schedulers.lower_bound). A tqdm bar shows greedy batches against the bound;
`policy.meta["history"]` keeps them.

Settling (on by default, stored in the policy). Before each decision, every type
whose whole G_a frontier is ready (ratio 1, reward 0) runs at once, outside the
policy, like unbatchable nodes. This is safe: a later batch of that type could
only hold those same nodes. It leaves the policy the contested states only,
which makes tables small and lets them carry over to new graphs (trees and
BiLSTMs need no decision at all). The cost: the scheduler computes G_a.

Deliberate fix of an ED-Batch quirk. ED-Batch bootstraps the n-step return from
max_a Q(s', a) over a table that defaults to 0; every reward here is <= 0, so an
unexplored action makes that max 0 and silently truncates the return to the
n rewards seen (and a first update moves Q only 40% of the way from an
optimistic 0). Here (n_step_update) the bootstrap maximises only over actions
already tried in s', a new (s, a) entry takes its first target as its value,
and each episode's updates run backwards, so s' always has a tried action when
it is used; at the end of an episode the return is the exact remaining sum.

Why gamma = 0.9, not ED-Batch's 1. With an honest bootstrap and gamma 1, Q(s, a)
estimates all batches left, which depends on how much of the graph remains, and
a type-set state cannot see that: the same state shows up early and late, and
actions get credited for landing in "late" states. The truncation in ED-Batch
happened to hide this. A discount of 0.9 keeps the bootstrap and makes values
local (horizon ~10 decisions); measured on TreeLSTM-2Type, the encoder-decoder
and LatticeLSTM it clearly beat gamma 1 with bootstrapping and did about as well
as an explicit 10-step horizon without bootstrap (`bootstrap="none"`, offered).

Deferring (`defer`, on by default). A policy with fewer batches can still lose end to
end: computing G_a costs a few times agenda's scheduling, and on trees settling already
leaves nothing to decide. When `graph` is a callable, train ends by timing whole steps
(record, forward, backward) under the policy and BASELINES (agenda, depth, and agenda followed
by the batch-merging post-pass, schedulers/merge.py), interleaved, best of 5 rounds, in CPU time
(wall time on a loaded machine flipped the choice); if the best of the others is faster by more
than DEFER_MARGIN (5%) of the policy's step, or some baseline's schedule has no more batches than
the policy's and its step is within that margin (the policy then saves nothing and still pays for
G_a: the fastest such baseline),
the policy stores that one's name in `defer_to` and the FSM scheduler runs it instead, and train
says so (faster_baseline). The rule is the measurement on this machine and model, not a fixed choice.

The chain encoding and the bound reward (the default). A type-set state cannot tell
which types are *late*: the bound (schedulers.lower_bound) charges each type its longest
remaining chain, and a batch that leaves the head of that chain behind costs one batch over
it. The chain state writes, per frontier type, whether its ready nodes hold every pending
node at the head of its longest remaining chain (typewise.Simulation.chain_ready), and the
reward is minus the rise of (batches so far + remaining bound) over the decision and the
settling after it: 0 for a batch that keeps the bound, an episode's rewards summing to
bound - batches (potential-based shaping of -1 per batch, so the best policy is unchanged).
Q then estimates the excess still to come, which a state can see, rather than all batches
left. Unseen states fall back to chain_first (schedulers/fsm.py). Trained on one graph of 32
samples and run on another (bench/compare_schedulers.py, README "Schedulers"), it cut batches
from 1.28/1.23/1.39x the lower bound (base) to 1.07/1.08/1.13x on the NER lattices,
LatticeLSTM and LatticeGRU. A beam search over types with the same bound as its guide (a perfect-information
teacher, not shipped) reached 1.05-1.10x on those graphs. "base" remains for comparison;
it carried over better than "sort" (a sort state also depends on counts).
"""
from __future__ import annotations

import random
import time
from typing import Callable, Union

from .expression import Expression
from .graph import ComputationGraph
from .schedulers.base import lower_bound
from .schedulers.fsm import ENCODINGS, FSMScheduler, Policy, allowed, encode, fallback
from .schedulers.typewise import Simulation, stable_keys

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover - tqdm is a dependency
    tqdm = None

REWARDS = ("ratio", "bound")

__all__ = ["REWARDS", "train", "load", "Policy", "Scheduler", "ENCODINGS", "Trainer", "n_step_update", "expected_step",
           "faster_baseline", "DEFER_MARGIN", "BASELINES"]

Scheduler = FSMScheduler


def load(path: str) -> Policy:
    """Read a policy saved with Policy.save (JSON; format in schedulers/fsm.py)."""
    return Policy.load(path)


def _graph_of(g) -> ComputationGraph:
    if callable(g) and not isinstance(g, ComputationGraph):
        g = g()
    if isinstance(g, Expression):
        g = g.cg
    if not isinstance(g, ComputationGraph):
        raise TypeError(f"fsm.train needs a ComputationGraph or a callable returning one, got {type(g).__name__}")
    return g


def n_step_update(q: dict, S: list, A: list, R: list, n: int, gamma: float, alpha: float,
                  bootstrap: bool = True) -> None:
    """n-step Q-learning updates for one episode, last step first.

    target(t) = sum_{i<n} gamma^i R[t+i] + gamma^n max_{a tried in S[t+n]} Q(S[t+n], a)
    (no bootstrap past the end, or when bootstrap is False). S[t+n] was updated
    before S[t], so it always has a tried action: nothing defaults to 0. A new
    (s, a) entry takes its first target as its value; later ones move by alpha.
    """
    T = len(R)
    gn = gamma ** n
    win = 0.0  # sum_{i=t}^{min(t+n,T)-1} gamma^(i-t) R[i], slid backwards
    for t in range(T - 1, -1, -1):
        win = R[t] + gamma * win
        k = t + n
        if k < T:
            win -= gn * R[k]
        target = win + gn * max(q[S[k]].values()) if (k < T and bootstrap) else win
        qs = q.get(S[t])
        if qs is None:
            q[S[t]] = {A[t]: target}
        else:
            old = qs.get(A[t])
            qs[A[t]] = target if old is None else old + alpha * (target - old)


class Trainer:
    """Q-learning on one graph's scheduling MDP. `run()` returns the best greedy Policy."""

    def __init__(self, cg: ComputationGraph, encoding: str = "chain", seed: int = 0, step_size: float = 0.4,
                 gamma: float = 0.9, epsilon: float = 0.5, epsilon_decay: float = 0.9,
                 epsilon_min: float = 0.05, n_step: int = 10, bootstrap: str = "max", settle: bool = True,
                 hold_tail: bool = True, reward: str = "auto"):
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown FSM encoding {encoding!r}; use one of {ENCODINGS}")
        if reward == "auto":
            reward = "bound" if encoding == "chain" else "ratio"
        if reward not in REWARDS:
            raise ValueError(f"unknown FSM reward {reward!r}; use one of {REWARDS} or 'auto'")
        if bootstrap not in ("max", "none"):
            raise ValueError(f"bootstrap must be 'max' or 'none', got {bootstrap!r}")
        cg._sync_values()
        self.nodes = [i for i in range(cg.done, len(cg.op)) if not cg.op[i].leaf and cg.blk[i] < 0]
        self.reward = reward
        self.sim = Simulation(cg, self.nodes, typewise=True, hold_tail=hold_tail,
                              heights=encoding == "chain" or reward == "bound")
        self.hold_tail = hold_tail
        keys = stable_keys(cg, self.sim.type_sig)
        self.types = [keys[s] for s in self.sim.type_sig]  # vocabulary id == simulation type
        self.vmap = list(range(len(self.types)))
        self.lower_bound = lower_bound(cg, self.nodes)
        self.encoding, self.alpha, self.gamma, self.n = encoding, step_size, gamma, n_step
        self.epsilon, self.epsilon_decay, self.epsilon_min = epsilon, epsilon_decay, epsilon_min
        self.bootstrap, self.settle = bootstrap, settle
        self.rng = random.Random(seed)
        self.q: dict = {}

    # --------------------------------------------------------------- episodes
    def _decide(self) -> bool:
        """Run what needs no decision; False when the episode is over."""
        if self.settle:
            self.sim.settle()
        return bool(self.sim.ready)

    def episode(self, eps: float) -> tuple[list, list, list]:
        """Play one episode epsilon-greedily; returns states, actions and rewards."""
        sim, q, enc, vmap, rng = self.sim, self.q, self.encoding, self.vmap, self.rng
        sim.reset(record=False)
        ready = sim.ready
        chain = sim.chain_ready if sim.heights else None
        bound = self.reward == "bound"
        S, A, R = [], [], []
        while self._decide():
            s = encode(enc, ready, vmap, sim.fcount, chain)
            if eps > 0.0 and rng.random() < eps:
                a = rng.choice([t for t in ready if allowed(enc, sim, t)])
            else:
                qs = q.get(s)
                a = max(qs, key=qs.get) if qs else -1
                if a not in ready or not allowed(enc, sim, a):
                    a = fallback(enc, sim)
            if bound:  # minus the rise of batches + remaining bound, settling included
                before = sim.steps + sim.left
                sim.step(a)
                self._decide()
                R.append(float(before - sim.steps - sim.left))
            else:
                R.append(sim.step(a))
            S.append(s)
            A.append(a)
        return S, A, R

    def greedy(self, table: dict) -> int:
        """Batches of the schedule the table picks (fallback rule on unseen states)."""
        sim, enc, vmap = self.sim, self.encoding, self.vmap
        sim.reset(record=False)
        ready = sim.ready
        chain = sim.chain_ready if sim.heights else None
        while self._decide():
            a = table.get(encode(enc, ready, vmap, sim.fcount, chain))
            sim.step(a if a in ready and allowed(enc, sim, a) else fallback(enc, sim))
        return sim.n_batches

    def update(self, S: list, A: list, R: list) -> None:
        n_step_update(self.q, S, A, R, self.n, self.gamma, self.alpha, self.bootstrap == "max")

    def table(self) -> dict:
        return {s: max(qs, key=qs.get) for s, qs in self.q.items() if qs}

    # ------------------------------------------------------------------- loop
    def run(self, episodes: int = 1000, eval_every: int = 50, tolerance: float = 0.01,
            patience: int | None = None, time_limit: float | None = None, progress: bool = True) -> Policy:
        t0, c0 = time.perf_counter(), time.process_time()  # the limit is CPU time: load-independent
        lb = self.lower_bound
        best_table: dict = {}
        best_q: dict = {}
        best = self.greedy(best_table)
        history = [(0, best)]
        goal = lb * (1.0 + tolerance)
        bar = tqdm(total=episodes, desc=f"fsm[{self.encoding}]", unit="ep", leave=False,
                   disable=not progress) if tqdm else None
        if bar:
            bar.set_postfix(greedy=best, lower_bound=lb)
        eps, stale, ep = self.epsilon, 0, 0
        while ep < episodes and best > goal:
            self.update(*self.episode(eps))
            eps = max(eps * self.epsilon_decay, self.epsilon_min)
            ep += 1
            if bar:
                bar.update(1)
            if ep % eval_every == 0 or ep == episodes:
                table = self.table()
                b = self.greedy(table)
                history.append((ep, b))
                if b < best:
                    best, best_table, stale = b, table, 0
                    best_q = {s: dict(qs) for s, qs in self.q.items()}
                else:
                    stale += 1
                if bar:
                    bar.set_postfix(greedy=b, best=best, lower_bound=lb, ratio=f"{best / max(lb, 1):.3f}")
                if (patience is not None and stale >= patience) or \
                        (time_limit is not None and time.process_time() - c0 > time_limit):
                    break
        if bar:
            bar.close()
        meta = {"episodes": ep, "batches": best, "lower_bound": lb, "nodes": len(self.nodes),
                "seconds": round(time.perf_counter() - t0, 3),
                "cpu_seconds": round(time.process_time() - c0, 3), "history": history,
                "hyper": {"reward": self.reward, "step_size": self.alpha, "gamma": self.gamma, "epsilon": self.epsilon,
                          "epsilon_decay": self.epsilon_decay, "epsilon_min": self.epsilon_min,
                          "n_step": self.n, "bootstrap": self.bootstrap}}
        return Policy(self.encoding, self.types, best_table, best_q, meta, settle=self.settle,
                      hold_tail=self.hold_tail)


def train(graph: Union[ComputationGraph, Callable[[], ComputationGraph]], encoding: str = "chain",
          episodes: int = 1000, seed: int = 0, *, step_size: float = 0.4, gamma: float = 0.9,
          epsilon: float = 0.5, epsilon_decay: float = 0.9, epsilon_min: float = 0.05, n_step: int = 10,
          eval_every: int = 50, tolerance: float = 0.01, patience: int | None = None,
          time_limit: float | None = None, bootstrap: str = "max", settle: bool = True,
          progress: bool = True, defer: bool = True, hold_tail: bool = True, reward: str = "auto") -> Policy:
    """Learn an FSM batching policy on one recorded graph (see the module docstring).

    patience: stop after this many greedy evaluations without improvement (None: never).
    time_limit: stop at the first greedy evaluation after this many CPU seconds of this process
    (None: never); CPU time, so that neighbours on a loaded machine do not cut training short.
    The returned policy's `meta` holds the episodes run, the best greedy batch count,
    the lower bound, the seconds taken and the (episode, greedy batches) history.
    With progress on, it ends by printing the step it expects under the policy against
    agenda's, depth's and agenda+merge's (expected_step; kept in meta["expected_step"]): whole steps timed when
    `graph` is a callable, scheduling time and batches only for an already recorded graph.
    hold_tail: hold tail types (a loss layer, the losses) back until nothing else is pending, so
    each runs once (schedulers/typewise.py); stored in the policy.
    defer: when whole steps were timed and the policy's is slower than the best of BASELINES
    (agenda, depth, agenda+merge), set `policy.defer_to` to that scheduler (module docstring, "Deferring").
    reward: "ratio" (ED-Batch's -1 + |ready_a| / |F_a|), "bound" (minus the rise of batches plus
    the remaining lower bound; module docstring) or "auto": "bound" for the chain encoding, else "ratio".
    """
    recorder = graph if callable(graph) and not isinstance(graph, ComputationGraph) else None
    cg = _graph_of(graph)
    trainer = Trainer(cg, encoding, seed, step_size, gamma, epsilon, epsilon_decay, epsilon_min, n_step,
                      bootstrap, settle, hold_tail, reward)
    policy = trainer.run(episodes, eval_every, tolerance, patience, time_limit, progress)
    if progress or (defer and recorder is not None):
        est = expected_step(recorder if recorder is not None else cg, policy, rounds=5)  # 3 flipped under load
        policy.meta["expected_step"] = est
        if defer:
            policy.defer_to = faster_baseline(est)
        if progress:
            print(_expected_line(est, policy.defer_to))
    return policy


DEFER_MARGIN = 0.05  # a baseline must beat the policy's step by more than this share to be deferred to
# What a policy is timed against, and may defer to: agenda, depth, and agenda followed by the batch-merging
# post-pass (schedulers/merge.py), which on the NER lattices comes within 1.1x of the lower bound at
# a fraction of the FSM's scheduling cost.
BASELINES = ("agenda", "depth", "agenda+merge")


def faster_baseline(est: dict, margin: float = DEFER_MARGIN) -> str | None:
    """The baseline (BASELINES: agenda, depth, agenda+merge) the policy defers to, from expected_step's
    result; None keeps the policy (and when steps were not timed).

    1. The fastest baseline when its timed step beat the policy's by more than `margin` (a share of
       the policy's step): the margin keeps a policy that ties with a baseline from flipping
       between runs on noise. Steps are CPU time.
    2. Otherwise, the fastest baseline whose schedule has no more batches than the policy's and
       whose step is within the margin of it: the policy then saves nothing and still pays for G_a,
       so it can only be as fast on noise (on chains and trees settling leaves no decision: the
       policy's 147 batches on the BiLSTM are agenda's, and its step measured 0.95-1.05x agenda's
       across runs, never reliably below). Batch counts are exact, so this part does not flip."""
    fsm = est.get("fsm", {})
    if "step_ms" not in fsm:
        return None
    others = [k for k in est if k != "fsm"]
    best = min(others, key=lambda k: est[k]["step_ms"])
    if est[best]["step_ms"] < (1.0 - margin) * fsm["step_ms"]:
        return best
    if "batches" not in fsm:
        return None
    level = [k for k in others if "batches" in est[k] and est[k]["batches"] <= fsm["batches"]
             and est[k]["step_ms"] <= (1.0 + margin) * fsm["step_ms"]]
    return min(level, key=lambda k: est[k]["step_ms"]) if level else None


def _time_step(record: Callable[[], ComputationGraph], sched) -> tuple[float, float, int]:
    """CPU seconds of one record + forward (+ backward when the last node is a scalar) under `sched`,
    the CPU seconds of its scheduling call, and its batch count. CPU time (time.process_time), not
    wall time: on a loaded machine wall time measures the neighbours and flipped the deferral."""
    t0 = time.process_time()
    cg = _graph_of(record)
    cg._sync_values()
    nodes = [i for i in range(cg.done, len(cg.op)) if not cg.op[i].leaf and cg.blk[i] < 0]
    t1 = time.process_time()
    n_batches = len(sched.schedule(cg, nodes)) if nodes else 0
    t_sched = time.process_time() - t1
    cg.scheduler = sched
    last = len(cg.op) - 1
    if last >= 0:
        if cg.shape[last] == (1,):
            cg.backward(Expression(cg, last))
        else:
            cg.forward_to(last)
    return time.process_time() - t0 - t_sched, t_sched, n_batches


def expected_step(graph, policy: Policy, rounds: int = 3) -> dict:
    """What a training step is expected to cost under the policy against agenda's.

    With a callable (it records a fresh graph), each scheduler runs whole steps (record, forward,
    backward of the last node when it is a scalar), rounds interleaved, best kept; all times are
    CPU time of this process (time.process_time). With a recorded
    graph nothing may run: only scheduling is timed and batches counted.
    """
    from .schedulers import get
    own = Policy(policy.encoding, policy.types, policy.table, policy.q, policy.meta, policy.settle,
                 hold_tail=policy.hold_tail)  # no defer_to
    scheds = {name: get(name) for name in BASELINES}
    scheds["fsm"] = FSMScheduler(own)
    if callable(graph) and not isinstance(graph, ComputationGraph):
        best: dict = {}
        for _ in range(rounds):
            for name, sched in scheds.items():
                step, sched_s, nb = _time_step(graph, sched)
                prev = best.get(name)
                total = step + sched_s
                if prev is None or total < prev["step_ms"] / 1e3:
                    best[name] = {"step_ms": 1e3 * total, "sched_ms": 1e3 * sched_s, "batches": nb}
        return best
    cg = _graph_of(graph)
    cg._sync_values()
    nodes = [i for i in range(cg.done, len(cg.op)) if not cg.op[i].leaf and cg.blk[i] < 0]
    out = {}
    for name, sched in scheds.items():
        t = []
        for _ in range(rounds):
            t0 = time.process_time()
            nb = len(sched.schedule(cg, nodes)) if nodes else 0
            t.append(time.process_time() - t0)
        out[name] = {"sched_ms": 1e3 * min(t), "batches": nb}
    return out


def _expected_line(est: dict, defer_to: str | None = None) -> str:
    a, d, f = est["agenda"], est["depth"], est["fsm"]
    line = (f"fsm: {f['batches']} batches (agenda {a['batches']}, depth {d['batches']}), scheduling "
            f"{f['sched_ms']:.1f} ms (agenda {a['sched_ms']:.1f} ms)")
    if "step_ms" in f:
        line += (f"; expected step {f['step_ms']:.0f} ms against agenda's {a['step_ms']:.0f} ms "
                 f"(x{f['step_ms'] / max(a['step_ms'], 1e-9):.2f}) and depth's {d['step_ms']:.0f} ms")
        m = est.get("agenda+merge")
        if m and "step_ms" in m:
            line += f", agenda+merge's {m['step_ms']:.0f} ms ({m['batches']} batches)"
        if defer_to:
            line += f"; the policy does not pay here: the fsm scheduler runs {defer_to} instead (policy.defer_to)"
    else:
        line += "; pass a callable that records a graph to time whole steps"
    return line
