"""ParameterCollection.save/populate (dynagraph.checkpoint) and dy.save/dy.load."""
import json
import os

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import checkpoint


def _pc(seed=0, rows=4):
    rng = np.random.default_rng(seed)
    pc = dy.ParameterCollection()
    pc.add_parameters((2, 3), init=rng.normal(size=(2, 3)))
    sub = pc.add_subcollection("enc")
    sub.add_parameters(3, init=rng.normal(size=3), name="bias")
    sub.add_lookup_parameters((rows, 2), init=rng.normal(size=(rows, 2)))
    return pc


def _values(pc):
    return [p.values.copy() for p in pc._all()]


def _leftovers(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".tmp"))


# ------------------------------------------------------------ save / populate
def test_round_trip_in_place(tmp_path):
    f = str(tmp_path / "m.npz")
    a, b = _pc(0), _pc(1)
    a.save(f)
    arrays = [p.values for p in b._all()]
    b.populate(f)
    for x, y in zip(_values(a), _values(b)):
        np.testing.assert_array_equal(x, y)
    assert all(p.values is arr for p, arr in zip(b._all(), arrays))


def test_keys_namespace_collections_and_append(tmp_path):
    f = str(tmp_path / "m.npz")
    a, b = _pc(0), _pc(1)
    a.save(f, key="first")
    b.save(f, key="second", append=True)
    # Keyed entries are relative: a collection with another name can take them.
    outer = dy.ParameterCollection()
    outer.add_parameters(7)
    inner = outer.add_subcollection("elsewhere")
    inner.add_parameters((2, 3))
    s = inner.add_subcollection("enc")
    s.add_parameters(3, name="bias")
    s.add_lookup_parameters((4, 2))
    inner.populate(f, key="second")
    for x, y in zip(_values(b), _values(inner)):
        np.testing.assert_array_equal(x, y)
    inner.populate(f, key="first")
    for x, y in zip(_values(a), _values(inner)):
        np.testing.assert_array_equal(x, y)


def test_append_refuses_to_overwrite_a_name_and_plain_save_replaces(tmp_path):
    f = str(tmp_path / "m.npz")
    _pc(0).save(f, key="k")
    with pytest.raises(ValueError, match="already holds"):
        _pc(1).save(f, key="k", append=True)
    _pc(1).save(f)  # no append: the file now holds only the unkeyed entries
    assert all(k.startswith("/") for k in checkpoint.read_arrays(f))


def test_populate_reports_missing_names_and_changes_nothing(tmp_path):
    f = str(tmp_path / "m.npz")
    _pc(0).save(f)
    b = _pc(1)
    b.add_parameters(5, name="extra")
    before = _values(b)
    with pytest.raises(ValueError, match="no saved values for.*/extra"):
        b.populate(f)
    for x, y in zip(before, _values(b)):
        np.testing.assert_array_equal(x, y)


def test_populate_reports_shape_mismatch_and_changes_nothing(tmp_path):
    f = str(tmp_path / "m.npz")
    _pc(0, rows=4).save(f)
    b = _pc(1, rows=6)
    before = _values(b)
    with pytest.raises(ValueError, match=r"shape mismatch: /enc/_0: saved \(4, 2\), collection has \(6, 2\)"):
        b.populate(f)
    for x, y in zip(before, _values(b)):
        np.testing.assert_array_equal(x, y)


def test_populate_reports_saved_parameters_the_collection_lacks(tmp_path):
    f = str(tmp_path / "m.npz")
    _pc(0).save(f)
    small = dy.ParameterCollection()
    small.add_parameters((2, 3))
    with pytest.raises(ValueError, match="missing from the collection.*/enc/bias"):
        small.populate(f)


def test_populate_unknown_key(tmp_path):
    f = str(tmp_path / "m.npz")
    _pc(0).save(f, key="a")
    with pytest.raises(ValueError, match="key 'b'.*no saved values"):
        _pc(1).populate(f, key="b")


