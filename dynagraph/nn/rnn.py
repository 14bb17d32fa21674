"""RNN builders with DyNet's exact parameter layout, written with plain dy.* ops.

Copying a DyNet model's weights (in `parameters_list()` order) into a builder
built with the same arguments gives the same outputs: sub-collection names,
parameter order, shapes, initialisers (biases start at zero), gate order and
forget-bias handling all follow DyNet 2.x (dynet/rnn.cc, gru.cc, lstm.cc).

Gate pre-activations are single `affine_transform` nodes, so when dynagraph
batches the same step of many samples every shared weight is one GEMM.

Differences from DyNet, on purpose:
  * every `initial_state()` call starts an independent sequence with its own
    dropout masks (DyNet caches one state per graph, so sequences recorded in
    the same graph share masks); per-sample code then means per-sample masks.
  * a state is a plain value: `add_input` on any state (even an old one)
    continues from exactly that state; an LSTM's set_h keeps that state's c
    (zeros for a fresh state), where DyNet takes c from its latest step.

Save/load protocol (used by dynagraph.nn.io for dy.save / dy.load):
  * `builder.spec` is a JSON-serialisable tuple of the constructor arguments
    after `model` (the dims first, then extra args), e.g. (layers, input_dim,
    hidden_dim, ln_lstm, forget_bias) for VanillaLSTMBuilder. For BiRNNBuilder
    it is (num_layers, input_dim, hidden_dim, [[whoami, spec], ...]) listing
    the inner builders in creation order.
  * `builder.param_collection()` is the sub-collection holding its parameters.
  * `BUILDER_TYPES[builder.whoami()].from_spec(spec, model)` rebuilds an equal
    builder inside `model` (the *parent* collection, as the constructor takes),
    creating parameters in the same order; populate `param_collection()` next.
    (BiRNNBuilder.from_spec rebuilds its inner builders through BUILDER_TYPES.)
  One deliberate layout change: VanillaLSTMBuilder(ln_lstm=True) keeps its
  layer-norm gains and biases in its own sub-collection (DyNet puts them in
  `model`, so DyNet's own dy.save of such a builder loses them). Creation
  order, hence `parameters_list()` order and shapes, is still DyNet's; only
  those builders' parameter names differ.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

from ..expression import Expression, record1, record2
from ..expressions import (
    affine_transform, cmult, concatenate, dropout, logistic, pick_range, random_normal, record_list, tanh, zeros,
)
from ..parameters import ConstInitializer, ParameterCollection
from ..ops import OPS
from ..ops.cells import STATE_WIDTH
from ..subgraph import block
from .rnn_base import RNNState, _err, _layer_norm, _positive, _RNNBuilder, _Sequence

_LSTM_C, _LSTM_H, _LSTM_STEP = OPS["lstm_c"], OPS["lstm_h"], OPS["lstm_step"]

__all__ = ["RNNState", "SimpleRNNBuilder", "GRUBuilder", "VanillaLSTMBuilder", "LSTMBuilder",
           "CompactVanillaLSTMBuilder", "CoupledLSTMBuilder", "BiRNNBuilder"]


class SimpleRNNBuilder(_RNNBuilder):
    """h_t = tanh(W_hx x_t + W_hh h_{t-1} + b_h) per layer; params [W_hx, W_hh, b_h]."""
    _subname = "simple-rnn-builder"

    def __init__(self, layers: int, input_dim: int, hidden_dim: int, model: ParameterCollection):
        super().__init__(layers, input_dim, hidden_dim, model)
        d_in, hidden_dim = self.input_dim, self.hidden_dim
        for _ in range(self.layers):
            self.params.append([self._w(hidden_dim, d_in), self._w(hidden_dim, hidden_dim), self._b(hidden_dim)])
            d_in = hidden_dim

    def _step(self, seq, hs, cs, x):
        out = []
        for i, (W_x, W_h, b) in enumerate(seq.vars):
            x = self._dropped_input(seq, i, x)
            if hs is None:
                x = tanh(affine_transform([b, W_x, x]))
            else:
                x = tanh(affine_transform([b, W_x, x, W_h, self._dropped_h(seq, i, hs[i])]))
            out.append(x)
        return out, None, x


class GRUBuilder(_RNNBuilder):
    """GRU with DyNet's per-gate params [W_zx, W_zh, b_z, W_rx, W_rh, b_r, W_hx, W_hh, b_h]."""
    _subname = "gru-builder"
    _blockable = True

    def __init__(self, layers: int, input_dim: int, hidden_dim: int, model: ParameterCollection):
        super().__init__(layers, input_dim, hidden_dim, model)
        d_in, hd = self.input_dim, self.hidden_dim
        for _ in range(self.layers):
            ps = []
            for _gate in range(3):  # z, r, candidate h
                ps += [self._w(hd, d_in), self._w(hd, hd), self._b(hd)]
            self.params.append(ps)
            d_in = hd

    def set_dropouts(self, d: float, d_h: float) -> None:
        raise _err(self.whoami(), "GRUBuilder has no set_dropouts in DyNet; use set_dropout(d)")

    def set_dropout(self, d: float) -> None:
        """DyNet's GRU dropout is standard (not variational): each layer's input and the output."""
        self._check_rates(d)
        self.dropout_rate = float(d)

    def set_dropout_masks(self, batch_size: int = 1) -> None:
        raise _err(self.whoami(), "GRUBuilder draws fresh dropout at every step; it has no masks")

    def _step(self, seq, hs, cs, x):
        d = self.dropout_rate
        if self._use_blocks(seq) and hs is not None:
            out = []
            for i in range(self.layers):
                x = self._layer_block(i)(x, hs[i])
                out.append(x)
            return out, None, x
        out = []
        for i, ps in enumerate(seq.vars):
            if d > 0:
                x = dropout(x, d)
            x = _gru_update(ps, x, None if hs is None else hs[i])
            out.append(x)
        return out, None, (dropout(x, d) if d > 0 else x)

    def _make_block(self, i: int):
        ps = self.params[i]
        return block(lambda x, hp: _gru_update(ps, x, hp), name=f"gru-layer{i}")


