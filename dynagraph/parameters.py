"""Trainable storage: ParameterCollection, Parameters, LookupParameters, initialisers.

Arrays are updated in place, never replaced, so a graph that bound a parameter
keeps seeing its current value (as in DyNet).

Values and gradients live on the device of the backend current when the parameter is
made (`dy.config.set(backend=...)` first): arrays of that backend's `xp`. Initialisers
draw on the host (one seeded stream for every backend) and the result is moved once.
Only as_array, grad_as_array, row_as_array (and saving) copy back to the host; the
touched-row mask of a lookup table is host bookkeeping, as its row ids are.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable

import numpy as np

from . import checkpoint, dynet_format, overlap
from .backends import get_backend
from .config import config
from .errors import CheckpointError
from .ops.base import as_shape

# Installed by graph.py: turns a parameter into an expression of the current graph.
expression_hook: Callable | None = None
# Installed by expressions.py: E.batch(ids) as DyNet's lookup_batch.
batch_hook: Callable | None = None
_creation = itertools.count()  # DyNet lists parameters in creation order, across sub-collections
# Bumped whenever any collection gains a parameter or a sub-collection, a parameter's storage is
# replaced, or its updated flag changes: what a trainer and ParameterCollection._all cache on.
_layout = [0]


def layout_version() -> int:
    """Changes whenever the set of parameters, their arrays or their updated flags may have."""
    return _layout[0]


def _bump() -> None:
    _layout[0] += 1


class _Tracked(overlap.Synced):
    """A Synced storage attribute whose replacement bumps the layout version (a trainer's
    compiled update holds pointers into the old array)."""

    def __set__(self, obj, value) -> None:
        same = obj.__dict__.get(self.slot) is value  # `p.grad += g` stores the same array back
        super().__set__(obj, value)
        if not same:
            _bump()


# ------------------------------------------------------------------ initialisers
class Initializer:
    def __call__(self, shape: tuple, is_lookup: bool = False) -> np.ndarray:
        raise NotImplementedError


class GlorotInitializer(Initializer):
    """DyNet's: uniform(+-gain*sqrt(3*nd)/sqrt(sum(dims))); lookups skip the row dim."""
    def __init__(self, is_lookup: bool = False, gain: float = 1.0):
        self.is_lookup, self.gain = is_lookup, gain

    def __call__(self, shape, is_lookup=False):
        dims = shape[1:] if (is_lookup or self.is_lookup) else shape
        s = self.gain * math.sqrt(3 * len(dims)) / math.sqrt(sum(dims))
        return config.rng.uniform(-s, s, size=shape)


class UniformInitializer(Initializer):
    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, shape, is_lookup=False):
        return config.rng.uniform(-self.scale, self.scale, size=shape)


class NormalInitializer(Initializer):
    """DyNet's signature: (mean, var); the standard deviation is sqrt(var)."""
    def __init__(self, mean: float = 0.0, var: float = 1.0):
        self.mean, self.var = mean, var

    def __call__(self, shape, is_lookup=False):
        return config.rng.normal(self.mean, math.sqrt(self.var), size=shape)


class ConstInitializer(Initializer):
    def __init__(self, c: float):
        self.c = c

    def __call__(self, shape, is_lookup=False):
        return np.full(shape, self.c)


class IdentityInitializer(Initializer):
    def __call__(self, shape, is_lookup=False):
        if len(shape) != 2 or shape[0] != shape[1]:
            raise ValueError(f"IdentityInitializer needs a square matrix, got shape {shape}")
        return np.eye(shape[0])


class SaxeInitializer(Initializer):
    """Random orthogonal matrix (Saxe et al., 2014)."""
    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def __call__(self, shape, is_lookup=False):
        if len(shape) != 2:
            raise ValueError(f"SaxeInitializer needs a matrix, got shape {shape}")
        q, r = np.linalg.qr(config.rng.normal(size=(max(shape), min(shape))))
        q = q * np.sign(np.diag(r))
        return self.scale * (q if shape[0] >= shape[1] else q.T)


