"""dy.distributed: data-parallel training over MPI (mpi4py on OpenMPI), the way Horovod does it.

    rank, size = dy.distributed.init()              # from the mpirun environment
    trainer = dy.distributed.DataParallelTrainer(dy.AdamTrainer(pc))   # broadcasts rank 0's parameters
    for batch in dy.distributed.tqdm(batches):       # a bar on rank 0 only
        dy.renew_cg()
        loss = dy.esum([model.loss(x) for x in dy.distributed.shard(batch)])  # this rank's part
        loss.backward()
        trainer.update()                             # sums gradients across ranks, then updates

Each rank records and autobatches its own shard. `update()` sums the gradients of
every rank before the wrapped trainer runs, so a loss summed over each rank's shard
gives exactly the update of one process on the combined mini-batch: every rank then
holds the same gradients and applies the same deterministic rule.

- Dense gradients: a gradient of at least `inplace_bytes` is all-reduced in place (no
  copy in or out); the smaller ones travel packed in a few flat buckets (one all-reduce
  per ~`bucket_bytes`), not one message per parameter. All are in flight at once.
- Lookup tables send their touched rows only: the ranks all-gather (row ids, rows),
  and every rank adds them in rank order, so duplicates sum and all ranks agree bit
  for bit; the union of touched rows is then touched everywhere, as on one process.
- Collectives are non-blocking requests polled against a deadline (`timeout`, or
  DYNAGRAPH_MPI_TIMEOUT seconds): a peer that hangs ends the job with an error
  naming the collective instead of a silent hang. A peer that dies is reported by
  mpirun, which then ends the other ranks.
- Checkpoints hold parameters, optimizer state, the trainer's counters, the step and
  every rank's RNG state; rank 0 writes them with the project's atomic save, and
  `load_checkpoint` broadcasts rank 0's copy, so no shared filesystem is needed.

mpi4py is imported only by `init()`: `import dynagraph` never needs it.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from . import checkpoint
from .config import config

__all__ = ["init", "rank", "size", "is_main", "shard", "log", "tqdm", "barrier", "broadcast_object",
           "allgather_object", "DataParallelTrainer", "DistributedError"]

_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
_comm: Any = None          # mpi4py communicator once init() ran with MPI; None on one process
_rank, _size = 0, 1


class DistributedError(RuntimeError):
    """A collective failed or timed out; the message names the rank and the operation."""


# ------------------------------------------------------------------ process group
def init(comm: Any = None) -> tuple[int, int]:
    """(rank, size) of this process. Under mpirun this initialises MPI (importing mpi4py);
    started without mpirun and without mpi4py, it is one process: (0, 1)."""
    global _comm, _rank, _size
    if _comm is not None and comm is None:
        return _rank, _size
    try:
        from mpi4py import MPI
    except ImportError:
        if any(k in os.environ for k in _MPI_ENV):
            raise ImportError("dy.distributed.init(): started by mpirun, but mpi4py is not installed; "
                              "pip install 'dynagraph[mpi]' (needs an MPI such as Debian's libopenmpi-dev)") from None
        _comm, _rank, _size = None, 0, 1
        return 0, 1
    _comm = comm if comm is not None else MPI.COMM_WORLD
    # Errors from MPI calls become Python exceptions we can report, not an abort without a word.
    _comm.Set_errhandler(MPI.ERRORS_RETURN)
    _rank, _size = _comm.Get_rank(), _comm.Get_size()
    return _rank, _size


def rank() -> int:
    return _rank


def size() -> int:
    return _size


def is_main() -> bool:
    """True on rank 0, the rank that shows bars, logs and writes checkpoints."""
    return _rank == 0


def shard(items: Sequence, rank: int | None = None, size: int | None = None,
          cost: Callable[[Any], float] | None = None) -> list:
    """This rank's part of `items`: a contiguous slice.

    Contiguous (not strided) so that the concatenation of the shards in rank order is
    `items` itself: the combined mini-batch, in order. Without `cost` the sizes differ
    by at most one; with `cost` (e.g. `lambda tree: len(tree)`) the split points balance
    the summed cost instead, so that no rank waits long for the slowest in update()."""
    r = _rank if rank is None else int(rank)
    n = _size if size is None else int(size)
    if not 0 <= r < n:
        raise ValueError(f"shard: rank {r} out of range for {n} rank(s)")
    items = list(items)
    if cost is None:
        base, extra = divmod(len(items), n)
        start = r * base + min(r, extra)
        return items[start:start + base + (1 if r < extra else 0)]
    costs = np.array([float(cost(x)) for x in items])
    with np.errstate(over="ignore", invalid="ignore"):
        finite_sum = bool(np.isfinite(costs.sum()))  # implies finite items
    if costs.size and (not finite_sum or (costs < 0).any()):
        raise ValueError("shard: cost must give finite, non-negative numbers (with a finite sum)")
    # Each item goes to the rank whose share of the total cost holds the item's midpoint:
    # monotone in the item's position, so every shard stays contiguous.
    total = float(costs.sum())
    if total > 0:
        mid = np.clip((np.cumsum(costs) - costs / 2) / total, 0.0, 1.0)  # in [0, 1], even for subnormal totals
        owner = np.minimum((mid * n).astype(np.int64), n - 1)
    else:
        owner = np.arange(len(items)) * n // max(len(items), 1)
    bounds = np.searchsorted(owner, np.arange(n + 1), side="left")
    return items[bounds[r]:bounds[r + 1]]


def log(*args, **kwargs) -> None:
    """print() on rank 0 only (to stderr unless `file=` says otherwise)."""
    if is_main():
        kwargs.setdefault("file", sys.stderr)
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def tqdm(iterable: Iterable | None = None, **kwargs):
    """A tqdm bar on rank 0; the other ranks iterate silently."""
    from tqdm import tqdm as _tqdm
    kwargs["disable"] = kwargs.get("disable", False) or not is_main()
    return _tqdm(iterable, **kwargs)


def _timeout(t: float | None) -> float:
    return float(os.environ.get("DYNAGRAPH_MPI_TIMEOUT", 300.0)) if t is None else float(t)


def _wait(requests: list, what: str, timeout: float) -> None:
    """Wait for non-blocking requests, polling against a deadline.

    Blocking MPI collectives cannot time out; a stuck peer would hang every rank.
    Polling backs off to 0.25 ms so that waiting ranks leave the (shared) cores to the
    ranks still computing."""
    from mpi4py import MPI
    deadline, pause = time.monotonic() + timeout, 2e-5
    try:
        while not MPI.Request.Testall(requests):
            if time.monotonic() > deadline:
                msg = (f"dy.distributed: rank {_rank}/{_size}: {what} did not complete within {timeout:g} s; "
                       f"another rank is stuck or dead. Aborting the job.")
                sys.stderr.write(msg + "\n")
                sys.stderr.flush()
                _comm.Abort(3)  # the others are blocked inside MPI: only an abort ends them
                raise DistributedError(msg)
            time.sleep(pause)
            pause = min(pause * 2, 2.5e-4)
    except MPI.Exception as e:
        raise DistributedError(f"dy.distributed: rank {_rank}/{_size}: {what} failed: {e}") from None


def barrier(timeout: float | None = None) -> None:
    if _comm is not None:
        _wait([_comm.Ibarrier()], "barrier", _timeout(timeout))


def broadcast_object(obj: Any, what: str = "object broadcast", timeout: float | None = None) -> Any:
    """rank 0's `obj` on every rank (pickled in memory between our own processes, never from a file)."""
    if _comm is None:
        return obj
    import pickle
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if is_main() else None
    n = np.array([0 if data is None else data.size], np.int64)
    _wait([_comm.Ibcast(n, root=0)], what, _timeout(timeout))
    buf = data.copy() if is_main() else np.empty(int(n[0]), np.uint8)
    _wait([_comm.Ibcast(buf, root=0)], what, _timeout(timeout))
    return obj if is_main() else pickle.loads(buf.tobytes())


