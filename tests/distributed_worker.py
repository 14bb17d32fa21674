"""A small training run for tests/test_distributed.py, started under `mpirun -np 2` or
as one plain process (size 1: the combined mini-batch).

    python distributed_worker.py OUT_DIR TRAINER SPARSE STEPS [--fail kill|hang] [--save-at K CKPT]
                                                             [--resume CKPT]

Each rank writes OUT_DIR/rank<r>.npz: its per-step local losses and its final weights.
Every step draws its mini-batch from dy.config.rng, so an exact resume needs the RNG state.
"""
from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np

import dynagraph as dy

N_WORDS, EMB, HID, N_LABELS, BATCH = 20, 4, 6, 3, 8


def build(trainer_name: str):
    pc = dy.ParameterCollection()
    model = {"E": pc.add_lookup_parameters((N_WORDS, EMB), name="E"),
             "W": pc.add_parameters((HID, EMB), name="W"), "b": pc.add_parameters(HID, name="b"),
             "V": pc.add_parameters((N_LABELS, HID), name="V"), "x": pc.add_parameters(EMB, name="x")}
    trainer = {"sgd": lambda: dy.SimpleSGDTrainer(pc, 0.3), "adam": lambda: dy.AdamTrainer(pc, 0.05),
               "momentum": lambda: dy.MomentumSGDTrainer(pc, 0.1)}[trainer_name]()
    return pc, model, trainer


def sample_loss(m: dict, words: list, label: int, sparse: bool):
    # Sparse: the embedding rows of the sample's words; dense: one shared input vector.
    x = dy.esum([m["E"][w] for w in words]) if sparse else m["x"] * float(len(words))
    h = dy.tanh(m["W"] * x + m["b"])
    return dy.pickneglogsoftmax(m["V"] * h, label)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("trainer")
    ap.add_argument("sparse", type=int)
    ap.add_argument("steps", type=int)
    ap.add_argument("--fail", choices=["kill", "hang"])
    ap.add_argument("--save-at", nargs=2)
    ap.add_argument("--resume")
    a = ap.parse_args()
    dy.config.set(dtype="float64", random_seed=1, threads=1)
    rank, size = dy.distributed.init()
    # A different seed per rank: the broadcast from rank 0 must make the start identical.
    dy.reset_random_seed(1 + 1000 * rank)
    pc, m, base = build(a.trainer)
    trainer = dy.distributed.DataParallelTrainer(base)
    dy.reset_random_seed(7)  # the data stream: the same on every rank
    start = 0
    if a.resume:
        start = trainer.load_checkpoint(a.resume)["next_step"]
    losses = []
    for step in dy.distributed.tqdm(range(start, a.steps), desc="train"):
        if a.fail and step == 2 and rank == 1:
            if a.fail == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)
        words = dy.config.config.rng.integers(0, N_WORDS, size=(BATCH, 3))
        labels = dy.config.config.rng.integers(0, N_LABELS, size=BATCH)
        batch = list(zip(words.tolist(), labels.tolist()))
        dy.renew_cg()
        loss = dy.esum([sample_loss(m, w, y, bool(a.sparse)) for w, y in dy.distributed.shard(batch)])
        losses.append(loss.value())
        loss.backward()
        trainer.update()
        if a.save_at and step + 1 == int(a.save_at[0]):
            trainer.save_checkpoint(a.save_at[1], extra={"next_step": step + 1})
            break
    weights = {p.name(): p.as_array() for p in pc.parameters_list() + pc.lookup_parameters_list()}
    np.savez(os.path.join(a.out, f"rank{rank}.npz"), losses=np.array(losses), **weights)
    dy.distributed.log(f"done: {len(losses)} steps on {size} rank(s)")


if __name__ == "__main__":
    main()
