"""The workload interface shared by every model in this package."""
from __future__ import annotations

import dynagraph as dy


class Workload:
    """Parameters of one model plus per-sample loss code. Subclasses set `name`,
    `kind` ("tree", "chain" or "lattice"), build parameters in `_build`, and
    implement `instances` and `loss`."""
    name = ""
    kind = ""

    def __init__(self, hidden: int = 32, seed: int | None = 0, pc: dy.ParameterCollection | None = None):
        """Parameters go into `pc` (a new collection by default); seed=None keeps the global RNG as is."""
        self.hidden = hidden
        if seed is not None:
            dy.reset_random_seed(seed)  # parameter values depend on the seed only
        self.pc = pc if pc is not None else dy.ParameterCollection()
        self._build(self.pc, hidden)
        self.last_loss = None

    def _build(self, pc: dy.ParameterCollection, hidden: int) -> None:
        raise NotImplementedError

    def instances(self, n: int, seed: int = 1) -> list:
        raise NotImplementedError

    def loss(self, x) -> dy.Expression:
        raise NotImplementedError

    def record(self, xs: list) -> dy.Expression:
        """The summed loss of all samples, recorded into the current graph (nothing runs)."""
        return dy.esum([self.loss(x) for x in xs])

    def graph(self, xs: list, scheduler=None) -> dy.ComputationGraph:
        """A fresh default graph holding all samples; the loss is kept in `last_loss`."""
        cg = dy.renew_cg(scheduler=scheduler)
        self.last_loss = self.record(xs)
        return cg


def lstm_cell(b, Wx, x, Wh, h, c, hidden: int):
    """One LSTM step from (h, c): gates i, f, o and candidate u from one affine node."""
    g = dy.affine_transform([b, Wx, x, Wh, h])
    i = dy.logistic(dy.pick_range(g, 0, hidden))
    f = dy.logistic(dy.pick_range(g, hidden, 2 * hidden))
    o = dy.logistic(dy.pick_range(g, 2 * hidden, 3 * hidden))
    u = dy.tanh(dy.pick_range(g, 3 * hidden, 4 * hidden))
    c = dy.cmult(i, u) + dy.cmult(f, c)
    return dy.cmult(o, dy.tanh(c)), c


def gru_cell(ps, x, h):
    """One GRU step (DyNet's GRUBuilder equations); ps = (bz, Wzx, Wzh, br, Wrx, Wrh, bh, Whx, Whh)."""
    bz, Wzx, Wzh, br, Wrx, Wrh, bh, Whx, Whh = ps
    z = dy.logistic(dy.affine_transform([bz, Wzx, x, Wzh, h]))
    r = dy.logistic(dy.affine_transform([br, Wrx, x, Wrh, h]))
    cand = dy.tanh(dy.affine_transform([bh, Whx, x, Whh, dy.cmult(r, h)]))
    return dy.cmult(1.0 - z, h) + dy.cmult(z, cand)


def gru_params(pc: dy.ParameterCollection, d_in: int, hidden: int, name: str) -> tuple:
    ps = []
    for gate in "zrh":
        ps += [pc.add_parameters((hidden,), init=dy.ConstInitializer(0.0), name=f"{name}_b{gate}"),
               pc.add_parameters((hidden, d_in), name=f"{name}_W{gate}x"),
               pc.add_parameters((hidden, hidden), name=f"{name}_W{gate}h")]
    return tuple(ps)
