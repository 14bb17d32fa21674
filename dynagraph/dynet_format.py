"""Reading the model files DyNet writes: `ParameterCollection.save` and `dy.save`'s `.data`.

DyNet's text format, one block per parameter:

    #Parameter# /W {2,3} 194 FULL_GRAD
    <2*3 values, column-major>
    <2*3 gradient values: only for FULL_GRAD>
    #LookupParameter# /E {8,5} ... ZERO_GRAD
    <values of the (8, 5) column-major tensor: dims of one entry, then the number of entries>

`dy.save` also writes `.meta`: one pickle per saved object. Nothing here unpickles: the
.meta reader walks the pickle's opcodes (pickletools) and accepts only the plain shapes
DyNet writes for parameters, ('Parameters', name) and ('LookupParameters', name); an object
of any other kind (a pickled builder) is refused with a message, never constructed.
Everything is checked (counts, finite numbers, dims) and reported with the line number.
"""
from __future__ import annotations

import pickletools
from typing import Iterator, NamedTuple

import numpy as np

from .errors import CheckpointError

_HEADERS = ("#Parameter#", "#LookupParameter#")
_MAX_VALUES = 1 << 31  # refuse absurd dims before allocating


class Entry(NamedTuple):
    kind: str            # "#Parameter#" or "#LookupParameter#"
    name: str            # DyNet's full name, e.g. "/enc/_0"
    values: np.ndarray   # our layout: DyNet's shape, lookup entries first: (rows, *dim)
    grad: np.ndarray | None
    line: int


