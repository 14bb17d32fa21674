"""The fused LSTM cell ops (ops/cells.py) against the cell written out in numpy."""
from __future__ import annotations

import numpy as np

from dynagraph.expressions import record_list
from dynagraph.nn.cells import lstm_step, lstm_update
from dynagraph.ops import OPS
from opcases import A, Case

H = 3
PRE, CELL = A((4 * H,), -2.0, 2.0), A((H,), -1.5, 1.5)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _c(pre, c_prev=None, fb=1.0):
    i, f, g = _sig(pre[:H]), _sig(pre[H:2 * H] + fb), np.tanh(pre[3 * H:])
    return i * g if c_prev is None else f * c_prev + i * g


def _h(pre, c):
    return _sig(pre[2 * H:3 * H]) * np.tanh(c)


STATE = A((7 * H,), -1.5, 1.5)
STATE2 = A((14 * H,), -1.5, 1.5)


def _two_chains(pres: list, rest: list = (), fb: float = 1.0):
    """An lstm_step node stepping two chains (what BiRNNBuilder records per time step)."""
    return record_list(OPS["lstm_step"], list(pres) + list(rest), (H, fb, 2))
W_H = A((4 * H, H), -1.0, 1.0)


def _step(pre_x, W=None, s=None, fb=1.0):
    """lstm_step's state [h | c | i f o g tanh(c)], the cell written out."""
    pre = pre_x if W is None else pre_x + W @ s[:H]
    i, f, o, g = _sig(pre[:H]), _sig(pre[H:2 * H] + fb), _sig(pre[2 * H:3 * H]), np.tanh(pre[3 * H:])
    c = i * g if s is None else f * s[H:2 * H] + i * g
    return np.concatenate([o * np.tanh(c), c, i, f, o, g, np.tanh(c)])


CASES = [
    Case("lstm_c", "lstm_c", lambda k, p, c: lstm_update(p, c)[1], [PRE, CELL], lambda k, p, c: _c(p, c)),
    Case("lstm_c_first_step", "lstm_c", lambda k, p: lstm_update(p, None, 0.5)[1], [PRE],
         lambda k, p: _c(p, None, 0.5)),
    Case("lstm_c_no_forget_bias", "lstm_c", lambda k, p, c: lstm_update(p, c, 0.0)[1], [PRE, CELL],
         lambda k, p, c: _c(p, c, 0.0)),
    Case("lstm_h", "lstm_h", lambda k, p, c: lstm_update(p, c)[0], [PRE, CELL],
         lambda k, p, c: _h(p, _c(p, c))),
    Case("lstm_h_first_step", "lstm_h", lambda k, p: lstm_update(p, None, 2.0)[0], [PRE],
         lambda k, p: _h(p, _c(p, None, 2.0))),
    Case("lstm_step", "lstm_step", lambda k, p, W, s: lstm_step(p, W, s), [PRE, W_H, STATE],
         lambda k, p, W, s: _step(p, W, s)),
    Case("lstm_step_first", "lstm_step", lambda k, p: lstm_step(p, forget_bias=0.5), [PRE],
         lambda k, p: _step(p, fb=0.5)),
    Case("lstm_step_two_chains", "lstm_step", lambda k, p, q, W, U, s: _two_chains([p, q], [W, U, s]),
         [PRE, PRE, W_H, W_H, STATE2],
         lambda k, p, q, W, U, s: np.concatenate([_step(p, W, s[:7 * H]), _step(q, U, s[7 * H:])])),
    Case("lstm_step_two_chains_first", "lstm_step", lambda k, p, q: _two_chains([p, q], fb=0.0), [PRE, PRE],
         lambda k, p, q: np.concatenate([_step(p, fb=0.0), _step(q, fb=0.0)])),
    Case("lstm_step_chain", "lstm_step", lambda k, p, q, W, s: lstm_step(q, W, lstm_step(p, W, s, 0.0), 0.0),
         [PRE, PRE, W_H, STATE], lambda k, p, q, W, s: _step(q, W, _step(p, W, s, 0.0), 0.0)),
]