def test_read_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such parameter file"):
        _pc().populate(str(tmp_path / "absent.npz"))
    bad = tmp_path / "bad.npz"
    bad.write_text("not an archive")
    with pytest.raises(ValueError, match="not a dynagraph parameter file"):
        _pc().populate(str(bad))
    arr = tmp_path / "arr.npy"
    np.save(arr, np.ones(3))
    with pytest.raises(ValueError, match="not a dynagraph parameter file"):
        _pc().populate(str(arr))


def _crash(*a, **k):
    raise OSError("disk died")


def _half_write_then_crash(f, **arrays):
    f.write(b"PK\x03\x04 torn")
    raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["savez", "replace"])
def test_interrupted_save_keeps_old_file(tmp_path, monkeypatch, where):
    f = str(tmp_path / "m.npz")
    old = _pc(0)
    old.save(f)
    if where == "savez":
        monkeypatch.setattr(np, "savez", _half_write_then_crash)
    else:
        monkeypatch.setattr(os, "replace", _crash)
    with pytest.raises((KeyboardInterrupt, OSError)):
        _pc(1).save(f)
    monkeypatch.undo()
    assert _leftovers(tmp_path) == []
    fresh = _pc(2)
    fresh.populate(f)
    for x, y in zip(_values(old), _values(fresh)):
        np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------ dy.save / dy.load
@dy.register_saveable  # load rebuilds only dynagraph's own and registered classes
class TinyMLP:
    """A user type following DyNet's saveable protocol."""

    def __init__(self, model, n_in, n_hid, act=dy.tanh, extra=None):
        self.pc = model.add_subcollection("tinymlp")
        self.W = self.pc.add_parameters((n_hid, n_in))
        self.b = self.pc.add_parameters(n_hid)
        self.E = self.pc.add_lookup_parameters((3, n_in))
        self.act = act
        self.spec = (n_in, n_hid, act, extra)

    def param_collection(self):
        return self.pc

    @staticmethod
    def from_spec(spec, model):
        return TinyMLP(model, *spec)

    def __call__(self, i):
        return self.act(self.W * self.E[i] + self.b)


def _mixed(seed):
    dy.reset_random_seed(seed)
    pc = dy.ParameterCollection()
    W = pc.add_parameters((3, 2), name="W")
    E = pc.add_lookup_parameters((5, 2))
    mlp = TinyMLP(pc, 2, 4, dy.logistic, {"tags": ("a", 1), 2: np.arange(3, dtype=np.int64)})
    return pc, [E, mlp, W]


def test_save_load_mixed_objects(tmp_path):
    base = str(tmp_path / "model")
    _, objs = _mixed(0)
    E, mlp, W = objs
    dy.save(base, objs)
    meta = json.loads((tmp_path / "model.meta").read_text())
    assert [o["kind"] for o in meta["objects"]] == ["LookupParameters", "object", "Parameters"]

    pc2 = dy.ParameterCollection()
    pc2.add_parameters(1)  # loading into a collection that already holds parameters
    E2, mlp2, W2 = dy.load(base, pc2)
    assert isinstance(E2, dy.LookupParameters) and isinstance(W2, dy.Parameters)
    assert W2.name() == "/W"
    np.testing.assert_array_equal(E2.values, E.values)
    np.testing.assert_array_equal(W2.values, W.values)
    assert isinstance(mlp2, TinyMLP) and mlp2.act is dy.logistic
    n_in, n_hid, act, extra = mlp2.spec
    assert (n_in, n_hid) == (2, 4) and extra["tags"] == ("a", 1)
    np.testing.assert_array_equal(extra[2], np.arange(3))
    for p, q in zip(mlp.pc._all(), mlp2.pc._all()):
        np.testing.assert_array_equal(p.values, q.values)
    dy.renew_cg()
    a = mlp(2).npvalue()
    dy.renew_cg()
    np.testing.assert_allclose(mlp2(2).npvalue(), a)


