"""The workspace that keeps a run's big buffers for the next run (dynagraph.memory.workspace)."""
from __future__ import annotations

import gc
import weakref

import numpy as np

from dynagraph.memory.workspace import Workspace


def _run(ws, n=100, tag="S", dtype=np.float32, keep_view=None):
    lease = ws.lease()
    a = lease.empty(tag, (n, 2), dtype)
    a[...] = 1
    if keep_view is not None:
        keep_view.append(a[:3])
    lease.release()
    return weakref.ref(a.base)  # not the array: a reference here would keep it from reuse


def test_a_released_buffer_is_reused_once_nothing_refers_to_it():
    ws = Workspace()
    first = _run(ws)
    assert (ws.hits, ws.misses) == (0, 1)
    lease = ws.lease()
    b = lease.empty("S", (90, 2), np.float32)  # smaller: fits in the kept buffer
    assert b.base is first() and ws.hits == 1
    z = lease.zeros("S", (10, 3), np.float32)  # the only kept one is taken: a new buffer, zeroed
    assert z.base is not first() and not z.any() and ws.misses == 2


def test_a_buffer_a_user_still_views_is_never_handed_out():
    ws = Workspace()
    views: list = []
    first = _run(ws, keep_view=views)
    lease = ws.lease()
    b = lease.empty("S", (100, 2), np.float32)
    assert b.base is not first() and ws.misses == 2
    b[...] = 7
    assert (views[0] == 1).all()  # the user's view kept its numbers
    views.clear()
    gc.collect()
    c = ws.lease().empty("S", (100, 2), np.float32)  # now the old one is free again
    assert ws.hits == 1 and c.base is first()


def test_keys_are_tag_and_dtype_and_too_small_buffers_go():
    ws = Workspace(keep=1)
    _run(ws, tag="S", dtype=np.float32)
    lease = ws.lease()
    lease.empty("S", (100, 2), np.float64)
    lease.empty("gS", (100, 2), np.float32)
    assert ws.hits == 0
    lease.release()
    big = ws.lease().empty("S", (10_000, 2), np.float32)  # nothing kept fits: the small one is dropped
    assert ws.misses == 4 and big.shape == (10_000, 2)
    assert ws.bytes_kept() > 0
    ws.clear()
    assert ws.bytes_kept() == 0


def test_give_back_never_waits_for_the_lock():
    """A run's context can die in a GC pass that fires inside _take, which holds the lock:
    handing buffers back must not take it (that deadlocked)."""
    ws = Workspace()
    lease = ws.lease()
    lease.empty("S", 4, np.float32)
    with ws._lock:
        lease.release()
    assert len(ws._pending) == 1
