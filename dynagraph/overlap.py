"""The second core: a training step's backward() and update() run on a worker thread.

DyNet's training loop is `renew_cg(); build; loss.value(); loss.backward(); trainer.update()`.
Recording the next graph needs parameter *references* only (graphs bind views of `p.values`),
never their values, so backward() and update() can run on one worker thread while the user's
code returns and records the next graph. The C kernels (cffi) and BLAS release the GIL, so on
two cores the step's arithmetic runs beside the next graph's recording.

Every read or write of parameter values, gradients or optimizer state first waits for the
pending step (`wait()`): the next evaluation, `as_array()`, `gradient()`, saving, loading,
`set_value()` and the like. Jobs run one at a time, in the order they were submitted, on a
single worker, so values and gradients are bit-identical to running each call where it was made.
An exception on the worker (a NonFiniteError from update()) cancels the jobs queued after it
and is raised by the next synchronising call, naming the deferred call that failed.

Opt-in (`dy.config.set(overlap=True)` or DYNAGRAPH_OVERLAP=1): on this project's shared 2-core
machine, where no core is ever idle, the worker and the recording thread fight over the GIL and
a step took 1.1-1.2x as long as in place (README, "The second core"). It takes effect only with
more than one core and BLAS threads not capped at one (`dy.config.set(threads=1)` keeps one
core). This module imports nothing of ours but the settings.
"""
from __future__ import annotations

import atexit
import contextvars
import os
import threading
from collections import deque
from typing import Callable

from .config import config

__all__ = ["enabled", "before_execution", "defer", "idle", "wait", "wait_for", "pending", "Synced", "storage",
           "OverlapError"]


class OverlapError(RuntimeError):
    """Raised when a deferred call failed with an exception that cannot be re-made with a message."""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_CORES = _cores()


def enabled() -> bool:
    """Whether backward() and update() may be deferred to the worker thread now."""
    return bool(config.overlap) and _CORES > 1 and config.threads != 1 and not _on_worker()


class _Worker:
    """One daemon thread running submitted jobs in order; the first failure cancels the rest."""

    def __init__(self) -> None:
        self.jobs: deque = deque()
        self.cv = threading.Condition()
        self.busy = 0                # jobs submitted and not yet finished (or cancelled)
        self.owners: dict = {}       # id(graph) -> its queued or running jobs
        self.error: tuple | None = None  # (exception, what) of the first failed job
        self.thread: threading.Thread | None = None
        self.chained = False         # a job was deferred since the user's thread last waited
        self.submitted = 0           # jobs deferred so far (tests check the path was taken)

    def start(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            _one_malloc_arena()
            self.thread = threading.Thread(target=self._loop, name="dynagraph-overlap", daemon=True)
            self.thread.start()

    def submit(self, fn: Callable, what: str, owner: object) -> None:
        ctx = contextvars.copy_context()  # the caller's current graph, sample and settings
        key = id(owner)
        with self.cv:
            self.start()
            self.busy += 1
            self.submitted += 1
            self.owners[key] = self.owners.get(key, 0) + 1
            self.jobs.append((ctx, fn, what, key))
            self.cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.jobs:
                    self.cv.wait()
                ctx, fn, what, key = self.jobs.popleft()
                failed = self.error is not None
            if not failed:  # after a failure, later jobs (the update after a failed backward) are dropped
                try:
                    ctx.run(fn)
                except BaseException as e:  # noqa: BLE001 -- handed to the user's thread by wait()
                    with self.cv:
                        self.error = (e, what)
            ctx = fn = None  # the finished step's graph goes now, not when the next job comes
            with self.cv:
                self.busy -= 1
                left = self.owners.pop(key) - 1
                if left:
                    self.owners[key] = left
                self.cv.notify_all()

    def wait(self) -> None:
        self.chained = False
        with self.cv:
            while self.busy:
                self.cv.wait()
            err, self.error = self.error, None
        if err is not None:
            raise _surface(*err)


def _one_malloc_arena() -> None:
    """glibc gives a new thread its own malloc arena: every buffer backward() allocated there
    came from cold pages and made backward()+update() 1.3x slower on the worker than in place;
    with one arena, 1.07x (the TreeLSTM of bench/overlap_bench.py, H=256). As MALLOC_ARENA_MAX=1."""
    import ctypes
    import ctypes.util
    import platform
    if platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-8, 1)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # a libc without mallopt: only slower