def allgather_object(obj: Any, what: str = "object all-gather", timeout: float | None = None) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if _comm is None:
        return [obj]
    import pickle
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    return [pickle.loads(b.tobytes()) for b in _allgatherv(data, what, _timeout(timeout))]


def _allgatherv(local: np.ndarray, what: str, timeout: float) -> list:
    """Every rank's 1-d `local` (same dtype on all ranks), in rank order."""
    from mpi4py.util.dtlib import from_numpy_dtype
    counts = np.zeros(_size, np.int64)
    _wait([_comm.Iallgather(np.array([local.size], np.int64), counts)], what, timeout)
    out = np.empty(int(counts.sum()), local.dtype)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    mpi_type = from_numpy_dtype(local.dtype)
    _wait([_comm.Iallgatherv(np.ascontiguousarray(local), [out, counts, displs, mpi_type])], what, timeout)
    return np.split(out, np.cumsum(counts)[:-1])


# ------------------------------------------------------------------- the wrapper
class DataParallelTrainer:
    """Wraps any trainer: parameters broadcast from rank 0 now, gradients summed across
    ranks in every `update()`. Attributes it does not define are the trainer's
    (learning_rate, set_clip_threshold, status, ...)."""

    def __init__(self, trainer, bucket_bytes: int = 25 << 20, timeout: float | None = None,
                 broadcast: bool = True, inplace_bytes: int = 256 << 10):
        if not hasattr(trainer, "update") or not hasattr(trainer, "model"):
            raise TypeError(f"DataParallelTrainer wraps a trainer, got {type(trainer).__name__}")
        if _comm is None and _size == 1 and any(k in os.environ for k in _MPI_ENV):
            init()
        self.trainer = trainer
        self.timeout = _timeout(timeout)
        pc = trainer.model
        self._dense = pc.parameters_list()
        self._lookups = pc.lookup_parameters_list()
        # A large contiguous gradient is reduced where it lies; packing it would cost two
        # copies of its bytes per step (measured: ~1 ms of a 110 ms TreeLSTM step at H=256).
        self._inplace = [p for p in self._dense if p.grad.nbytes >= inplace_bytes and p.grad.flags.c_contiguous]
        self._buckets = _make_buckets([p for p in self._dense if not any(p is q for q in self._inplace)],
                                      int(bucket_bytes))
        self.step = 0               # update() calls, for checkpoints
        self.comm_seconds = 0.0     # time spent in gradient collectives (for the bench)
        if broadcast:
            self.broadcast_parameters()

    def __getattr__(self, name: str):
        if name == "trainer":  # not yet set (during unpickling or a failed __init__)
            raise AttributeError(name)
        return getattr(self.trainer, name)

    # ------------------------------------------------------------ collectives
    def broadcast_parameters(self) -> None:
        """Every rank takes rank 0's values (initialisers drew different numbers per rank
        only if the seeds differ; this makes the start identical either way)."""
        if _comm is None:
            return
        reqs = [_comm.Ibcast(p.values, root=0) for p in self._dense + self._lookups]
        _wait(reqs, "parameter broadcast", self.timeout)

    def allreduce_gradients(self) -> None:
        """Sum every gradient across ranks, in place (what update() does first). Two rounds of
        requests, each all in flight at once: the dense all-reduces with the lookup tables'
        row counts, then every table's row ids and rows."""
        if _comm is None:
            return
        from mpi4py import MPI
        t0 = time.perf_counter()
        for params, buf in self._buckets:
            _pack(params, buf)
        reqs = [_comm.Iallreduce(MPI.IN_PLACE, p.grad, op=MPI.SUM) for p in self._inplace]
        reqs += [_comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM) for _, buf in self._buckets]
        rows = [p.touched_rows().astype(np.int64) for p in self._lookups]
        counts = np.zeros((_size, max(len(rows), 1)), np.int64)
        if rows:
            reqs.append(_comm.Iallgather(np.array([r.size for r in rows], np.int64), counts))
        _wait(reqs, "gradient all-reduce", self.timeout)
        for params, buf in self._buckets:
            _unpack(params, buf)
        if rows:
            self._allgather_lookups(rows, counts)
        self.comm_seconds += time.perf_counter() - t0

    def _allgather_lookups(self, rows: list, counts: np.ndarray) -> None:
        """Touched rows only: every rank's (ids, rows) of every table, added in rank order."""
        from mpi4py.util.dtlib import from_numpy_dtype
        reqs, outs = [], []
        for j, (p, r) in enumerate(zip(self._lookups, rows)):
            n = counts[:, j]
            width = int(np.prod(p.grad.shape[1:], dtype=np.int64))
            ids = np.empty(int(n.sum()), np.int64)
            vals = np.empty(int(n.sum()) * width, p.grad.dtype)
            for out, local, per in ((ids, r, n), (vals, np.ascontiguousarray(p.grad[r]).reshape(-1), n * width)):
                displs = np.concatenate([[0], np.cumsum(per)[:-1]])
                reqs.append(_comm.Iallgatherv(local, [out, per, displs, from_numpy_dtype(out.dtype)]))
            outs.append((p, ids, vals))
        _wait(reqs, "lookup gradient all-gather", self.timeout)
        for p, ids, vals in outs:
            if ids.size:
                p.clear_grad()
                p.add_sparse_grad(ids, vals.reshape((ids.size,) + p.grad.shape[1:]))

    def update(self) -> None:
        pc = self.trainer.model
        if len(pc.parameters_list()) != len(self._dense) or len(pc.lookup_parameters_list()) != len(self._lookups):
            raise ValueError("DataParallelTrainer: parameters were added to the collection after the trainer was "
                             "wrapped; they were never broadcast from rank 0. Create every parameter first.")
        self.allreduce_gradients()
        self.trainer.update()
        self.step += 1

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str, extra: dict | None = None) -> None:
        """Rank 0 writes parameters, optimizer state, counters, step and every rank's RNG
        state atomically to `path` (an .npz, never pickled). Call it on every rank."""
        rng_states = allgather_object(json.dumps(config.rng.bit_generator.state), "checkpoint RNG gather",
                                    self.timeout)
        if is_main():
            arrays = _checkpoint_arrays(self.trainer, self.step, rng_states, extra or {})
            checkpoint.write_arrays(path, arrays)
        barrier(self.timeout)  # nobody goes on (or reads it) before the file is complete

    def load_checkpoint(self, path: str) -> dict:
        """Restore what save_checkpoint wrote (rank 0 reads, every rank receives); returns
        the `extra` dict that was saved."""
        arrays = checkpoint.read_arrays(path) if is_main() else None
        arrays = broadcast_object(arrays, "checkpoint broadcast", self.timeout)
        return _restore(self, arrays, path)


