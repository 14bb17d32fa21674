"""update() of a whole collection in one C call (backends/cpu/optim.CollectionStep) against the
per-parameter path it replaces: the same values, optimizer state, gradients and counters."""
import numpy as np
import pytest

import dynagraph as dy
from backend_params import unavailable
from refcheck import using

pytestmark = pytest.mark.skipif(unavailable("cpu") is not None, reason="compiled kernels not built")


@pytest.fixture(autouse=True)
def _cpu_backend():
    """Parameters made here live on the cpu backend, whatever an earlier test left selected."""
    saved = dy.config.config.backend
    dy.config.set(backend="cpu")
    yield
    dy.config.set(backend=saved)

KINDS = {"sgd": lambda pc: dy.SimpleSGDTrainer(pc, 0.05),
         "momentum": lambda pc: dy.MomentumSGDTrainer(pc, 0.05, mom=0.8),
         "adagrad": lambda pc: dy.AdagradTrainer(pc, 0.05),
         "adam": lambda pc: dy.AdamTrainer(pc, alpha=0.05)}


def _model(sparse_rows: bool):
    """A dense matrix and vector, a frozen matrix, a lookup table and a sub-collection's vector."""
    rng = np.random.default_rng(0)
    pc = dy.ParameterCollection()
    ps = {"W": pc.add_parameters((3, 4), init=rng.normal(size=(3, 4))),
          "b": pc.add_parameters(3, init=rng.normal(size=3)),
          "F": pc.add_parameters((2, 2), init=rng.normal(size=(2, 2))),
          "E": pc.add_lookup_parameters((7, 4), init=rng.normal(size=(7, 4)))}
    ps["s"] = pc.add_subcollection("sub").add_parameters(5, init=rng.normal(size=5))
    ps["F"].set_updated(False)
    return pc, ps


def _grads(ps, rng, scale):
    for k in ("W", "b", "F", "s"):
        ps[k].grad[...] = rng.normal(size=ps[k].grad.shape) * scale
    rows = rng.integers(0, 7, size=3)
    ps["E"].add_sparse_grad(rows, (rng.normal(size=(3, 4)) * scale).astype(ps["E"].grad.dtype))


def _run(kind, clip, sparse, compiled, steps=5):
    pc, ps = _model(sparse)
    t = KINDS[kind](pc)
    t.set_clip_threshold(clip)
    t.set_sparse_updates(sparse)
    if not compiled:
        t._collection_rule = None  # the per-parameter path
    rng = np.random.default_rng(1)
    for step in range(steps):
        _grads(ps, rng, 4.0 if step % 2 else 0.3)  # odd steps exceed the clipping threshold
        t.update()
    states = {k: [s.copy() for s in t._states(p)] for k, p in ps.items()}
    return t, {k: p.values.copy() for k, p in ps.items()}, {k: p.grad.copy() for k, p in ps.items()}, states, ps


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("clip", [0.0, 5.0])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_one_call_update_matches_the_per_parameter_path(kind, clip, sparse):
    with using(dtype="float64"):
        t1, v1, g1, s1, ps = _run(kind, clip, sparse, compiled=True)
        t0, v0, g0, s0, _ = _run(kind, clip, sparse, compiled=False)
    assert t1._collection is not None and t1._collection[1] is not None, "the compiled step was used"
    assert (t1.updates, t1.clips) == (t0.updates, t0.clips) and t1.clips == (2 if clip else 0)
    for k in v0:
        if clip:  # the global norm is summed in float64 here, per parameter by BLAS there
            np.testing.assert_allclose(v1[k], v0[k], rtol=1e-12, atol=1e-12, err_msg=k)
            for a, b in zip(s1[k], s0[k]):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=k)
        else:  # the same arithmetic, bit for bit
            np.testing.assert_array_equal(v1[k], v0[k], err_msg=k)
            for a, b in zip(s1[k], s0[k]):
                np.testing.assert_array_equal(a, b, err_msg=k)
        np.testing.assert_array_equal(g1[k], g0[k], err_msg=k)  # cleared, but a frozen one's kept
    assert ps["F"].grad.any() and not ps["W"].grad.any()
    assert ps["E"].touched_rows().size == 0


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_float32_without_clipping_is_bit_identical(kind):
    t1, v1, _, _, _ = _run(kind, 0.0, True, compiled=True)
    t0, v0, _, _, _ = _run(kind, 0.0, True, compiled=False)
    for k in v0:
        assert v1[k].dtype == np.float32
        np.testing.assert_array_equal(v1[k], v0[k], err_msg=k)


