"""Atomic on-disk storage of named arrays (ParameterCollection.save / populate, dy.save).

Format: a numpy .npz archive (zip of .npy, never pickle) mapping entry names
to arrays. Entry names follow DyNet's TextFileSaver: with key "" an entry is
the parameter's full name ("/_0", "/lstm/_1"); with a key it is
"<key>/<name relative to the saved collection>", so a collection saved under
a key can be populated into a collection with another name.

Writes go to a temporary file in the target's directory, are fsynced, then
renamed over the target (and the directory is fsynced), so a crash at any
point leaves either the complete old file or the complete new one.
"""
from __future__ import annotations

import os
import tempfile
import zipfile
from typing import Callable

import numpy as np


# ------------------------------------------------------------------ raw files
def atomic_write(path: str, write: Callable) -> None:
    """Call write(fileobj) on a temp file next to `path`, then atomically rename it to `path`."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(d)


def _fsync_dir(d: str) -> None:
    """Make the rename itself durable (best effort: not every platform can open a directory)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_arrays(path: str) -> dict:
    """All entries of a parameter file, in the order they were written."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such parameter file")
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError("a single .npy array, not an archive")
        with z:
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path}: not a dynagraph parameter file ({e})") from None


def write_arrays(path: str, arrays: dict) -> None:
    # savez takes names as keywords; ours always contain "/", so they never hit its own arguments.
    atomic_write(path, lambda f: np.savez(f, **arrays))


# --------------------------------------------------------------- collections
def entry_names(pc, key: str = "") -> list:
    """(entry name, parameter) for every parameter of pc, under `key` (see module doc)."""
    if not key:
        return [(p.name(), p) for p in pc._all()]
    prefix, base = _prefix(key), pc.name()
    return [(prefix + _relative(p.name(), base), p) for p in pc._all()]


def _prefix(key: str) -> str:
    return key if key.endswith("/") else key + "/"


def _relative(name: str, base: str) -> str:
    if not name.startswith(base):
        raise AssertionError(f"parameter {name} does not live under its collection {base}")
    return name[len(base):]


def collection_arrays(pc, key: str = "") -> dict:
    return {e: p.values for e, p in entry_names(pc, key)}


def save_collection(pc, fname: str, key: str = "", append: bool = False) -> None:
    """Write pc's values; append=True keeps the file's other entries (a repeated name is an error)."""
    arrays = read_arrays(fname) if append and os.path.exists(fname) else {}
    new = collection_arrays(pc, key)
    clash = [e for e in new if e in arrays]
    if clash:
        raise ValueError(f"{fname} already holds {_show(clash)}; save under another key, or without append")
    arrays.update(new)
    write_arrays(fname, arrays)


def populate_collection(pc, fname: str, key: str = "") -> None:
    """Load values saved by save_collection with the same key; checks names and shapes first."""
    fill(entry_names(pc, key), read_arrays(fname), f"{fname}" + (f" (key {key!r})" if key else ""),
         scope=_prefix(key) if key else pc.name())


def fill(wanted: list, stored: dict, where: str, scope: str | None = None) -> None:
    """Assign stored[entry] to each (entry, parameter) of `wanted`, all or nothing.

    Every problem is reported at once: entries the file lacks, entries under
    `scope` that no parameter claims (DyNet errors on such count mismatches
    too), and shape mismatches. Nothing is written unless all is well.
    """
    names = {e for e, _ in wanted}
    missing = [e for e in names if e not in stored]
    extra = [e for e in stored if scope is not None and e.startswith(scope) and e not in names]
    bad = [f"{e}: saved {tuple(stored[e].shape)}, collection has {tuple(p.values.shape)}"
           for e, p in wanted if e in stored and stored[e].shape != p.values.shape]
    problems = []
    if missing:
        near = sorted(e for e in stored if scope is None or e.startswith(scope)) or sorted(stored)
        problems.append(f"no saved values for {_show(sorted(missing))}; it holds {_show(near)}")
    if extra:
        problems.append(f"saved parameters missing from the collection: {_show(sorted(extra))}")
    if bad:
        problems.append("shape mismatch: " + "; ".join(bad))
    if problems:
        raise ValueError(f"cannot populate from {where}: " + "\n  ".join(problems))
    for e, p in wanted:
        p.values[...] = stored[e]


def _show(names: list, limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}] ({len(names)})"
