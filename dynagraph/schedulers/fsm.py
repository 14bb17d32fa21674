"""The FSM scheduler (ED-Batch): a learned table from frontier state to the type to run.

The state is an encoding of the frontier's types (see `encode`); a type is a
signature named by its model-level stable key (typewise.stable_keys), so a
policy trained on one graph applies to any graph of the same model. The policy
is trained by dynagraph.fsm.train (tabular Q-learning). Unbatchable nodes run as
soon as they are ready; with `settle` (the default) so does every type whose
whole G_a frontier is ready (typewise.Simulation.settle): the policy only
decides the contested steps.

By name: "fsm" is the FSM with the policy file named by $DYNAGRAPH_FSM_POLICY,
or, without it, an empty policy (settling plus the fallback rule: an untrained
FSM). Scheduler.from_file(path) keeps one scheduler per file.

Unseen states. When the state is not in the table (or a frontier type is not in
the policy's vocabulary) the scheduler falls back to running the *most common
type on the frontier* (most ready nodes; ties to the first-recorded type); a
"chain" policy falls back to `chain_first` instead (a type whose longest chain
stays on schedule, then the typewise ratio, then most ready nodes; when no type
keeps its chain, the one holding the node farthest from a sink), and also uses it
when the table's type would leave its chain behind while another keeps its own
(`allowed`; counted as a miss). Hits
and misses are counted on the scheduler (`hits`, `misses`) and added to
`cg.stats.policy_hits` / `policy_misses` when Stats has those fields.

Policy file (JSON, written by Policy.save):
    {"format": "dynagraph.fsm.policy", "version": 1,
     "encoding": "base" | "max" | "sort" | "ratio" | "chain",
     "settle": true,                               # run ratio-1 types outside the policy
     "hold_tail": true,                            # optional: hold tail types back (typewise.py)
     "types":  [stable type key, ...],             # vocabulary; a type is its index
     "states": [{"s": [type, ...],                 # the encoded state (ratio: 2 type + h)
                 "a": type,                        # the action: the type to run
                 "q": {"type": value, ...}}, ...], # Q-values of the actions tried
     "defer_to": "agenda",                         # optional: see below
     "meta":   {...}}                              # training summary (informative)

Deferring. dy.fsm.train times whole training steps under the policy, agenda, depth and
agenda+merge (dynagraph.fsm.BASELINES); when the policy's step is slower than the best it stores that
scheduler's name in `defer_to`, and FSMScheduler schedules with it instead (the
policy is kept; `Policy.defer_to = None` runs it anyway). Fewer batches do not
always pay: on trees, settling already leaves no decision and agenda or depth find
as few batches without computing G_a.
"""
from __future__ import annotations

import json
import os
from typing import Sequence

from ..recording import NATIVE
from .base import batchable_by_sig, get, register
from .typewise import Simulation, base_key, param_names, stable_keys

ENCODINGS = ("base", "max", "sort", "ratio", "chain")
FORMAT = "dynagraph.fsm.policy"


# ------------------------------------------------------------------ encodings
def encode(encoding: str, ready: dict, vmap: Sequence[int], fcount: Sequence[int] | None = None,
           chain_ready=None) -> tuple | None:
    """The state of a frontier: ready maps a type to its ready nodes, vmap a type to its vocabulary id.

    base:  the sorted set of frontier types.
    max:   base plus the type with the most ready nodes (ties: lower id).
    sort:  the frontier types ordered by ready count, descending (ties: lower id).
    ratio: base with each type v written 2v + h, h = 1 when at least half of its G_a frontier is
           ready (2 |ready| >= |F_a|; fcount[t] = |F_a|, typewise.Simulation.fcount): the typewise
           heuristic's signal, coarse enough that states recur across graphs.
    chain: base with each type v written 2v + c, c = chain_ready(t) (typewise.Simulation.chain_ready:
           its ready nodes hold every pending node at the head of its longest remaining chain, so
           running it now costs no batch over the lower bound). Structural, so it carries over to
           new graphs; trained with the "bound" reward (dynagraph.fsm).
    None when a frontier type is outside the vocabulary (the state cannot be seen).
    """
    items = []
    for t, bucket in ready.items():
        v = vmap[t]
        if v < 0:
            return None
        items.append((-len(bucket), v))
    if encoding == "sort":
        items.sort()
        return tuple([v for _, v in items])
    if encoding == "ratio":
        if fcount is None:
            raise ValueError("the ratio encoding needs the G_a frontier counts (fcount)")
        return tuple(sorted([2 * vmap[t] + (2 * len(b) >= fcount[t]) for t, b in ready.items()]))
    if encoding == "chain":
        if chain_ready is None:
            raise ValueError("the chain encoding needs the chain heights (chain_ready)")
        return tuple(sorted([2 * vmap[t] + bool(chain_ready(t)) for t in ready]))
    base = tuple(sorted([v for _, v in items]))
    if encoding == "base":
        return base
    if encoding == "max":
        return base + (min(items)[1],)
    raise ValueError(f"unknown FSM encoding {encoding!r}; use one of {ENCODINGS}")


