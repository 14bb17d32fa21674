"""Saves are all-or-nothing even under kill -9, loads validate everything before changing
anything, never import what a file names, and corrupt or hostile files raise CheckpointError."""
from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _temps(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".tmp"))


def _model(k: float):
    pc = dy.ParameterCollection()
    W = pc.add_parameters((30, 40), init=dy.ConstInitializer(k))
    E = pc.add_lookup_parameters((500, 20), init=dy.ConstInitializer(k))
    lstm = dy.VanillaLSTMBuilder(1, 20, 30, pc)
    for p in lstm.param_collection()._all():
        p.values[...] = k
    return pc, [W, E, lstm]


def _generation(values: list) -> float:
    """The one generation number every loaded array holds (a mixed model fails here)."""
    ks = {float(v) for a in values for v in np.unique(a)}
    assert len(ks) == 1, f"a mixed model: {sorted(ks)[:5]}"
    return ks.pop()


def _load_generation(d) -> tuple:
    pc, _ = _model(0.0)
    pc.populate(os.path.join(d, "pc.npz"))
    a = _generation([p.values for p in pc._all()])
    W, E, lstm = dy.load(os.path.join(d, "m"), dy.ParameterCollection())
    b = _generation([W.values, E.values] + [p.values for p in lstm.param_collection()._all()])
    return a, b


SAVER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    from nn.test_io_hardening import _model
    import dynagraph as dy
    d, k = sys.argv[1], float(sys.argv[2])
    pc, objs = _model(k)
    W, E, lstm = objs
    arrays = [W.values, E.values] + [p.values for p in lstm.param_collection()._all()]
    t0 = time.perf_counter()
    while True:
        k += 1
        for a in arrays:                       # one model, refilled: the loop is mostly saving
            a[...] = k
        pc.save(os.path.join(d, "pc.npz"))
        dy.save(os.path.join(d, "m"), objs)
        if t0 is not None:                     # warm now; tell the parent how long a save pair takes
            print("ready", time.perf_counter() - t0, flush=True)
            t0 = None
""")


def test_kill_9_at_random_moments_leaves_old_or_new_model(tmp_path):
    d = str(tmp_path)
    pc, objs = _model(1.0)
    pc.save(os.path.join(d, "pc.npz"))
    dy.save(os.path.join(d, "m"), objs)
    script = tmp_path / "saver.py"
    script.write_text(SAVER.format(tests=os.path.join(ROOT, "tests")))
    rng = random.Random(0)
    k, seen_temps, kills = 1.0, 0, 0
    start = time.monotonic()
    # Kill at random moments for at least 4 s and 3 kills; on a slow, loaded machine keep
    # going (up to 60 s) until some kill has landed inside a save, so the test always tests.
    while (time.monotonic() - start < 4 or kills < 3 or not seen_temps) and time.monotonic() - start < 60:
        p = subprocess.Popen([sys.executable, str(script), d, str(k)], stdout=subprocess.PIPE, text=True)
        word, pair_s = p.stdout.readline().split()
        assert word == "ready"
        time.sleep(rng.uniform(0.0, 3 * float(pair_s)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        kills += 1
        seen_temps += bool(_temps(d))
        a, b = _load_generation(d)             # each file pair is one complete save
        assert a >= k and b >= k
        k = max(a, b)
        pc, objs = _model(k + 0.5)             # the next save cleans up after the dead one
        pc.save(os.path.join(d, "pc.npz"))
        dy.save(os.path.join(d, "m"), objs)
        assert _temps(d) == []
        assert _load_generation(d) == (k + 0.5, k + 0.5)
        k += 0.5
    assert seen_temps, "no kill landed inside a save: the loop tested nothing"


KILL_BETWEEN = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from nn.test_io_hardening import _model
    import dynagraph as dy
    real = os.replace
    def replace(a, b):
        real(a, b)
        if b.endswith(".data"):
            os.kill(os.getpid(), signal.SIGKILL)    # between the two files
    os.replace = replace
    pc, objs = _model(2.0)
    dy.save(os.path.join(sys.argv[1], "m"), objs)
""")


@pytest.mark.parametrize("first", [False, True])
def test_kill_between_the_two_files_recovers_the_new_save(tmp_path, first):
    d = str(tmp_path)
    if not first:
        dy.save(os.path.join(d, "m"), _model(1.0)[1])
    script = tmp_path / "k.py"
    script.write_text(KILL_BETWEEN.format(tests=os.path.join(ROOT, "tests")))
    r = subprocess.run([sys.executable, str(script), d], timeout=120)
    assert r.returncode == -signal.SIGKILL
    assert len(_temps(d)) == 1                    # the new .meta, waiting
    W, E, lstm = dy.load(os.path.join(d, "m"), dy.ParameterCollection())
    assert _generation([W.values, E.values]) == 2.0
    dy.save(os.path.join(d, "m"), _model(3.0)[1])
    assert _temps(d) == []
    W, E, lstm = dy.load(os.path.join(d, "m"), dy.ParameterCollection())
    assert _generation([W.values, E.values]) == 3.0


def test_live_writers_temp_file_is_not_removed(tmp_path):
    f = str(tmp_path / "pc.npz")
    stale = checkpoint.temp_name(f, "dead")
    open(stale, "wb").write(b"half")
    tmp, fd = checkpoint.write_temp(f, lambda fo: fo.write(b"live"))  # held, as by a running save
    _model(1.0)[0].save(f)
    assert _temps(tmp_path) == [os.path.basename(tmp)]
    checkpoint.discard(tmp, fd)


