"""dy.save / dy.load: parameters, lookup parameters and saveable objects, DyNet-style.

An object is saveable (DyNet's protocol) when it has `param_collection()`, a
`spec` attribute and a static `from_spec(spec, model)` that rebuilds it with
fresh parameters inside `model`; the RNN builders follow it.

`basename.data` holds the values (dynagraph.checkpoint format, object i's
parameters under key "i"); `basename.meta` is JSON describing how to recreate
each object. Unlike DyNet's pickled .meta, specs are encoded as JSON with
tuples, dicts, arrays and importable classes/functions (e.g. dy.tanh) tagged,
so loading never unpickles and never imports: a class or function named by a
.meta file is looked up among dynagraph's own (already imported) modules and the
classes and functions the program registered with `dy.register_saveable`.

A save is atomic as a whole. Both files are first written completely to temporary
files (the new .meta as `.<basename>.meta.<data id>.tmp`), then .data and .meta are
renamed into place. The two files carry a shared id; if a save died between the two
renames, load finds the new .meta still waiting under the new .data's id and uses it
(the next save completes that rename), so every outcome is the old or the new model.
"""
from __future__ import annotations

import json
import os
import re
import sys
import uuid
from typing import Iterable, Iterator

import numpy as np

from .. import checkpoint, dynet_format
from ..config import config
from ..errors import CheckpointError
from ..parameters import LookupParameters, ParameterCollection, Parameters

__all__ = ["save", "load", "load_generator", "register_saveable"]

_REGISTERED: dict = {}  # "module:qualname" -> class or function the program allowed load to use


def register_saveable(obj):
    """Allow dy.load to rebuild objects of class `obj` (or use function `obj` in a spec).

    dynagraph's own classes and functions need no registration; a program's own saveable
    classes do, before loading. Usable as a class decorator; returns `obj`.
    """
    for qual in (getattr(obj, "__qualname__", None), getattr(obj, "__name__", None)):
        if isinstance(qual, str) and "<" not in qual:
            _REGISTERED[f"{obj.__module__}:{qual}"] = obj
            return obj
    raise TypeError(f"register_saveable: {obj!r} has no name a file could refer to")

_FORMAT, _VERSION = "dynagraph.save", 1
_ID = "#id/"


# ----------------------------------------------------------------------- save
def save(basename: str, objs: Iterable) -> None:
    """Write `basename.data` and `basename.meta` for a list of parameters and saveable objects."""
    data_id = uuid.uuid4().hex
    arrays = {_ID + data_id: np.zeros(0, np.uint8)}
    records = []
    for i, o in enumerate(list(objs)):  # DyNet accepts any iterable (e.g. a tqdm wrapper)
        rec, entries = _describe(i, o)
        records.append(rec)
        arrays.update(entries)
    # Encode everything before touching the disk: a bad spec leaves old files intact.
    meta = json.dumps({"format": _FORMAT, "version": _VERSION, "data_id": data_id, "objects": records},
                      indent=1).encode()
    data_path, meta_path = basename + ".data", basename + ".meta"
    _finish_interrupted_save(basename)
    checkpoint.clean_stale(data_path)
    checkpoint.clean_stale(meta_path)
    tmp_meta, fd_meta = checkpoint.write_temp(meta_path, lambda f: f.write(meta), tag=data_id)
    try:
        tmp_data, fd_data = checkpoint.write_temp(data_path, lambda f: np.savez(f, **arrays))
    except BaseException:
        checkpoint.discard(tmp_meta, fd_meta)  # no new .data: the new .meta must not linger
        raise
    checkpoint.commit(tmp_data, fd_data, data_path)   # from here on, load sees the new model
    checkpoint.commit(tmp_meta, fd_meta, meta_path)