class NumpyInitializer(Initializer):
    def __init__(self, array):
        self.array = np.asarray(array)

    def __call__(self, shape, is_lookup=False):
        if self.array.shape != shape:
            raise ValueError(f"initial array has shape {self.array.shape}, parameter has {shape}")
        return self.array


def dynet_lookup_layout(array: np.ndarray) -> np.ndarray:
    """The (rows, *dim) table DyNet's lookup_parameters_from_numpy makes of `array`.

    DyNet swaps the first and last axes and copies the result in column-major order into its
    (*dim, rows) column-major tensor. For one vector per row that is array itself; for a matrix
    per row (array of shape (V, a, b)) row i is array[i] read row-major into a column-major
    (a, b) matrix, and so on for higher ranks (checked against dynet38 for ranks 2 to 5)."""
    if array.ndim <= 2:
        return array
    rows, dim = array.shape[0], array.shape[1:]
    flat = np.swapaxes(array, 0, array.ndim - 1).ravel(order="F")
    return np.ascontiguousarray(np.moveaxis(flat.reshape(dim + (rows,), order="F"), -1, 0))


def make_initializer(init, scale: float = 1.0) -> Initializer:
    """DyNet's `init=` argument: None, an Initializer, a number, an array, or a name."""
    if init is None:
        return GlorotInitializer(gain=scale)
    if isinstance(init, Initializer):
        return init
    if isinstance(init, str):
        named = {"glorot": lambda: GlorotInitializer(gain=scale), "uniform": lambda: UniformInitializer(scale),
                 "normal": lambda: NormalInitializer(0.0, scale), "identity": IdentityInitializer,
                 "saxe": lambda: SaxeInitializer(scale)}
        if init not in named:
            raise ValueError(f"unknown initializer {init!r}; use one of {sorted(named)}")
        return named[init]()
    if isinstance(init, (int, float)):
        return ConstInitializer(float(init))
    return NumpyInitializer(init)


# --------------------------------------------------------------------- parameters
class _Stored:
    """Shared parts of Parameters and LookupParameters."""
    is_lookup = False
    # Reads wait for a backward()/update() still running on the overlap thread (overlap.py).
    values = _Tracked()
    grad = _Tracked()

    def __init__(self, pc: "ParameterCollection", name: str, values: np.ndarray):
        self._pc, self._name = pc, name
        self._order = next(_creation)
        self.backend = be = get_backend()
        host = np.array(values, dtype=config.np_dtype, order="C")  # a copy, as DyNet makes
        self.values = host if be.xp is np else be.to_device(host)
        self.grad = be.xp.zeros_like(self.values)
        self._updated = True
        # How this parameter appears in its users' signatures (trained, constant): shared
        # arguments batch by identity and mode. Made once, so the recorder's signature cache,
        # which compares these by identity, hits in every graph.
        self._sig_parts = (("shared", id(self), True), ("shared", id(self), False))

    @property
    def updated(self) -> bool:
        return self._updated

    @updated.setter
    def updated(self, b: bool) -> None:
        self._updated = bool(b)
        _bump()

    def name(self) -> str:
        return self._name

    def shape(self) -> tuple:
        return self.values.shape

    def as_array(self) -> np.ndarray:
        return np.array(self.backend.to_host(self.values))  # a host copy

    def grad_as_array(self) -> np.ndarray:
        return np.array(self.backend.to_host(self.grad))

    def zero(self) -> None:
        self.values[...] = 0

    def scale(self, s: float) -> None:
        self.values *= s

    def scale_gradient(self, s: float) -> None:
        self.grad *= s

    def clip_inplace(self, left: float, right: float) -> None:
        self.backend.xp.clip(self.values, left, right, out=self.values)

    def grad_norm_sq(self) -> float:
        return float(self.backend.to_host(self.grad_norm_sq_device()))

    def grad_norm_sq_device(self):
        """The squared gradient norm as a float64 scalar of the device (no transfer)."""
        return self.backend.xp.vdot(self.grad, self.grad).astype(np.float64)

    def set_updated(self, b: bool) -> None:
        self.updated = bool(b)

    def is_updated(self) -> bool:
        return self.updated

    def _check_shape(self, arr: np.ndarray, shape: tuple):
        """A host value checked against `shape`, as an array of the parameter's device."""
        arr = np.asarray(arr, dtype=self.values.dtype)
        if arr.shape != shape:
            if arr.size == int(np.prod(shape)) and (arr.ndim == 1 or len(shape) == 1):
                return self._device(arr.reshape(shape))
            raise ValueError(f"{self._name}: value has shape {arr.shape}, expected {shape}")
        return self._device(arr)

    def assign_host(self, values: np.ndarray, grad: np.ndarray | None = None) -> None:
        """Copy host arrays of the parameter's shape (checked by the caller) into its values
        (and gradient) on the device: the loaders' one host-to-device door."""
        self.values[...] = self._device(np.asarray(values, dtype=self.values.dtype))
        if grad is not None:
            self.grad[...] = self._device(np.asarray(grad, dtype=self.grad.dtype))

    def _device(self, a):
        """A host array (values or row ids) as the parameter's device's array."""
        return a if self.backend.xp is np else self.backend.to_device(a)

    def __repr__(self):
        return f"<{type(self).__name__} {self._name} {self.values.shape}>"


