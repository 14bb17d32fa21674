"""The second core (dynagraph/overlap.py): backward() and update() deferred to a worker thread
give bit-identical losses, values and gradients; every read of parameters waits; errors surface."""
import threading
import time

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import overlap
from dynagraph.config import config
from dynagraph.errors import NonFiniteError

TRAINERS = [dy.SimpleSGDTrainer, dy.AdamTrainer, dy.MomentumSGDTrainer, dy.AdagradTrainer]


@pytest.fixture
def two_cores(monkeypatch):
    """Overlap on whatever the test machine has; settings restored afterwards."""
    monkeypatch.setattr(overlap, "_CORES", 2)
    monkeypatch.setattr(config, "threads", None)
    monkeypatch.setattr(config, "overlap", True)
    yield
    overlap.wait()


class _dtype:
    """float64 inside, the previous dtype after."""
    def __init__(self, dtype: str):
        self.dtype = dtype

    def __enter__(self):
        self.old = config.dtype
        dy.config.set(dtype=self.dtype)

    def __exit__(self, *exc):
        config.dtype = self.old


def _model(H: int = 12, V: int = 30):
    dy.config.set(random_seed=5)
    pc = dy.ParameterCollection()
    return pc, pc.add_parameters((H, H)), pc.add_parameters(H), pc.add_lookup_parameters((V, H))


def _train(trainer_cls, use_overlap: bool, steps: int = 6, scheduler: str = "agenda"):
    """A small recurrent model over random sequences, DyNet's loop; losses, final values, grads."""
    config.overlap = use_overlap
    pc, W, b, E = _model()
    trainer = trainer_cls(pc)
    rng = np.random.default_rng(11)
    losses, grads = [], []
    for _ in range(steps):
        dy.renew_cg(scheduler=scheduler)
        per_sample = []
        for _ in range(5):
            h = E[int(rng.integers(30))]
            for _ in range(int(rng.integers(1, 5))):
                h = dy.tanh(W * h + b + E[int(rng.integers(30))])
            per_sample.append(dy.pickneglogsoftmax(h, int(rng.integers(12))))
        loss = dy.esum(per_sample)
        losses.append(loss.value())
        loss.backward()
        grads.append(W.grad_as_array())  # waits for the deferred backward
        trainer.update()
    return losses, [p.as_array() for p in (W, b, E)], grads


@pytest.mark.parametrize("trainer_cls", TRAINERS)
def test_deferred_steps_are_bit_identical(two_cores, trainer_cls):
    with _dtype("float64"):
        sync = _train(trainer_cls, False)
        deferred = _train(trainer_cls, True)
    assert sync[0] == deferred[0]
    for a, b in zip(sync[1] + sync[2], deferred[1] + deferred[2]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("scheduler", ["none", "depth"])
def test_deferred_matches_unbatched_execution(two_cores, scheduler):
    """Deferred under any scheduler equals in-place execution without batching, 1e-10 in float64."""
    with _dtype("float64"):
        ref = _train(dy.SimpleSGDTrainer, False, steps=4, scheduler="none")
        got = _train(dy.SimpleSGDTrainer, True, steps=4, scheduler=scheduler)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-10, atol=1e-10)
    for a, b in zip(ref[1], got[1]):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-10)


def _slow_update(monkeypatch, trainer, seconds: float, calls: list):
    """Make the trainer's update take `seconds`, so the step is still pending when we look."""
    real = trainer._update

    def slow():
        time.sleep(seconds)
        calls.append(threading.current_thread().name)
        real()
    monkeypatch.setattr(trainer, "_update", slow)


def _one_step(W, E):
    dy.renew_cg()
    loss = dy.pickneglogsoftmax(dy.tanh(W * E[3]), 2)
    loss.value()
    loss.backward()
    return loss


def test_update_runs_on_the_worker_and_reads_wait(two_cores, monkeypatch):
    pc, W, b, E = _model()
    trainer = dy.SimpleSGDTrainer(pc, learning_rate=0.5)
    before = W.as_array()
    calls: list = []
    _slow_update(monkeypatch, trainer, 0.3, calls)
    _one_step(W, E)
    trainer.update()
    assert overlap.pending() and not calls  # update() returned before the step ran
    dy.renew_cg()
    recorded = dy.tanh(W * E[4])  # recording the next graph does not wait
    assert overlap.pending()
    after = W.as_array()  # waits
    assert calls == ["dynagraph-overlap"] and not overlap.pending()
    assert not np.array_equal(after, before)
    assert recorded.npvalue().shape == (12,)


