"""Models saved by DyNet load into dynagraph and continue training with DyNet's losses
(dynagraph/dynet_format.py). The files are written by dynet38 itself; without it the
format tests run on a hand-written file in DyNet's format."""
from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import dynet_format
from refcheck import using

try:
    import dynet as dn
except ImportError:
    dn = None

needs_dynet = pytest.mark.skipif(dn is None, reason="dynet38 is not installed")
RTOL = 1e-4
DATA = [([0, 3], 2), ([1, 1], 0), ([6, 2], 1), ([4, 5], 2), ([3, 0], 0)]


def make(m: ModuleType):
    """DyNet-style model: embeddings (a matrix per word, exercising the lookup layout), an
    LSTM over them in a subcollection, a softmax layer."""
    pc = m.ParameterCollection()
    E = pc.add_lookup_parameters((7, 2, 3))
    enc = pc.add_subcollection("enc")
    lstm = m.LSTMBuilder(1, 6, 5, enc)
    W, b = pc.add_parameters((3, 5), name="W"), pc.add_parameters(3)
    return pc, E, lstm, W, b


def epoch(m: ModuleType, model, trainer) -> list:
    pc, E, lstm, W, b = model
    losses = []
    for words, label in DATA:
        m.renew_cg()
        s = lstm.initial_state()
        for w in words:
            s = s.add_input(m.reshape(m.lookup(E, w), (6,)))
        loss = m.pickneglogsoftmax(m.parameter(W) * s.output() + m.parameter(b), label)
        losses.append(loss.value())
        loss.backward()
        trainer.update()
    return losses


@needs_dynet
@pytest.mark.parametrize("how", ["populate", "populate_from_textfile"])
def test_model_saved_by_dynet_continues_training_with_dynets_losses(tmp_path, how):
    path = str(tmp_path / "model")
    with using(dtype="float32", seed=0):
        theirs = make(dn)
        trainer = dn.SimpleSGDTrainer(theirs[0], 0.3)
        epoch(dn, theirs, trainer)  # trained in DyNet, then saved by DyNet
        theirs[0].save(path)
        want = [epoch(dn, theirs, trainer) for _ in range(2)]
        weights = [p.as_array() for p in theirs[0].parameters_list()]

        ours = make(dy)
        getattr(ours[0], how)(path)
        trainer = dy.SimpleSGDTrainer(ours[0], 0.3)
        got = [epoch(dy, ours, trainer) for _ in range(2)]
    np.testing.assert_allclose(got, want, rtol=RTOL)
    for p, w in zip(ours[0].parameters_list(), weights):
        np.testing.assert_allclose(p.as_array(), w, rtol=RTOL, atol=1e-6, err_msg=p.name())


@needs_dynet
def test_dy_load_reads_dynets_dy_save_of_parameters(tmp_path):
    base = str(tmp_path / "basic")
    pc = dn.ParameterCollection()
    W = pc.add_parameters((2, 3), name="W")
    E = pc.add_lookup_parameters((4, 2, 3))
    dn.renew_cg()
    loss = dn.sum_elems(dn.parameter(W) * dn.inputVector([1.0, 2.0, 3.0])) + dn.sum_elems(E[2])
    loss.value()
    loss.backward()  # W's gradient is saved too (FULL_GRAD)
    dn.save(base, [W, E])
    ours = dy.ParameterCollection()
    W2, E2 = dy.load(base, ours)
    np.testing.assert_allclose(W2.as_array(), W.as_array(), rtol=1e-6)
    np.testing.assert_allclose(W2.grad_as_array(), W.grad_as_array(), rtol=1e-6)
    np.testing.assert_allclose(E2.as_array(), E.as_array(), rtol=1e-6)
    dy.renew_cg()
    np.testing.assert_allclose(E2[1].npvalue(), E[1].npvalue(), rtol=1e-6)
    X = ours.load_param(base + ".data", "/W")
    np.testing.assert_allclose(X.as_array(), W.as_array(), rtol=1e-6)


@needs_dynet
def test_pickled_builders_are_refused_not_unpickled(tmp_path):
    base = str(tmp_path / "with_builder")
    pc = dn.ParameterCollection()
    lstm = dn.LSTMBuilder(1, 2, 3, pc)
    dn.save(base, [lstm])
    with pytest.raises(ValueError, match="never unpickles"):
        dy.load(base, dy.ParameterCollection())


# ------------------------------------------------------------- without DyNet: the format
TEXT = """#Parameter# /W {2,3} 194 FULL_GRAD
+0.0e+00 +3.0e+00 +1.0e+00 +4.0e+00 +2.0e+00 +5.0e+00
+1.0e+00 +1.0e+00 +2.0e+00 +2.0e+00 +3.0e+00 +3.0e+00
#LookupParameter# /_1 {2,3} 100 ZERO_GRAD
+1 +2 +3 +4 +5 +6
"""


