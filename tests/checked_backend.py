"""A test-only backend whose arrays are a device of their own, so that the suite can prove
on a machine without a GPU where training crosses the device boundary.

`DeviceArray` wraps a numpy array the way a CuPy array holds device memory: arithmetic,
indexing, ufuncs and numpy functions run on it and give DeviceArrays (as CuPy does through
`__array_ufunc__` / `__array_function__`), but nothing turns it into host data implicitly.
`np.asarray(x)`, `np.array(x)`, `float(x)`, `int(x)`, `bool(x)`, `x.item()`, `x.tolist()`,
`x.tobytes()`, the buffer protocol, `host[...] = x` and `np.add(host, x, out=host)` all raise
HostTransferError, and so does a ufunc mixing a host array into device
arithmetic (CuPy refuses that too). The one door is explicit: `x.get()` (CuPy's spelling, which
`backends.to_numpy` uses) or `CheckedBackend.to_host(x)`; each crossing is recorded in
`TRANSFERS` (size and the line that asked), so a test can assert what left
the device. Host-to-device moves (`xp.asarray(host)`, `to_device`) copy, as a real upload
does, and are allowed.

The backend itself is the numpy reference (NumpyBackend) over this array module, with
two optional capabilities that a device backend has: fused_cells (dy.cavs's TreeLSTM cell
as the generated cell program evaluated with xp, backends/tree_cell.py: the wrapper the
cuda backend's kernel shares) and row_add. Every other op runs its own `xp` code.
"""
from __future__ import annotations

import sys
import types
import weakref

import numpy as np
import numpy.lib.mixins

from dynagraph.backends import register_backend
from dynagraph.backends.numpy_backend import NumpyBackend
from dynagraph.backends.tree_cell import XpCells


class HostTransferError(TypeError):
    """A device array was about to become host data without an explicit transfer."""


def _refuse(what: str):
    raise HostTransferError(f"implicit device-to-host transfer ({what}) of a checked DeviceArray; "
                            f"use backend.to_host(x) or x.get()")


_FIRST = weakref.WeakValueDictionary()  # id(numpy array) -> its first live DeviceArray
TRANSFERS: list = []  # (size, caller 'file:line') of every explicit device-to-host copy


def _caller() -> str:
    """'package/module.py:line' of the code that asked for the copy (past this file and
    the backends' own doors)."""
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename == __file__ or "/dynagraph/backends/" in f.f_code.co_filename):
        f = f.f_back
    return "/".join(f.f_code.co_filename.rsplit("/", 2)[-2:]) + f":{f.f_lineno}" if f is not None else "?"


def _unwrap(x):
    if type(x) is DeviceArray:
        return x._a
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(r):
    if isinstance(r, np.ndarray):
        return DeviceArray(r)
    if isinstance(r, np.generic):  # CuPy reductions give 0-d device arrays, never host scalars
        return DeviceArray(np.asarray(r))
    if isinstance(r, (list, tuple)) and not isinstance(r, np.dtype):
        return type(r)(_wrap(v) for v in r) if type(r) in (list, tuple) else r
    return r


def _holds_device(xs) -> bool:
    return any(type(x) is DeviceArray or (isinstance(x, (list, tuple)) and _holds_device(x)) for x in xs)


