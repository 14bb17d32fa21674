"""Fixtures of the viz tests: a known graph and, where one is installed, a headless browser."""
from __future__ import annotations

import pytest

import dynagraph as dy

from .browser import Unavailable, open_browser

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
