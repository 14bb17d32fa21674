"""Cell updates shared by tree models (there is no DyNet builder for them)."""
from __future__ import annotations

from typing import Sequence

from ..expressions import cmult, logistic, pick_range, tanh
from ..expression import Expression

__all__ = ["tree_lstm_update"]


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
