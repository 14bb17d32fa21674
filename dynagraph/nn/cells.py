"""Cell updates: the vanilla LSTM step the builders record, and the N-ary TreeLSTM (there is
no DyNet builder for trees)."""
from __future__ import annotations

from typing import Sequence

from ..expression import Expression, record1, record2
from ..expressions import cmult, logistic, pick_range, record_list, tanh
from ..ops import OPS

__all__ = ["lstm_update", "lstm_step", "tree_lstm_update"]
_LSTM_C, _LSTM_H, _LSTM_STEP = OPS["lstm_c"], OPS["lstm_h"], OPS["lstm_step"]


def lstm_update(pre: Expression, c_prev: Expression | None = None, forget_bias: float = 1.0) -> tuple:
    """One vanilla LSTM step from stacked pre-activations [i, f, o, g] (4H): returns (h, c),
    c = s(f + forget_bias) c_prev + s(i) tanh(g) (s(i) tanh(g) without c_prev) and
    h = s(o) tanh(c), as two nodes (ops lstm_c, lstm_h) instead of thirteen elementwise
    ones. VanillaLSTMBuilder records its cell with it."""
    shape = pre.shape
    if len(shape) != 1 or shape[0] % 4:
        raise TypeError(f"lstm_update: pre-activations must be a vector of 4H elements, got shape {shape}")
    attrs = (shape[0] // 4, float(forget_bias))
    c = record1(_LSTM_C, pre, attrs) if c_prev is None else record2(_LSTM_C, pre, c_prev, attrs)
    return record2(_LSTM_H, pre, c, attrs[:1]), c


def lstm_step(pre_x: Expression, W_h: Expression | None = None, state: Expression | None = None,
              forget_bias: float = 1.0) -> Expression:
    """A whole vanilla LSTM step as one node (op lstm_step): from the input's pre-activations
    pre_x (4H, i.e. W_x x + b), the recurrent weight W_h (4H x H) and the previous step's
    state, the new state [h | c | i f o g tanh(c)] (7H); h is pick_range(state, 0, H) and c
    pick_range(state, H, 2H). Without W_h and state, the first step (c = s(i) tanh(g)).
    VanillaLSTMBuilder.transduce records its steps with it."""
    shape = pre_x.shape
    if len(shape) != 1 or shape[0] % 4:
        raise TypeError(f"lstm_step: pre-activations must be a vector of 4H elements, got shape {shape}")
    if (W_h is None) != (state is None):
        raise TypeError("lstm_step: give both the recurrent weight and the previous state, or neither")
    attrs = (shape[0] // 4, float(forget_bias))
    return record1(_LSTM_STEP, pre_x, attrs) if W_h is None else record_list(_LSTM_STEP, [pre_x, W_h, state], attrs)


def tree_lstm_update(pre: Expression, child_cells: Sequence[Expression], hidden: int) -> tuple:
    """N-ary TreeLSTM (Tai et al., 2015) from stacked pre-activations [i, f_1..f_N, o, u].

    c = s(i) t(u) + sum_k s(f_k) c_k,  h = s(o) t(c).  With no children it is the
    leaf cell [i, o, u]. Returns (h, c).
    """
    n, h = len(child_cells), hidden
    i = logistic(pick_range(pre, 0, h))
    forget = [logistic(pick_range(pre, (1 + k) * h, (2 + k) * h)) for k in range(n)]
    o = logistic(pick_range(pre, (1 + n) * h, (2 + n) * h))
    u = tanh(pick_range(pre, (2 + n) * h, (3 + n) * h))
    c = cmult(i, u)
    for f, child in zip(forget, child_cells):
        c = c + cmult(f, child)
    return cmult(o, tanh(c)), c
