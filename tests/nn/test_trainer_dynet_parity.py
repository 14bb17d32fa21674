"""Trainer parity with DyNet: same MLP + lookup model, copied weights, 5 steps each.

Runs only where DyNet is installed (the dev machine); dynagraph never needs it.
"""
import numpy as np
import pytest

import dynagraph as dg

dynet = pytest.importorskip("dynet")

VOCAB, EMB, HID, OUT = 7, 3, 5, 4
# Each step sums three samples; rows 5 and 6 of the table are never looked up.
STEPS = [[(0, 1, 2), (3, 1, 0), (2, 2, 3)],
         [(4, 0, 1), (1, 3, 2), (0, 0, 0)],
         [(2, 4, 3), (3, 3, 1), (1, 2, 2)],
         [(0, 4, 0), (4, 4, 1), (2, 0, 3)],
         [(1, 1, 1), (3, 0, 2), (4, 2, 0)]]

TRAINERS = {
    "SimpleSGDTrainer": {"learning_rate": 0.1},
    "MomentumSGDTrainer": {"learning_rate": 0.1, "mom": 0.8},
    "AdagradTrainer": {"learning_rate": 0.2},
    "AdamTrainer": {"alpha": 0.05},
    "AmsgradTrainer": {"alpha": 0.05},
    "AdadeltaTrainer": {},
    "RMSPropTrainer": {"learning_rate": 0.01},
}


def _weights():
    rng = np.random.default_rng(7)
    return {"E": rng.normal(0, 1, (VOCAB, EMB)), "W": rng.normal(0, 0.8, (HID, 2 * EMB)),
            "b": rng.normal(0, 0.1, HID), "V": rng.normal(0, 0.8, (OUT, HID)), "c": rng.normal(0, 0.1, OUT)}


def _build(lib, w):
    pc = lib.ParameterCollection()
    ps = {"E": pc.add_lookup_parameters((VOCAB, EMB))}
    ps["E"].init_from_array(w["E"])
    for k in ("W", "b", "V", "c"):
        ps[k] = pc.add_parameters(w[k].shape)
        ps[k].set_value(w[k])
    return pc, ps


def _loss(lib, ps, batch, scale):
    losses = []
    for a, b, y in batch:
        x = lib.concatenate([lib.lookup(ps["E"], a), lib.lookup(ps["E"], b)])
        h = lib.tanh(ps["W"] * x + ps["b"])
        losses.append(lib.pickneglogsoftmax(ps["V"] * h + ps["c"], y))
    return lib.esum(losses) * scale


def _run(lib, name, clip, sparse, scale):
    pc, ps = _build(lib, _weights())
    trainer = getattr(lib, name)(pc, **TRAINERS[name])
    if clip is not None:
        trainer.set_clip_threshold(clip)
    trainer.set_sparse_updates(sparse)
    losses = []
    for batch in STEPS:
        lib.renew_cg()
        loss = _loss(lib, ps, batch, scale)
        losses.append(loss.value())
        loss.backward()
        trainer.update()
    return np.array(losses), {k: p.as_array() for k, p in ps.items()}, trainer


# (clip threshold, sparse updates, loss scale): the default threshold (5) fires
# on every step at scale 20; threshold 0 turns clipping off.
SETTINGS = [(None, True, 1.0), (None, True, 20.0), (0.0, True, 2.0), (None, False, 1.0)]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"clip{s[0]}-sparse{s[1]}-x{s[2]:g}")
@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_matches_dynet(name, setting):
    ref_losses, ref, _ = _run(dynet, name, *setting)
    losses, got, trainer = _run(dg, name, *setting)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4, atol=1e-6)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=1e-6, err_msg=f"{name} {k}")
    # The scenario must actually train, and untouched rows stay put under sparse updates.
    assert not np.allclose(got["W"], _weights()["W"])
    if setting[0] == 0.0:
        assert trainer.clips == 0
    if setting[2] == 20.0:
        assert trainer.clips > 0
    if setting[1]:
        np.testing.assert_array_equal(got["E"][5:], _weights()["E"][5:].astype(np.float32))