def is_dynet_text(path: str) -> bool:
    """True when the file starts like DyNet's text format (cheap: reads 32 bytes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(32)
    except OSError:
        return False
    return any(head.startswith(h.encode()) for h in _HEADERS)


def read_entries(path: str) -> Iterator[Entry]:
    try:
        yield from _entries(path)
    except UnicodeDecodeError as e:  # binary garbage after a valid-looking header
        raise CheckpointError(f"{path}: not DyNet's text format (byte {e.start} is not ASCII)") from None


def _entries(path: str) -> Iterator[Entry]:
    with open(path, "r", encoding="ascii", errors="strict") as f:
        lines = iter(enumerate(f, start=1))
        for no, line in lines:
            if not line.strip():
                continue
            kind, name, dims, full = _header(path, no, line)
            n = int(np.prod(dims))
            values = _numbers(path, lines, n, "values")
            grad = _numbers(path, lines, n, "gradient") if full else None
            yield Entry(kind, name, _our_layout(kind, values, dims), None if grad is None
                        else _our_layout(kind, grad, dims), no)


def _header(path: str, no: int, line: str) -> tuple:
    parts = line.split()
    if len(parts) != 5 or parts[0] not in _HEADERS or parts[4] not in ("FULL_GRAD", "ZERO_GRAD"):
        raise CheckpointError(f"{path}:{no}: not a DyNet parameter header: {line.strip()[:80]!r}")
    dims_text = parts[2]
    try:
        if not (dims_text.startswith("{") and dims_text.endswith("}")):
            raise ValueError
        dims = tuple(int(d) for d in dims_text[1:-1].split(","))
    except ValueError:
        raise CheckpointError(f"{path}:{no}: bad dimensions {dims_text!r}") from None
    if not dims or min(dims) < 1 or int(np.prod(dims, dtype=np.float64)) > _MAX_VALUES:
        raise CheckpointError(f"{path}:{no}: bad dimensions {dims_text!r}")
    if parts[0] == "#LookupParameter#" and len(dims) < 2:
        raise CheckpointError(f"{path}:{no}: a lookup parameter needs at least two dimensions, got {dims_text}")
    return parts[0], parts[1], dims, parts[4] == "FULL_GRAD"


def _numbers(path: str, lines, n: int, what: str) -> np.ndarray:
    try:
        no, line = next(lines)
    except StopIteration:
        raise CheckpointError(f"{path}: file ends where {n} {what} were expected") from None
    try:
        a = np.array(line.split(), dtype=np.float64)
    except ValueError:
        raise CheckpointError(f"{path}:{no}: {what} are not all numbers") from None
    if a.size != n:
        raise CheckpointError(f"{path}:{no}: {a.size} {what} where the header says {n}")
    if not np.isfinite(a).all():
        raise CheckpointError(f"{path}:{no}: {what} contain NaN or inf")
    return a


def _our_layout(kind: str, flat: np.ndarray, dims: tuple) -> np.ndarray:
    full = flat.reshape(dims, order="F")
    if kind == "#LookupParameter#":  # DyNet keeps the entry index last
        full = np.moveaxis(full, -1, 0)
    return np.ascontiguousarray(full)


def populate(pc, path: str, key: str = "") -> None:
    """DyNet's populate(fname, key): the file's parameters whose names start with `key`,
    in file order, go into pc's parameters and lookup parameters in creation order; shapes
    must match, and so must the counts (as in DyNet)."""
    entries = [e for e in read_entries(path) if e.name.startswith(key)]
    for kind, targets in (("#Parameter#", pc.parameters_list()), ("#LookupParameter#",
                                                                    pc.lookup_parameters_list())):
        found = [e for e in entries if e.kind == kind]
        if len(found) != len(targets):
            label = "parameters" if kind == "#Parameter#" else "lookup parameters"
            raise CheckpointError(f"cannot populate from {path} (key {key!r}): the file has {len(found)} "
                             f"{label}, the collection {len(targets)}")
        for e, p in zip(found, targets):
            if tuple(e.values.shape) != tuple(p.values.shape):
                raise CheckpointError(f"{path}:{e.line}: {e.name} has shape {e.values.shape}, "
                                 f"{p.name()} has {p.values.shape}")
    for e, p in zip([e for e in entries if e.kind == "#Parameter#"], pc.parameters_list()):
        _assign(p, e)
    for e, p in zip([e for e in entries if e.kind == "#LookupParameter#"], pc.lookup_parameters_list()):
        _assign(p, e)


def _assign(p, e: Entry) -> None:
    p.assign_host(e.values, e.grad)
    if e.grad is not None:
        if p.is_lookup:
            p.touched[:] = e.grad.reshape(e.grad.shape[0], -1).any(axis=1)


def find(path: str, name: str) -> Entry:
    """The entry named exactly `name` (DyNet's load_param / load_lookup_param key)."""
    for e in read_entries(path):
        if e.name == name:
            return e
    raise CheckpointError(f"{path}: no parameter named {name!r}")


# ----------------------------------------------------------------------------- .meta
def read_meta(path: str) -> list:
    """The (kind, name) records of a DyNet .meta, read from the pickle opcodes without
    running them. Refuses anything but a tuple of two strings per object."""
    with open(path, "rb") as f:
        raw = f.read()
    out, pos = [], 0
    while pos < len(raw):
        strings, ops, end = [], [], None
        try:
            parsed = list(_opcodes_of_one_object(raw[pos:]))
        except ValueError as e:  # truncated or not a pickle: pickletools says why
            raise CheckpointError(f"{path}: object {len(out)} is not a readable DyNet record ({e})") from None
        for opcode, arg, at in parsed:
            ops.append(opcode.name)
            if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(arg)
            if opcode.name == "STOP":
                end = pos + at + 1
                break
        allowed = {"PROTO", "FRAME", "SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8", "MEMOIZE",
                   "BINPUT", "TUPLE2", "STOP"}
        if end is None or set(ops) - allowed or len(strings) != 2 or ops.count("TUPLE2") != 1:
            raise CheckpointError(f"{path}: object {len(out)} is not a parameter record ('Parameters', name) or "
                             f"('LookupParameters', name); dynagraph never unpickles, so pickled builders "
                             f"cannot be loaded: create the builder in your program and call "
                             f"pc.populate(basename + '.data', key) instead")
        if strings[0] not in ("Parameters", "LookupParameters"):
            raise CheckpointError(f"{path}: object {len(out)} has unknown kind {strings[0]!r}")
        out.append((strings[0], strings[1]))
        pos = end
    return out


def _opcodes_of_one_object(raw: bytes):
    """The opcodes of the first pickled object in raw, up to its STOP (read, never run)."""
    for opcode, arg, at in pickletools.genops(raw):
        yield opcode, arg, at
        if opcode.name == "STOP":
            return


def load_objects(basename: str, pc) -> list:
    """dy.load for a DyNet `dy.save`: its parameters and lookup parameters, recreated in pc
    with the saved values (and gradients, for FULL_GRAD)."""
    records = read_meta(basename + ".meta")
    data = basename + ".data"
    objs, scratch = [], pc.staging()  # all or nothing: pc changes only once every entry loaded
    for kind, name in records:
        e = find(data, name)
        if (kind == "LookupParameters") != (e.kind == "#LookupParameter#"):
            raise CheckpointError(f"{data}:{e.line}: {name} is a {e.kind.strip('#')}, the .meta says {kind}")
        local = name.rstrip("/").rsplit("/", 1)[-1]
        local = "" if local.startswith("_") else local  # DyNet's automatic names are renumbered
        if kind == "Parameters":
            p = scratch.add_parameters(e.values.shape, init=e.values.copy(), name=local)
        else:
            p = scratch.add_lookup_parameters(e.values.shape, init=e.values.copy(), name=local)
        if e.grad is not None:
            _assign(p, e)
        objs.append(p)
    pc.commit_staged(scratch)
    return objs
