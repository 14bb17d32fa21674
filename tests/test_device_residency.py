"""Parameters, gradients and optimizer state stay on the backend's device.

Run on the `checked` backend (tests/checked_backend.py): its arrays refuse every implicit
conversion to host data, and every explicit copy (`to_host`, `.get()`) is recorded with
the line that asked. A training loop (lookups, forward, backward, each trainer's update)
must give the numpy backend's values bit for bit while copying to the host only the
scalars it has to: the loss that `.value()` returns, the loss `backward()` checks for
nan/inf, and the one global gradient norm per update that clipping needs.
"""
from __future__ import annotations

import numpy as np
import pytest

import checked_backend as cb
import dynagraph as dy
from checked_backend import DeviceArray, HostTransferError
from dynagraph.backends import get_backend, register_backend
from refcheck import using

cb.install()

TRAINERS = ["SimpleSGDTrainer", "MomentumSGDTrainer", "AdagradTrainer", "AdadeltaTrainer", "RMSPropTrainer",
            "AdamTrainer", "AmsgradTrainer"]
# the only places that may copy device values to the host during training (one scalar each)
TRAINING_DOORS = ("dynagraph/expression.py", "dynagraph/graph.py", "nn/trainers.py")


@pytest.fixture
def on(request):
    """on(name): run the rest of the test body's models on backend `name`."""
    old = dy.config.config.backend

    def switch(name: str) -> None:
        dy.config.set(backend=name)
    yield switch
    dy.config.set(backend=old)


def transfers_since(n: int) -> list:
    return cb.TRANSFERS[n:]


# ------------------------------------------------------------------ the checker is honest
def test_device_array_refuses_every_implicit_host_door():
    xp = get_backend("checked").xp
    x = xp.asarray(np.arange(6.0).reshape(2, 3))
    host = np.zeros((2, 3))
    doors = {
        "np.asarray": lambda: np.asarray(x), "np.array": lambda: np.array(x), "float": lambda: float(x.sum()),
        "int": lambda: int(x[0, 0]), "bool": lambda: bool(x.any()), "item": lambda: x.sum().item(),
        "tolist": lambda: x.tolist(), "tobytes": lambda: x.tobytes(), "index": lambda: [1, 2][x[0, 1]],
        "assign into host": lambda: host.__setitem__(Ellipsis, x),
        "ufunc out= host": lambda: np.add(host, x, out=host), "add.at into host": lambda: np.add.at(host, [0], x[0]),
        "np function out= host": lambda: np.sum(x, axis=0, out=host[0]),
        "in-place host op": lambda: host.__iadd__(x),
        "host operand in device arithmetic": lambda: x + np.ones((2, 3)),
        "host operand, reflected": lambda: np.ones((2, 3)) * x,
    }
    for what, door in doors.items():
        with pytest.raises(HostTransferError):
            door()
            pytest.fail(f"{what} let device values through")
    with pytest.raises(TypeError):
        memoryview(x)
    assert not hasattr(x, "__array_interface__") and not hasattr(x, "__array_struct__")
    assert not host.any(), "nothing reached the host array"
    # what stays on the device stays a device array, reductions included (CuPy's 0-d arrays)
    for r in (x * 2 + 1, x.sum(), np.tanh(x), xp.matmul(x, x.T), x[0], xp.vdot(x, x), x.T.copy(), list(x)[0]):
        assert type(r) is DeviceArray
    n = len(cb.TRANSFERS)
    np.testing.assert_array_equal(get_backend("checked").to_host(x), np.arange(6.0).reshape(2, 3))
    assert transfers_since(n) == [(6, "tests/test_device_residency.py:" + str(_line_of_last_to_host()))]


def _line_of_last_to_host() -> int:
    import inspect
    src, start = inspect.getsourcelines(test_device_array_refuses_every_implicit_host_door)
    return start + next(i for i, s in enumerate(src) if "to_host(x)" in s)


def test_backend_registry():
    with pytest.raises(ValueError, match="built in"):
        register_backend("cpu", cb.CheckedBackend)
    with pytest.raises(ValueError, match="checked"):
        get_backend("no-such-backend")


