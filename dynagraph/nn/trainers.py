"""Trainers with DyNet's update rules and defaults (dynet/training.cc, _dynet.pyx).

`update()` follows DyNet's Trainer::update: one global L2 norm over every
gradient of the collection (lookup tables count their touched rows only),
clipping by threshold/norm when that norm exceeds the threshold (5 by
default), then the trainer's rule on each parameter whose is_updated() is
true. Lookup tables update only their touched rows unless sparse updates are
off. Unlike DyNet, a non-finite gradient always raises NonFiniteError before
anything is modified.

Every array is changed in place, never replaced: graphs bind views of
`p.values`, and the user may hold references to them.

Optimizer state lives next to the parameter, on its backend's device (arrays of
`p.backend.xp`); the rules run there, through the backend's optimizer_rules where it
has them and as `xp` code otherwise. The one host transfer per update is the global
gradient norm that clipping needs (a float64 scalar, summed on the device).
"""
from __future__ import annotations

import math
import sys

import numpy as np

from .. import overlap
from ..backends import get_backend
from ..errors import NonFiniteError
from ..parameters import layout_version

__all__ = ["Trainer", "SimpleSGDTrainer", "MomentumSGDTrainer", "AdagradTrainer", "AdadeltaTrainer",
           "RMSPropTrainer", "AdamTrainer", "AmsgradTrainer"]