def _gru_update(ps, x, hp):
    """One GRU layer step; ps are parameter expressions (op-level) or Parameters (block)."""
    W_zx, W_zh, b_z, W_rx, W_rh, b_r, W_hx, W_hh, b_h = ps
    if hp is None:  # no previous state: DyNet drops the h terms (h_{-1} = 0)
        z = logistic(affine_transform([b_z, W_zx, x]))
        return cmult(z, tanh(affine_transform([b_h, W_hx, x])))
    z = logistic(affine_transform([b_z, W_zx, x, W_zh, hp]))
    r = logistic(affine_transform([b_r, W_rx, x, W_rh, hp]))
    cand = tanh(affine_transform([b_h, W_hx, x, W_hh, cmult(r, hp)]))
    return cmult(1.0 - z, hp) + cmult(z, cand)


@functools.lru_cache(maxsize=64)
def _cell_attrs(hd: int, fb: float) -> tuple:
    """The attrs of lstm_c and lstm_h, one tuple each per builder shape: the same objects
    every step also let the recorder's signature cache match them by identity."""
    return (hd, fb), (hd,)


@functools.lru_cache(maxsize=64)
def _step_attrs(hd: int, fb: float, chains: int = 1) -> tuple:
    """lstm_step's attrs, one tuple per builder shape (as _cell_attrs)."""
    return (hd, fb) if chains == 1 else (hd, fb, chains)


def _lstm_update(pre, cp, hd: int, fb: float):
    """Vanilla LSTM gates (i, f, o, g stacked in `pre`) -> (h, c); cp None at the first step."""
    a_f = pick_range(pre, hd, 2 * hd)
    i_t = logistic(pick_range(pre, 0, hd))
    f_t = logistic(a_f + fb) if fb != 0.0 else logistic(a_f)
    o_t = logistic(pick_range(pre, 2 * hd, 3 * hd))
    g_t = tanh(pick_range(pre, 3 * hd, 4 * hd))
    c = cmult(i_t, g_t) if cp is None else cmult(f_t, cp) + cmult(i_t, g_t)
    return o_t, c