_worker = _Worker()


def _forget_in_child() -> None:
    """A forked child has no worker thread: a step pending at the fork is the parent's to finish."""
    global _worker
    _worker = _Worker()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _on_worker() -> bool:
    return threading.current_thread() is _worker.thread


def before_execution() -> None:
    """Called before every evaluation: a deferred backward()/update() may still be writing the
    parameters it reads."""
    wait()


def pending() -> bool:
    """Whether a deferred call is queued or running (or failed and not yet reported)."""
    return _worker.busy > 0 or _worker.error is not None


def defer(fn: Callable[[], None], what: str, owner: object = None, chained: bool = False) -> bool:
    """Run fn() on the worker if overlap is enabled (True), else leave it to the caller (False,
    after waiting for earlier deferred calls so the order of effects is kept). `owner` (the
    graph a backward() reads and writes) makes wait_for(owner) wait for this job. `chained`:
    defer only right after another deferred call (update() after a deferred backward(); an
    update of gradients set by hand runs, and raises, in place)."""
    if enabled() and (_worker.chained or not chained):
        _worker.submit(fn, what, owner)
        _worker.chained = True
        return True
    wait()
    return False


def idle() -> bool:
    """Whether a call may run in place with no wait() first: overlap off and nothing deferred
    or pending (wait() would do nothing then). For the per-sentence calls (update())."""
    return not config.overlap and not _worker.busy and _worker.error is None and not _worker.chained


def wait() -> None:
    """Block until every deferred call has finished; raise the first one's exception, if any.
    A no-op on the worker itself (its jobs run in order) and when nothing is pending."""
    if not _on_worker():
        _worker.chained = False
        if _worker.busy or _worker.error is not None:
            _worker.wait()


def wait_for(owner: object) -> None:
    """wait() if a pending job reads or writes `owner` (a graph about to be changed or read)."""
    if _worker.busy and id(owner) in _worker.owners and not _on_worker():
        _worker.wait()


def _surface(e: BaseException, what: str) -> BaseException:
    """The worker's exception, re-raised in the user's thread with the deferred call named."""
    note = (f"(raised by {what}, which ran on dynagraph's overlap thread; the failure surfaced at the "
            f"next call that reads parameters. dy.config.set(overlap=False) runs it in place)")
    if isinstance(e, Exception):
        try:
            again = type(e)(f"{e}\n  {note}")
        except Exception:  # noqa: BLE001 -- an exception type with another constructor
            again = None
        if again is not None:
            again.__cause__ = e
            return again
        wrapped = OverlapError(f"{type(e).__name__}: {e}\n  {note}")
        wrapped.__cause__ = e
        return wrapped
    return e


class Synced:
    """A data attribute (a parameter's `values`, `grad`) that, read or replaced from any thread but
    the worker, first waits for the pending step: `p.values`, `p.as_array()`, saving, loading and
    the trainers all see what in-place execution would have left. Recording a graph binds the
    storage through `storage()` instead, which never waits (views, not values)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = _slot(name)

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if (_worker.busy or _worker.error is not None) and not _on_worker():
            _worker.wait()
        return obj.__dict__[self.slot]

    def __set__(self, obj, value) -> None:
        wait()
        obj.__dict__[self.slot] = value


def _slot(name: str) -> str:
    return f"_{name}_storage"


def storage(obj, name: str):
    """The array behind a Synced attribute, without waiting: for binding a view while a step is
    pending (its values are read later, at evaluation, which waits)."""
    stored = getattr(obj, "__dict__", {}).get(_slot(name))
    return stored if stored is not None else getattr(obj, name)  # a stand-in with a plain attribute


@atexit.register
def _drain() -> None:
    """A program that ends right after update() still applies it (errors are printed, not lost)."""
    try:
        wait()
    except BaseException as e:  # noqa: BLE001 -- at exit there is no caller left to raise to
        import sys
        sys.stderr.write(f"dynagraph: a deferred training step failed: {e}\n")