class Trainer:
    """Base class: clipping, sparse/dense dispatch and bookkeeping. Subclasses give `_rule`."""

    n_states = 0  # optimizer arrays kept per parameter, shaped like its values

    def __init__(self, m, learning_rate: float):
        if not hasattr(m, "_all"):
            raise TypeError(f"{type(self).__name__} needs a ParameterCollection, got {type(m).__name__}")
        self.model = m
        self.learning_rate = learning_rate
        self.clipping_enabled = True
        self.clip_threshold = 5.0
        self.sparse_updates_enabled = True
        self.updates = 0           # DyNet's counter; Adam's bias correction reads it
        self.clips = 0
        self.updates_since_status = 0
        self.clips_since_status = 0
        self._state: dict = {}     # id(parameter) -> list of n_states arrays (pc keeps p alive)
        self._collection = None    # (key, CollectionStep or None) for update() in one call

    # ------------------------------------------------------------ settings
    @property
    def learning_rate(self) -> float:
        return self._lr

    @learning_rate.setter
    def learning_rate(self, lr: float) -> None:
        lr = float(lr)
        overlap.wait()  # a pending update() reads the rate it was called with
        if not math.isfinite(lr):
            raise ValueError(f"learning_rate must be finite, got {lr}")
        self._lr = lr

    def set_learning_rate(self, lr: float) -> None:
        self.learning_rate = lr

    def set_clip_threshold(self, thr: float) -> None:
        """DyNet: a threshold <= 0 turns clipping off (and reads back as 0)."""
        thr = float(thr)
        overlap.wait()
        self.clipping_enabled = thr > 0
        self.clip_threshold = thr if thr > 0 else 0.0

    def get_clip_threshold(self) -> float:
        return self.clip_threshold

    def set_sparse_updates(self, su: bool) -> None:
        overlap.wait()
        self.sparse_updates_enabled = bool(su)

    def get_sparse_updates(self) -> bool:
        return self.sparse_updates_enabled

    def whoami(self) -> str:
        return type(self).__name__

    def status(self) -> None:
        """Print DyNet's status line to stderr and reset the since-status counters."""
        overlap.wait()
        sys.stderr.write(f"[lr={self.learning_rate:g} clips={self.clips_since_status} "
                         f"updates={self.updates_since_status}] ")
        self.updates_since_status = self.clips_since_status = 0

    def restart(self, learning_rate: float | None = None) -> None:
        """Zero the optimizer state (momenta, moment estimates); optionally set the rate."""
        overlap.wait()
        if learning_rate is not None:
            self.learning_rate = learning_rate
        for states in self._state.values():
            for s in states:
                s[...] = 0

    def update_epoch(self, r: float = 1.0) -> None:
        # Deprecated in DyNet, where it prints this and does nothing.
        sys.stderr.write("Trainer::update_epoch has been deprecated and doesn't do anything. Control the "
                         "learning rate directly, e.g. trainer.learning_rate /= (1 - rate_decay)\n")

    # -------------------------------------------------------------- update
    def update(self) -> None:
        # On two cores the update runs on the overlap thread, after the deferred backward().
        # Per-sentence programs call this once per sentence: with nothing deferred and nothing
        # to defer to (overlap off, the default), straight to the update.
        if overlap.idle() or not overlap.defer(self._update, f"{type(self).__name__}.update()", chained=True):
            self._update()

    def _update(self) -> None:
        if self._collection_rule is not None and self._step_collection():
            return
        params = self.model._all()
        gscale = self._clip_scale(_grad_norm_sq(params))
        rules = self._rules()  # once per update, not per parameter: per-sentence programs update often
        for p in params:
            if not p.is_updated():
                continue  # DyNet leaves frozen parameters (and their gradients) alone
            self._xp = p.backend.xp
            if p.is_lookup:
                self._update_lookup(p, gscale)
            else:
                if rules is None:
                    self._rule(p.values, p.grad, self._states(p), gscale)
                else:
                    self._kernel(rules, p.values, p.grad, self._states(p), gscale, None)
                p.grad[...] = 0
        self.updates += 1
        self.updates_since_status += 1

    # ---------------------------------------------- the whole collection in one call
    _collection_rule: str | None = None  # the compiled rule's name where a subclass has one

    def _collection_hp(self) -> tuple:
        """The rule's scalars for the backend's CollectionStep (see kernels/dg_kernels.h)."""
        raise NotImplementedError

    def _step_collection(self) -> bool:
        """update() as one call of the backend's CollectionStep (norm, clipping, rule, cleared
        gradients), where every parameter lives on one backend that has it; False where not
        (the per-parameter path then runs). The same arithmetic as that path, but for the
        global norm, which is summed in float64 instead of per parameter in its dtype."""
        key = self._collection_key()
        plan = self._collection
        if plan is None or plan[0] != key:
            plan = self._collection = (key, self._collection_plan(self.model._all()))
        step = plan[1]
        if step is None or (self.clipping_enabled and not self.clip_threshold > 0):
            return False
        finite, norm_sq, clipped = step(self._collection_hp(), self.clip_threshold if self.clipping_enabled else 0.0)
        if not finite:
            _grad_norm_sq(self.model._all())  # names the non-finite parameters (raises); nothing was written
            return False
        if clipped:
            self.clips += 1
            self.clips_since_status += 1
        self.updates += 1
        self.updates_since_status += 1
        return True

    def _collection_key(self) -> tuple:
        """What a CollectionStep was built from: the parameters, their arrays and updated flags
        (parameters.layout_version changes with any of them, and with any parameter added to
        any collection), and the sparse-update setting."""
        return (layout_version(), self.sparse_updates_enabled)

    def _collection_plan(self, params: list):
        """A CollectionStep of the parameters' one backend, or None (mixed or other backends,
        arrays it cannot take: the per-parameter path handles those)."""
        if not params:
            return None
        be = params[0].backend
        rules = be.optimizer_rules
        make = getattr(rules, "CollectionStep", None)
        if make is None or any(p.backend is not be for p in params):
            return None
        entries = []
        for p in params:
            mode = 0 if not p.is_updated() else 2 if p.is_lookup and self.sparse_updates_enabled else 1
            entries.append((p.values, p.grad, self._states(p), p.touched if p.is_lookup else None, mode))
        try:
            return make(self._collection_rule, entries)
        except (TypeError, ValueError):
            return None

    def _clip_scale(self, norm_sq: float) -> float:
        if not self.clipping_enabled:
            return 1.0
        norm = math.sqrt(norm_sq)
        if norm > self.clip_threshold:
            self.clips += 1
            self.clips_since_status += 1
            return self.clip_threshold / norm
        return 1.0

    def _update_lookup(self, p, gscale: float) -> None:
        states = self._states(p)
        if not self.sparse_updates_enabled:
            self._apply(p.values, p.grad, states, gscale, None)
            p.grad[...] = 0
        else:
            rows = p.touched_rows()
            if rows.size and not self._compiled(p.values, p.grad, states, gscale, rows):
                # Gather the touched rows, apply the rule, scatter back: untouched rows
                # and their optimizer state stay exactly as they were.
                rows = p._device(rows)
                w = p.values[rows]
                sub = [s[rows] for s in states]
                self._rule(w, p.grad[rows], sub, gscale)
                p.values[rows] = w
                for s, x in zip(states, sub):
                    s[rows] = x
        p.clear_grad()

    def _states(self, p) -> list:
        s = self._state.get(id(p))
        if s is None:
            s = self._state[id(p)] = [p.backend.xp.zeros_like(p.values) for _ in range(self.n_states)]
        return s

    def state_arrays(self, p) -> list:
        """p's optimizer arrays (momenta, moment estimates), in place, created on first use;
        for checkpoints and dy.distributed. Empty for plain SGD."""
        return self._states(p)

    _xp = np  # the array module of the parameter being updated (set per parameter by update)

    def _rule(self, w, g, states: list, gscale: float) -> None:
        """Update w (and states) in place from gradient g scaled by gscale, with self._xp
        (w's array module). g must not be kept."""
        raise NotImplementedError

    def _apply(self, w, g, states, gscale, rows) -> None:
        if not self._compiled(w, g, states, gscale, rows):
            self._rule(w, g, states, gscale)

    def _compiled(self, w, g, states, gscale, rows) -> bool:
        """Where the backend has optimizer rules, run the compiled rule (same arithmetic in
        one pass; rows: only those rows, in place). False where this trainer or the
        backend has none: use _rule."""
        rules = self._rules()
        if rules is None:
            return False
        self._kernel(rules, w, g, states, gscale, rows)
        return True

    def _rules(self):
        """The backend's optimizer rules where this trainer has a compiled kernel, else None."""
        return get_backend().optimizer_rules if getattr(type(self), "_kernel", None) is not None else None


