"""DyNet's layout in every from-numpy and to-numpy path, ranks 1 to 4 per entry.

DyNet stores tensors column-major. Its Python paths mostly hide that (a (2, 3) numpy array
gives a (2, 3) parameter), except where they expose it: lookup_parameters_from_numpy with a
matrix (or more) per row, init_row with a flat list, vec_value. The same program must give the
same numbers in both libraries, so dynagraph copies each path; dynet38 is the oracle.
"""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph.parameters import dynet_lookup_layout
from refcheck import using

dn = pytest.importorskip("dynet")

ENTRY_SHAPES = [(3,), (2, 3), (2, 3, 2), (2, 2, 3, 2)]
RTOL = 1e-4


def _arr(shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32).astype(np.float64)


@pytest.fixture(autouse=True)
def _float32():
    with using(dtype="float32", seed=0):
        yield


def _paths(m, entry: tuple) -> dict:
    """Every from/to-numpy path of one library, on the same arrays."""
    table = _arr((4,) + entry, seed=1)
    pc = m.ParameterCollection()
    E = pc.lookup_parameters_from_numpy(table)
    P = pc.parameters_from_numpy(_arr(entry, seed=2))
    F = pc.add_lookup_parameters((3,) + entry)
    F.init_row(1, list(_arr(entry, seed=3).ravel()))
    Q = pc.add_parameters(entry)
    Q.set_value(_arr(entry, seed=4))
    m.renew_cg()
    x = m.inputTensor(_arr(entry, seed=5))
    xb = m.inputTensor(_arr(entry + (2,), seed=6), batched=True)
    w = m.inputTensor(_arr(entry, seed=7))
    loss = m.sum_elems(m.cmult(E[2] + m.parameter(P) + F[1] + m.parameter(Q) + x, w))
    loss.value()
    loss.backward()
    return {
        "lookup_parameters_from_numpy as_array": E.as_array(),
        "lookup_parameters_from_numpy npvalue": np.stack([E[i].npvalue() for i in range(4)]),
        "row_as_array": E.row_as_array(2),
        "parameters_from_numpy npvalue": m.parameter(P).npvalue(),
        "parameters_from_numpy as_array": P.as_array(),
        "init_row list": F[1].npvalue(),
        "set_value": Q.as_array(),
        "inputTensor npvalue": x.npvalue(),
        "inputTensor vec_value": np.array(x.vec_value()),
        "inputTensor batched npvalue": xb.npvalue(),
        "lookup vec_value": np.array(E[3].vec_value()),
        "loss": np.array(loss.value()),
        "lookup grad": E.grad_as_array(),
        "parameter grad": P.grad_as_array(),
        "init_row grad": F.grad_as_array(),
    }


@pytest.mark.parametrize("entry", ENTRY_SHAPES, ids=lambda s: f"rank{len(s)}")
def test_every_layout_path_matches_dynet(entry):
    theirs, ours = _paths(dn, entry), _paths(dy, entry)
    for name, want in theirs.items():
        got = ours[name]
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("entry", ENTRY_SHAPES, ids=lambda s: f"rank{len(s)}")
def test_weights_after_an_update_match_dynet(entry):
    table = _arr((3,) + entry, seed=8)
    got = []
    for m in (dn, dy):
        pc = m.ParameterCollection()
        E = pc.lookup_parameters_from_numpy(table)
        trainer = m.SimpleSGDTrainer(pc, 0.5)
        for step in range(2):
            m.renew_cg()
            loss = m.squared_norm(m.tanh(E[step] * 2.0) - m.inputTensor(_arr(entry, seed=9)))
            loss.value()
            loss.backward()
            trainer.update()
        got.append(E.as_array())
    np.testing.assert_allclose(got[1], got[0], rtol=RTOL, atol=1e-6)


def test_layout_formula_is_identity_for_vectors_and_not_beyond():
    a = np.arange(24.0).reshape(4, 6)
    assert dynet_lookup_layout(a) is a
    b = np.arange(24.0).reshape(4, 2, 3)
    np.testing.assert_array_equal(dynet_lookup_layout(b)[1], b[1].ravel().reshape((2, 3), order="F"))