class _LSTMBase(_RNNBuilder):
    _has_cell = True

    def _set_s(self, state: RNNState, es: list) -> RNNState:
        """es is [c_1..c_L] or [c_1..c_L, h_1..h_L] (DyNet's layout)."""
        L = self.layers
        if len(es) not in (L, 2 * L):
            raise _err(self.whoami(), f"set_s needs {L} (c) or {2 * L} (c then h) expressions, got {len(es)}")
        es = [self._check_vec(e, self.hidden_dim, "set_s") for e in es]
        cs = es[:L]
        if len(es) == 2 * L:
            hs = es[L:]
        else:  # only c given: keep this state's h (zeros at the start)
            hs = state._h if state._h is not None else [zeros(self.hidden_dim) for _ in cs]
        return RNNState(self, state._seq, hs, cs, state, hs[-1])


class VanillaLSTMBuilder(_LSTMBase):
    """Standard LSTM; per layer [W_x (4h x in), W_h (4h x h), b (4h)], gates stacked i, f, o, g."""
    _subname = "vanilla-lstm-builder"
    _blockable = True
    # The cell after the gates' affine_transform as two fused ops (lstm_c, lstm_h) instead of
    # DyNet's thirteen elementwise nodes: the same numbers, far fewer nodes to record, schedule,
    # run and differentiate. False records DyNet's nodes one by one (layer norm always does).
    fused_cell = True
    # transduce() records every step's input product W_x x + b before the recurrence (one batch
    # per layer and sequence), then b' + W_h h per step: the same sum, added in another order.
    # False records DyNet's single affine_transform([b, W_x, x, W_h, h]) per step.
    hoist_inputs = True
    # with hoist_inputs, transduce() from the initial state records each step as one lstm_step
    # node (ops/cells.py: W_h h_prev, the cell and h in one; a state [h | c | gates]) and each
    # output as pick_range(state, 0, h): per sentence and direction one batch a step, not three.
    # False records the step's affine_transform, lstm_c and lstm_h.
    fused_step = True

    def __init__(self, layers: int, input_dim: int, hidden_dim: int, model: ParameterCollection,
                 ln_lstm: bool = False, forget_bias: float = 1.0):
        super().__init__(layers, input_dim, hidden_dim, model)
        self.ln_lstm, self.forget_bias = bool(ln_lstm), float(forget_bias)
        self.spec = self.spec + (self.ln_lstm, self.forget_bias)
        d_in, hidden_dim = self.input_dim, self.hidden_dim
        h4 = 4 * hidden_dim
        for _ in range(self.layers):
            self.params.append([self._w(h4, d_in), self._w(h4, hidden_dim), self._b(h4)])
            d_in = hidden_dim
            if self.ln_lstm:  # gains/biases for h, x and c, right after the layer's weights
                one, zero = ConstInitializer(1.0), ConstInitializer(0.0)
                self.ln_params.append([self.model.add_parameters((n,), init=init) for n, init in (
                    (h4, one), (h4, zero), (h4, one), (h4, zero), (hidden_dim, one), (hidden_dim, zero))])

    def _gates(self, seq, i, x, hp):
        W_x, W_h, b = seq.vars[i]
        if self.ln_lstm:
            g_h, b_h, g_x, b_x = seq.ln_vars[i][:4]
            pre = b + _layer_norm(W_x * x, g_x, b_x)
            return pre if hp is None else pre + _layer_norm(W_h * hp, g_h, b_h)
        if hp is None:
            return affine_transform([b, W_x, x])
        return affine_transform([b, W_x, x, W_h, hp])

    def _plain(self, seq: _Sequence) -> bool:
        """The cell as DyNet records it and nothing else (no layer norm, dropout, weight
        noise or static-subgraph steps): what _plain_step records."""
        return (self.fused_cell and not self.ln_lstm and self.dropout_rate == 0.0 and self.dropout_rate_h == 0.0
                and not self._use_blocks(seq))

    def _plain_step(self, seq, hs, cs, x):
        """_step for plain Expressions and a plain cell: one affine_transform for the four
        gates, as DyNet records it, then the cell as two nodes (ops lstm_c and lstm_h, the
        same formulas as _lstm_update's thirteen elementwise nodes). A builder step is
        recorded, scheduled, run and differentiated once per word of every sentence."""
        c_attrs, h_attrs = _cell_attrs(self.hidden_dim, self.forget_bias)
        out_h, out_c = [], []
        for i, (W_x, W_h, b) in enumerate(seq.vars):
            if hs is None:
                pre = affine_transform([b, W_x, x])
                c = record1(_LSTM_C, pre, c_attrs)
            else:
                pre = affine_transform([b, W_x, x, W_h, hs[i]])
                c = record2(_LSTM_C, pre, cs[i], c_attrs)
            x = record2(_LSTM_H, pre, c, h_attrs)
            out_h.append(x)
            out_c.append(c)
        return out_h, out_c, x

    def _step_chains(self, pres: list, W_hs: list) -> list:
        """K chains of steps from the initial state as one chain of lstm_step nodes (K = len(pres):
        each chain's input pre-activations, one list per chain, and its W_h); each chain's
        outputs h, as pick_range of its part of every state."""
        H, K = self.hidden_dim, len(pres)
        attrs, step_op, W_hs = _step_attrs(H, self.forget_bias, K), _LSTM_STEP, list(W_hs)
        # (outputs, first, end) per chain, made once: recording runs the loop per step of every sentence
        slices = [([], k * STATE_WIDTH * H, k * STATE_WIDTH * H + H) for k in range(K)]
        state = None
        for step in zip(*pres):
            state = record_list(step_op, [*step] if state is None else [*step, *W_hs, state], attrs)
            for out, lo, hi in slices:
                out.append(pick_range(state, lo, hi))
        return [out for out, _, _ in slices]

    def _plain_inputs(self, state: RNNState, xs: list) -> bool:
        """Whether every input is a plain Expression of the input shape and the state and the
        cell are plain: what _transduce's fast paths take."""
        want = (self.input_dim,)
        for x in xs:
            if type(x) is not Expression or x.cg.shape[x.i] != want:
                return False
        hs, cs = state._h, state._c
        return (hs is None or all(type(e) is Expression for e in (*hs, *cs))) and self._plain(state._seq)

    def _paired_steps(self, other: "VanillaLSTMBuilder", xs: list) -> list | None:
        """A bidirectional layer (BiRNNBuilder) as one chain of lstm_step nodes that step both
        directions at once (K = 2: this builder over xs, `other` over xs reversed), when both are
        one-layer plain VanillaLSTMBuilders of one shape and forget bias transducing from their
        initial states (None otherwise). Per sentence the two directions' steps could not share
        a batch (their weights differ): now a time step is one batch, not two. Returns each
        position's [forward h; backward h]."""
        if not (type(self) is type(other) is VanillaLSTMBuilder and self.layers == other.layers == 1
                and self.fused_step and other.fused_step and self.hoist_inputs and other.hoist_inputs
                and self.input_dim == other.input_dim and self.hidden_dim == other.hidden_dim
                and self.forget_bias == other.forget_bias and xs):
            return None
        sf, sb = self.initial_state(), other.initial_state()
        if not (self._plain_inputs(sf, xs) and other._plain_inputs(sb, xs)):
            return None
        (Wx_f, Wh_f, b_f), = sf._seq.vars
        (Wx_b, Wh_b, b_b), = sb._seq.vars
        pres_f = [affine_transform([b_f, Wx_f, x]) for x in xs]
        pres_b = [affine_transform([b_b, Wx_b, x]) for x in reversed(xs)]
        fwd, bwd = self._step_chains([pres_f, pres_b], [Wh_f, Wh_b])
        return [concatenate([f, b]) for f, b in zip(fwd, reversed(bwd))]

    def _transduce(self, state: RNNState, xs: list) -> list | None:
        """RNNState.transduce without the intermediate states, when every input is a plain
        Expression of the input shape and the cell is plain (None otherwise: the general
        path). Outputs are the nodes add_inputs would record, in the same order."""
        seq = state._seq
        if not self._plain_inputs(state, xs):
            return None
        hs, cs = state._h, state._c
        if not self.hoist_inputs:
            out, step = [], self._plain_step
            for x in xs:
                hs, cs, h = step(seq, hs, cs, x)
                out.append(h)
            return out
        c_attrs, h_attrs = _cell_attrs(self.hidden_dim, self.forget_bias)
        for i, (W_x, W_h, b) in enumerate(seq.vars):  # layer by layer: each reads the one below
            # Every step's input product first: none depends on the recurrence, so the scheduler
            # runs them as one GEMM (W_x read once per sequence, not once per word), and each
            # step's own product is W_h h alone.
            pres = [affine_transform([b, W_x, x]) for x in xs]
            if hs is None and self.fused_step:
                xs = self._step_chains([pres], [W_h])[0]
                continue
            h, c = (None, None) if hs is None else (hs[i], cs[i])
            out = []
            for pre in pres:
                if h is None:
                    c = record1(_LSTM_C, pre, c_attrs)
                else:
                    pre = affine_transform([pre, W_h, h])
                    c = record2(_LSTM_C, pre, c, c_attrs)
                h = record2(_LSTM_H, pre, c, h_attrs)
                out.append(h)
            xs = out
        return xs

    def _step(self, seq, hs, cs, x):
        if type(x) is Expression and self._plain(seq) and (
                hs is None or all(type(e) is Expression for e in (*hs, *cs))):
            return self._plain_step(seq, hs, cs, x)
        hd, fb = self.hidden_dim, self.forget_bias
        out_h, out_c = [], []
        if self._use_blocks(seq) and hs is not None:
            for i in range(self.layers):
                x, c = self._layer_block(i)(x, hs[i], cs[i])
                out_h.append(x)
                out_c.append(c)
            return out_h, out_c, x
        for i in range(self.layers):
            x = self._dropped_input(seq, i, x)
            hp = None if hs is None else self._dropped_h(seq, i, hs[i])
            pre = self._gates(seq, i, x, hp)
            cp = None if hs is None else cs[i]
            if self.fused_cell and not self.ln_lstm and type(pre) is Expression and (
                    cp is None or type(cp) is Expression):  # dropout, weight noise: the same cell
                c_attrs, h_attrs = _cell_attrs(hd, fb)
                c = record1(_LSTM_C, pre, c_attrs) if cp is None else record2(_LSTM_C, pre, cp, c_attrs)
                x = record2(_LSTM_H, pre, c, h_attrs)
                out_h.append(x)
                out_c.append(c)
                continue
            o_t, c = _lstm_update(pre, cp, hd, fb)
            if self.ln_lstm:
                g_c, b_c = seq.ln_vars[i][4:]
                x = cmult(o_t, tanh(_layer_norm(c, g_c, b_c)))
            else:
                x = cmult(o_t, tanh(c))
            out_h.append(x)
            out_c.append(c)
        return out_h, out_c, x


    def _make_block(self, i: int):
        W_x, W_h, b = self.params[i]
        hd, fb = self.hidden_dim, self.forget_bias

        def cell(x, hp, cp):
            o_t, c = _lstm_update(affine_transform([b, W_x, x, W_h, hp]), cp, hd, fb)
            return cmult(o_t, tanh(c)), c
        return block(cell, name=f"lstm-layer{i}")