# --------------------------------------------------------------- where the state lives
def test_parameters_gradients_and_optimizer_state_live_on_the_device(on, float64):
    on("checked")
    pc = dy.ParameterCollection()
    W, E = pc.add_parameters((3, 2), init=0.5), pc.add_lookup_parameters((4, 2))
    tr = dy.AdamTrainer(pc)
    loss = dy.sum_elems(dy.tanh(W * E[1]))
    loss.backward()
    tr.update()
    for arr in (W.values, W.grad, E.values, E.grad, *tr.state_arrays(W), *tr.state_arrays(E)):
        assert type(arr) is DeviceArray
    n = len(cb.TRANSFERS)
    for host in (W.as_array(), W.grad_as_array(), E.row_as_array(1), dy.parameter(W).npvalue()):
        assert type(host) is np.ndarray
    assert [size for size, _ in transfers_since(n)] == [6, 6, 2, 6]
    E.init_row(2, [1.0, 2.0])
    W.set_value(np.ones((3, 2)))
    np.testing.assert_array_equal(E.row_as_array(2), [1.0, 2.0])
    np.testing.assert_array_equal(W.as_array(), np.ones((3, 2)))
    assert type(W.values) is DeviceArray and type(E.values) is DeviceArray


# ------------------------------------------------------------ training, every trainer
def _train(backend: str, trainer: str, sparse: bool, clip: float, dtype: str, steps: int = 3):
    """A lookup + dense model, one parameter frozen, trained `steps` times; returns host
    copies of every value, gradient and optimizer state, the losses and the transfers."""
    with using(dtype=dtype, seed=0):
        dy.config.set(backend=backend)
        pc = dy.ParameterCollection()
        W, b, E = pc.add_parameters((4, 3)), pc.add_parameters(4), pc.add_lookup_parameters((7, 3))
        frozen = pc.add_parameters((4, 4))
        tr = getattr(dy, trainer)(pc)
        tr.set_sparse_updates(sparse)
        tr.set_clip_threshold(clip)
        frozen.set_updated(False)
        n, losses = len(cb.TRANSFERS), []
        for step in range(steps):
            dy.renew_cg()
            h = [dy.tanh(frozen * dy.tanh(W * E[w] + b)) for w in (1, 5, 1, 6)]
            loss = dy.esum([dy.pickneglogsoftmax(x, w % 4) for x, w in zip(h, (1, 5, 1, 6))])
            losses.append(loss.value())
            loss.backward()
            tr.update()
        moved = transfers_since(n)
        host = [p.as_array() for p in (W, b, E, frozen)] + [p.grad_as_array() for p in (W, b, E, frozen)]
        states = [get_backend(backend).to_host(s) for p in (W, b, E) for s in tr.state_arrays(p)]
        return losses, host + states, moved