def test_objects_with_equal_names_from_different_collections(tmp_path):
    base = str(tmp_path / "m")
    _, (E1, m1, W1) = _mixed(1)
    _, (E2, m2, W2) = _mixed(2)
    assert W1.name() == W2.name() and m1.pc.name() == m2.pc.name()
    dy.save(base, [W1, W2, m1, m2])
    V1, V2, n1, n2 = dy.load(base, dy.ParameterCollection())
    np.testing.assert_array_equal(V1.values, W1.values)
    np.testing.assert_array_equal(V2.values, W2.values)
    np.testing.assert_array_equal(n2.W.values, m2.W.values)
    np.testing.assert_array_equal(n1.E.values, m1.E.values)


def test_unsaveable_objects_are_refused_before_writing(tmp_path):
    base = str(tmp_path / "m")
    pc = dy.ParameterCollection()
    with pytest.raises(TypeError, match="not saveable"):
        dy.save(base, [pc.add_parameters(2), object()])
    with pytest.raises(TypeError, match="not importable"):
        dy.save(base, [TinyMLP(pc, 2, 2, act=lambda x: x)])
    with pytest.raises(TypeError, match="cannot store a set"):
        dy.save(base, [TinyMLP(pc, 2, 2, extra={1, 2})])
    assert os.listdir(tmp_path) == []


def test_load_checks_object_shapes(tmp_path, monkeypatch):
    base = str(tmp_path / "m")
    _, objs = _mixed(0)
    dy.save(base, objs)
    monkeypatch.setattr(TinyMLP, "from_spec", staticmethod(lambda spec, model: TinyMLP(model, 2, 5)))
    with pytest.raises(ValueError, match=r"object 1, TinyMLP.*shape mismatch.*saved \(4, 2\), collection has \(5, 2\)"):
        dy.load(base, dy.ParameterCollection())


def test_interrupted_dy_save(tmp_path, monkeypatch):
    base = str(tmp_path / "m")
    _, objs = _mixed(0)
    dy.save(base, objs)
    old_w = objs[2].values.copy()
    objs[2].values[...] += 1

    monkeypatch.setattr(np, "savez", _half_write_then_crash)  # crash writing .data
    with pytest.raises(KeyboardInterrupt):
        dy.save(base, objs)
    monkeypatch.undo()
    assert _leftovers(tmp_path) == []
    np.testing.assert_array_equal(dy.load(base, dy.ParameterCollection())[2].values, old_w)

    real = os.replace
    monkeypatch.setattr(os, "replace",  # die renaming .meta, after .data was renamed
                        lambda a, b: _crash() if b.endswith(".meta") else real(a, b))
    with pytest.raises(OSError):
        dy.save(base, objs)
    monkeypatch.undo()
    assert _leftovers(tmp_path) == []
    # the new .meta went with the failed rename; .data is new, so load refuses the pair
    with pytest.raises(dy.CheckpointError, match="different saves"):
        dy.load(base, dy.ParameterCollection())


def test_load_errors(tmp_path):
    base = str(tmp_path / "m")
    with pytest.raises(FileNotFoundError):
        dy.load(base, dy.ParameterCollection())
    (tmp_path / "m.meta").write_bytes(b"\x80\x04pickled")
    with pytest.raises(ValueError, match="not a dynagraph .meta file"):
        dy.load(base, dy.ParameterCollection())


@pytest.mark.parametrize("name", ["VanillaLSTMBuilder", "LSTMBuilder", "CompactVanillaLSTMBuilder",
                                  "CoupledLSTMBuilder", "GRUBuilder",
                                  "SimpleRNNBuilder"])
