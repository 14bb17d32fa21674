"""Atomic on-disk storage of named arrays (ParameterCollection.save / populate, dy.save).

Format: a numpy .npz archive (zip of .npy, never pickle) mapping entry names
to arrays. Entry names follow DyNet's TextFileSaver: with key "" an entry is
the parameter's full name ("/_0", "/lstm/_1"); with a key it is
"<key>/<name relative to the saved collection>", so a collection saved under
a key can be populated into a collection with another name.

Writes go to a temporary file `.<name>.<tag>.tmp` in the target's directory, are
fsynced, then renamed over the target (and the directory is fsynced), so a crash at
any point leaves either the complete old file or the complete new one. The new file
keeps the old one's mode (a new one gets the umask's). A writer holds an flock on its
temporary file while it lives; the next save of the same target removes every
temporary file nobody holds, i.e. those of saves that died.

Reading never trusts the file: every .npy header is parsed here, its dtype must be
real or integer, and the size it claims must be the size stored in the archive, so a
1 KB file claiming 4 TB is refused before anything is allocated. Every problem with a
file is a CheckpointError.
"""
from __future__ import annotations

import glob
import os
import stat
import uuid
import zipfile
from typing import Callable

import numpy as np

from .errors import CheckpointError

try:  # POSIX; elsewhere stale temporary files are left for the user
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

# Deflate cannot expand a stream by more than about 1032:1; a member claiming more is hostile.
_MAX_RATIO, _MAX_HEADER = 1100, 1 << 16
VALUE_KINDS = "biuf"  # bool, signed, unsigned, float: what parameter values may come from


# ------------------------------------------------------------------ raw files
def temp_name(path: str, tag: str | None = None) -> str:
    d, base = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{base}.{tag or uuid.uuid4().hex}.tmp")


def write_temp(path: str, write: Callable, tag: str | None = None) -> tuple:
    """Write a complete, fsynced temporary file for `path`; returns (temp path, held fd).

    The fd holds an flock that marks the file as alive; close it once the file is
    renamed or removed (see `clean_stale`).
    """
    tmp = temp_name(path, tag)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))  # keep the old file's mode
        except OSError:
            pass
        with os.fdopen(os.dup(fd), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        discard(tmp, fd)
        raise
    return tmp, fd


def discard(tmp: str, fd: int) -> None:
    """Remove a temporary file of ours and release its lock."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.close(fd)


def commit(tmp: str, fd: int, path: str) -> None:
    """Rename a written temporary file over `path` (the atomic step), durably."""
    try:
        os.replace(tmp, path)
    except BaseException:
        discard(tmp, fd)
        raise
    os.close(fd)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def clean_stale(path: str) -> list:
    """Remove the temporary files of dead saves of `path` (no live writer holds their lock)."""
    if fcntl is None:
        return []
    d, base = os.path.split(os.path.abspath(path))
    removed = []
    for tmp in glob.glob(os.path.join(glob.escape(d), f".{glob.escape(base)}.*.tmp")):
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)   # a live save is writing it
            continue
        try:
            os.unlink(tmp)
            removed.append(tmp)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def atomic_write(path: str, write: Callable) -> None:
    """Call write(fileobj) on a temp file next to `path`, then atomically rename it to `path`."""
    clean_stale(path)
    tmp, fd = write_temp(path, write)
    commit(tmp, fd, path)


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
    """All entries of a parameter file, in the order they were written (see module doc)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such parameter file")
    try:
        with zipfile.ZipFile(path) as zf:
            out = {}
            for info in zf.infolist():
                name = info.filename[:-4] if info.filename.endswith(".npy") else None
                if name is None or name in out:
                    raise CheckpointError(f"unexpected or repeated member {info.filename!r}")
                out[name] = _read_member(zf, info)
            return out
    except CheckpointError as e:
        raise CheckpointError(f"{path}: not a valid dynagraph parameter file ({e})") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError, KeyError,
            NotImplementedError, RuntimeError, MemoryError, OverflowError, TypeError) as e:
        raise CheckpointError(f"{path}: not a dynagraph parameter file ({type(e).__name__}: {e})") from None


def entry_names_in(path: str) -> list:
    """The entry names of a parameter file, without reading any values (cheap on big files)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise CheckpointError(f"{path}: not a dynagraph parameter file ({type(e).__name__}: {e})") from None


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    if info.file_size > _MAX_RATIO * info.compress_size + 4096:
        raise CheckpointError(f"{info.filename}: claims {info.file_size} bytes from {info.compress_size}")
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=_MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=_MAX_HEADER)
        else:
            raise CheckpointError(f"{info.filename}: unknown .npy version {version}")
        if dtype.kind not in VALUE_KINDS or dtype.hasobject or dtype.fields or dtype.subdtype:
            raise CheckpointError(f"{info.filename}: dtype {dtype} is not real or integer")
        count = 1
        for n in shape:
            if not isinstance(n, int) or n < 0:
                raise CheckpointError(f"{info.filename}: bad shape {shape}")
            count *= n
        nbytes = count * dtype.itemsize
        if nbytes != info.file_size - f.tell():
            raise CheckpointError(f"{info.filename}: header claims {shape} {dtype} ({nbytes} bytes), "
                                  f"the archive holds {info.file_size - f.tell()}")
        buf = f.read(nbytes)
    if len(buf) != nbytes:
        raise CheckpointError(f"{info.filename}: truncated ({len(buf)} of {nbytes} bytes)")
    a = np.frombuffer(buf, dtype).reshape(shape, order="F" if fortran else "C")
    return np.ascontiguousarray(a, dtype=dtype.newbyteorder("="))


def write_arrays(path: str, arrays: dict) -> None:
    # savez takes names as keywords; ours always contain "/", so they never hit its own arguments.
    atomic_write(path, lambda f: np.savez(f, **arrays))


def checked_values(a: np.ndarray, dtype, what: str) -> np.ndarray:
    """`a` as `dtype` if it is real or integer and stays finite there; else a CheckpointError.

    float64 1e300 becomes inf in float32: refused like a stored inf, never stored.
    """
    a = np.asarray(a)
    if a.dtype.kind not in VALUE_KINDS or a.dtype.hasobject:
        raise CheckpointError(f"{what}: values of dtype {a.dtype} (need real or integer numbers)")
    with np.errstate(over="ignore", invalid="ignore"):
        c = a.astype(dtype)
    if not np.isfinite(c).all():
        src = "are" if not np.isfinite(a.astype(np.float64)).all() else f"overflow {np.dtype(dtype)} and become"
        raise CheckpointError(f"{what}: values {src} non-finite (nan or inf)")
    return c


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
    """entry -> host copy of the parameter's values (saving is the allowed device-to-host copy)."""
    return {e: p.as_array() for e, p in entry_names(pc, key)}


def save_collection(pc, fname: str, key: str = "", append: bool = False) -> None:
    """Write pc's values; append=True keeps the file's other entries (a repeated name is an error)."""
    arrays = read_arrays(fname) if append and os.path.exists(fname) else {}
    new = collection_arrays(pc, key)
    clash = [e for e in new if e in arrays]
    if clash:
        raise CheckpointError(f"{fname} already holds {_show(clash)}; save under another key, or without append")
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
    cast = {}
    for e, p in wanted:
        if e in stored and not bad:
            try:
                cast[e] = checked_values(stored[e], p.values.dtype, e)
            except CheckpointError as err:
                problems.append(str(err))
    if problems:
        raise CheckpointError(f"cannot populate from {where}: " + "\n  ".join(problems))
    for e, p in wanted:
        p.assign_host(cast[e])


def _show(names: list, limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}] ({len(names)})"