def _finish_interrupted_save(basename: str) -> None:
    """Complete the .meta rename of a save that died after renaming its .data."""
    data_id = _data_id(basename + ".data")
    pending = checkpoint.temp_name(basename + ".meta", data_id) if data_id else None
    if pending and os.path.exists(pending) and _meta_id(basename + ".meta") != data_id:
        try:
            _read_meta(pending)
        except (CheckpointError, OSError):
            return
        os.replace(pending, basename + ".meta")


def _data_id(path: str) -> str | None:
    try:
        ids = [k[len(_ID):] for k in checkpoint.entry_names_in(path) if k.startswith(_ID)]
    except (CheckpointError, OSError):
        return None
    return ids[0] if len(ids) == 1 else None


def _meta_id(path: str) -> str | None:
    try:
        return _read_meta(path)["data_id"]
    except (CheckpointError, OSError):
        return None


def _describe(i: int, o) -> tuple:
    key = str(i)
    if isinstance(o, (Parameters, LookupParameters)):
        entry = f"{key}/{o.name().rstrip('/').rsplit('/', 1)[-1]}"
        kind = "LookupParameters" if o.is_lookup else "Parameters"
        return {"kind": kind, "name": o.name(), "shape": list(o.values.shape), "entry": entry}, {entry: o.as_array()}
    missing = [a for a in ("param_collection", "spec") if not hasattr(o, a)]
    if missing or not callable(getattr(type(o), "from_spec", None)):
        raise TypeError(f"dy.save: object {i} ({type(o).__name__}) is not saveable: it needs "
                        f"param_collection(), a .spec attribute and a static from_spec(spec, model)")
    pc = o.param_collection()
    if not isinstance(pc, ParameterCollection):
        raise TypeError(f"dy.save: object {i} ({type(o).__name__}).param_collection() returned "
                        f"{type(pc).__name__}, not a ParameterCollection")
    where = f"object {i} ({type(o).__name__}) spec"
    rec = {"kind": "object", "class": _ref(type(o), where), "spec": _encode(o.spec, where),
           "collection": pc.name(), "key": key}
    return rec, checkpoint.collection_arrays(pc, key)


# ----------------------------------------------------------------------- load
def load(basename: str, pc: ParameterCollection) -> list:
    """Recreate the saved objects inside pc, in the order they were saved; all or nothing:
    on any error pc is left exactly as it was."""
    return list(load_generator(basename, pc))


def load_generator(basename: str, pc: ParameterCollection) -> Iterator:
    if dynet_format.is_dynet_text(basename + ".data"):  # written by DyNet's dy.save
        yield from dynet_format.load_objects(basename, pc)
        return
    try:
        meta = _read_meta(basename + ".meta")
    except FileNotFoundError:  # the first save may have died between its two renames
        if not os.path.exists(basename + ".data"):
            raise
        meta = {"data_id": None}
    stored = checkpoint.read_arrays(basename + ".data")
    if meta["data_id"] is None or _ID + meta["data_id"] not in stored:
        # A save that died between its two renames left its complete .meta pending.
        ids = [k[len(_ID):] for k in stored if k.startswith(_ID)]
        pending = checkpoint.temp_name(basename + ".meta", ids[0]) if len(ids) == 1 else None
        if pending is None or not os.path.exists(pending):
            raise CheckpointError(f"{basename}.data and {basename}.meta come from different saves "
                                  f"(was one of them replaced or copied separately?)")
        meta = _read_meta(pending)
        if _ID + meta["data_id"] not in stored:
            raise CheckpointError(f"{basename}.data and {pending} come from different saves")
    records = meta["objects"]
    dtype = config.np_dtype
    classes = []
    for i, rec in enumerate(records):  # check everything the file alone decides before creating anything
        if rec["kind"] == "object":
            classes.append(_resolve_class(basename, i, rec["class"]))
            rec["spec"] = _decode(rec["spec"])
            for e, a in stored.items():
                if e.startswith(rec["key"] + "/"):
                    checkpoint.checked_values(a, dtype, f"{basename}.data: object {i} entry {e}")
        else:
            _check_entry(basename, i, rec, stored, dtype)
            classes.append(None)
    # An object's own shapes are known only once from_spec has built it: build everything in
    # a scratch copy of pc and move it over only when all of it loaded.
    scratch = pc.staging()
    objs = [_load_one(basename, i, rec, cls, stored, scratch)
            for i, (rec, cls) in enumerate(zip(records, classes))]
    pc.commit_staged(scratch)
    yield from objs