@pytest.mark.parametrize("trainer", TRAINERS)
@pytest.mark.parametrize("sparse,clip", [(True, 5.0), (False, 0.05)], ids=["sparse", "dense-clipped"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_trainer_on_the_device_matches_numpy_and_moves_only_scalars(on, trainer, sparse, clip, dtype):
    losses_ref, ref, _ = _train("numpy", trainer, sparse, clip, dtype)
    losses, got, moved = _train("checked", trainer, sparse, clip, dtype)
    assert losses == losses_ref
    for a, r in zip(got, ref):
        np.testing.assert_array_equal(a, r)
    assert all(size == 1 for size, _ in moved), moved
    assert sorted({where.rsplit(":", 1)[0] for _, where in moved}) == sorted(TRAINING_DOORS), moved
    assert len(moved) == 3 * 3, "per step: the loss .value(), backward()'s nan check, the clipping norm"


def test_non_finite_gradient_raises_and_changes_nothing_on_the_device(on):
    on("checked")
    pc = dy.ParameterCollection()
    W, E = pc.add_parameters((2, 3)), pc.add_lookup_parameters((5, 3))
    t = dy.AdamTrainer(pc)
    before = [W.as_array(), E.as_array()]
    W.grad[...] = 1.0
    E.add_sparse_grad(np.array([2]), get_backend().to_device(np.array([[np.inf, 0, 0]], np.float32)))
    with pytest.raises(dy.NonFiniteError, match=r"/_1 \(5, 3\)"):
        t.update()
    np.testing.assert_array_equal(W.as_array(), before[0])
    np.testing.assert_array_equal(E.as_array(), before[1])


def test_restart_and_parameters_added_after_the_trainer(on, float64):
    def run(backend):
        dy.config.set(backend=backend, random_seed=0)
        pc = dy.ParameterCollection()
        W = pc.add_parameters((2, 2))
        t = dy.MomentumSGDTrainer(pc)
        out = []
        for step in range(4):
            if step == 2:
                V = pc.add_parameters((2, 2))
                t.restart(0.05)
            dy.renew_cg()
            x = dy.inputVector([1.0, -2.0])
            loss = dy.squared_norm(W * x + (V * x if step >= 2 else 0 * x))
            loss.backward()
            t.update()
            out.append(W.as_array())
        return out + [V.as_array()]
    for a, r in zip(run("checked"), run("numpy")):
        np.testing.assert_array_equal(a, r)


# ------------------------------------------------------------------- end to end
def _bilstm_tagger(steps: int = 2):
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((12, 5))
    fwd, bwd = dy.LSTMBuilder(1, 5, 6, pc), dy.LSTMBuilder(1, 5, 6, pc)
    O = pc.add_parameters((3, 12))
    tr = dy.AdamTrainer(pc)
    sents = [[1, 4, 2, 7], [3, 3, 9], [11, 0, 5, 6, 2]]
    losses = []
    for _ in range(steps):
        dy.renew_cg()
        terms = []
        for s in sents:
            xs = [E[w] for w in s]
            fs = fwd.initial_state().transduce(xs)
            bs = bwd.initial_state().transduce(xs[::-1])[::-1]
            terms += [dy.pickneglogsoftmax(O * dy.concatenate([f, b]), w % 3) for f, b, w in zip(fs, bs, s)]
        loss = dy.esum(terms)
        losses.append(loss.value())
        loss.backward()
        tr.update()
    return losses, [p.as_array() for p in pc.parameters_list() + pc.lookup_parameters_list()]


def _treelstm(steps: int = 2):
    H = 4
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((10, H))
    WS = [pc.add_parameters((H, 2 * H)) for _ in "iouf"]
    bs = [pc.add_parameters(H) for _ in "iouf"]
    O = pc.add_parameters((2, H))
    tr = dy.AdagradTrainer(pc)

    def node(t):
        if isinstance(t, int):
            return dy.tanh(E[t]), dy.zeros(H)
        (h1, c1), (h2, c2) = node(t[0]), node(t[1])
        x = dy.concatenate([h1, h2])
        i, o = (dy.logistic(WS[k] * x + bs[k]) for k in range(2))
        u = dy.tanh(WS[2] * x + bs[2])
        f = dy.logistic(WS[3] * x + bs[3])
        c = dy.cmult(i, u) + dy.cmult(f, c1 + c2)
        return dy.cmult(o, dy.tanh(c)), c
    trees = [((1, 2), (3, (4, 5))), (6, (7, 8)), ((9, 0), 1)]
    losses = []
    for _ in range(steps):
        dy.renew_cg()
        loss = dy.esum([dy.pickneglogsoftmax(O * node(t)[0], k % 2) for k, t in enumerate(trees)])
        losses.append(loss.value())
        loss.backward()
        tr.update()
    return losses, [p.as_array() for p in pc.parameters_list() + pc.lookup_parameters_list()]


@pytest.mark.parametrize("model", [_bilstm_tagger, _treelstm], ids=["bilstm-tagger", "treelstm"])
@pytest.mark.parametrize("scheduler", ["none", "agenda", "depth"])
def test_end_to_end_training_on_the_device_matches_numpy(on, float64, model, scheduler):
    def run(backend):
        dy.config.set(backend=backend, random_seed=0, scheduler=scheduler)
        return model()
    losses_ref, ref = run("numpy")
    n = len(cb.TRANSFERS)
    losses, got = run("checked")
    moved = transfers_since(n)
    np.testing.assert_allclose(losses, losses_ref, rtol=1e-10)
    for a, r in zip(got, ref):
        np.testing.assert_allclose(a, r, rtol=1e-10, atol=1e-12)
    training = [m for m in moved if not m[1].startswith("dynagraph/parameters.py")]  # the final as_array()s
    assert all(size == 1 for size, _ in training), training
    assert {w.rsplit(":", 1)[0] for _, w in training} <= set(TRAINING_DOORS), training


def test_saving_and_loading_copy_through_the_doors(on, tmp_path, float64):
    on("checked")
    pc = dy.ParameterCollection()
    W, E = pc.add_parameters((3, 2)), pc.add_lookup_parameters((4, 2))
    pc.save(str(tmp_path / "m"))
    dy.save(str(tmp_path / "o"), [W, E])
    want = [W.as_array(), E.as_array()]
    W.zero()
    E.zero()
    pc.populate(str(tmp_path / "m"))
    np.testing.assert_array_equal(W.as_array(), want[0])
    np.testing.assert_array_equal(E.as_array(), want[1])
    W2, E2 = dy.load(str(tmp_path / "o"), dy.ParameterCollection())
    assert type(W2.values) is DeviceArray and type(E2.values) is DeviceArray
    np.testing.assert_array_equal(W2.as_array(), want[0])
    np.testing.assert_array_equal(E2.as_array(), want[1])