def test_text_format_is_read_column_major_with_entries_last(tmp_path):
    f = tmp_path / "m"
    f.write_text(TEXT)
    assert dynet_format.is_dynet_text(str(f))
    pc = dy.ParameterCollection()
    W, E = pc.add_parameters((2, 3)), pc.add_lookup_parameters((3, 2))
    pc.populate(str(f))
    np.testing.assert_array_equal(W.as_array(), [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(W.grad_as_array(), [[1, 2, 3], [1, 2, 3]])
    np.testing.assert_array_equal(E.as_array(), [[1, 2], [3, 4], [5, 6]])


@pytest.mark.parametrize("text, match", [
    (TEXT.replace("{2,3} 194", "{2,4} 194"), "6 values where the header says 8"),
    (TEXT.replace("+5.0e+00\n", "nan\n", 1), "NaN"),
    (TEXT.replace("FULL_GRAD", "SOME_GRAD"), "not a DyNet parameter header"),
    (TEXT.replace("+1 +2", "+1 x"), "not all numbers"),
    (TEXT.splitlines(keepends=True)[0], "file ends"),
])
def test_bad_files_raise_with_the_line(tmp_path, text, match):
    f = tmp_path / "bad"
    f.write_text(text)
    pc = dy.ParameterCollection()
    pc.add_parameters((2, 3))
    pc.add_lookup_parameters((3, 2))
    with pytest.raises(ValueError, match=match):
        pc.populate(str(f))


def test_count_and_shape_mismatches_are_refused(tmp_path):
    f = tmp_path / "m"
    f.write_text(TEXT)
    pc = dy.ParameterCollection()
    pc.add_parameters((2, 3))
    with pytest.raises(ValueError, match="the file has 1 lookup parameters, the collection 0"):
        pc.populate(str(f))
    pc.add_lookup_parameters((3, 2))
    pc2 = dy.ParameterCollection()
    pc2.add_parameters((3, 2))
    pc2.add_lookup_parameters((3, 2))
    with pytest.raises(ValueError, match="shape"):
        pc2.populate(str(f))
    pc3 = dy.ParameterCollection()
    W = pc3.add_parameters((2, 3))
    before = W.as_array().copy()
    with pytest.raises(ValueError):
        pc3.populate(str(f), key="/")
    np.testing.assert_array_equal(W.as_array(), before)  # nothing written on a refused file


def test_key_selects_entries_by_name_prefix(tmp_path):
    f = tmp_path / "m"
    f.write_text(TEXT)
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((3, 2))
    pc.populate(str(f), key="/_1")
    np.testing.assert_array_equal(E.as_array(), [[1, 2], [3, 4], [5, 6]])


@needs_dynet
def test_dy_load_of_a_dynet_save_is_all_or_nothing(tmp_path):
    import pickle
    base = str(tmp_path / "basic")
    pc = dn.ParameterCollection()
    dn.save(base, [pc.add_parameters((2, 3), name="W"), pc.add_lookup_parameters((4, 2))])
    with open(base + ".meta", "ab") as f:  # a third object the .data does not hold
        f.write(pickle.dumps(("Parameters", "/missing"), protocol=2))
    ours = dy.ParameterCollection()
    ours.add_parameters(3, name="W")
    before = [(p.name(), p.as_array()) for p in ours._all()]
    with pytest.raises(dy.CheckpointError, match="missing"):
        dy.load(base, ours)
    assert [p.name() for p in ours._all()] == [n for n, _ in before]
    np.testing.assert_array_equal(ours._all()[0].as_array(), before[0][1])
    assert ours.add_parameters(2, name="W").name() == "/W_1"  # no name was taken by the failed load


@pytest.mark.parametrize("meta", [b"\x80\x02X\x0a", b"not a pickle at all"])
def test_a_corrupt_dynet_meta_raises_checkpoint_error(tmp_path, meta):
    """A truncated or foreign .meta next to valid DyNet text data: one clear error type."""
    base = str(tmp_path / "m")
    with open(base + ".data", "w") as f:
        f.write("#Parameter# /W {2} 0 ZERO_GRAD\n0.5 0.25\n")
    with open(base + ".meta", "wb") as f:
        f.write(meta)
    with pytest.raises(dy.CheckpointError):
        dy.load(base, dy.ParameterCollection())


def test_binary_garbage_after_a_dynet_header_raises_checkpoint_error(tmp_path):
    path = str(tmp_path / "g.data")
    with open(path, "wb") as f:
        f.write(b"#Parameter# /W {2} 0 ZERO_GRAD\n\xff\xfe\x00\x01\n")
    pc = dy.ParameterCollection()
    pc.add_parameters(2, name="W")
    with pytest.raises(dy.CheckpointError):
        pc.populate(path)