class DeviceArray(numpy.lib.mixins.NDArrayOperatorsMixin):
    """An array on the checked 'device' (see the module doc)."""
    __slots__ = ("_a", "__weakref__")

    def __init__(self, a: np.ndarray):
        self._a = a
        _FIRST.setdefault(id(a), self)  # the wrapper that `.base` of a view answers with

    # ------------------------------------------------------------ the explicit door
    def get(self) -> np.ndarray:
        TRANSFERS.append((self._a.size, _caller()))
        return self._a.copy()

    # ------------------------------------------------------- implicit doors, all shut
    def __array__(self, *a, **k):
        _refuse("__array__: np.asarray / np.array / assignment into a host array")

    def __float__(self):
        _refuse("float()")

    def __int__(self):
        _refuse("int()")

    def __index__(self):
        _refuse("operator.index()")

    def __bool__(self):
        _refuse("bool(): a Python branch on device values")

    def __complex__(self):
        _refuse("complex()")

    def item(self, *a):
        _refuse(".item()")

    def tolist(self):
        _refuse(".tolist()")

    def tobytes(self, *a, **k):
        _refuse(".tobytes()")

    def tofile(self, *a, **k):
        _refuse(".tofile()")

    def __repr__(self) -> str:  # no values: printing them would be a transfer
        return f"DeviceArray(shape={self._a.shape}, dtype={self._a.dtype})"

    __str__ = __repr__

    # -------------------------------------------------------------- metadata
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: DeviceArray(self._a.T))
    @property
    def base(self):
        """The device array this one is a view of, as the same object each time (numpy's
        `a.base is b.base` identity, which dy.block's stacked weights rely on)."""
        b = self._a.base
        if b is None or not isinstance(b, np.ndarray):
            return None
        w = _FIRST.get(id(b))
        return w if w is not None and w._a is b else DeviceArray(b)

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        return (DeviceArray(r) if isinstance(r, np.ndarray) else DeviceArray(np.asarray(r)) for r in self._a)

    # -------------------------------------------------------------- indexing
    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key)])

    def __setitem__(self, key, value):
        self._a[_unwrap(key)] = _unwrap(value)  # a host value is an upload: allowed

    # -------------------------------------------------------------- methods
    @property
    def flags(self):
        """CuPy's flags: the contiguity ones alone (no writeable: device arrays always are)."""
        f = self._a.flags
        return types.SimpleNamespace(c_contiguous=f.c_contiguous, f_contiguous=f.f_contiguous, owndata=f.owndata)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # __array_interface__, __array_struct__, __buffer__, ...
            raise AttributeError(name)
        if name == "ctypes":  # CuPy has no host pointer either: backend.address(a) is the door
            raise AttributeError("a device array has no ctypes (ask the backend: address(a))")
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        return lambda *a, **k: _wrap(attr(*_unwrap(a), **_unwrap(k)))

    # ------------------------------------------------------- numpy protocols
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        if out is not None:
            if any(isinstance(o, np.ndarray) for o in out) and _holds_device(inputs):
                _refuse(f"np.{ufunc.__name__} writing device values into a host out= array")
            kwargs["out"] = tuple(_unwrap(o) for o in out)
        if method == "at" and isinstance(inputs[0], np.ndarray) and _holds_device(inputs[1:]):
            _refuse(f"np.{ufunc.__name__}.at into a host array")
        # as CuPy: arithmetic refuses host operands (index arguments of .at/.reduceat are fine)
        operands = inputs[:1] + inputs[2:] if method in ("at", "reduceat") else inputs
        if any(isinstance(x, np.ndarray) and x.ndim for x in operands):
            raise HostTransferError(f"np.{ufunc.__name__}: a host array mixed with device arrays (CuPy refuses "
                                    f"it too: move it with xp.asarray first)")
        r = getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs))
        if out is not None:
            return out[0] if len(out) == 1 else out
        return None if method == "at" else _wrap(r)

    def __array_function__(self, func, types_, args, kwargs):
        out = kwargs.get("out")
        if isinstance(out, np.ndarray):
            _refuse(f"np.{func.__name__} writing device values into a host out= array")
        r = func(*_unwrap(args), **_unwrap(kwargs))
        return out if out is not None else _wrap(r)


class _XP(types.ModuleType):
    """numpy's namespace over DeviceArrays: functions take device (or host: an upload)
    arguments and give device results; dtypes, constants and errstate pass through."""

    def __init__(self):
        super().__init__("checked_xp")

    def __getattr__(self, name: str):
        obj = getattr(np, name)
        if isinstance(obj, np.ufunc):
            return _UFunc(obj)
        if isinstance(obj, type) or not callable(obj) or name in ("errstate", "dtype", "result_type",
                                                                     "broadcast_shapes", "iinfo", "finfo"):
            if isinstance(obj, types.ModuleType):
                raise AttributeError(f"checked xp: numpy.{name} is not modelled")
            return obj

        def fn(*a, **k):
            return _wrap(obj(*_unwrap(a), **_unwrap(k)))
        fn.__name__ = name
        setattr(self, name, fn)
        return fn

    def asarray(self, a, dtype=None, order=None):
        if type(a) is DeviceArray:
            return a if dtype is None or a.dtype == np.dtype(dtype) else a.astype(dtype)
        return DeviceArray(np.array(a, dtype=dtype, order=order or "K"))  # an upload copies

    array = asarray

    def ascontiguousarray(self, a, dtype=None):
        if type(a) is DeviceArray:
            return DeviceArray(np.ascontiguousarray(a._a, dtype=dtype))
        return DeviceArray(np.array(a, dtype=dtype, order="C"))


class _UFunc:
    __slots__ = ("_u",)

    def __init__(self, u: np.ufunc):
        self._u = u

    def __call__(self, *a, **k):
        if not _holds_device(a):  # all host: an upload first, so the result is a device array
            a = tuple(DeviceArray(np.asarray(x)) if isinstance(x, np.ndarray) else x for x in a)
            if not _holds_device(a):
                return _wrap(self._u(*a, **k))
        return self._u(*a, **k)

    def __getattr__(self, name: str):
        attr = getattr(self._u, name)
        if name in ("at", "reduce", "accumulate", "reduceat", "outer"):
            return lambda *a, **k: attr(*a, **k) if _holds_device(a) else _wrap(attr(*a, **k))
        return attr


XP = _XP()


class CheckedBackend(NumpyBackend):
    """The numpy reference over DeviceArrays; every device-to-host copy is recorded."""
    name = "checked"

    def __init__(self):
        super().__init__(XP)
        self.fused_cells = XpCells(XP)
        self.row_add = self._row_add

    @staticmethod
    def _row_add(g, rows, vals) -> None:
        XP.add.at(g, XP.asarray(rows), vals.reshape((len(rows),) + g.shape[1:]))

    def to_host(self, a) -> np.ndarray:
        if type(a) is not DeviceArray:
            raise TypeError(f"checked backend: to_host of a {type(a).__name__}, not a device array")
        return a.get()

    def to_device(self, a):
        if type(a) is DeviceArray:
            return a
        return DeviceArray(np.array(a))

    def address(self, a) -> int:
        return a._a.ctypes.data


def install() -> None:
    """Make `dy.config.set(backend="checked")` available (idempotent)."""
    register_backend("checked", CheckedBackend)
