"""Buffers kept from one run to the next: Cavs's dynamic tensors, across mini-batches.

Why: a vertex-function run allocates megabytes (states, gathered inputs, activations,
gradients) that live for one forward and backward. Fresh allocations of that size come
from the kernel as untouched pages, and every first touch is a page fault: measured at
4,600-8,100 faults a step for TreeLSTM at H=256 until glibc's heap settles (about 30
steps), and those steps ran up to 45% slower (61-82 ms against 55.5 ms). A buffer handed back by the previous run has its
pages mapped already.

A run takes buffers through a `Lease`; when the run's context dies, the lease hands them
back as *pending*. A pending buffer is reused only once nothing else refers to it (a view
a user kept, for example), which is checked by reference count at the next request."""
from __future__ import annotations

import sys
import threading
import weakref

import numpy as np

__all__ = ["WORKSPACE", "Lease", "Workspace"]

_GROWTH = 1.25  # slack on a fresh buffer, so the next, slightly larger batch still fits


class Workspace:
    """Free 1-D numpy buffers by (tag, dtype); at most `keep` kept per key."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._free: dict = {}
        self._pending: list = []
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def lease(self) -> Lease:
        return Lease(self)

    def bytes_kept(self) -> int:
        with self._lock:
            return sum(b.nbytes for lst in self._free.values() for b in lst) + \
                sum(b.nbytes for _, b in list(self._pending))

    def clear(self) -> None:
        """Drop every kept buffer (their memory goes back once no run uses them)."""
        with self._lock:
            self._free.clear()
            self._pending.clear()

    def _take(self, tag: str, n: int, dtype) -> np.ndarray:
        key = (tag, np.dtype(dtype))
        with self._lock:
            self._settle()
            lst = self._free.get(key) or []
            fits = [i for i, b in enumerate(lst) if b.size >= n]
            if fits:
                self.hits += 1
                return lst.pop(min(fits, key=lambda i: lst[i].size))
            if lst:  # too small for this run: it would only ever be dropped later
                _drop_smallest(lst)
            self.misses += 1
        return np.empty(int(n * _GROWTH) + 1, dtype=key[1])

    def _give_back(self, taken: list) -> None:
        # No lock: this runs from a finalizer, which the cyclic GC may fire inside _take
        # while that holds the lock (a deadlock, seen in CI). list.extend is atomic.
        self._pending.extend(taken)

    def _settle(self) -> None:
        """Pending buffers nobody else refers to become free. References to one base here:
        the pending list's tuple, the local name and getrefcount's own argument. Buffers
        given back meanwhile land in the fresh list and wait for the next call."""
        pending, self._pending = self._pending, []
        still = []
        for item in pending:
            tag, base = item
            if sys.getrefcount(base) > 3:
                still.append(item)
                continue
            lst = self._free.setdefault((tag, base.dtype), [])
            lst.append(base)
            if len(lst) > self.keep:
                _drop_smallest(lst)
        self._pending.extend(still)


def _drop_smallest(lst: list) -> None:
    del lst[min(range(len(lst)), key=lambda i: lst[i].size)]  # by position: == on arrays is elementwise


class Lease:
    """The buffers one run took; `bind` hands them back when the run's context dies."""

    __slots__ = ("taken", "ws")

    def __init__(self, ws: Workspace):
        self.ws, self.taken = ws, []

    def empty(self, tag: str, shape, dtype) -> np.ndarray:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        n = int(np.prod(shape, dtype=np.int64))
        base = self.ws._take(tag, n, dtype)
        self.taken.append((tag, base))
        return base[:n].reshape(shape)

    def zeros(self, tag: str, shape, dtype) -> np.ndarray:
        a = self.empty(tag, shape, dtype)
        a.fill(0)
        return a

    def release(self) -> None:
        taken, self.taken = self.taken, []
        self.ws._give_back(taken)

    def bind(self, owner) -> None:
        """Release when `owner` (the run's saved context) is garbage collected."""
        weakref.finalize(owner, self.release)


WORKSPACE = Workspace()