LSTMBuilder = VanillaLSTMBuilder  # as in DyNet's Python API


class CompactVanillaLSTMBuilder(VanillaLSTMBuilder):
    """DyNet's CompactVanillaLSTMBuilder: the same cell and layout as VanillaLSTMBuilder
    (forget bias 1, no layer norm; DyNet fuses it into one node, here the batching and
    dy.block do that), plus Gaussian weight noise (`set_weightnoise`)."""
    _subname = "compact-vanilla-lstm-builder"

    def __init__(self, layers: int, input_dim: int, hidden_dim: int, model: ParameterCollection):
        super().__init__(layers, input_dim, hidden_dim, model)
        self.spec = self.spec[:3]
        self.weightnoise_std = 0.0

    def set_weightnoise(self, std: float) -> None:
        """Add N(0, std^2) noise to W_x, W_h and b at every step (training regulariser)."""
        if not float(std) >= 0.0:
            raise _err(self.whoami(), f"weight noise must have a standard deviation >= 0, got {std}")
        self.weightnoise_std = float(std)

    def _use_blocks(self, seq: _Sequence) -> bool:
        return self.weightnoise_std == 0.0 and super()._use_blocks(seq)

    def _plain(self, seq: _Sequence) -> bool:
        return self.weightnoise_std == 0.0 and super()._plain(seq)

    def _gates(self, seq, i, x, hp):
        if self.weightnoise_std == 0.0:
            return super()._gates(seq, i, x, hp)
        W_x, W_h, b = (v + random_normal(v.dim()[0], 0.0, self.weightnoise_std) for v in seq.vars[i])
        if hp is None:
            return affine_transform([b, W_x, x])
        return affine_transform([b, W_x, x, W_h, hp])