def _read_meta(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read().decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: not a dynagraph .meta file ({type(e).__name__}: {e}); DyNet's "
                              f"pickled .meta files cannot be read") from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise CheckpointError(f"{path}: not a dynagraph .meta file")
    if meta.get("version") != _VERSION:
        raise CheckpointError(f"{path}: format version {meta.get('version')} is not supported (need {_VERSION})")
    problem = _meta_problem(meta)
    if problem:
        raise CheckpointError(f"{path}: malformed dynagraph .meta file: {problem}")
    return meta


_FIELDS = {"Parameters": {"name": str, "shape": list, "entry": str},
           "LookupParameters": {"name": str, "shape": list, "entry": str},
           "object": {"class": str, "collection": str, "key": str}}


def _meta_problem(meta: dict) -> str | None:
    """What is wrong with a parsed .meta's structure, or None."""
    if not isinstance(meta.get("data_id"), str) or not isinstance(meta.get("objects"), list):
        return "needs a string data_id and a list of objects"
    for i, rec in enumerate(meta["objects"]):
        if not isinstance(rec, dict) or rec.get("kind") not in _FIELDS:
            return f"object {i} is not a record of a known kind ({', '.join(_FIELDS)})"
        for field, typ in _FIELDS[rec["kind"]].items():
            if not isinstance(rec.get(field), typ):
                return f"object {i} ({rec['kind']}) needs a {typ.__name__} {field!r}"
        if rec["kind"] == "object" and "spec" not in rec:
            return f"object {i} has no spec"
        if "shape" in rec and not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                      for n in rec["shape"]):
            return f"object {i} has a bad shape {rec['shape']!r}"
    return None


def _check_entry(basename: str, i: int, rec: dict, stored: dict, dtype) -> None:
    a = stored.get(rec["entry"])
    if a is None:
        raise CheckpointError(f"{basename}.data lacks the values of object {i} ({rec['kind']} {rec['name']})")
    if list(a.shape) != rec["shape"]:
        raise CheckpointError(f"{basename}.data: object {i} ({rec['kind']} {rec['name']}) has shape "
                              f"{tuple(a.shape)}, {basename}.meta says {tuple(rec['shape'])}")
    checkpoint.checked_values(a, dtype, f"{basename}.data: object {i} ({rec['kind']} {rec['name']})")


def _resolve_class(basename: str, i: int, ref: str):
    cls = _resolve(ref, f"{basename}.meta: object {i}")
    if not isinstance(cls, type) or not callable(getattr(cls, "from_spec", None)):
        raise CheckpointError(f"{basename}.meta: object {i}: {ref} is not a class with from_spec(spec, model)")
    return cls


def _load_one(basename: str, i: int, rec: dict, cls, stored: dict, pc: ParameterCollection):
    if rec["kind"] in ("Parameters", "LookupParameters"):
        a = stored[rec["entry"]]
        add = pc.add_lookup_parameters if rec["kind"] == "LookupParameters" else pc.add_parameters
        return add(a.shape, init=a, name=_local_name(rec["name"]))
    obj = cls.from_spec(rec["spec"], pc)
    wanted = checkpoint.entry_names(obj.param_collection(), rec["key"])
    where = f"{basename}.data (object {i}, {cls.__name__} saved from {rec['collection']})"
    checkpoint.fill(wanted, stored, where, scope=rec["key"] + "/")
    return obj


