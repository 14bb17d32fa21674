"""The machinery every RNN builder shares (dynagraph/nn/rnn.py holds the builders):
RNNState, the per-sequence parameter expressions and dropout masks, and _RNNBuilder
(parameters, initial states, set_h/set_s, dropout settings, shape checks).

A state is a plain value: `add_input` on any state (even an old one) continues from
exactly that state, and every `initial_state()` starts an independent sequence with its
own dropout masks (see rnn.py for how this differs from DyNet).
"""
from __future__ import annotations

from typing import Sequence

from ..batched import BatchedExpression
from ..errors import DynagraphError, user_line
from ..expression import Expression, record1
from ..expressions import cmult, inputVector, mean_elems, random_bernoulli, reshape, sqrt, square, zeros
from ..ops import OPS
from ..parameters import ConstInitializer, ParameterCollection

_RESHAPE = OPS["reshape"]


def _err(who: str, msg: str) -> DynagraphError:
    return DynagraphError(f"{who}: {msg}\n  at {user_line()}")


def _positive(who: str, **dims) -> None:
    for k, v in dims.items():
        if isinstance(v, bool) or not hasattr(v, "__index__") or v <= 0:
            raise _err(who, f"{k} must be a positive int, got {v!r}")


def _bernoulli_mask(dim: int, rate: float) -> Expression:
    """DyNet's variational mask: keep with prob 1-rate, scaled by 1/(1-rate)."""
    keep = 1.0 - rate
    return random_bernoulli(dim, keep, 1.0 / keep if keep > 0 else 0.0)


def _layer_norm(x, g, b):
    """DyNet's layer_norm: g * (x - mean) / (std + 1e-8) + b, population std."""
    xc = x - mean_elems(x)
    sigma = sqrt(mean_elems(square(xc)))
    return cmult(g, xc / (sigma + 1e-8)) + b


class _Sequence:
    """What every state of one sequence shares: parameter expressions and dropout masks."""
    __slots__ = ("vars", "ln_vars", "masks", "update")

    def __init__(self, vars_, ln_vars, update: bool = True):
        self.vars, self.ln_vars, self.masks, self.update = vars_, ln_vars, {}, update

    def mask(self, key: tuple, dim: int, rate: float) -> Expression:
        m = self.masks.get(key)
        if m is None:
            m = self.masks[key] = _bernoulli_mask(dim, rate)
        return m


class RNNState:
    """One point of a sequence. Immutable: adding an input returns a new state."""
    __slots__ = ("builder", "_seq", "_h", "_c", "_prev", "_out")

    def __init__(self, builder, seq, h=None, c=None, prev=None, out=None):
        self.builder, self._seq, self._h, self._c = builder, seq, h, c
        self._prev, self._out = prev, out

    def add_input(self, x: Expression) -> "RNNState":
        return self.builder._add_input(self, x)

    def add_inputs(self, xs: Sequence[Expression]) -> list:
        """The list of states after each input (see transduce for just outputs)."""
        states, cur = [], self
        for x in xs:
            cur = self.builder._add_input(cur, x)
            states.append(cur)
        return states

    def transduce(self, xs: Sequence[Expression]) -> list:
        """The list of outputs after each input."""
        xs = xs if type(xs) is list else list(xs)
        fast = self.builder._transduce(self, xs)
        if fast is not None:
            return fast
        return [s._out for s in self.add_inputs(xs)]

    def output(self):
        return self._out

    def h(self) -> tuple:
        """Each layer's output at this step (empty for a fresh initial state)."""
        return tuple(self._h) if self._h is not None else ()

    def s(self) -> tuple:
        """The full state: (c_1..c_L, h_1..h_L) for LSTMs, h() otherwise."""
        if self._c is None:
            return self.h()
        return tuple(self._c) + self.h()

    def prev(self):
        return self._prev

    def b(self):
        return self.builder

    def set_h(self, es=None) -> "RNNState":
        return self.builder._set_h(self, list(es or []))

    def set_s(self, es=None) -> "RNNState":
        return self.builder._set_s(self, list(es or []))