class CoupledLSTMBuilder(_LSTMBase):
    """LSTM with peepholes and coupled gates (f = 1 - i), DyNet's old default.

    Per layer: [W_ix, W_ih, W_ic, b_i, W_ox, W_oh, W_oc, b_o, W_cx, W_ch, b_c].
    """
    _subname = "lstm-builder"

    def __init__(self, layers: int, input_dim: int, hidden_dim: int, model: ParameterCollection):
        super().__init__(layers, input_dim, hidden_dim, model)
        self.dropout_rate_c = 0.0
        d_in, hd = self.input_dim, self.hidden_dim
        for _ in range(self.layers):
            ps = []
            for _gate in range(2):  # i, o: input, hidden and cell (peephole) weights
                ps += [self._w(hd, d_in), self._w(hd, hd), self._w(hd, hd), self._b(hd)]
            ps += [self._w(hd, d_in), self._w(hd, hd), self._b(hd)]  # candidate c
            self.params.append(ps)
            d_in = hd

    def set_dropouts(self, d: float, d_h: float, d_c: float | None = None) -> None:
        """DyNet's C++ set_dropout(d, d_h, d_c); d_c defaults to d_h."""
        d_c = d_h if d_c is None else d_c
        self._check_rates(d, d_h, d_c)
        self.dropout_rate, self.dropout_rate_h, self.dropout_rate_c = float(d), float(d_h), float(d_c)

    def set_dropout(self, d: float) -> None:
        self.set_dropouts(d, d, d)

    def disable_dropout(self) -> None:
        self.dropout_rate = self.dropout_rate_h = self.dropout_rate_c = 0.0

    def _dropped_c(self, seq, i, c):
        if self.dropout_rate_c > 0:  # one mask for c_{t-1} and c_t, as in DyNet
            c = cmult(c, seq.mask((i, "c"), self.hidden_dim, self.dropout_rate_c))
        return c

    def _step(self, seq, hs, cs, x):
        out_h, out_c = [], []
        for i, (W_ix, W_ih, W_ic, b_i, W_ox, W_oh, W_oc, b_o, W_cx, W_ch, b_c) in enumerate(seq.vars):
            x = self._dropped_input(seq, i, x)
            if hs is None:
                i_t = logistic(affine_transform([b_i, W_ix, x]))
                c = cmult(i_t, tanh(affine_transform([b_c, W_cx, x])))
                a_o = affine_transform([b_o, W_ox, x, W_oc, self._dropped_c(seq, i, c)])
            else:
                hp, cp = self._dropped_h(seq, i, hs[i]), cs[i]
                i_t = logistic(affine_transform([b_i, W_ix, x, W_ih, hp, W_ic, self._dropped_c(seq, i, cp)]))
                w_t = tanh(affine_transform([b_c, W_cx, x, W_ch, hp]))
                c = cmult(1.0 - i_t, cp) + cmult(i_t, w_t)
                a_o = affine_transform([b_o, W_ox, x, W_oh, hp, W_oc, self._dropped_c(seq, i, c)])
            x = cmult(logistic(a_o), tanh(c))
            out_h.append(x)
            out_c.append(c)
        return out_h, out_c, x