def _grad_norm_sq(params) -> float:
    """Sum of squared gradient norms; raises NonFiniteError naming every bad parameter.

    Each parameter's float64 term is formed on its device and the terms are summed there
    in order (the same float64 additions as summing them on the host), so one scalar per
    backend crosses to the host; only a non-finite sum looks at the parameters one by one."""
    total, sums = 0.0, {}
    for p in params:
        be = p.backend
        sums[be] = p.grad_norm_sq_device() if be not in sums else sums[be] + p.grad_norm_sq_device()
    for be, s in sums.items():
        total += float(be.to_host(s))
    if math.isfinite(total):
        return total
    total, bad = 0.0, []
    for p in params:
        s = p.grad_norm_sq()
        if not math.isfinite(s):
            be = p.backend
            g = p.touched_grad() if p.is_lookup else p.grad
            if not bool(be.to_host(be.xp.isfinite(g).all())):
                bad.append(f"{p.name()} {tuple(p.shape())}")
                continue
            s = float(be.to_host(be.xp.sum(be.xp.square(g, dtype=np.float64))))  # float32 sum overflowed
        total += s
    if bad:
        raise NonFiniteError(f"non-finite (nan or inf) gradient in parameter(s) {', '.join(bad)}; "
                             f"no parameter was updated (pc.reset_gradient() discards the gradients)")
    return total


# ------------------------------------------------------------------- rules
class SimpleSGDTrainer(Trainer):
    """w -= lr * g"""

    def __init__(self, m, learning_rate: float = 0.1):
        super().__init__(m, learning_rate)

    def _rule(self, w, g, states, gscale):
        w -= g * (self.learning_rate * gscale)

    def _kernel(self, k, w, g, states, gscale, rows):
        k.sgd_update(w, g, self.learning_rate * gscale, rows)

    _collection_rule = "sgd"

    def _collection_hp(self):
        return (self.learning_rate,)


class MomentumSGDTrainer(Trainer):
    """v = mom * v - lr * g;  w += v"""
    n_states = 1

    def __init__(self, m, learning_rate: float = 0.01, mom: float = 0.9):
        super().__init__(m, learning_rate)
        self.momentum = float(mom)

    def _rule(self, w, g, states, gscale):
        v, = states
        v *= self.momentum
        v -= g * (self.learning_rate * gscale)
        w += v

    def _kernel(self, k, w, g, states, gscale, rows):
        k.momentum_update(w, g, states[0], self.momentum, self.learning_rate * gscale, rows)

    _collection_rule = "momentum"

    def _collection_hp(self):
        return (self.learning_rate, self.momentum)