def most_common(ready: dict) -> int:
    """The fallback rule: the ready type with the most ready nodes (ties: first recorded)."""
    best, size = -1, -1
    for t, bucket in ready.items():
        if len(bucket) > size or (len(bucket) == size and t < best):
            best, size = t, len(bucket)
    return best


def chain_first(ready: dict, fcount: Sequence[int], chain_ready, crit: Sequence[int] | None = None) -> int:
    """The chain encoding's fallback. Among types whose longest chain stays on schedule
    (chain_ready): the highest |ready| / |F_a|, then the most ready nodes, then the first recorded.
    When no type is chain_ready, every choice costs a batch over the bound: then the type holding
    the ready node with the longest path to a sink (crit, typewise.path_lengths; ties: first
    recorded), which unblocks a sample left behind (without it, a rare type the table never
    picks stalled one lattice, and with it the head of every type's chain: 1.5x the bound);
    without crit, the ratio rule over all types."""
    best, key = -1, None
    if crit is not None and not any(chain_ready(t) for t in ready):
        for t, bucket in ready.items():
            k = (max([crit[n] for n in bucket]), -t)
            if key is None or k > key:
                best, key = t, k
        return best
    for t, bucket in ready.items():
        m = len(bucket)
        k = (bool(chain_ready(t)), m / fcount[t], m, -t)
        if key is None or k > key:
            best, key = t, k
    return best


def allowed(encoding: str, sim, t: int) -> bool:
    """Whether a chain policy may run type t: a type that is chain_ready, or any type when none is.
    A batch that leaves its longest chain behind while another type keeps its own costs a batch
    over the bound now; on held-out graphs the table's such choices lost more than they won
    (LatticeGRU 1.14-1.18x the bound -> 1.12-1.13x), so the scheduler and training mask them."""
    if encoding != "chain" or sim.chain_ready(t):
        return True
    return not any(sim.chain_ready(u) for u in sim.ready)


def fallback(encoding: str, sim) -> int:
    """The type to run when the policy has no (ready) action: chain_first for "chain" policies,
    else most_common; sim is the typewise.Simulation."""
    if encoding == "chain":
        return chain_first(sim.ready, sim.fcount, sim.chain_ready, sim.crit)
    return most_common(sim.ready)


def simulation(cg, nodes: Sequence[int], encoding: str, settle: bool, hold_tail: bool) -> Simulation:
    """The Simulation a policy of this encoding runs on: G_a when settling or the state needs it,
    chain heights for "chain"."""
    return Simulation(cg, nodes, typewise=settle or encoding in ("ratio", "chain"), hold_tail=hold_tail,
                      heights=encoding == "chain")


# --------------------------------------------------------------------- policy
class Policy:
    """A trained FSM: encoding, type vocabulary, state -> action table (+ Q-values)."""

    def __init__(self, encoding: str, types: list, table: dict, q: dict | None = None,
                 meta: dict | None = None, settle: bool = True, defer_to: str | None = None,
                 hold_tail: bool = False):
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown FSM encoding {encoding!r}; use one of {ENCODINGS}")
        if defer_to is not None and (not isinstance(defer_to, str) or defer_to.partition(":")[0] == "fsm"):
            raise ValueError(f"an FSM policy defers to a scheduler name other than fsm, got {defer_to!r}")
        self.defer_to = defer_to
        self.hold_tail = bool(hold_tail)  # typewise.Simulation(hold_tail=...): the loss layer runs last, once
        self.encoding = encoding
        self.settle = bool(settle)
        self.types = list(types)
        self.index = {k: i for i, k in enumerate(self.types)}
        self.table = dict(table)
        self.q = q or {}
        self.meta = meta or {}

    def act(self, state) -> int | None:
        return self.table.get(state)

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        defer = f", defers to {self.defer_to}" if self.defer_to else ""
        return f"<fsm.Policy {self.encoding}: {len(self.types)} types, {len(self.table)} states{defer}>"

    def to_json(self) -> dict:
        states = []
        for s, a in self.table.items():
            e = {"s": list(s), "a": a}
            q = self.q.get(s)
            if q:
                e["q"] = {str(k): round(v, 6) for k, v in q.items()}
            states.append(e)
        out = {"format": FORMAT, "version": 1, "encoding": self.encoding, "settle": self.settle,
               "types": self.types, "states": states, "meta": self.meta}
        if self.defer_to:
            out["defer_to"] = self.defer_to
        if self.hold_tail:
            out["hold_tail"] = True
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Policy":
        if d.get("format") != FORMAT:
            raise ValueError(f"not an FSM policy (format {d.get('format')!r}, expected {FORMAT!r})")
        if d.get("version") != 1:
            raise ValueError(f"unsupported FSM policy version {d.get('version')!r}")
        table, q = {}, {}
        for e in d["states"]:
            s = tuple(e["s"])
            table[s] = int(e["a"])
            if "q" in e:
                q[s] = {int(k): float(v) for k, v in e["q"].items()}
        return cls(d["encoding"], d["types"], table, q, d.get("meta", {}), d.get("settle", False),
                   d.get("defer_to"), bool(d.get("hold_tail", False)))

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=0, separators=(",", ":"))

    @classmethod
    def load(cls, path: str) -> "Policy":
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))