def test_builder_round_trip(tmp_path, name):
    builder_cls = getattr(dy, name, None)
    if builder_cls is None or not hasattr(builder_cls, "from_spec"):
        pytest.skip(f"dy.{name} with from_spec is not available yet")
    base = str(tmp_path / "rnn")
    dy.reset_random_seed(3)
    pc = dy.ParameterCollection()
    lstm = builder_cls(2, 3, 4, pc)
    dy.save(base, [lstm])
    lstm2, = dy.load(base, dy.ParameterCollection())
    assert type(lstm2) is builder_cls
    for p, q in zip(lstm.param_collection()._all(), lstm2.param_collection()._all()):
        np.testing.assert_array_equal(p.values, q.values)
    x = [0.5, -1.0, 2.0]
    dy.renew_cg()
    h = lstm.initial_state().add_input(dy.inputVector(x)).output().npvalue()
    dy.renew_cg()
    np.testing.assert_allclose(lstm2.initial_state().add_input(dy.inputVector(x)).output().npvalue(), h)


def _snapshot(pc):
    return ([p.name() for p in pc._all()], pc.parameter_count(), [p.values.copy() for p in pc._all()],
            [s.name() for s in pc._subs])


def test_load_is_all_or_nothing_when_an_object_mismatches(tmp_path):
    """The second object (a builder) only finds its shape mismatch after from_spec built it:
    the target collection must still be exactly as before (names, count, values, namers)."""
    base = str(tmp_path / "m")
    src = dy.ParameterCollection()
    saved = [src.add_parameters((2, 3), name="W"), dy.VanillaLSTMBuilder(1, 3, 4, src)]
    dy.save(base, saved)
    meta = json.loads((tmp_path / "m.meta").read_text())
    meta["objects"][1]["spec"]["__tuple__"][2] = 5  # hidden dim 5: the stored (16, 3) weights no longer fit
    (tmp_path / "m.meta").write_text(json.dumps(meta))

    target = _pc(7)
    before = _snapshot(target)
    with pytest.raises(ValueError, match="object 1.*shape mismatch"):
        dy.load(base, target)
    after = _snapshot(target)
    assert after[:2] == before[:2] and after[3] == before[3]
    for x, y in zip(before[2], after[2]):
        np.testing.assert_array_equal(x, y)
    # Nothing was half-registered: names given later are the ones a fresh copy gives.
    fresh = _pc(7)
    assert target.add_parameters(2).name() == fresh.add_parameters(2).name()
    assert target.add_subcollection().name() == fresh.add_subcollection().name()


def test_load_into_a_nonempty_collection_names_like_direct_creation(tmp_path):
    base = str(tmp_path / "m")
    src = dy.ParameterCollection()
    W, lstm = src.add_parameters((2, 3)), dy.VanillaLSTMBuilder(1, 3, 4, src)
    dy.save(base, [W, lstm])
    target, direct = _pc(1), _pc(1)
    W2, lstm2 = dy.load(base, target)
    direct.add_parameters((2, 3)), dy.VanillaLSTMBuilder(1, 3, 4, direct)
    assert [p.name() for p in target._all()] == [p.name() for p in direct._all()]
    assert lstm2.param_collection()._parent is target
    assert W2 in target.parameters_list()
    np.testing.assert_array_equal(W2.values, W.values)
    for p, q in zip(lstm.param_collection()._all(), lstm2.param_collection()._all()):
        np.testing.assert_array_equal(p.values, q.values)
    assert target.add_subcollection().name() == direct.add_subcollection().name()


def test_commit_staged_refuses_foreign_or_stale_scratch():
    pc, other = dy.ParameterCollection(), dy.ParameterCollection()
    scratch = pc.staging()
    scratch.add_parameters(2)
    with pytest.raises(ValueError, match="not made by"):
        other.commit_staged(scratch)
    pc.add_parameters(3)  # would clash with the scratch's '/_0'
    with pytest.raises(ValueError, match="after staging"):
        pc.commit_staged(scratch)
    assert [p.name() for p in pc._all()] == ["/_0"]
