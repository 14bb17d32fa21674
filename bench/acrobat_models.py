"""ACROBAT's models (Fegade et al., MLSys 2023), scaled for CPU, written once against the DyNet API.

The same text runs on dynagraph and DyNet: `dy` is passed in. The per-sample loop is
`run_all(dy, fn, samples)`: dy.autobatch_map where the module has it (dynagraph: the samples run
concurrently, or one by one with concurrent=False), else a plain loop (DyNet). Data-dependent
decisions read a value the way such programs do (`.value()`, `.npvalue()`), and take their
outcome from the sample's own seeded pseudo-random stream, so every system does the same work.

    nestedrnn  an outer RNN over inner RNNs of data-dependent lengths (no reads)
    drnn       top-down tree generation: each node reads its expansion score, then grows 0-2 children
    earlyexit  one shared-weight layer applied up to L times; after each, a read of the classifier
    stackrnn   shift-reduce over the words: each step reads the action scores, then shifts or reduces
    treelstm   a TreeLSTM over a random binary tree (no reads)
    birnn      a bidirectional RNN tagger (no reads)
"""
from __future__ import annotations

import contextlib
import os
import random
from typing import Any

H = 128
MODELS = ["nestedrnn", "drnn", "earlyexit", "stackrnn", "treelstm", "birnn"]
V, C, LAYERS = 100, 5, 8


def hints(dy: Any) -> bool:
    """ACROBAT's static hints (dy.ghost, dy.phase) where the module has them; DYNAGRAPH_HINTS=0
    leaves them out (the bench measures batches with and without)."""
    return hasattr(dy, "ghost") and os.environ.get("DYNAGRAPH_HINTS", "1") != "0"


def run_all(dy: Any, fn, samples: list, concurrent: bool = True) -> list:
    mapped = getattr(dy, "autobatch_map", None)
    if mapped is None:
        return [fn(s) for s in samples]
    return mapped(fn, samples, concurrent=concurrent)