def test_saving_waits_for_the_pending_update(two_cores, monkeypatch, tmp_path):
    pc, W, b, E = _model()
    trainer = dy.SimpleSGDTrainer(pc, learning_rate=0.5)
    calls: list = []
    _slow_update(monkeypatch, trainer, 0.3, calls)
    _one_step(W, E)
    trainer.update()
    pc.save(str(tmp_path / "pc.model"))  # must hold the updated values
    dy.save(str(tmp_path / "objs"), [W])
    assert calls
    pc2, W2, _, _ = _model()
    pc2.populate(str(tmp_path / "pc.model"))
    assert np.array_equal(W2.as_array(), W.as_array())
    (W3,) = dy.load(str(tmp_path / "objs"), dy.ParameterCollection())
    assert np.array_equal(W3.as_array(), W.as_array())


def test_learning_rate_change_does_not_reach_a_pending_update(two_cores, monkeypatch):
    with _dtype("float64"):
        results = []
        for defer in (False, True):
            config.overlap = defer
            pc, W, b, E = _model()
            trainer = dy.SimpleSGDTrainer(pc, learning_rate=0.5)
            _slow_update(monkeypatch, trainer, 0.1, [])
            _one_step(W, E)
            trainer.update()
            trainer.learning_rate = 100.0  # waits: the update above used 0.5
            results.append(W.as_array())
        assert np.array_equal(results[0], results[1])


def test_worker_error_surfaces_at_the_next_read(two_cores, monkeypatch):
    pc, W, b, E = _model()
    trainer = dy.SimpleSGDTrainer(pc)

    def broken():
        raise NonFiniteError("gradient of W is nan")
    monkeypatch.setattr(trainer, "_update", broken)
    _one_step(W, E)
    trainer.update()  # returns: the failure is on the worker
    named = r"(?s)gradient of W is nan.*SimpleSGDTrainer\.update\(\).*overlap"
    with pytest.raises(NonFiniteError, match=named):
        W.as_array()
    W.as_array()  # reported once; the worker goes on


def test_jobs_after_a_failure_are_dropped(two_cores):
    ran = []
    assert overlap.defer(lambda: (_ for _ in ()).throw(ValueError("first")), "job one")
    assert overlap.defer(lambda: ran.append(1), "job two")
    with pytest.raises(ValueError, match=r"(?s)first.*job one"):
        overlap.wait()
    assert ran == []
    assert overlap.defer(lambda: ran.append(2), "job three")
    overlap.wait()
    assert ran == [2]


def test_gradient_of_a_pending_graph_waits(two_cores):
    with _dtype("float64"):
        got = {}
        for defer in (False, True):
            config.overlap = defer
            pc, W, b, E = _model()
            dy.renew_cg()
            x = dy.tanh(W * E[1] + b)
            loss = dy.pickneglogsoftmax(x, 4)
            loss.value()
            loss.backward()
            got[defer] = (x.gradient(), loss.gradient())
        for a, c in zip(got[False], got[True]):
            assert np.array_equal(a, c)


def test_one_thread_keeps_one_core(two_cores, monkeypatch):
    monkeypatch.setattr(config, "threads", 1)  # what dy.config.set(threads=1) leaves
    assert not overlap.enabled()
    pc, W, b, E = _model()
    trainer = dy.SimpleSGDTrainer(pc)
    calls: list = []
    _slow_update(monkeypatch, trainer, 0.05, calls)
    _one_step(W, E)
    trainer.update()
    assert calls == [threading.current_thread().name] and not overlap.pending()


def test_overlap_setting_and_one_core(two_cores, monkeypatch):
    dy.config.set(overlap=False)
    assert not overlap.enabled() and dy.config.get()["overlap"] is False
    dy.config.set(overlap=True)
    assert overlap.enabled()
    monkeypatch.setattr(overlap, "_CORES", 1)
    assert not overlap.enabled()


def _count_blas_caps(monkeypatch, threads):
    import threadpoolctl
    calls = []
    monkeypatch.setattr(threadpoolctl, "threadpool_limits", lambda **k: calls.append(k))
    monkeypatch.setattr(config, "threads", threads)
    dy.renew_cg()
    pc, W, b, E = _model()
    dy.tanh(W * E[1]).value()
    dy.tanh(W * E[2]).value()
    return calls


def test_default_threads_are_the_libraries(monkeypatch):
    # measured on an idle 2-core machine, two BLAS threads are faster from H=256 on and equal at
    # H=64 (README, "The second core"), so evaluation never caps them
    assert _count_blas_caps(monkeypatch, None) == []


def test_a_thread_count_the_user_set_is_kept(monkeypatch):
    assert _count_blas_caps(monkeypatch, 2) == []


def test_overlap_is_opt_in(monkeypatch):
    monkeypatch.delenv("DYNAGRAPH_OVERLAP", raising=False)
    assert type(config)().overlap is False
    monkeypatch.setenv("DYNAGRAPH_OVERLAP", "1")
    assert type(config)().overlap is True
