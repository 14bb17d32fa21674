"""dy.save / dy.load: parameters, lookup parameters and saveable objects, DyNet-style.

An object is saveable (DyNet's protocol) when it has `param_collection()`, a
`spec` attribute and a static `from_spec(spec, model)` that rebuilds it with
fresh parameters inside `model`; the RNN builders follow it.

`basename.data` holds the values (dynagraph.checkpoint format, object i's
parameters under key "i"); `basename.meta` is JSON describing how to recreate
each object. Unlike DyNet's pickled .meta, specs are encoded as JSON with
tuples, dicts, arrays and importable classes/functions (e.g. dy.tanh) tagged,
so loading never unpickles. Both files are written atomically and carry a
shared id so a .data and a .meta from different saves are never mixed.
"""
from __future__ import annotations

import importlib
import json
import re
import uuid
from typing import Iterable, Iterator

import numpy as np

from .. import checkpoint, dynet_format
from ..parameters import LookupParameters, ParameterCollection, Parameters

__all__ = ["save", "load", "load_generator"]

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
    checkpoint.write_arrays(basename + ".data", arrays)
    checkpoint.atomic_write(basename + ".meta", lambda f: f.write(meta))


def _describe(i: int, o) -> tuple:
    key = str(i)
    if isinstance(o, (Parameters, LookupParameters)):
        entry = f"{key}/{o.name().rstrip('/').rsplit('/', 1)[-1]}"
        kind = "LookupParameters" if o.is_lookup else "Parameters"
        return {"kind": kind, "name": o.name(), "shape": list(o.values.shape), "entry": entry}, {entry: o.values}
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
    """Recreate the saved objects inside pc, in the order they were saved."""
    return list(load_generator(basename, pc))


def load_generator(basename: str, pc: ParameterCollection) -> Iterator:
    if dynet_format.is_dynet_text(basename + ".data"):  # written by DyNet's dy.save
        yield from dynet_format.load_objects(basename, pc)
        return
    meta = _read_meta(basename + ".meta")
    stored = checkpoint.read_arrays(basename + ".data")
    if _ID + meta["data_id"] not in stored:
        raise ValueError(f"{basename}.data and {basename}.meta come from different saves "
                         f"(was one of them replaced or copied separately?)")
    records = meta["objects"]
    for i, rec in enumerate(records):  # check plain parameters before creating anything
        if rec["kind"] != "object":
            _check_entry(basename, i, rec, stored)
    for i, rec in enumerate(records):
        yield _load_one(basename, i, rec, stored, pc)


def _read_meta(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a dynagraph .meta file ({e}); DyNet's pickled .meta files "
                         f"cannot be read") from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a dynagraph .meta file")
    if meta.get("version") != _VERSION:
        raise ValueError(f"{path}: format version {meta.get('version')} is not supported (need {_VERSION})")
    return meta


def _check_entry(basename: str, i: int, rec: dict, stored: dict) -> None:
    a = stored.get(rec["entry"])
    if a is None:
        raise ValueError(f"{basename}.data lacks the values of object {i} ({rec['kind']} {rec['name']})")
    if list(a.shape) != rec["shape"]:
        raise ValueError(f"{basename}.data: object {i} ({rec['kind']} {rec['name']}) has shape "
                         f"{tuple(a.shape)}, {basename}.meta says {tuple(rec['shape'])}")


def _load_one(basename: str, i: int, rec: dict, stored: dict, pc: ParameterCollection):
    if rec["kind"] in ("Parameters", "LookupParameters"):
        a = stored[rec["entry"]]
        add = pc.add_lookup_parameters if rec["kind"] == "LookupParameters" else pc.add_parameters
        return add(a.shape, init=a, name=_local_name(rec["name"]))
    if rec["kind"] != "object":
        raise ValueError(f"{basename}.meta: object {i} has unknown kind {rec['kind']!r}")
    cls = _resolve(rec["class"])
    if not callable(getattr(cls, "from_spec", None)):
        raise TypeError(f"{basename}.meta: {rec['class']} has no from_spec(spec, model)")
    obj = cls.from_spec(_decode(rec["spec"]), pc)
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
    if "__tuple__" in x:
        return tuple(_decode(v) for v in x["__tuple__"])
    if "__dict__" in x:
        return {_decode(k): _decode(v) for k, v in x["__dict__"]}
    if "__array__" in x:
        return np.array(x["__array__"], dtype=np.dtype(x["dtype"])).reshape(x["shape"])
    if "__ref__" in x:
        return _resolve(x["__ref__"])
    raise ValueError(f"unknown spec entry {x!r}")


def _ref(obj, where: str) -> str:
    """'module:qualname' of an importable class or function (checked to resolve back to it)."""
    mod = getattr(obj, "__module__", None)
    # Functions made by a factory (dy.tanh is one) have a '<locals>' qualname but are
    # still bound at module level under their __name__.
    for qual in (getattr(obj, "__qualname__", None), getattr(obj, "__name__", None)):
        if not (mod and isinstance(qual, str)) or "<" in qual:
            continue
        try:
            if _resolve(f"{mod}:{qual}") is obj:
                return f"{mod}:{qual}"
        except (ImportError, AttributeError):
            pass
    raise TypeError(f"dy.save: {where}: {obj!r} is not importable by name (lambdas, local "
                    f"classes and bound methods cannot be saved)")


def _resolve(ref: str):
    mod, _, qual = ref.partition(":")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj
