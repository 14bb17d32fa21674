"""Fixtures of the viz tests: a known graph and, where one is installed, a headless browser."""
from __future__ import annotations

import pytest

import dynagraph as dy
from dynagraph.viz.browser import Unavailable, open_browser

# The known graph: two samples, each two steps of h = tanh(W h + E[w]) from h = 0, summed.
# Per sample: constant, 2 x (matmul, lookup, add, tanh), sum_elems = 10 nodes and 9 edges;
# plus the joint esum (2 more edges). Batched: every step pairs the two samples, and the
# four lookups are one batch: 10 batches, which is also the lower bound.
KNOWN_NODES, KNOWN_EDGES, KNOWN_BATCHES = 21, 20, 10


def record_known(scheduler: str = "agenda"):
    pc = dy.ParameterCollection()
    W, E = pc.add_parameters((4, 4)), pc.add_lookup_parameters((10, 4))
    dy.renew_cg(scheduler=scheduler)
    losses = []
    for words in ([1, 2], [3, 4]):
        h = dy.zeros(4)
        for w in words:
            h = dy.tanh(W * h + E[w])
        losses.append(dy.sum_elems(h))
    return dy.cg(), dy.esum(losses)


@pytest.fixture
def known():
    return record_known()


@pytest.fixture(scope="session")
def browser():
    try:
        drv = open_browser()
    except Unavailable as e:
        pytest.skip(f"no headless browser: {e}")
    yield drv
    drv.quit()


H = 4


def traced_lstm_block():
    """An LSTM cell as a planned dy.block, traced once: 2 batched kernels (three gate logistics,
    two cmults) whose 5 lists the planner all makes consecutive; 19 variables."""
    pc = dy.ParameterCollection()
    W, U, b = pc.add_parameters((4 * H, H)), pc.add_parameters((4 * H, H)), pc.add_parameters(4 * H)

    @dy.block
    def cell(x, h, c):
        g = dy.affine_transform([b, W, x, U, h])
        i, f, o = (dy.logistic(g[k * H:(k + 1) * H]) for k in range(3))
        u = dy.tanh(g[3 * H:4 * H])
        c2 = dy.cmult(i, u) + dy.cmult(f, c)
        return dy.cmult(o, dy.tanh(c2)), c2

    cell(dy.zeros(H), dy.zeros(H), dy.zeros(H))
    return cell


CAVS_GRAPHS = [[[], [], [0, 1], [], [2, 3]], [[]], [[], [], [0, 1]]]  # 9 vertices, 6 edges
CAVS_TASKS = 3  # heights 0, 1, 2


def cavs_run():
    pc = dy.ParameterCollection()
    W, U, b = pc.add_parameters((H, H)), pc.add_parameters((H, 2 * H)), pc.add_parameters(H)
    E = pc.add_lookup_parameters((10, H))

    @dy.cavs.vertex_function(arity=2, state=(H,))
    def cell(v):
        h = dy.tanh(dy.affine_transform([b, W, v.pull(), U, dy.concatenate([v.gather(0), v.gather(1)])]))
        v.scatter(h)
        v.push(h)

    return dy.cavs.run(cell, CAVS_GRAPHS, pull=(E, [[1, 2, 3, 4, 5], [4], [1, 2, 3]]))