class Model:
    def __init__(self, dy: Any, kind: str, hidden: int = 128):
        global H
        H = hidden  # module-wide: the models read it as a constant, as DyNet's examples do
        self.dy, self.kind = dy, kind
        pc = self.pc = dy.ParameterCollection()
        self.E = pc.add_lookup_parameters((V, H))
        self.W = {n: pc.add_parameters((H, H)) for n in ("x", "h", "l", "r", "c")}
        self.g = {n: pc.add_parameters((3 * H, H)) for n in ("x", "l", "r")}
        self.b = pc.add_parameters(H)
        self.bg = pc.add_parameters(3 * H)
        self.out = pc.add_parameters((C, H))
        self.act = pc.add_parameters((2, 2 * H))
        self.gate = pc.add_parameters((1, H))
        self.trainer = dy.SimpleSGDTrainer(pc, 0.01)
        self.fn = getattr(self, "_" + kind)
        # a data-dependent branch: both arms padded to one length (no-op context for DyNet)
        self.branch = dy.ghost if hints(dy) else contextlib.nullcontext
        # per-step losses no read needs: program phase 1, one batch after every sample's last read
        self.later = (lambda: dy.phase(1)) if hints(dy) else contextlib.nullcontext

    # ------------------------------------------------------------------ cells
    def rnn(self, x, h):
        dy = self.dy
        return dy.tanh(self.W["x"] * x + self.W["h"] * h + self.b)

    def loss(self, h, y: int, train: bool):
        scores = self.out * h
        if train:
            return self.dy.pickneglogsoftmax(scores, y)
        return scores

    # ------------------------------------------------------------------ models
    def _nestedrnn(self, s, train):
        dy, rng = self.dy, random.Random(s)
        h = dy.zeros(H)
        for _ in range(rng.randint(2, 5)):
            inner = dy.zeros(H)
            for _ in range(rng.randint(2, 6)):
                inner = self.rnn(self.E[rng.randrange(V)], inner)
            h = self.rnn(inner, h)
        return self.loss(h, rng.randrange(C), train)

    def _drnn(self, s, train):
        dy, rng = self.dy, random.Random(s)
        losses, frontier = [], [(self.rnn(self.E[rng.randrange(V)], dy.zeros(H)), 0)]
        while frontier:
            h, depth = frontier.pop()
            with self.later():
                losses.append(self.loss(h, rng.randrange(C), train))
            dy.logistic(self.gate * h).value()  # the decision reads a value: expand this node or not
            if depth < 4 and rng.random() < 0.75:
                for side in ("l", "r")[:rng.randint(1, 2)]:
                    frontier.append((dy.tanh(self.W[side] * h + self.b), depth + 1))
        # inference reads every node's scores too (summed): with only the last one read, phase 1
        # would let dynagraph skip the others' output layers, which DyNet computes at each read
        return dy.esum(losses)

    def _earlyexit(self, s, train):
        dy, rng = self.dy, random.Random(s)
        h = dy.tanh(self.W["x"] * self.E[rng.randrange(V)] + self.b)
        exit_at = rng.randint(1, LAYERS)
        for layer in range(LAYERS):
            h = dy.tanh(self.W["c"] * h + self.b)  # one shared-weight layer, applied again and again
            conf = dy.softmax(self.out * h)
            c = conf.npvalue().max()  # the decision reads the classifier's confidence
            if layer + 1 >= exit_at or c > 2.0:
                break
        return self.loss(h, rng.randrange(C), train)

    def _stackrnn(self, s, train):
        dy, rng = self.dy, random.Random(s)
        words = [rng.randrange(V) for _ in range(rng.randint(4, 10))]
        stack, buf, losses = [], list(words), []
        empty = dy.zeros(H)
        while buf or len(stack) > 1:
            top = stack[-1] if stack else empty
            head = self.E[buf[-1]] if buf else empty
            scores = self.act * dy.concatenate([top, head])
            scores.npvalue()  # the decision reads the action scores
            shift = bool(buf) and (len(stack) < 2 or rng.random() < 0.5)
            action = 0 if shift else 1
            if train:
                with self.later():
                    losses.append(dy.pickneglogsoftmax(scores, action))
            with self.branch():
                if shift:
                    stack.append(self.rnn(self.E[buf.pop()], top))
                else:
                    r, l_ = stack.pop(), stack.pop()
                    stack.append(dy.tanh(self.W["l"] * l_ + self.W["r"] * r + self.b))
        final = self.loss(stack[0], rng.randrange(C), train)
        return dy.esum(losses + [final]) if train else final

    def _treelstm(self, s, train):
        dy, rng = self.dy, random.Random(s)

        def node(n):
            if n == 1:
                g = self.g["x"] * self.E[rng.randrange(V)] + self.bg
                c = dy.cmult(dy.logistic(g[0:H]), dy.tanh(g[2 * H:3 * H]))
                return dy.cmult(dy.logistic(g[H:2 * H]), dy.tanh(c)), c
            k = rng.randint(1, n - 1)
            (hl, cl), (hr, cr) = node(k), node(n - k)
            g = self.g["l"] * hl + self.g["r"] * hr + self.bg
            c = dy.cmult(dy.logistic(g[0:H]), dy.tanh(g[2 * H:3 * H])) + (cl + cr) * 0.5
            return dy.cmult(dy.logistic(g[H:2 * H]), dy.tanh(c)), c

        return self.loss(node(rng.randint(4, 12))[0], rng.randrange(C), train)

    def _birnn(self, s, train):
        dy, rng = self.dy, random.Random(s)
        xs = [self.E[rng.randrange(V)] for _ in range(rng.randint(4, 12))]
        fw, bw, hf, hb = [], [], dy.zeros(H), dy.zeros(H)
        for x, y in zip(xs, reversed(xs)):
            hf, hb = self.rnn(x, hf), self.rnn(y, hb)
            fw.append(hf)
            bw.append(hb)
        outs = [self.loss(f + b, rng.randrange(C), train) for f, b in zip(fw, reversed(bw))]
        return dy.esum(outs) if train else outs[-1]

    # ------------------------------------------------------------------ one minibatch
    def step(self, seeds: list, train: bool, concurrent: bool = True) -> float:
        dy = self.dy
        dy.renew_cg()
        if train:
            losses = run_all(dy, lambda s: self.fn(s, True), seeds, concurrent)
            loss = dy.esum(losses)
            v = loss.value()
            loss.backward()
            self.trainer.update()
            return v

        def infer(s):
            return int(self.fn(s, False).npvalue().argmax())  # the prediction reads its scores
        return float(sum(run_all(dy, infer, seeds, concurrent)))
