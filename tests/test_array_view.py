"""The compiled steps' direct numpy views (kernels/cpython/array_view.c: dg_get_buffer).

A plain float32/float64 array is read through numpy's struct fields instead of the buffer
protocol. The first such view is compared with the protocol's export, field by field; these
tests check that the comparison passed on the installed numpy (else every view silently takes
the slower protocol path), and that inputs in other layouts (other byte orders, Fortran order,
strided or read-only views, subclasses, other dtypes), which the graph normalizes or the direct
path refuses, give the same values and gradients as plain ones; and, through a compiled
entry point that reads its arguments' buffers directly (`_bookkeeping.add_arrays`), that
arrays the direct path must refuse are read as the buffer protocol exports them: a
byte-swapped, strided, read-only or half-precision operand is refused, not misread.
"""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import recording
from refcheck import using

NATIVE = recording.NATIVE
needs_native = pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "array_view_state"),
                                  reason="dynagraph._bookkeeping is not built")


def _run(x: np.ndarray, table: np.ndarray):
    """Values and gradients of a small graph reading x as an input and `table` as lookup rows."""
    pc = dy.ParameterCollection()
    W = pc.add_parameters((4, 4), init=np.arange(16, dtype=np.float64).reshape(4, 4) / 16.0)
    E = pc.add_lookup_parameters((3, 4), init=np.asarray(table, dtype=np.float64))
    dy.renew_cg()
    h = dy.inputTensor(x)
    outs = [dy.tanh(dy.parameter(W) * h + dy.lookup(E, k)) for k in range(3)]
    loss = dy.esum([dy.sum_elems(dy.cmult(o, o)) for o in outs])
    value = loss.value()
    loss.backward()
    return value, [o.npvalue() for o in outs], W.grad_as_array(), E.grad_as_array()


@needs_native
def test_direct_views_match_the_buffer_protocol_on_this_numpy():
    with using("float32"):
        _run(np.linspace(-1, 1, 4), np.ones((3, 4)))
    assert NATIVE.array_view_state() == 1, "numpy's array layout differs: every view takes the protocol path"


class _Sub(np.ndarray):
    pass


PLAIN = np.linspace(-1.0, 1.0, 4)
ODD_LAYOUTS = {
    "big-endian": PLAIN.astype(">f8"),
    "strided": np.repeat(PLAIN, 2)[::2],
    "fortran 2-d column": np.asfortranarray(PLAIN.reshape(4, 1))[:, 0],
    "read-only": np.frombuffer(PLAIN.tobytes(), dtype=np.float64),
    "subclass": PLAIN.copy().view(_Sub),
    "int": np.array([-1, 0, 1, 2]),
    "float16": PLAIN.astype(np.float16),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", sorted(ODD_LAYOUTS))
def test_arrays_the_direct_path_refuses_give_the_same_numbers(layout, dtype):
    x = ODD_LAYOUTS[layout]
    table = np.arange(12, dtype=np.float64).reshape(3, 4) / 12.0
    with using(dtype):
        want = _run(np.array(x, dtype=np.float64), table)
        got = _run(x, table)
    assert got[0] == want[0]
    for a, b in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_reads_refuse_what_the_protocol_refuses(dtype):
    """add_arrays takes C-contiguous, writable float pairs of one dtype: plain operands (the
    direct path) and a subclass (the protocol path) are added exactly; every other layout
    raises and leaves the destination as it was, as numpy's own export makes it do."""
    add = NATIVE.add_arrays
    src = np.linspace(-1.0, 1.0, 6).astype(dtype)
    dst = np.arange(6, dtype=dtype)
    want = dst + src
    add([dst], [src])
    np.testing.assert_array_equal(dst, want)
    sub = np.arange(6, dtype=dtype).view(_Sub)
    add([sub], [src])
    np.testing.assert_array_equal(np.asarray(sub), np.arange(6, dtype=dtype) + src)
    read_only = np.arange(6, dtype=dtype)
    read_only.flags.writeable = False
    refused = {
        "byte-swapped source": ([np.zeros(6, dtype)], [src.astype(src.dtype.newbyteorder(">"))]),
        "strided source": ([np.zeros(6, dtype)], [np.repeat(src, 2)[::2]]),
        "read-only destination": ([read_only], [src]),
        "float16 source": ([np.zeros(6, dtype)], [src.astype(np.float16)]),
    }
    for what, (dsts, srcs) in refused.items():
        before = [d.copy() for d in dsts]
        with pytest.raises(TypeError):
            add(dsts, srcs)
        for d, b in zip(dsts, before):
            np.testing.assert_array_equal(d, b, err_msg=what)


def _c_strides(a: np.ndarray) -> tuple:
    """The strides numpy gives a fresh C-ordered array of a's shape and dtype."""
    out, step = [], a.itemsize
    for n in reversed(a.shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_parameter_and_weight_gradient_blocks_have_c_strides(dtype):
    """A parameter's block is its values as one row, (1,) + shape, and so is a weight's gradient
    block. Made as values[None], the new axis had stride 0: numpy still calls that contiguous,
    but the direct view takes canonical strides only, so every read of such a block went through
    numpy's buffer protocol (about 45 times per sentence of a CBOW classifier). ops.base.one_row
    makes them with C strides, as views of the parameter's storage."""
    with using(dtype):
        pc = dy.ParameterCollection()
        W = pc.add_parameters((4, 4), init=np.arange(16, dtype=np.float64).reshape(4, 4) / 16.0)
        b = pc.add_parameters(4, init=np.ones(4))
        E = pc.add_lookup_parameters((3, 4), init=np.arange(12, dtype=np.float64).reshape(3, 4) / 12.0)
        dy.renew_cg()
        hs = [dy.esum([dy.lookup(E, k) for k in ks]) for ks in ((0, 2), (1,))]
        loss = dy.esum([dy.sum_elems(dy.tanh(dy.parameter(W) * h + dy.parameter(b))) for h in hs])
        loss.value()
        loss.backward()
        cg = dy.cg()
        params = {id(p.values): p for p in (W, b, E)}
        seen = 0
        for leaf in cg._leaves.values():
            block = cg.blocks[cg.blk[leaf]]
            p = cg.leaf_param(cg.blk[leaf])
            assert block.shape == (1,) + p.values.shape
            assert block.strides == _c_strides(block), (block.shape, block.strides)
            assert np.shares_memory(block, p.values)  # a view of the storage, not a copy
            seen += id(p.values) in params
        assert seen == 3
        grads = [g for g in cg.grad_blocks if isinstance(g, np.ndarray) and g.ndim == 3]
        assert grads, "the weight's gradient block (two products: G^T X of two rows)"
        for g in grads:
            assert g.strides == _c_strides(g), (g.shape, g.strides)
        hv = [h.npvalue() for h in hs]
        want = sum(np.outer(1 - np.tanh(W.as_array() @ x + 1) ** 2, x) for x in hv)
        np.testing.assert_allclose(W.grad_as_array(), want, rtol=1e-5)