def test_file_mode_is_kept(tmp_path):
    f = str(tmp_path / "pc.npz")
    pc = _model(1.0)[0]
    pc.save(f)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(f).st_mode & 0o777 == 0o666 & ~umask
    for mode in (0o640, 0o604):
        os.chmod(f, mode)
        pc.save(f)
        assert os.stat(f).st_mode & 0o777 == mode
        dy.save(str(tmp_path / "m"), [pc.add_parameters(3)] if mode == 0o640 else [])
        os.chmod(str(tmp_path / "m.meta"), mode)
        dy.save(str(tmp_path / "m"), [])
        assert os.stat(str(tmp_path / "m.meta")).st_mode & 0o777 == mode


def _npz(path, **arrays):
    np.savez(path, **arrays)


@pytest.mark.parametrize("bad", [np.array([[1 + 2j] * 4] * 3), np.array([["1.5"] * 4] * 3),
                                 np.array([[np.datetime64("2020-01-01")] * 4] * 3),
                                 np.full((3, 4), 1e300), np.full((3, 4), np.nan)],
                         ids=["complex", "strings", "datetimes", "overflow", "nan"])
def test_populate_is_all_or_nothing(tmp_path, bad):
    f = str(tmp_path / "x.npz")
    pc = dy.ParameterCollection()
    a = pc.add_parameters(5, name="a")
    b = pc.add_parameters((3, 4), name="b")
    before = [a.values.copy(), b.values.copy()]
    _npz(f, **{"/a": np.arange(5.0), "/b": bad})
    with pytest.raises(dy.CheckpointError, match="/b"):
        pc.populate(f)
    np.testing.assert_array_equal(a.values, before[0])
    np.testing.assert_array_equal(b.values, before[1])


def test_load_refuses_non_finite_values_before_creating_anything(tmp_path):
    base = str(tmp_path / "m")
    pc = dy.ParameterCollection()
    W, E = pc.add_parameters((2, 2)), pc.add_lookup_parameters((3, 2))
    E.values[1, 1] = np.inf
    dy.save(base, [W, E])
    pc2 = dy.ParameterCollection()
    with pytest.raises(dy.CheckpointError, match="non-finite"):
        dy.load(base, pc2)
    assert list(pc2._all()) == []


def test_meta_naming_a_foreign_module_is_refused_without_importing_it(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evil_dg_module.py").write_text(
        f"open({str(marker)!r}, 'w').write('x')\n"
        "class Thing:\n    @staticmethod\n    def from_spec(spec, model):\n        raise SystemExit('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    base = str(tmp_path / "m")
    lstm = dy.VanillaLSTMBuilder(1, 2, 3, dy.ParameterCollection())
    dy.save(base, [lstm])
    meta = json.loads(open(base + ".meta").read())
    for ref in ("evil_dg_module:Thing", "os:system", "dynagraph.nn.io:_resolve", "dynagraph:__builtins__"):
        meta["objects"][0]["class"] = ref
        open(base + ".meta", "w").write(json.dumps(meta))
        with pytest.raises(dy.CheckpointError, match="nothing was imported|not a class"):
            dy.load(base, dy.ParameterCollection())
    meta["objects"][0]["class"] = "dynagraph.nn.rnn:VanillaLSTMBuilder"
    meta["objects"][0]["spec"] = {"__ref__": "evil_dg_module:Thing"}
    open(base + ".meta", "w").write(json.dumps(meta))
    with pytest.raises(dy.CheckpointError, match="nothing was imported"):
        dy.load(base, dy.ParameterCollection())
    assert not marker.exists() and "evil_dg_module" not in sys.modules


def _claiming_npz(path, shape):
    """A valid one-entry npz whose .npy header claims `shape` but holds 8 bytes."""
    hdr = io.BytesIO()
    np.lib.format.write_array_header_1_0(hdr, {"descr": "<f8", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("/w.npy", hdr.getvalue() + b"\0" * 8)


def test_corrupt_and_hostile_files_raise_checkpoint_error(tmp_path):
    pc = dy.ParameterCollection()
    pc.add_parameters(3, name="w")
    good = str(tmp_path / "good.npz")
    pc.save(good)
    raw = open(good, "rb").read()
    cases = {"truncated.npz": raw[: len(raw) // 2], "garbage.npz": b"not a zip at all",
             "empty.npz": b"", "flipped.npz": raw[:60] + bytes(b ^ 0xFF for b in raw[60:90]) + raw[90:]}
    for name, content in cases.items():
        open(tmp_path / name, "wb").write(content)
    _claiming_npz(str(tmp_path / "huge.npz"), (1 << 19, 1 << 20))     # 4 TB of float64
    _npz(str(tmp_path / "objects.npz"), **{"/w": np.array([1, "a", None], dtype=object)})
    for name in list(cases) + ["huge.npz", "objects.npz"]:
        with pytest.raises(dy.CheckpointError):
            pc.populate(str(tmp_path / name))
    base = str(tmp_path / "m")
    dy.save(base, [dy.VanillaLSTMBuilder(1, 2, 3, dy.ParameterCollection()), pc.add_parameters(2)])
    meta = json.loads(open(base + ".meta").read())
    for broken in ({k: v for k, v in meta["objects"][1].items() if k != "entry"},
                   dict(meta["objects"][1], shape="x"), dict(meta["objects"][0], spec={"__array__": 1}),
                   dict(meta["objects"][0], spec={"__what__": 1}), 7):
        open(base + ".meta", "w").write(json.dumps(dict(meta, objects=[meta["objects"][0], broken])))
        with pytest.raises(dy.CheckpointError):
            dy.load(base, dy.ParameterCollection())
    open(base + ".meta", "w").write("[" * 100000)
    with pytest.raises(dy.CheckpointError):
        dy.load(base, dy.ParameterCollection())