def _pack(params: list, buf: np.ndarray) -> None:
    off = 0
    for p in params:
        n = p.grad.size
        buf[off:off + n] = p.grad.reshape(-1)
        off += n


def _unpack(params: list, buf: np.ndarray) -> None:
    off = 0
    for p in params:
        n = p.grad.size
        p.grad[...] = buf[off:off + n].reshape(p.grad.shape)
        off += n


def _make_buckets(params: list, bucket_bytes: int) -> list:
    """Consecutive parameters of one dtype grouped into flat buffers of about bucket_bytes each."""
    buckets, cur, nbytes = [], [], 0
    for p in params:
        if cur and (nbytes + p.grad.nbytes > bucket_bytes or p.grad.dtype != cur[0].grad.dtype):
            buckets.append(cur)
            cur, nbytes = [], 0
        cur.append(p)
        nbytes += p.grad.nbytes
    if cur:
        buckets.append(cur)
    return [(b, np.empty(sum(p.grad.size for p in b), b[0].grad.dtype)) for b in buckets]


_SCALARS = ("updates", "clips", "learning_rate")


def _checkpoint_arrays(trainer, step: int, rng_states: list, extra: dict) -> dict:
    arrays = {}
    pc = trainer.model
    for p in pc.parameters_list() + pc.lookup_parameters_list():
        arrays["param" + p.name()] = p.values
        for i, s in enumerate(trainer.state_arrays(p)):
            arrays[f"state{p.name()}/{i}"] = s
    meta = {"step": step, "size": _size, "trainer": type(trainer).__name__,
            "scalars": {k: getattr(trainer, k) for k in _SCALARS}, "rng": rng_states, "extra": extra}
    arrays["meta/json"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    return arrays


def _restore(dp: DataParallelTrainer, arrays: dict, path: str) -> dict:
    trainer, pc = dp.trainer, dp.trainer.model
    meta = json.loads(arrays["meta/json"].tobytes().decode()) if "meta/json" in arrays else None
    if meta is None:
        raise ValueError(f"{path}: not a dy.distributed checkpoint (no meta/json entry)")
    if meta["trainer"] != type(trainer).__name__:
        raise ValueError(f"{path}: saved from {meta['trainer']}, cannot resume {type(trainer).__name__}")
    if meta["size"] != _size:
        raise ValueError(f"{path}: saved by {meta['size']} ranks, resuming with {_size}; "
                         f"the data shards and per-rank RNG states would not line up")
    params = pc.parameters_list() + pc.lookup_parameters_list()
    states = [(f"state{p.name()}/{i}", s) for p in params for i, s in enumerate(trainer.state_arrays(p))]
    bad = [k for k, s in states if k not in arrays or arrays[k].shape != s.shape]
    if bad:  # checked before anything is written: a failed resume changes nothing
        raise ValueError(f"{path}: optimizer state missing or of another shape: {', '.join(bad[:8])}")
    checkpoint.fill([("param" + p.name(), p) for p in params], arrays, path, scope="param/")
    for k, s in states:
        s[...] = arrays[k]
    for k, v in meta["scalars"].items():
        setattr(trainer, k, v)
    config.rng.bit_generator.state = json.loads(meta["rng"][_rank])
    dp.step = int(meta["step"])
    return meta["extra"]