class _RNNBuilder:
    """Shared machinery: parameters, initial states, dropout bookkeeping."""
    _subname = ""
    _has_cell = False   # LSTMs carry c next to h
    _blockable = False  # has a _make_block (static-subgraph step)

    def __init__(self, layers: int, input_dim: int, hidden_dim: int, model: ParameterCollection):
        who = self.whoami()
        _positive(who, layers=layers, input_dim=input_dim, hidden_dim=hidden_dim)
        if not isinstance(model, ParameterCollection):
            raise TypeError(f"{who}: model must be a ParameterCollection, got {type(model).__name__}")
        layers, input_dim, hidden_dim = int(layers), int(input_dim), int(hidden_dim)
        self.layers, self.input_dim, self.hidden_dim = layers, input_dim, hidden_dim
        self.spec = (layers, input_dim, hidden_dim)
        self.model = model.add_subcollection(self._subname)
        self.params: list[list] = []
        self.ln_params: list[list] = []
        self.dropout_rate = self.dropout_rate_h = 0.0
        self._last_seq: _Sequence | None = None
        self.blocked = False
        self._blocks: list = []

    def set_blocked(self, on: bool = True) -> None:
        """Run each layer's step as one static subgraph (dy.block): one coarse node per
        step instead of ~15 ops. Same numbers; used when dropout is off, parameters are
        trained (update=True) and, for LSTMs, ln_lstm is off (op-level otherwise)."""
        self.blocked = bool(on)

    def _use_blocks(self, seq: _Sequence) -> bool:
        return (self.blocked and self._blockable and seq.update and self.dropout_rate == 0.0 and self.dropout_rate_h == 0.0
                and not self.ln_params)

    def _layer_block(self, i: int):
        while len(self._blocks) <= i:
            self._blocks.append(self._make_block(len(self._blocks)))
        return self._blocks[i]

    # ---------------------------------------------------------------- parameters
    def _w(self, rows: int, cols: int):
        return self.model.add_parameters((rows, cols))

    def _b(self, rows: int):
        return self.model.add_parameters((rows,), init=ConstInitializer(0.0))

    def whoami(self) -> str:
        return type(self).__name__

    def param_collection(self) -> ParameterCollection:
        return self.model

    def get_parameters(self) -> list:
        """One list per layer, in DyNet's order."""
        return [list(ps) for ps in self.params]

    def get_parameter_expressions(self) -> list:
        return [[p.expr(True) for p in ps] for ps in self.params]

    @classmethod
    def from_spec(cls, spec, model: ParameterCollection):
        spec = list(spec)
        return cls(*spec[:3], model, *spec[3:])

    # ------------------------------------------------------------------- states
    def initial_state(self, vecs=None, update: bool = True) -> RNNState:
        """A fresh sequence; `vecs` gives h per layer ([c..., h...] for LSTMs)."""
        seq = _Sequence([[p.expr(update) for p in ps] for ps in self.params],
                        [[p.expr(update) for p in ps] for ps in self.ln_params], update)
        self._last_seq = seq
        if vecs is None:
            return RNNState(self, seq)
        vecs = list(vecs)
        L = self.layers
        want = 2 * L if self._has_cell else L
        if len(vecs) != want:
            what = "c and h for each layer" if self._has_cell else "h for each layer"
            raise _err(self.whoami(), f"initial_state needs {want} expressions ({what}) for {L} layers, "
                                      f"got {len(vecs)}")
        for v in vecs:
            self._check_vec(v, self.hidden_dim, "initial_state")
        if self._has_cell:
            return RNNState(self, seq, vecs[L:], vecs[:L])
        return RNNState(self, seq, vecs)

    def initial_state_from_raw_vectors(self, vecs=None, update: bool = True) -> RNNState:
        return self.initial_state(None if vecs is None else [inputVector(v) for v in vecs], update)

    def _check_vec(self, x, dim: int, where: str):
        if type(x) is Expression:  # the common case, once per step: no property, no wrappers
            shape = x.cg.shape[x.i]
            if shape == (dim,):
                return x
            if shape == (dim, 1):  # a column (e.g. attention's context): DyNet takes it as a vector
                return record1(_RESHAPE, x, ((dim,),))
        elif not isinstance(x, (Expression, BatchedExpression)):  # a minibatch: one step per sample
            raise TypeError(f"{self.whoami()}.{where}: expected an Expression, got {type(x).__name__}")
        shape = x.shape
        if shape == (dim,):
            return x
        if shape == (dim, 1):
            return reshape(x, (dim,))
        raise _err(self.whoami(), f"{where}: got an expression of shape {shape}, expected ({dim},)")

    def _add_input(self, state: RNNState, x) -> RNNState:
        x = self._check_vec(x, self.input_dim, "add_input")
        hs, cs, out = self._step(state._seq, state._h, state._c, x)
        return RNNState(self, state._seq, hs, cs, state, out)

    def _set_h(self, state: RNNState, es: list) -> RNNState:
        if len(es) != self.layers:
            raise _err(self.whoami(), f"set_h needs one expression per layer ({self.layers}), got {len(es)}")
        es = [self._check_vec(e, self.hidden_dim, "set_h") for e in es]
        cs = None
        if self._has_cell:
            cs = state._c if state._c is not None else [zeros(self.hidden_dim) for _ in es]
        return RNNState(self, state._seq, es, cs, state, es[-1])

    def _set_s(self, state: RNNState, es: list) -> RNNState:
        return self._set_h(state, es)

    # ------------------------------------------------------------------ dropout
    def set_dropout(self, d: float) -> None:
        self.set_dropouts(d, d)

    def set_dropouts(self, d: float, d_h: float) -> None:
        """Variational dropout (Gal 2016): one mask per sequence on x and on h."""
        self._check_rates(d, d_h)
        self.dropout_rate, self.dropout_rate_h = float(d), float(d_h)

    def disable_dropout(self) -> None:
        self.dropout_rate = self.dropout_rate_h = 0.0

    def set_dropout_masks(self, batch_size: int = 1) -> None:
        """Resample the masks of the latest sequence (batch_size must be 1 here)."""
        if batch_size != 1:
            raise _err(self.whoami(), "set_dropout_masks: the minibatch dimension is not supported; "
                                      "write per-sample code and let dynagraph batch it")
        if self._last_seq is not None:
            self._last_seq.masks = {}

    def _check_rates(self, *ds) -> None:
        for d in ds:
            if not 0.0 <= d <= 1.0:
                raise _err(self.whoami(), f"dropout rate must be a probability in [0, 1], got {d}")

    def _dropped_input(self, seq: _Sequence, i: int, x):
        if self.dropout_rate > 0:
            x = cmult(x, seq.mask((i, "x"), self.input_dim if i == 0 else self.hidden_dim, self.dropout_rate))
        return x

    def _dropped_h(self, seq: _Sequence, i: int, h):
        if self.dropout_rate_h > 0:
            h = cmult(h, seq.mask((i, "h"), self.hidden_dim, self.dropout_rate_h))
        return h

    def _step(self, seq, hs, cs, x):
        raise NotImplementedError

    def _transduce(self, state: RNNState, xs: list) -> list | None:
        """A builder's shortcut for state.transduce(xs), or None: take the general path."""
        return None