class Parameters(_Stored):
    def set_value(self, arr) -> None:
        self.values[...] = self._check_shape(arr, self.values.shape)

    def expr(self, update: bool = False):
        """As in DyNet, `W.expr()` is a constant; `W.expr(True)` (or plain `W`) is trained."""
        return expression_hook(self, update)

    # Parameters act as trained expressions in arithmetic, as in DyNet 2.1.
    def __mul__(self, o): return self._bound(o) * o
    def __rmul__(self, o): return o * self._bound(o)
    def __add__(self, o): return self._bound(o) + o
    def __radd__(self, o): return o + self._bound(o)
    def __sub__(self, o): return self._bound(o) - o
    def __rsub__(self, o): return o - self._bound(o)
    def __truediv__(self, o): return self._bound(o) / o
    def __neg__(self): return -self.expr(True)
    def __getitem__(self, i): return self.expr(True)[i]

    def _bound(self, o):
        """The trained expression, in the graph of `o` when `o` is an expression."""
        return expression_hook(self, True, graph=getattr(o, "cg", None))


class LookupParameters(_Stored):
    """Embedding table of shape (rows, *dim). Gradients are tracked per touched row."""
    is_lookup = True
    touched = _Tracked()

    def __init__(self, pc, name, values):
        super().__init__(pc, name, values)
        self.touched = np.zeros(self.values.shape[0], dtype=bool)

    def init_row(self, i: int, row) -> None:
        """A flat list fills a matrix (or higher) entry in DyNet's column-major order, as
        DyNet does; an array of the entry's shape is taken as it is."""
        i = self._row_index(i)
        shape = self.values.shape[1:]
        row = np.asarray(row, dtype=self.values.dtype)
        if len(shape) > 1 and row.ndim == 1 and row.size == int(np.prod(shape)):
            row = row.reshape(shape, order="F")
        self.values[i] = self._check_shape(row, shape)

    def init_from_array(self, arr) -> None:
        self.values[...] = self._check_shape(arr, self.values.shape)

    def row_as_array(self, i: int) -> np.ndarray:
        return np.array(self.backend.to_host(self.values[self._row_index(i)]))

    def rows_as_array(self, rows) -> np.ndarray:
        return np.stack([self.row_as_array(r) for r in rows])

    def _row_index(self, i) -> int:
        if not 0 <= int(i) < self.values.shape[0]:
            raise IndexError(f"{self._name}: row {i} out of range for a table with {self.values.shape[0]} rows")
        return int(i)

    def add_sparse_grad(self, idx: np.ndarray, g) -> None:
        """grad[idx] += g (repeated ids add up); idx are host row ids, g the device's rows."""
        if self.backend.xp is np:
            np.add.at(self.grad, idx, g)
        else:
            self.backend.add_rows(self.grad, list(np.asarray(idx).reshape(-1)), g)
        self.touched[idx] = True

    def touched_rows(self) -> np.ndarray:
        return np.flatnonzero(self.touched)

    def clear_grad(self) -> None:
        rows = self.touched_rows()
        self.grad[self._device(rows)] = 0
        self.touched[rows] = False

    def touched_grad(self):
        """The gradient's touched rows, gathered on the device."""
        return self.grad[self._device(self.touched_rows())]

    def grad_norm_sq_device(self):
        g = self.touched_grad()
        return self.backend.xp.vdot(g, g).astype(np.float64)

    def expr(self, update: bool = False):
        return expression_hook(self, update)

    def __getitem__(self, i):
        return expression_hook(self, True, lookup=i)

    def batch(self, indices):
        """DyNet's `E.batch(ids)`: one lookup per id, as a minibatch expression."""
        return batch_hook(self, indices)