@pytest.mark.parametrize("clip", [0.0, 5.0])
def test_many_tables_and_touched_rows(clip):
    """The compiled step keeps the rows its norm pass found for the update: past its stack buffer
    (512 rows: 1500 touched here, in rows across the 32-byte mask words) and with more parameters
    than its stack offsets (70 tables), it still equals the per-parameter path."""
    def run(compiled):
        rng = np.random.default_rng(3)
        pc = dy.ParameterCollection()
        tables = [pc.add_lookup_parameters((2000 if k == 0 else 40, 3), init=rng.normal(size=(2000 if k == 0 else 40, 3)))
                  for k in range(70)]
        t = dy.AdagradTrainer(pc, 0.05)
        t.set_clip_threshold(clip)
        if not compiled:
            t._collection_rule = None
        for step in range(3):
            for k, e in enumerate(tables):
                n = e.values.shape[0]
                rows = rng.choice(n, size=1500 if k == 0 else k % 7, replace=False)
                if k == 0:
                    rows[:2] = (n - 1, 31)  # a mask's last row and a 32-byte word's last byte
                e.add_sparse_grad(rows, rng.normal(size=(rows.size, 3)) * (0.2 if step else 3.0))
            t.update()
        assert all(e.touched_rows().size == 0 and not e.grad.any() for e in tables)
        return t, [e.values.copy() for e in tables]
    with using(dtype="float64"):
        t1, v1 = run(True)
        t0, v0 = run(False)
    assert t1._collection is not None and t1._collection[1] is not None, "the compiled step was used"
    assert t1.clips == t0.clips
    for a, b in zip(v1, v0):
        if clip:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        else:
            np.testing.assert_array_equal(a, b)


def test_the_step_follows_changes_to_the_collection():
    pc = dy.ParameterCollection()
    a = pc.add_parameters(2, init=np.zeros(2))
    t = dy.SimpleSGDTrainer(pc, learning_rate=1.0)
    a.grad[...] = 1.0
    t.update()
    first = t._collection[1]
    b = pc.add_parameters(2, init=np.zeros(2))  # added after the first update: trained too
    a.grad[...] = b.grad[...] = 1.0
    t.update()
    assert t._collection[1] is not first
    np.testing.assert_allclose(a.values, -2.0)
    np.testing.assert_allclose(b.values, -1.0)
    a.set_updated(False)  # frozen after the step was built
    a.grad[...] = b.grad[...] = 1.0
    t.update()
    np.testing.assert_allclose(a.values, -2.0)
    np.testing.assert_allclose(b.values, -2.0)
    a.set_updated(True)
    a.values = np.full(2, 10.0, dtype=a.values.dtype)  # storage replaced: the step re-reads it
    a.grad[...] = b.grad[...] = 1.0
    t.update()
    np.testing.assert_allclose(a.values, 10.0 - 1.0)
    np.testing.assert_allclose(b.values, -3.0)


def test_backends_without_the_capability_keep_the_per_parameter_path():
    with using(dtype="float64"):
        dy.config.set(backend="numpy")
        try:
            pc = dy.ParameterCollection()
            p = pc.add_parameters(2, init=np.zeros(2))
            t = dy.AdamTrainer(pc)
            p.grad[...] = 1.0
            t.update()
        finally:
            dy.config.set(backend="cpu")
    assert t._collection[1] is None and t.updates == 1 and not p.grad.any()
    assert p.values[0] == pytest.approx(-0.001)


def test_amsgrad_has_no_compiled_step():
    pc = dy.ParameterCollection()
    p = pc.add_parameters(2, init=np.zeros(2))
    t = dy.AmsgradTrainer(pc)
    p.grad[...] = 1.0
    t.update()
    assert t._collection is None and not p.grad.any()


def test_collection_step_checks_its_arrays():
    from dynagraph.backends.cpu import optim
    w = np.zeros((3, 2))
    with pytest.raises(ValueError, match="rule"):
        optim.CollectionStep("rmsprop", [])
    with pytest.raises(ValueError, match="gradient"):
        optim.CollectionStep("sgd", [(w, np.zeros((3, 2), np.float32), (), None, optim.DENSE)])
    with pytest.raises(ValueError, match="state"):
        optim.CollectionStep("momentum", [(w, np.zeros((3, 2)), (np.zeros(6),), None, optim.DENSE)])
    with pytest.raises(ValueError, match="touched"):
        optim.CollectionStep("sgd", [(w, np.zeros((3, 2)), (), None, optim.ROWS)])
    with pytest.raises(ValueError, match="touched"):
        optim.CollectionStep("sgd", [(w, np.zeros((3, 2)), (), np.zeros(2, bool), optim.ROWS)])
    with pytest.raises(ValueError, match="contiguous"):
        optim.CollectionStep("sgd", [(w, np.zeros((2, 3)).T, (), None, optim.DENSE)])


def test_training_steps_reuse_one_compiled_step():
    """backward() accumulates into the same gradient arrays (`p.grad += g` stores the array
    back): that must not count as a new layout, or every update() would rebuild the step."""
    pc = dy.ParameterCollection()
    W = pc.add_parameters((3, 4))
    E = pc.add_lookup_parameters((10, 4))
    t = dy.SimpleSGDTrainer(pc)
    steps = set()
    for w in (1, 2, 3):
        dy.renew_cg()
        loss = dy.pickneglogsoftmax(W * dy.lookup(E, w), 1)
        loss.value()
        loss.backward()
        t.update()
        steps.add(id(t._collection[1]))
    assert len(steps) == 1