def _local_name(full: str) -> str:
    """The saved name's last part; DyNet's automatic names (_0, _1...) are regenerated instead."""
    base = full.rstrip("/").rsplit("/", 1)[-1]
    return "" if re.fullmatch(r"_\d+(_\d+)?", base) else base


# --------------------------------------------------------------- spec codec
def _encode(x, where: str):
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (np.integer, np.floating, np.bool_)):
        return x.item()
    if isinstance(x, list):
        return [_encode(v, where) for v in x]
    if isinstance(x, tuple):
        return {"__tuple__": [_encode(v, where) for v in x]}
    if isinstance(x, dict):
        return {"__dict__": [[_encode(k, where), _encode(v, where)] for k, v in x.items()]}
    if isinstance(x, np.ndarray):
        return {"__array__": x.tolist(), "dtype": x.dtype.str, "shape": list(x.shape)}
    if isinstance(x, type) or callable(x):
        return {"__ref__": _ref(x, where)}
    raise TypeError(f"dy.save: {where}: cannot store a {type(x).__name__} (JSON specs hold numbers, "
                    f"strings, lists, tuples, dicts, arrays and importable classes/functions)")


def _decode(x):
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if not isinstance(x, dict):
        return x
    try:
        if "__tuple__" in x:
            return tuple(_decode(v) for v in x["__tuple__"])
        if "__dict__" in x:
            return {_decode(k): _decode(v) for k, v in x["__dict__"]}
        if "__array__" in x:
            dt = np.dtype(x["dtype"])
            if dt.kind not in checkpoint.VALUE_KINDS or dt.hasobject:
                raise CheckpointError(f"array of dtype {dt}")
            return np.array(x["__array__"], dtype=dt).reshape(x["shape"])
        if "__ref__" in x:
            return _resolve(x["__ref__"], "spec")
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise CheckpointError(f"malformed spec entry {str(x)[:200]} ({type(e).__name__}: {e})") from None
    raise CheckpointError(f"unknown spec entry {str(x)[:200]}")


def _ref(obj, where: str) -> str:
    """'module:qualname' of a class or function that load can find again (see `_resolve`)."""
    mod = getattr(obj, "__module__", None)
    # Functions made by a factory (dy.tanh is one) have a '<locals>' qualname but are
    # still bound at module level under their __name__.
    for qual in (getattr(obj, "__qualname__", None), getattr(obj, "__name__", None)):
        if not (mod and isinstance(qual, str)) or "<" in qual:
            continue
        try:
            if _resolve(f"{mod}:{qual}", where) is obj:
                return f"{mod}:{qual}"
        except CheckpointError:
            pass
    raise TypeError(f"dy.save: {where}: {obj!r} is not importable by name from dynagraph nor registered "
                    f"with dy.register_saveable (lambdas, local classes and bound methods cannot be saved)")


def _resolve(ref, where: str):
    """The class or function `ref` names, if dynagraph owns it or the program registered it.

    Nothing is imported: a dynagraph module must already be loaded (importing
    dynagraph loads every module whose classes are saveable), and attribute lookups
    stay on public names.
    """
    if not isinstance(ref, str):
        raise CheckpointError(f"{where}: a class reference must be a string, got {ref!r}")
    if ref in _REGISTERED:
        return _REGISTERED[ref]
    mod, _, qual = ref.partition(":")
    module = sys.modules.get(mod) if mod == "dynagraph" or mod.startswith("dynagraph.") else None
    parts = qual.split(".")
    if module is None or not qual or any(not p.isidentifier() or p.startswith("_") for p in parts):
        raise CheckpointError(f"{where}: {ref!r} is neither one of dynagraph's classes or functions nor "
                              f"registered with dy.register_saveable; nothing was imported")
    obj = module
    for part in parts:
        obj = getattr(obj, part, None)
    if obj is None or not callable(obj):
        raise CheckpointError(f"{where}: dynagraph has no class or function {ref!r}")
    return obj
