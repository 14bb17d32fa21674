"""The cpu backend's block pool (kernels/cpython/block_pool.c, backends/cpu/pool.py): numpy.empty
and numpy.zeros for the compiled steps' small blocks, reusing an array only once the pool's
reference is its last one."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import dynagraph as dy
from dynagraph.backends import get_backend
from tests.refcheck import memory_growth, using

bk = pytest.importorskip("dynagraph._bookkeeping")
if not hasattr(bk, "BlockPool"):
    pytest.skip("dynagraph._bookkeeping without BlockPool", allow_module_level=True)

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def new_pool(max_array: int = 1 << 16, max_total: int = 1 << 20):
    return bk.BlockPool(np.empty, np.zeros, F32, F64, max_array, max_total)


def test_arrays_are_numpy_empty_s():
    p = new_pool()
    for shape, dt in (((1, 64), F32), ((3, 2, 5), F64), ((0, 4), F32), ((), F64)):
        a = p(shape, dt)
        assert type(a) is np.ndarray and a.shape == shape and a.dtype == dt
        assert a.flags.c_contiguous and a.flags.writeable and a.flags.owndata
        b = p.empty(shape, dt)
        assert b.shape == shape and b.dtype == dt


def test_an_array_is_reused_only_when_nothing_else_holds_it():
    p = new_pool()
    a = p((2, 8), F32)
    first = id(a)
    b = p((2, 8), F32)  # a is still held: a new array
    assert id(b) != first and p.hits == 0
    del a
    c = p((2, 8), F32)
    assert id(c) == first and p.hits == 1
    view = c[1:]  # a view holds its base
    del c
    assert id(p((2, 8), F32)) != first
    m = memoryview(view)  # so does a buffer export of the view
    del view
    assert all(id(p((2, 8), F32)) != first for _ in range(6))
    del m
    gc.collect()
    assert any(id(p((2, 8), F32)) == first for _ in range(8))


def test_zeros_clears_a_reused_array():
    p = new_pool()
    a = p.zeros((4, 16), F64)
    assert not a.any()
    a[...] = 7.0
    first = id(a)
    del a
    z = p.zeros((4, 16), F64)
    assert id(z) == first and not z.any()
    big = p.zeros((300, 300), F64)  # too large to keep: numpy.zeros' own
    assert not big.any() and p.kept == 1


def test_other_dtypes_shapes_and_large_arrays_are_not_kept():
    p = new_pool(max_array=1024, max_total=4096)
    ints = p((3,), np.dtype(np.int64))
    assert ints.dtype == np.int64
    listed = p([2, 3], F32)  # a list is numpy.empty's business, not kept
    assert listed.shape == (2, 3)
    big = p((1024,), F32)    # 4 KB > 1 KB
    assert big.shape == (1024,)
    assert p.kept == 0 and p.kept_bytes == 0
    small = [p((16,), F64) for _ in range(8)]  # 128 B each: 32 fit in 4 KB, all 8 kept
    assert p.kept == 8 and p.kept_bytes == 8 * 128
    more = [p((16,), F64) for _ in range(40)]  # past the total: made, not kept
    assert p.kept_bytes <= 4096 and len(more) == 40
    p.clear()
    assert p.kept == 0 and p.kept_bytes == 0
    del small, more, big, listed, ints


def test_a_full_ring_forgets_arrays_held_elsewhere():
    """Arrays held for good (a parameter's adopted gradient) neither stop the pool nor grow it."""
    cap = bk.BLOCK_POOL_RING_CAP
    p = new_pool(max_total=1 << 30)
    held = [p((1, 4), F32) for _ in range(cap + 100)]  # more than one ring keeps
    assert p.kept <= cap
    for _ in range(3):  # the ring is full of held arrays: each round makes and keeps new ones
        batch = [p((1, 4), F32) for _ in range(20)]
        del batch
    assert p.kept <= cap
    hits = p.hits
    for _ in range(cap // 40 + 10):  # once the cursor has gone round the held arrays, the rounds' own come back
        batch = [p((1, 4), F32) for _ in range(20)]
        del batch
    assert p.hits > hits and p.kept <= cap
    reused = sum(id(p((1, 4), F32)) in {id(h) for h in held} for _ in range(20))
    assert reused == 0
    del held


def test_a_ring_grows_to_keep_every_live_block_of_a_long_sentence():
    """A long BiRNN sentence holds over a thousand (1, 32) blocks at once: the ring grows past its
    first size (16) to keep them all, and the next sentence's blocks are all reused ones."""
    p = new_pool(max_total=1 << 30)
    live = [p((1, 32), F32) for _ in range(1500)]
    assert p.kept == 1500
    del live
    misses = p.misses
    again = [p((1, 32), F32) for _ in range(1500)]
    assert p.misses == misses and p.kept == 1500
    assert len({id(a) for a in again}) == 1500  # every one a different array
    del again


def test_bad_calls_raise():
    p = new_pool()
    with pytest.raises(TypeError):
        p((1,))
    with pytest.raises(TypeError):
        p((1,), F32, shape=(2,))
    with pytest.raises(TypeError):
        p.zeros((1,))
    with pytest.raises(ValueError):
        p((-1, 3), F32)
    with pytest.raises(ValueError):
        bk.BlockPool(np.empty, np.zeros, F32, F64, -1, 10)
    with pytest.raises(TypeError):
        bk.BlockPool(np.empty, np.zeros, F32, F64)


def test_the_cpu_backend_offers_it_and_numpy_does_not():
    assert get_backend("numpy").block_pool is None
    cpu = get_backend("cpu")
    assert cpu.block_pool is None or isinstance(cpu.block_pool, bk.BlockPool)


# ------------------------------------------------------------------ in training
def _sentences(n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [(list(rng.integers(0, 30, rng.integers(3, 9))), int(rng.integers(0, 4))) for _ in range(n)]


def _train(n: int, dtype: str, keep: list | None = None) -> tuple[list, list]:
    """A per-sentence BiLSTM classifier (builders, lookups, concatenation, softmax loss), one
    graph, backward() and update() per sentence; (losses, final parameter values)."""
    with using(dtype=dtype, seed=3):
        pc = dy.ParameterCollection()
        E = pc.add_lookup_parameters((30, 8))
        fw, bw = dy.VanillaLSTMBuilder(1, 8, 6, pc), dy.VanillaLSTMBuilder(1, 8, 6, pc)
        W, b = pc.add_parameters((4, 12)), pc.add_parameters(4)
        tr = dy.SimpleSGDTrainer(pc, 0.1)
        losses = []
        for words, label in _sentences(n):
            dy.renew_cg()
            xs = [E[w] for w in words]
            hf = fw.initial_state().transduce(xs)[-1]
            hb = bw.initial_state().transduce(xs[::-1])[-1]
            h = dy.concatenate([hf, hb])
            loss = dy.pickneglogsoftmax(W * h + b, label)
            losses.append(loss.value())
            if keep is not None:
                keep.append((h.npvalue(), h.npvalue().copy()))
            loss.backward()
            tr.update()
        return losses, [p.as_array().copy() for p in pc.parameters_list() + pc.lookup_parameters_list()]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_training_is_bit_identical_with_and_without_the_pool(monkeypatch, dtype):
    be = get_backend()
    pool = be.block_pool
    if pool is None:
        pytest.skip("the backend has no block pool")
    hits = pool.hits
    with_pool = _train(12, dtype)
    assert pool.hits > hits  # the blocks came from the pool
    monkeypatch.setattr(be, "block_pool", None)
    without = _train(12, dtype)
    assert with_pool[0] == without[0]
    for a, b in zip(with_pool[1], without[1]):
        assert np.array_equal(a, b)


def test_values_the_user_kept_are_never_overwritten():
    """npvalue() arrays of earlier sentences keep their values while later sentences reuse blocks."""
    if get_backend().block_pool is None:
        pytest.skip("the backend has no block pool")
    keep: list = []
    _train(15, "float32", keep)
    for got, copy in keep:
        assert np.array_equal(got, copy)


def test_repeated_sentences_do_not_grow_memory():
    if get_backend().block_pool is None:
        pytest.skip("the backend has no block pool")
    first, last = memory_growth(lambda: _train(4, "float32"))
    assert last - first < 256 * 1024, (first, last)


def test_the_environment_turns_the_pool_off(monkeypatch):
    from dynagraph.backends.cpu import pool
    monkeypatch.setenv("DYNAGRAPH_BLOCK_POOL", "0")
    assert pool.block_pool() is None
    monkeypatch.setenv("DYNAGRAPH_BLOCK_POOL", "1")
    made = pool.block_pool()
    assert made is None or made is pool.block_pool()  # one per process
