"""Atomic on-disk storage of named arrays (ParameterCollection.save / populate).

Format: a numpy .npz archive (zip, no pickle) whose entries are
"<key>|<parameter name>". Writes go to a temporary file in the same
directory, are fsynced, then renamed over the target, so a crash at any point
leaves either the old file or the new one, never a torn file.
"""
from __future__ import annotations

import os
import tempfile
import zipfile

import numpy as np


def atomic_write(path: str, write) -> None:
    """Call write(fileobj) on a temp file, then atomically rename it to `path`."""
    d = os.path.dirname(os.path.abspath(path)) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_arrays(path: str) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise ValueError(f"{path}: not a dynagraph parameter file ({e})") from None


def write_arrays(path: str, arrays: dict) -> None:
    atomic_write(path, lambda f: np.savez(f, **arrays))


def save_collection(pc, fname: str, key: str = "", append: bool = False) -> None:
    arrays = read_arrays(fname) if append and os.path.exists(fname) else {}
    for p in pc._all():
        arrays[f"{key}|{p.name()}"] = p.values
    write_arrays(fname, arrays)


def populate_collection(pc, fname: str, key: str = "") -> None:
    stored = read_arrays(fname)
    wanted = {f"{key}|{p.name()}": p for p in pc._all()}
    missing = [k for k in wanted if k not in stored]
    if missing:
        have = sorted(k for k in stored if k.startswith(f"{key}|"))
        raise ValueError(f"{fname}: no saved values for {[m.split('|', 1)[1] for m in missing]} "
                         f"(key {key!r}); the file holds {[h.split('|', 1)[1] for h in have]}")
    for k, p in wanted.items():
        a = stored[k]
        if a.shape != p.values.shape:
            raise ValueError(f"{fname}: {p.name()} was saved with shape {a.shape}, the collection has {p.values.shape}")
    for k, p in wanted.items():
        p.values[...] = stored[k]