class BiRNNBuilder:
    """Stacked bidirectional RNN: each layer runs a forward and a backward builder
    (hidden_dim/2 each) and concatenates [forward; backward] per position."""

    def __init__(self, num_layers: int, input_dim: int, hidden_dim: int, model: ParameterCollection,
                 rnn_builder_factory: Callable, builder_layers: list | None = None):
        _positive("BiRNNBuilder", num_layers=num_layers, input_dim=input_dim, hidden_dim=hidden_dim)
        if hidden_dim % 2:
            raise _err("BiRNNBuilder", f"hidden dimension must be even, got {hidden_dim}")
        self.model = model.add_subcollection("birnn")
        if builder_layers is None:
            builder_layers, d_in = [], input_dim
            for _ in range(num_layers):
                f = rnn_builder_factory(1, d_in, hidden_dim // 2, self.model)
                b = rnn_builder_factory(1, d_in, hidden_dim // 2, self.model)
                builder_layers.append((f, b))
                d_in = hidden_dim
        self.builder_layers = builder_layers
        inner = [[bld.whoami(), list(bld.spec)] for fb in builder_layers for bld in fb]
        self.spec = (num_layers, input_dim, hidden_dim, inner)

    @classmethod
    def from_spec(cls, spec, model: ParameterCollection) -> "BiRNNBuilder":
        num_layers, input_dim, hidden_dim, inner = spec
        specs = iter(inner)

        def factory(layers, d_in, d_hid, m):
            name, s = next(specs)
            return BUILDER_TYPES[name].from_spec(s, m)
        return cls(num_layers, input_dim, hidden_dim, model, factory)

    def whoami(self) -> str:
        return "BiRNNBuilder"

    def param_collection(self) -> ParameterCollection:
        return self.model

    def set_dropout(self, p: float) -> None:
        for fb in self.builder_layers:
            for bld in fb:
                bld.set_dropout(p)

    def disable_dropout(self) -> None:
        for fb in self.builder_layers:
            for bld in fb:
                bld.disable_dropout()

    @staticmethod
    def _run(fb, bb, es: list) -> list:
        if isinstance(fb, VanillaLSTMBuilder):
            paired = fb._paired_steps(bb, es)  # both directions stepped by one chain of nodes
            if paired is not None:
                return paired
        fs = fb.initial_state().transduce(es)
        bs = bb.initial_state().transduce(es[::-1])
        return [concatenate([f, b]) for f, b in zip(fs, reversed(bs))]

    def transduce(self, es: Sequence[Expression]) -> list:
        """Per position: concatenate([forward output, backward output]) of the top layer."""
        es = list(es)
        for fb, bb in self.builder_layers:
            es = self._run(fb, bb, es)
        return es

    def add_inputs(self, es: Sequence[Expression]) -> list:
        """Per position: (forward state, backward state) of the top layer."""
        es = list(es)
        for fb, bb in self.builder_layers[:-1]:
            es = self._run(fb, bb, es)
        fb, bb = self.builder_layers[-1]
        fs = fb.initial_state().add_inputs(es)
        bs = bb.initial_state().add_inputs(es[::-1])
        return list(zip(fs, reversed(bs)))


# Name (whoami) -> class, for dy.load to rebuild builders from their spec.
BUILDER_TYPES: dict = {c.__name__: c for c in (SimpleRNNBuilder, GRUBuilder, VanillaLSTMBuilder,
                                               CompactVanillaLSTMBuilder, CoupledLSTMBuilder, BiRNNBuilder)}
BUILDER_TYPES["LSTMBuilder"] = VanillaLSTMBuilder
