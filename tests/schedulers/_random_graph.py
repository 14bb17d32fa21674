"""Random per-sample graphs for the scheduler-invariance property test.

A *program* is a list of instructions (opcode, a, b, c). The small ints pick
arguments from per-shape pools modulo the pool size, so every drawn program is
valid, and recording it is deterministic: the same graph under every scheduler.

Shape classes: vectors of 2, 3 and 5, a 3x2 matrix, and scalars. Every pool
entry carries a static bound on |value|; ops that could blow up (square, exp,
cmult, ...) squash big inputs with tanh first, so values and gradients stay
finite and a relative tolerance of 1e-10 is meaningful.
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

import dynagraph as dy
from dynagraph.expressions import record_list
from dynagraph.ops import OPS

LSTM_STEP = OPS["lstm_step"]

VECS = ("v2", "v3", "v5")
SIZES = {"v2": 2, "v3": 3, "v5": 5, "m32": 6, "s1": 1}
CLASSES = ("v2", "v3", "v5", "m32", "s1")
LIMIT = 10.0   # an entry bigger than this is squashed by tanh before it joins a pool
SMALL = 2.0    # growth ops (square, exp, products) first squash arguments bigger than this
INIT = 0.5     # parameters are uniform in [-INIT, INIT]

OPCODES = ("unary", "binary", "scale", "matvec", "matmul_node", "affine", "concat", "concat_cols",
           "pick_range", "pick", "sum_elems", "dot", "softmax", "log_softmax", "dropout", "lookup",
           "esum", "nobackprop", "lstm_step")

_small_int = st.integers(0, 63)
instruction = st.tuples(st.sampled_from(OPCODES), _small_int, _small_int, _small_int)
program = st.lists(instruction, min_size=1, max_size=12)
sample = st.tuples(program, st.lists(_small_int, min_size=1, max_size=3))  # (program, outputs)
graph_spec = st.tuples(st.lists(sample, min_size=1, max_size=3), st.integers(1, 2))  # (samples, repeats)


class Params:
    """Shared by every sample: weights for matvec/affine, a matrix leaf, two lookup tables."""

    def __init__(self, pc):
        u = dy.UniformInitializer(INIT)
        self.W32, self.W23, self.W33 = (pc.add_parameters(d, init=u) for d in ((3, 2), (2, 3), (3, 3)))
        self.b3 = pc.add_parameters(3, init=u)
        self.M = pc.add_parameters((3, 2), init=u)
        self.E3 = pc.add_lookup_parameters((6, 3), init=u)
        self.E2 = pc.add_lookup_parameters((4, 2), init=u)
        self.Wh = [pc.add_parameters((4, 1), init=u) for _ in range(2)]  # lstm_step's recurrent weights (H = 1)


# Unary ops: (function, bound of the output from the bound of the input, squash input first?)
UNARY = (
    (dy.tanh, lambda b: 1.0, False), (dy.logistic, lambda b: 1.0, False), (dy.softsign, lambda b: 1.0, False),
    (lambda x: -x, lambda b: b, False), (dy.square, lambda b: b * b, True), (dy.exp, math.exp, True),
    (dy.cube, lambda b: b ** 3, True), (lambda x: x * 0.5 + 1.0, lambda b: 0.5 * b + 1.0, False),
)


class Sample:
    """Records one program. `r` varies data (lookup rows, pick indices, inputs) between repeats."""

    def __init__(self, P: Params, r: int):
        self.P, self.r = P, r
        self.pools: dict[str, list] = {k: [] for k in CLASSES}
        self.put("v3", P.E3[r % 6], INIT)
        self.put("v2", dy.lookup(P.E2, (r + 1) % 4), INIT)
        self.put("v5", dy.inputVector([math.sin(r + k) for k in range(5)]), 1.0)
        self.put("m32", dy.parameter(P.M), INIT)  # a shared leaf in the matrix pool
        self.put("s1", dy.scalarInput(0.3 + 0.1 * r), 1.0)
        self.states: dict = {}  # chains per node -> (the last lstm_step's state, a bound on its c)

    # ------------------------------------------------------------------ pools
    def put(self, cls: str, e, bound: float) -> None:
        if bound > LIMIT:
            e, bound = dy.tanh(e), 1.0
        self.pools[cls].append((e, bound))

    def take(self, cls: str, i: int):
        pool = self.pools[cls]
        return pool[i % len(pool)]

    def small(self, cls: str, i: int):
        e, b = self.take(cls, i)
        return (dy.tanh(e), 1.0) if b > SMALL else (e, b)

    # ----------------------------------------------------------- instructions
    def run(self, prog) -> None:
        for opcode, a, b, c in prog:
            getattr(self, "op_" + opcode)(a, b, c)

    def op_unary(self, a, b, c):
        cls = VECS[a % 3]
        fn, bound, squash = UNARY[c % len(UNARY)]
        x, bx = self.small(cls, b) if squash else self.take(cls, b)
        self.put(cls, fn(x), bound(bx))

    def op_binary(self, a, b, c):
        cls = VECS[a % 3]
        kind = (a // 3) % 4
        if kind == 2:
            (x, bx), (y, by) = self.small(cls, b), self.small(cls, c)
            self.put(cls, dy.cmult(x, y), bx * by)
            return
        (x, bx), (y, by) = self.take(cls, b), self.take(cls, c)
        out = (x + y, x - y, None, dy.bmax(x, y))[kind]
        self.put(cls, out, bx + by)

    def op_scale(self, a, b, c):
        cls = VECS[a % 3]
        (x, bx), (s, bs) = self.small(cls, b), self.small("s1", c)
        self.put(cls, dy.cmult(x, s), bx * bs)  # broadcasts the scalar

    def op_matvec(self, a, b, c):
        P, k = self.P, a % 3
        if k == 0:
            x, bx = self.take("v2", b)
            self.put("v3", P.W32 * x, 2 * INIT * bx)
        elif k == 1:
            x, bx = self.take("v3", b)
            self.put("v2", dy.parameter(P.W23) * x, 3 * INIT * bx)
        else:
            x, bx = self.take("v3", b)
            self.put("v3", dy.parameter(P.W33) * x, 3 * INIT * bx)

    def op_matmul_node(self, a, b, c):
        (m, bm), (x, bx) = self.small("m32", a), self.small("v2", b)
        self.put("v3", m * x, 2 * bm * bx)

    def op_affine(self, a, b, c):
        P = self.P
        x, bx = self.take("v2", b)
        if a % 2:
            self.put("v3", dy.affine_transform([P.b3, P.W32, x]), INIT + 2 * INIT * bx)
            return
        y, by = self.take("v3", c)
        self.put("v3", dy.affine_transform([P.b3, P.W32, x, P.W33, y]), INIT + 2 * INIT * bx + 3 * INIT * by)

    def op_concat(self, a, b, c):
        (x, bx), (y, by) = self.take("v2", b), self.take("v3", c)
        self.put("v5", dy.concatenate([x, y] if a % 2 else [y, x]), max(bx, by))

    def op_concat_cols(self, a, b, c):
        (x, bx), (y, by) = self.take("v3", b), self.take("v3", c)
        self.put("m32", dy.concatenate_cols([x, y]), max(bx, by))

    def op_pick_range(self, a, b, c):
        src, s, e, dst = (("v5", 0, 2, "v2"), ("v5", 2, 5, "v3"), ("v5", 1, 4, "v3"), ("v3", 1, 3, "v2"))[a % 4]
        x, bx = self.take(src, b)
        self.put(dst, dy.pick_range(x, s, e) if a % 8 < 4 else x[s:e], bx)

    def op_pick(self, a, b, c):
        cls = VECS[a % 3]
        x, bx = self.take(cls, b)
        i = (c + self.r) % SIZES[cls]  # varies between repeats: data inside one batch differs
        self.put("s1", dy.pick(x, i) if a % 2 else x[i], bx)

    def op_sum_elems(self, a, b, c):
        cls = (*VECS, "m32")[a % 4]
        x, bx = self.take(cls, b)
        self.put("s1", dy.sum_elems(x), SIZES[cls] * bx)

    def op_dot(self, a, b, c):
        cls = VECS[a % 3]
        (x, bx), (y, by) = self.small(cls, b), self.small(cls, c)
        self.put("s1", dy.dot_product(x, y), SIZES[cls] * bx * by)

    def op_softmax(self, a, b, c):
        cls = VECS[a % 3]
        self.put(cls, dy.softmax(self.take(cls, b)[0]), 1.0)

    def op_log_softmax(self, a, b, c):
        cls = VECS[a % 3]
        x, bx = self.take(cls, b)
        self.put(cls, dy.log_softmax(x), 2 * bx + math.log(SIZES[cls]))

    def op_dropout(self, a, b, c):
        cls = VECS[a % 3]
        x, bx = self.take(cls, b)
        self.put(cls, dy.dropout(x, 0.25), bx / 0.75)

    def op_lookup(self, a, b, c):
        if a % 2:
            self.put("v3", self.P.E3[(c + self.r) % 6], INIT)
        else:
            self.put("v2", dy.lookup(self.P.E2, (c + self.r) % 4), INIT)

    def op_esum(self, a, b, c):
        cls = (*VECS, "s1")[a % 4]
        xs = [self.take(cls, i) for i in (b, c, a)[:2 + (a // 4) % 2]]
        self.put(cls, dy.esum([e for e, _ in xs]), sum(bx for _, bx in xs))

    def op_lstm_step(self, a, b, c):
        """A whole LSTM step with H = 1 from pre = [x; y] (two v2 entries), one chain or two
        (a // 6 odd: BiRNNBuilder's two directions in one node, the second from [y; x]): the next
        step of the sample's chain of that kind (its W_h shared), or a first step when a % 3 == 0.
        Each chain's h and c join s1, the last chain's five activations v5 (so their own
        gradients reach the op too)."""
        (x, _), (y, _) = self.take("v2", b), self.take("v2", c)
        K, fb = 1 + (a // 6) % 2, 0.5 * (a % 2)
        pres = [dy.concatenate([x, y]), dy.concatenate([y, x])][:K]
        state, bound = self.states.get(K, (None, 0.0))
        attrs = (1, fb) if K == 1 else (1, fb, K)
        if state is None or a % 3 == 0:
            state, bound = record_list(LSTM_STEP, pres, attrs), 1.0
        else:
            state, bound = record_list(LSTM_STEP, pres + [dy.parameter(w) for w in self.P.Wh[:K]] + [state], attrs), bound + 1.0
        self.states[K] = (state, bound)
        for k in range(K):
            self.put("s1", dy.pick_range(state, 7 * k, 7 * k + 1), 1.0)
            self.put("s1", dy.pick_range(state, 7 * k + 1, 7 * k + 2), bound)
        self.put("v5", dy.pick_range(state, 7 * K - 5, 7 * K), 1.0)

    def op_nobackprop(self, a, b, c):
        cls = VECS[a % 3]
        x, bx = self.take(cls, b)
        self.put(cls, dy.nobackprop(x), bx)

    # ---------------------------------------------------------------- outputs
    def loss(self, o: int):
        """A scalar loss from any pool entry: the entry itself, a sum, a norm or a softmax loss."""
        entries = [(cls, e) for cls in CLASSES for e, _ in self.pools[cls]]
        cls, e = entries[o % len(entries)]
        if cls == "s1":
            return e
        if cls == "m32" or o % 3 == 0:
            return dy.sum_elems(e)
        if o % 3 == 1:
            return dy.squared_norm(e)
        return dy.pickneglogsoftmax(e, (o + self.r) % SIZES[cls])


def record(pc, spec) -> list:
    """Record every sample `repeats` times; returns the output losses (run_graph sums them)."""
    samples, repeats = spec
    P = Params(pc)
    outs = []
    for r in range(repeats):
        for k, (prog, outputs) in enumerate(samples):
            s = Sample(P, r * 7 + k)
            s.run(prog)
            outs.extend(s.loss(o) for o in outputs)
    return outs


def every_branch_spec() -> tuple:
    """A fixed spec that reaches every opcode with every value of `a` mod 8 (each branch)."""
    prog = [(op, a, 3 * a + k, 5 * a + 2 * k) for k, op in enumerate(OPCODES) for a in range(8)]
    return ([(prog, [0, 7, 11, 29]), (prog[::-1], [1, 5, 33])], 2)