# ------------------------------------------------------------------ scheduler
_BY_FILE: dict = {}


class FSMScheduler:
    """Runs a trained Policy; unbatchable nodes run as soon as they are ready."""
    name = "fsm"
    trusted = True  # validated by tests/schedulers/test_fsm.py

    def __init__(self, policy: Policy):
        if not isinstance(policy, Policy):
            raise TypeError(f"FSMScheduler needs an fsm.Policy, got {type(policy).__name__} "
                            f"(use Scheduler.from_file(path) for a saved policy)")
        self.policy = policy
        self.hits = 0
        self.misses = 0
        self.deferred = 0          # schedules made by the scheduler the policy defers to
        self._defer: tuple = (None, None)  # (name, scheduler) of policy.defer_to
        self._keys: dict = {}      # signature tuple -> base_key, valid for the parameter names in _names
        self._names: dict = {}

    @classmethod
    def from_file(cls, path: str) -> "FSMScheduler":
        """A scheduler for a saved policy; one per file (and version), so counts accumulate."""
        path = os.path.abspath(path)
        key = (path, os.path.getmtime(path))
        sched = _BY_FILE.get(key)
        if sched is None:
            sched = _BY_FILE[key] = cls(Policy.load(path))
        return sched

    @classmethod
    def from_spec(cls, path: str | None = None) -> "FSMScheduler":
        """Registry factory: "fsm:<path>" loads a policy file; plain "fsm" loads
        $DYNAGRAPH_FSM_POLICY if set, else runs an empty policy (settling plus the
        fallback rule on every decision: an untrained FSM)."""
        path = path or os.environ.get("DYNAGRAPH_FSM_POLICY")
        if not path:
            return cls(Policy("base", [], {}))
        return cls.from_file(path)

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        """The policy's schedule, or that of the scheduler it defers to (policy.defer_to).
        In C when dynagraph._bookkeeping is built (same decisions); schedule_py is its twin."""
        name = self.policy.defer_to
        if name:
            if self._defer[0] != name:
                self._defer = (name, get(name))
            self.deferred += 1
            return self._defer[1].schedule(cg, nodes)
        return self.schedule_policy(cg, nodes)

    def schedule_policy(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        """The policy's own schedule, whatever defer_to says."""
        if NATIVE is not None and nodes:
            vocab = self._vocab_by_sig(cg)
            if vocab is not None:
                pol = self.policy
                out = NATIVE.typewise_batches(cg.args, cg.sig, batchable_by_sig(cg), nodes,
                                              (pol.table, vocab, len(pol.types), ENCODINGS.index(pol.encoding),
                                               pol.settle, pol.hold_tail))
                if out is not None:
                    batches, hits, misses = out
                    self._count(cg, hits, misses)
                    return batches
        return self.schedule_py(cg, nodes)

    def _vocab_by_sig(self, cg) -> list | None:
        """The policy's vocabulary id of every signature of cg (-1: not in it), or None when two
        signatures share a key (stable_keys would number them by the pending ones: Python decides)."""
        names = param_names(cg)
        if names != self._names:
            self._keys, self._names = {}, names
        cache, index = self._keys, self.policy.index
        keys = []
        for sig in cg.signatures:
            k = cache.get(sig)
            if k is None:
                k = cache[sig] = base_key(sig, names)
            keys.append(k)
        if len(set(keys)) < len(keys):
            return None
        return [index.get(k, -1) for k in keys]

    def _count(self, cg, hits: int, misses: int) -> None:
        self.hits += hits
        self.misses += misses
        st = cg.stats
        if hasattr(st, "policy_hits"):
            st.policy_hits += hits
            st.policy_misses += misses

    def schedule_py(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        if not nodes:
            return []
        pol = self.policy
        sim = simulation(cg, nodes, pol.encoding, pol.settle, pol.hold_tail)
        sim.reset()
        keys = stable_keys(cg, sim.type_sig)
        vmap = [pol.index.get(keys[s], -1) for s in sim.type_sig]
        inv = {v: t for t, v in enumerate(vmap) if v >= 0}
        ready, table, enc = sim.ready, pol.table, pol.encoding
        hits = misses = 0
        while ready:
            if pol.settle:
                sim.settle()
                if not ready:
                    break
            state = encode(enc, ready, vmap, sim.fcount if sim.typewise else None,
                           sim.chain_ready if sim.heights else None)
            t = inv.get(table.get(state, -1), -1) if state is not None else -1
            if t in ready and allowed(enc, sim, t):
                hits += 1
            else:
                misses += 1
                t = fallback(enc, sim)
            sim.step(t)
        self._count(cg, hits, misses)
        return sim.batches


register("fsm", FSMScheduler.from_spec)
