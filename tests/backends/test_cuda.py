"""The CuPy path: the same `xp` code on the GPU. Skips cleanly without CuPy or a device."""
import numpy as np
import pytest

import dynagraph as dy

cupy = pytest.importorskip("cupy")
try:
    cupy.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - no driver or no device
    pytest.skip("no CUDA device", allow_module_level=True)


@pytest.mark.parametrize("scheduler", ["none", "agenda"])
def test_cuda_matches_numpy(scheduler):
    def run(backend):
        dy.config.set(backend=backend, random_seed=0)
        pc = dy.ParameterCollection()
        E, W, b = pc.add_lookup_parameters((10, 4)), pc.add_parameters((3, 4)), pc.add_parameters(3)
        dy.renew_cg(scheduler=scheduler)
        loss = dy.esum([dy.pickneglogsoftmax(dy.tanh(W * E[w] + b), w % 3) for w in range(6)])
        value = loss.value()
        loss.backward()
        return value, W.grad_as_array()

    old = dy.config.config.backend
    try:
        v_ref, g_ref = run("numpy")
        v, g = run("cuda")
    finally:
        dy.config.set(backend=old)
    assert v == pytest.approx(v_ref, rel=1e-5)
    np.testing.assert_allclose(np.asarray(g), g_ref, rtol=1e-4, atol=1e-6)