class _Namer:
    """Unique names in one namespace: '_0', '_1', ... for unnamed, 'W', 'W_1' for repeats."""

    def __init__(self):
        self.counter = 0
        self.used: set[str] = set()

    def fresh(self, name: str) -> str:
        if not name:
            name = f"_{self.counter}"
            self.counter += 1
        base, k = name, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def copy(self) -> "_Namer":
        twin = _Namer()
        twin.counter, twin.used = self.counter, set(self.used)
        return twin

    def state(self) -> tuple:
        return self.counter, frozenset(self.used)


class ParameterCollection:
    """DyNet's ParameterCollection (alias Model). Names look like '/_0', '/W', '/sub/_1'."""

    def __init__(self, name: str = "/", parent: "ParameterCollection | None" = None):
        self._name, self._parent = name, parent
        self._params: list[_Stored] = []
        self._subs: list[ParameterCollection] = []
        # DyNet numbers unnamed parameters and unnamed sub-collections separately.
        self._param_names = _Namer()
        self._sub_names = _Namer()

    def _fresh(self, name: str) -> str:
        return self._name + self._param_names.fresh(name)

    def add_parameters(self, dim, init=None, name: str = "", device: str = "", scale: float = 1.0) -> Parameters:
        if isinstance(init, np.ndarray) and dim is None:
            dim = init.shape
        shape = as_shape(dim)
        p = Parameters(self, self._fresh(name), make_initializer(init, scale)(shape))
        self._params.append(p)
        _bump()
        return p

    def parameters_from_numpy(self, array, name: str = "", device: str = "") -> Parameters:
        array = np.asarray(array)
        return self.add_parameters(array.shape, init=array, name=name)

    def add_lookup_parameters(self, dim, init=None, name: str = "", device: str = "", scale: float = 1.0) -> LookupParameters:
        shape = as_shape(dim)
        if len(shape) < 2:
            raise ValueError(f"lookup parameters need (rows, dim...), got {shape}")
        init = GlorotInitializer(gain=scale) if init is None else make_initializer(init, scale)  # DyNet: all dims
        p = LookupParameters(self, self._fresh(name), init(shape))
        self._params.append(p)
        _bump()
        return p

    def lookup_parameters_from_numpy(self, array, name: str = "", device: str = "") -> LookupParameters:
        """Entries laid out as DyNet lays them out (see dynet_lookup_layout): for a matrix (or
        higher) per row this is not array[i], and a program must give the same numbers as in DyNet."""
        array = np.asarray(array)
        return self.add_lookup_parameters(array.shape, init=dynet_lookup_layout(array), name=name)

    def add_subcollection(self, name: str | None = None) -> "ParameterCollection":
        sub = ParameterCollection(self._name + self._sub_names.fresh(name or "") + "/", self)
        self._subs.append(sub)
        _bump()
        return sub

    def name(self) -> str:
        return self._name

    def staging(self) -> "ParameterCollection":
        """A detached collection that names what is added to it exactly as this one would now.

        Build into it, check the result, then `commit_staged` moves everything here in one
        step; dropping it instead leaves this collection untouched (all-or-nothing loading).
        """
        scratch = ParameterCollection(self._name, None)
        scratch._param_names, scratch._sub_names = self._param_names.copy(), self._sub_names.copy()
        scratch._staged_for = (self, self._param_names.state(), self._sub_names.state())
        return scratch

    def commit_staged(self, scratch: "ParameterCollection") -> None:
        """Move the parameters and sub-collections of `scratch` (from `self.staging()`) here."""
        owner, params_state, subs_state = getattr(scratch, "_staged_for", (None, None, None))
        if owner is not self:
            raise ValueError(f"commit_staged: the collection was not made by {self._name}.staging() "
                             f"(or was committed already)")
        if (params_state, subs_state) != (self._param_names.state(), self._sub_names.state()):
            # Names given in the scratch collection could now clash with ones added meanwhile.
            raise ValueError(f"commit_staged: {self._name} gained parameters or sub-collections "
                             f"after staging(); stage again")
        for p in scratch._params:
            p._pc = self
        for sub in scratch._subs:
            sub._parent = self
        self._params.extend(scratch._params)
        self._subs.extend(scratch._subs)
        self._param_names, self._sub_names = scratch._param_names, scratch._sub_names
        scratch._params, scratch._subs, scratch._staged_for = [], [], None
        _bump()

    def _all(self) -> list[_Stored]:
        """Every parameter of this collection and its sub-collections, in creation order (a
        fresh list: the sorted one is cached until any collection changes)."""
        cached = self.__dict__.get("_all_cache")
        if cached is not None and cached[0] == _layout[0]:
            return list(cached[1])
        out = list(self._params)
        for s in self._subs:
            out.extend(s._all())
        out.sort(key=lambda p: p._order)
        self._all_cache = (_layout[0], out)
        return list(out)

    def parameters_list(self) -> list[Parameters]:
        return [p for p in self._all() if not p.is_lookup]

    def lookup_parameters_list(self) -> list[LookupParameters]:
        return [p for p in self._all() if p.is_lookup]

    def parameter_count(self) -> int:
        return sum(p.values.size for p in self._all())

    def reset_gradient(self) -> None:
        for p in self._all():
            if p.is_lookup:
                p.clear_grad()
            else:
                p.grad[...] = 0

    def save(self, fname: str, key: str = "", append: bool = False) -> None:
        """Atomically write every parameter (a crash leaves any old file intact)."""
        checkpoint.save_collection(self, fname, key=key, append=append)

    def populate(self, fname: str, key: str = "") -> None:
        """Load values saved by `save`, checking names and shapes; a file written by DyNet
        (its text format) is read by dynagraph.dynet_format with DyNet's rules."""
        if dynet_format.is_dynet_text(fname):
            dynet_format.populate(self, fname, key)
            return
        checkpoint.populate_collection(self, fname, key=key)

    populate_from_textfile = populate

    def load_param(self, fname: str, key: str) -> Parameters:
        """DyNet's load_param: a new Parameters holding the DyNet-file entry named `key`."""
        e = dynet_format.find(fname, key)
        if e.kind != "#Parameter#":
            raise CheckpointError(f"{fname}:{e.line}: {key} is a lookup parameter (use load_lookup_param)")
        return self.add_parameters(e.values.shape, init=e.values.copy())

    def load_lookup_param(self, fname: str, key: str) -> LookupParameters:
        e = dynet_format.find(fname, key)
        if e.kind != "#LookupParameter#":
            raise CheckpointError(f"{fname}:{e.line}: {key} is not a lookup parameter (use load_param)")
        return self.add_lookup_parameters(e.values.shape, init=e.values.copy())


Model = ParameterCollection
