"""The training loops, written once in DyNet's idiom (imported after the swap, like a program)."""
import time

import dynet as dy


def minibatch_step(model, trainer, batch, train, split):
    """One graph for the whole mini-batch: the summed per-sample losses."""
    t0 = time.perf_counter()
    dy.renew_cg()
    model.begin()
    loss = dy.esum([model.loss(s) for s in batch])
    t1 = time.perf_counter()
    value = loss.value()
    t2 = time.perf_counter()
    split["record"] += t1 - t0
    split["forward"] += t2 - t1
    if train:
        loss.backward()
        t3 = time.perf_counter()
        trainer.update()
        t4 = time.perf_counter()
        split["backward"] += t3 - t2
        split["update"] += t4 - t3
    return value


def sentence_epoch(model, trainer, sentences, split):
    """One graph per sentence, backward() and update() after each (DyNet's commonest loop)."""
    total = 0.0
    for s in sentences:
        t0 = time.perf_counter()
        dy.renew_cg()
        loss = model.loss(s)
        t1 = time.perf_counter()
        total += loss.value()
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        trainer.update()
        t4 = time.perf_counter()
        split["record"] += t1 - t0
        split["forward"] += t2 - t1
        split["backward"] += t3 - t2
        split["update"] += t4 - t3
    return total