class AdagradTrainer(Trainer):
    """h += g^2;  w -= lr * g / sqrt(h + eps)   (eps inside the root, as in DyNet)"""
    n_states = 1

    def __init__(self, m, learning_rate: float = 0.1, eps: float = 1e-20):
        super().__init__(m, learning_rate)
        self.epsilon = float(eps)

    def _rule(self, w, g, states, gscale):
        h, = states
        g = g * gscale
        h += self._xp.square(g)
        w -= g / self._xp.sqrt(h + self.epsilon) * self.learning_rate

    def _kernel(self, k, w, g, states, gscale, rows):
        k.adagrad_update(w, g, states[0], self.learning_rate, self.epsilon, gscale, rows)

    _collection_rule = "adagrad"

    def _collection_hp(self):
        return (self.learning_rate, 0.0, self.epsilon)


class AdadeltaTrainer(Trainer):
    """hg = rho hg + (1-rho) g^2;  d = -g sqrt(hd+eps)/sqrt(hg+eps);  hd = rho hd + (1-rho) d^2;  w += d"""
    n_states = 2

    def __init__(self, m, eps: float = 1e-6, rho: float = 0.95):
        super().__init__(m, 1.0)  # DyNet keeps a learning rate of 1 that the rule never reads
        self.epsilon, self.rho = float(eps), float(rho)

    def _rule(self, w, g, states, gscale):
        hg, hd = states
        g = g * gscale
        hg *= self.rho
        xp = self._xp
        hg += xp.square(g) * (1 - self.rho)
        d = -g * xp.sqrt(hd + self.epsilon) / xp.sqrt(hg + self.epsilon)
        hd *= self.rho
        hd += xp.square(d) * (1 - self.rho)
        w += d


class RMSPropTrainer(Trainer):
    """h = rho h + (1-rho) g^2;  w -= lr * g / sqrt(h + eps)"""
    n_states = 1

    def __init__(self, m, learning_rate: float = 0.001, eps: float = 1e-8, rho: float = 0.9):
        super().__init__(m, learning_rate)
        self.epsilon, self.rho = float(eps), float(rho)

    def _rule(self, w, g, states, gscale):
        h, = states
        g = g * gscale
        h *= self.rho
        h += self._xp.square(g) * (1 - self.rho)
        w -= g / self._xp.sqrt(h + self.epsilon) * self.learning_rate


class AdamTrainer(Trainer):
    """m, v moving averages;  w -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)

    DyNet folds the bias correction into the step size and adds eps to sqrt(v)
    uncorrected; t counts update() calls, so rows of a lookup table that are
    updated rarely still see the global t.
    """
    n_states = 2

    def __init__(self, m, alpha: float = 0.001, beta_1: float = 0.9, beta_2: float = 0.999, eps: float = 1e-8):
        super().__init__(m, alpha)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(eps)

    def _moments(self, g, mom, var, gscale) -> float:
        g = g * gscale
        mom *= self.beta_1
        mom += g * (1 - self.beta_1)
        var *= self.beta_2
        var += self._xp.square(g) * (1 - self.beta_2)
        return self._lr_t()

    def _lr_t(self) -> float:
        t = self.updates + 1
        return self.learning_rate * math.sqrt(1 - self.beta_2 ** t) / (1 - self.beta_1 ** t)

    def _kernel(self, k, w, g, states, gscale, rows):
        k.adam_update(w, g, states[0], states[1], self.beta_1, self.beta_2, self.epsilon, self._lr_t(), gscale, rows)

    _collection_rule = "adam"

    def _collection_hp(self):
        return (0.0, 0.0, self.epsilon, self.beta_1, self.beta_2, self._lr_t())

    def _rule(self, w, g, states, gscale):
        mom, var = states
        lr_t = self._moments(g, mom, var, gscale)
        w -= mom / (self._xp.sqrt(var) + self.epsilon) * lr_t


class AmsgradTrainer(AdamTrainer):
    """Adam with vhat = max(vhat, v) in the denominator."""
    n_states = 3
    _kernel = None  # Adam's compiled rules do not apply
    _collection_rule = None

    def _rule(self, w, g, states, gscale):
        mom, var, vhat = states
        lr_t = self._moments(g, mom, var, gscale)
        self._xp.maximum(vhat, var, out=vhat)
        w -= mom / (self._xp.sqrt(vhat) + self.epsilon) * lr_t
