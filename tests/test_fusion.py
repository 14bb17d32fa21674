"""FusedChain: the C kernel (one call per chain, forward and backward) against the
op-by-op reference path, which itself is checked against finite differences.

Every fusable op alone and random straight-line programs (hypothesis), with per-row,
shared (1, n) and strided-slice inputs, float64 at 1e-12 and float32 at 1e-5."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dynagraph import fusion
from dynagraph.backends import get_backend
from dynagraph.fusion import ARITY, FusedChain, fusable
from dynagraph.ops.base import OPS, OpDef, same_shape

NUMPY = get_backend("numpy")
C_ONLY = pytest.mark.skipif(get_backend("cpu").fused_chains is None, reason="compiled kernels (with fused.c) not built")
DTYPES = [np.float64, np.float32]
ALL_OPS = sorted(ARITY)
CONSTS = {"elu": (0.7,), "addc": (0.3,), "mulc": (-1.5,), "rsubc": (2.0,), "rdivc": (1.5,), "powc": (1.7,)}
POSITIVE = {"log": (0,), "sqrt": (0,), "rdivc": (0,), "powc": (0,), "pow": (0,), "cdiv": (1,)}
KINDS = ("row", "shared", "strided")


def _cpu():
    be = get_backend("cpu")
    if be.name != "cpu":
        pytest.skip("cpu backend unavailable")
    return be


def _close(got, ref, dt) -> None:
    """rtol at the dtype's level; atol scaled by the array's magnitude, so that values
    that cancel to near zero compare by absolute error."""
    assert got.shape == ref.shape and got.dtype == np.dtype(dt), (got.shape, ref.shape, got.dtype)
    tol = 1e-12 if np.dtype(dt) == np.float64 else 1e-5
    finite = np.abs(ref[np.isfinite(ref)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * scale)


def _input(rng, kind: str, B: int, shape: tuple, dt, positive: bool = False):
    n = int(np.prod(shape))
    if kind == "strided":  # a column slice of a wider (B, 3n + 2) array, like a GEMM's gate slice
        wide = rng.standard_normal((B, 3 * n + 2)).astype(dt)
        if positive:
            wide = np.abs(wide) + dt(0.5)
        return wide[:, n + 1:2 * n + 1]
    x = rng.standard_normal(((1 if kind == "shared" else B),) + shape).astype(dt)
    return np.abs(x) + dt(0.5) if positive else x


def _compare(chain: FusedChain, ins: list, gouts: list, need: list, dt) -> None:
    cpu = _cpu()
    with np.errstate(all="ignore"):
        ref = chain.forward(NUMPY, ins)
        got = chain.forward(cpu, ins)
        assert len(got) == len(ref) == len(chain)
        for g, r in zip(got, ref):
            assert g.flags.c_contiguous
            _close(g, r, dt)
        gref = chain.backward(NUMPY, ins, ref, gouts, need)
        ggot = chain.backward(cpu, ins, got, gouts, need)
    for k, (g, r, x) in enumerate(zip(ggot, gref, ins)):
        if not need[k]:
            assert g is None and r is None
            continue
        assert g.shape == x.shape, (k, g.shape, x.shape)
        _close(g, r, dt)


# ----------------------------------------------------------------- every op alone
@C_ONLY
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", ALL_OPS)
def test_each_op_alone_matches_reference(name, dt):
    rng = np.random.default_rng(0)
    nargs = ARITY[name] or 3
    shape, B = (300,), 3  # 300 > the kernel's tile: a row takes two tiles
    for kinds in [("row",) * nargs, ("strided", "shared", "row")[:nargs], ("shared",) * nargs]:
        pos = POSITIVE.get(name, ())
        ins = [_input(rng, k, B, shape, dt, i in pos) for i, k in enumerate(kinds)]
        chain = FusedChain([(OPS[name], CONSTS.get(name, ()), list(range(nargs)))], nargs)
        gout = rng.standard_normal((max(x.shape[0] for x in ins),) + shape).astype(dt)
        _compare(chain, ins, [gout], [True] * nargs, dt)


@C_ONLY
@pytest.mark.parametrize("name", ["bmax", "bmin", "emax"])
def test_ties_go_where_numpy_sends_them(name):
    """Equal arguments: bmax/bmin give the gradient to the first, emax to the first
    maximum (numpy's argmax); NaN propagates and wins, as in np.maximum/argmax."""
    x = np.array([[1.0, 2.0, np.nan, -1.0, 3.0]])
    y = np.array([[1.0, 0.5, 1.0, np.nan, 3.0]])
    ins = [x, y, x.copy()] if name == "emax" else [x, y]
    chain = FusedChain([(OPS[name], (), list(range(len(ins))))], len(ins))
    _compare(chain, ins, [np.ones_like(x)], [True] * len(ins), np.float64)


@C_ONLY
@pytest.mark.parametrize("name", [n for n in ALL_OPS if ARITY[n] == 1])
def test_unary_specials_follow_numpy(name):
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-300, -50.0, 50.0, 0.5]])
    chain = FusedChain([(OPS[name], CONSTS.get(name, ()), [0])], 1)
    _compare(chain, [x], [np.full_like(x, 0.5)], [True], np.float64)


@C_ONLY
@pytest.mark.parametrize("name", ["tanh", "exp"])
def test_float64_exp_and_tanh_within_a_few_ulp(name):
    """fused.c's vectorized float64 exp/tanh against long double, over tiny, moderate and
    overflowing arguments."""
    if np.finfo(np.longdouble).nmant <= 52:
        pytest.skip("long double is no wider than double here")
    if np.array(np.nextafter(0.0, 1.0)) * np.array(1.0) == 0.0:
        pytest.skip("the FPU flushes subnormals to zero (DyNet's Eigen, imported earlier, sets FTZ/DAZ)")
    rng = np.random.default_rng(10)
    x = np.concatenate([rng.uniform(-1, 1, 3000) * 10.0 ** rng.uniform(-300, 1.5, 3000),
                        rng.uniform(-750, 750, 3000), np.linspace(-25, 25, 3001)]).reshape(1, -1)
    with np.errstate(all="ignore"):
        got = FusedChain([(OPS[name], (), [0])], 1).forward(_cpu(), [x])[0]
        exact = getattr(np, name)(x.astype(np.longdouble))
        ref = exact.astype(np.float64)
    assert np.array_equal(np.isinf(got), np.isinf(ref)) and not np.isnan(got).any()
    ok = np.isfinite(ref) & (ref != 0)
    ulps = np.abs((got[ok] - exact[ok]) / np.spacing(np.abs(ref[ok])))
    assert ulps.max() <= 4, float(ulps.max())


# ------------------------------------------------------------ random programs
@st.composite
def programs(draw):
    """A random DAG-shaped straight-line program over 1-4 inputs. Arguments that must
    be positive (log, sqrt, a divisor, a power's base) go through logistic + 0.5 first,
    so that both paths stay in the domain instead of comparing NaNs."""
    nin = draw(st.integers(1, 4))
    target = draw(st.integers(1, 12))
    steps: list = []

    def positive(r: int) -> int:
        steps.append(("logistic", (), [r]))
        steps.append(("addc", (0.5,), [nin + len(steps) - 1]))
        return nin + len(steps) - 1

    while len(steps) < target:
        name = draw(st.sampled_from(ALL_OPS))
        nargs = ARITY[name] or draw(st.integers(1, 4))
        args = [draw(st.integers(0, nin + len(steps) - 1)) for _ in range(nargs)]
        args = [positive(a) if i in POSITIVE.get(name, ()) else a for i, a in enumerate(args)]
        steps.append((name, CONSTS.get(name, ()), args))
    kinds = [draw(st.sampled_from(KINDS)) for _ in range(nin)]
    B = draw(st.sampled_from([1, 2, 5]))
    n = draw(st.sampled_from([1, 3, 17, 260]))
    gmask = [draw(st.sampled_from([None, "rows", "rows", "one"])) for _ in steps]  # "one": a (1, n) gradient
    gmask[-1] = gmask[-1] or "rows"
    need = [draw(st.booleans()) for _ in range(nin)]
    return steps, nin, kinds, B, n, gmask, need, draw(st.integers(0, 2**31))


def _run_program(prog, dt) -> None:
    steps, nin, kinds, B, n, gmask, need, seed = prog
    rng = np.random.default_rng(seed)
    ins = [_input(rng, k, B, (n,), dt) for k in kinds]
    chain = FusedChain([(OPS[name], a, args) for name, a, args in steps], nin)
    lead = max(x.shape[0] for x in ins)
    # output gradients as Plan.backward hands them over: column slices of one wide array
    wide = rng.standard_normal((lead, len(gmask) * (n + 1))).astype(dt)
    gouts = [None if g is None else wide[:1 if g == "one" else lead, m * (n + 1):m * (n + 1) + n]
             for m, g in enumerate(gmask)]
    _compare(chain, ins, gouts, need, dt)


@C_ONLY
@settings(max_examples=400, deadline=None, derandomize=True)
@given(programs())
def test_random_programs_float64(prog):
    _run_program(prog, np.float64)


@C_ONLY
@settings(max_examples=250, deadline=None, derandomize=True)
@given(programs())
def test_random_programs_float32(prog):
    _run_program(prog, np.float32)


# ------------------------------------------------------------- specific shapes
def _treelstm_chain(H_inputs: int = 7) -> FusedChain:
    """The elementwise part of a binary TreeLSTM cell over [i f_l f_r o u] and c_l, c_r."""
    L = OPS
    steps = [(L["logistic"], (), [0]), (L["logistic"], (), [1]), (L["logistic"], (), [2]),
             (L["logistic"], (), [3]), (L["tanh"], (), [4]),
             (L["cmult"], (), [7, 11]), (L["cmult"], (), [8, 5]), (L["cmult"], (), [9, 6]),
             (L["esum"], (), [12, 13, 14]), (L["tanh"], (), [15]), (L["cmult"], (), [10, 16])]
    return FusedChain(steps, H_inputs)


def _treelstm_inputs(rng, B: int, H: int, dt, shared_cr: bool = False) -> list:
    g = rng.standard_normal((B, 5 * H)).astype(dt)
    cr = rng.standard_normal((1 if shared_cr else B, H)).astype(dt)
    return [g[:, k * H:(k + 1) * H] for k in range(5)] + [rng.standard_normal((B, H)).astype(dt), cr]


@C_ONLY
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B", [1, 64])
def test_treelstm_cell_chain(dt, B):
    rng = np.random.default_rng(3)
    chain = _treelstm_chain()
    ins = _treelstm_inputs(rng, B, 37, dt, shared_cr=True)
    gouts = [None] * len(chain)
    gouts[8] = rng.standard_normal((B, 37)).astype(dt)   # dc
    gouts[10] = rng.standard_normal((B, 37)).astype(dt)  # dh
    _compare(chain, ins, gouts, [True] * 7, dt)


@C_ONLY
@pytest.mark.parametrize("dt", DTYPES)
def test_batch_of_one(dt):
    rng = np.random.default_rng(4)
    chain = FusedChain([(OPS["tanh"], (), [0]), (OPS["cmult"], (), [2, 1]), (OPS["logsumexp"], (), [3, 0, 1])], 2)
    ins = [rng.standard_normal((1, 9)).astype(dt) for _ in range(2)]
    _compare(chain, ins, [None, None, np.ones((1, 9), dt)], [True, True], dt)
    # a strided single row
    wide = rng.standard_normal((1, 30)).astype(dt)
    _compare(chain, [wide[:, 3:12], ins[1]], [np.ones((1, 9), dt)] * 3, [True, False], dt)


@C_ONLY
@pytest.mark.parametrize("dt", DTYPES)
def test_steps_over_shared_values_only(dt):
    """tanh(W) of a shared W is computed once and broadcast; its gradient (from inside
    the chain and from outside) is summed over the batch before flowing back to W."""
    rng = np.random.default_rng(5)
    chain = FusedChain([(OPS["tanh"], (), [0]), (OPS["mulc"], (3.0,), [2]), (OPS["cmult"], (), [3, 1]),
                        (OPS["add"], (), [4, 2])], 2)
    ins = [rng.standard_normal((1, 20)).astype(dt), rng.standard_normal((6, 20)).astype(dt)]
    outs = chain.forward(_cpu(), ins)
    assert all(o.shape == (6, 20) for o in outs)
    assert np.array_equal(outs[0], np.broadcast_to(outs[0][:1], (6, 20)))
    gouts = [rng.standard_normal((6, 20)).astype(dt), None, None, rng.standard_normal((6, 20)).astype(dt)]
    _compare(chain, ins, gouts, [True, True], dt)
    # output gradients with a leading axis of 1: summed for a shared step, every row's otherwise
    gouts = [rng.standard_normal((1, 20)).astype(dt), None, rng.standard_normal((1, 20)).astype(dt), None]
    _compare(chain, ins, gouts, [True, True], dt)


@C_ONLY
def test_multidimensional_instances_and_odd_layouts():
    """(B, 2, 3) instances; inputs that are neither contiguous nor row-strided slices
    (reversed, transposed) are copied and give the same results."""
    rng = np.random.default_rng(6)
    chain = FusedChain([(OPS["cmult"], (), [0, 1]), (OPS["tanh"], (), [2]), (OPS["sub"], (), [3, 1])], 2)
    a, b = rng.standard_normal((4, 2, 3)), rng.standard_normal((4, 2, 3))
    _compare(chain, [a, b], [None, None, np.ones((4, 2, 3))], [True, True], np.float64)
    rev = rng.standard_normal((4, 6))[:, ::-1]
    tr = rng.standard_normal((6, 4)).T
    _compare(chain, [rev, tr], [None, np.ones((4, 6)), np.ones((4, 6))], [True, True], np.float64)


@C_ONLY
def test_strided_slices_are_read_in_place():
    dt = np.dtype(np.float64)
    g = np.zeros((8, 50), dt)
    from dynagraph.backends.cpu import chains
    ptrs, strides, copied = chains._operands([g[:, 10:20], g[:1, :10], g[:, :10].copy(), None], 8, 10, dt)
    assert strides == [50, 0, 10, 0] and not copied
    assert chains.ffi.cast("intptr_t", ptrs[0]) == g.ctypes.data + 10 * dt.itemsize  # no copy


@C_ONLY
def test_backward_of_earlier_forwards_and_of_copies():
    """Several forwards (one per tree level) before their backwards, in any order; outputs
    or inputs that are not the forward's own objects take the general path; the records
    kept for backward stay bounded when no backward comes."""
    cpu, rng = _cpu(), np.random.default_rng(9)
    chain = _treelstm_chain()
    calls = [_treelstm_inputs(rng, B, 19, np.float64, shared_cr=B == 3) for B in (5, 3, 8)]
    outs = [chain.forward(cpu, ins) for ins in calls]
    for ins, ys in reversed(list(zip(calls, outs))):
        B = ys[0].shape[0]
        gouts = [None] * 10 + [rng.standard_normal((B, 19))]
        ref = chain.backward(NUMPY, ins, chain.forward(NUMPY, ins), gouts, [True] * 7)
        for variant in (ys, ys, [y.copy() for y in ys]):  # own outputs, again (record used up), copies
            for g, r in zip(chain.backward(cpu, ins, variant, gouts, [True] * 7), ref):
                _close(g, r, np.float64)
        copies = [x.copy() for x in ins]
        ys2 = chain.forward(cpu, ins)
        for g, r in zip(chain.backward(cpu, copies, ys2, gouts, [True] * 7), ref):
            _close(g, r, np.float64)
    for _ in range(100):
        chain.forward(cpu, calls[0])
    assert len(chain._records) <= fusion._MAX_RECORDS


@C_ONLY
def test_gradient_not_reaching_an_input_is_zero_and_nobackprop_blocks():
    chain = FusedChain([(OPS["nobackprop"], (), [0]), (OPS["cmult"], (), [2, 1]), (OPS["tanh"], (), [1])], 2)
    x, y = np.full((3, 4), 2.0), np.full((3, 4), 0.5)
    for be in (NUMPY, _cpu()):
        outs = chain.forward(be, [x, y])
        gx, gy = chain.backward(be, [x, y], outs, [None, np.ones((3, 4)), None], [True, True])
        assert np.array_equal(gx, np.zeros((3, 4))) and np.allclose(gy, 2.0)


def test_other_dtypes_and_numpy_backend_take_the_reference_path():
    chain = FusedChain([(OPS["square"], (), [0]), (OPS["add"], (), [1, 0])], 1)
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    (sq, s) = chain.forward(get_backend("cpu"), [x])
    assert sq.dtype == np.int64 and np.array_equal(s, x * x + x)


# ----------------------------------------------------- the reference path itself
def test_reference_backward_matches_finite_differences():
    rng = np.random.default_rng(7)
    L = OPS
    chain = FusedChain([(L["tanh"], (), [0]), (L["logistic"], (), [1]), (L["cmult"], (), [3, 4]),
                        (L["softsign"], (), [2]), (L["logsumexp"], (), [5, 6, 0]), (L["mulc"], (0.7,), [7]),
                        (L["esum"], (), [8, 1, 5]), (L["exp"], (), [9])], 3)
    ins = [rng.standard_normal((4, 5)), rng.standard_normal((4, 5)), rng.standard_normal((1, 5))]
    w = rng.standard_normal((4, 5))

    def loss(xs):
        return float((chain.forward(NUMPY, xs)[-1] * w).sum())

    outs = chain.forward(NUMPY, ins)
    grads = chain.backward(NUMPY, ins, outs, [None] * 7 + [w], [True, True, True])
    for k, x in enumerate(ins):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            xp, xm = [a.copy() for a in ins], [a.copy() for a in ins]
            xp[k][idx] += 1e-6
            xm[k][idx] -= 1e-6
            num[idx] = (loss(xp) - loss(xm)) / 2e-6
        np.testing.assert_allclose(grads[k], num, rtol=1e-6, atol=1e-8)


def test_reference_forward_is_the_ops_forward():
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    chain = FusedChain([(OPS["cdiv"], (), [0, 1]), (OPS["elu"], (0.5,), [2])], 2)
    a, b = chain.forward(NUMPY, [x, y])
    assert np.array_equal(a, x / y) and np.array_equal(b, OPS["elu"].forward(np, (0.5,), None, x / y))


# -------------------------------------------------------------------- fusable()
def test_fusable_accepts_elementwise_ops_with_matching_shapes():
    for name in ALL_OPS:
        nargs = ARITY[name] or 2
        assert fusable(OPS[name], CONSTS.get(name, ()), [(4, 2)] * nargs, (4, 2)), name


@pytest.mark.parametrize("name, attrs, shapes, out", [
    ("matmul", (), [(3, 4), (4,)], (3,)),
    ("softmax", (0,), [(5,)], (5,)),
    ("dropout", (0.5,), [(5,)], (5,)),
    ("sum_elems", (), [(5,)], (1,)),
    ("add", (), [(5,), (1,)], (5,)),          # broadcasting inside an instance
    ("cmult", (), [(5, 1), (5, 3)], (5, 3)),
    ("tanh", (), [(5,)], (6,)),
    ("tanh", (), [(5,), (5,)], (5,)),         # wrong arity
    ("esum", (), [], (5,)),
    ("mulc", (), [(5,)], (5,)),               # constant missing
    ("mulc", (np.float64(2.0),), [(5,)], (5,)),  # would promote float32 to float64
])
def test_fusable_rejects(name, attrs, shapes, out):
    assert not fusable(OPS[name], attrs, shapes, out)


def test_fusable_rejects_an_unregistered_op_of_the_same_name():
    fake = OpDef("tanh", same_shape, lambda xp, a, d, x: x, None)
    assert not fusable(fake, (), [(3,)], (3,))


@pytest.mark.parametrize("steps, nin, err", [
    ([(OPS["tanh"], (), [1])], 1, ValueError),          # a register not yet defined
    ([(OPS["tanh"], (), [-1])], 1, ValueError),
    ([(OPS["tanh"], (), [0.5])], 1, TypeError),
    ([(OPS["matmul"], (), [0, 0])], 1, ValueError),
    ([], 1, ValueError),
    ([(OPS["tanh"], (), [0])], 0, ValueError),
])
def test_chain_rejects_bad_programs(steps, nin, err):
    with pytest.raises(err):
        FusedChain(steps, nin)


@C_ONLY
def test_longest_chain_and_one_more():
    """The kernels keep per-register tables on the stack: at most MAX_REGS values."""
    names = ["tanh", "mulc", "neg", "softsign"]
    steps = [(OPS[names[m % 4]], (0.9,) if names[m % 4] == "mulc" else (), [m]) for m in range(fusion.MAX_REGS - 1)]
    x = np.random.default_rng(11).standard_normal((2, 5))
    _compare(FusedChain(steps, 1), [x], [None] * (len(steps) - 1) + [np.ones((2, 5))], [True], np.float64)
    with pytest.raises(ValueError):
        FusedChain(steps + [(OPS["tanh"], (), [len(steps)])], 1)


@pytest.mark.parametrize("be_name", ["numpy", "cpu"])
def test_chain_rejects_bad_inputs(be_name):
    be = get_backend(be_name)
    chain = FusedChain([(OPS["add"], (), [0, 1])], 2)
    with pytest.raises(ValueError):
        chain.forward(be, [np.ones((3, 4))])                      # too few inputs
    with pytest.raises(ValueError):
        chain.forward(be, [np.ones((3, 4)), np.ones((2, 4))])     # batch sizes 3 and 2
    with pytest.raises(ValueError):
        chain.forward(be, [np.ones((3, 4)), np.ones((3, 5))])     # instance sizes differ
    x = [np.ones((3, 4)), np.ones((3, 4))]
    outs = chain.forward(be, x)
    with pytest.raises(ValueError):
        chain.backward(be, x, outs, [np.ones((3, 5))], [True, True])
    with pytest.raises(ValueError):
        chain.backward(be, x, [np.ones((2, 4))], [None], [True, True])
    with pytest.raises(ValueError):  # the forward's own outputs, but inputs of another batch
        chain.backward(be, [np.ones((5, 4)), np.ones((5, 4))], outs, [np.ones((5, 4))], [True, True])


# ----------------------------------------------------------------- the C source
_FLAGS = ["-std=c99", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-Wall", "-Wextra",
          "-Werror", "-DDG_NO_CLONES"]
_KERNELS = Path(__file__).resolve().parents[1] / "kernels"

# Every opcode once over exactly-sized heap buffers (a strided input ends at its last
# row's n-th element, shared inputs and gradients hold one row), NaN/inf among the
# values, with every register live: AddressSanitizer and UBSan see any stray access.
_HARNESS_BODY = """
static void run$S(int64_t B, int64_t n) {
    enum { NIN = 4, NS = DG_FZ_NOPS };
    int64_t code[NS * 5], pos = 0, ostride[NS], gstride[NS];
    int64_t istride[NIN] = {n, 0, n + 5, 0};
    double consts[NS];
    for (int64_t m = 0; m < NS; m++) {
        int64_t na = m <= DG_FZ_FLIP_GRADIENT ? 1 : m <= DG_FZ_BMIN ? 2 : 3;
        code[pos++] = m;
        code[pos++] = na;
        for (int64_t i = 0; i < na; i++)
            code[pos++] = (m * 7 + i * 3) % (NIN + m);
        consts[m] = 1.5;
    }
    $T *in[NIN], *gin[NIN];
    int64_t size[NIN] = {B * n, n, (B - 1) * (n + 5) + n, n};
    for (int k = 0; k < NIN; k++) {
        in[k] = malloc((size_t)size[k] * sizeof($T));
        gin[k] = malloc((size_t)(istride[k] ? B * n : n) * sizeof($T));
        for (int64_t i = 0; i < size[k]; i++)
            in[k][i] = i % 11 == 3 ? ($T)NAN : i % 13 == 5 ? ($T)INFINITY : ($T)(sin((double)(i + k)) * 3);
    }
    $T *out = malloc((size_t)(NS * B * n) * sizeof($T)), *g = malloc((size_t)(B * n) * sizeof($T));
    $T *work = malloc((size_t)((NIN + NS + 1) * DG_FUSED_TILE + NS * n) * sizeof($T));
    const $T *ins[NIN], *outs[NS], *gout[NS];
    unsigned char live[NIN + NS];
    memset(live, 1, sizeof live);
    for (int k = 0; k < NIN; k++)
        ins[k] = in[k];
    for (int64_t i = 0; i < B * n; i++)
        g[i] = ($T)cos((double)i);
    dg_fused_fwd$S(code, consts, NS, ins, istride, NIN, out, B, n);
    for (int64_t m = 0; m < NS; m++) {
        outs[m] = out + m * B * n, ostride[m] = n;
        gout[m] = m % 3 ? NULL : g, gstride[m] = m % 2 ? n : 0;
    }
    dg_fused_bwd$S(code, consts, NS, ins, istride, NIN, outs, ostride, gout, gstride, gin, live, work, B, n);
    for (int k = 0; k < NIN; k++)
        free(in[k]), free(gin[k]);
    free(out), free(g), free(work);
}
"""
_HARNESS = ("#include <math.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
            "#include \"dg_kernels.h\"\n"
            + _HARNESS_BODY.replace("$T", "float").replace("$S", "_f32")
            + _HARNESS_BODY.replace("$T", "double").replace("$S", "_f64")
            + "int main(void) {\n    int64_t shapes[][2] = {{3, 300}, {1, 1}, {2, 256}, {4, 7}};\n"
              "    for (int i = 0; i < 4; i++)\n"
              "        run_f32(shapes[i][0], shapes[i][1]), run_f64(shapes[i][0], shapes[i][1]);\n"
              "    printf(\"harness ok\\n\");\n    return 0;\n}\n")


def _gcc() -> str:
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc not available")
    return cc


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def test_fused_c_compiles_warning_clean(tmp_path):
    """tests/backends/test_build.py covers the families it lists; this covers fused.c."""
    r = _run([_gcc(), *_FLAGS, "-O3", "-I", str(_KERNELS), "-c", str(_KERNELS / "fused.c"),
              "-o", str(tmp_path / "fused.o")])
    assert r.returncode == 0, r.stderr


def test_fused_c_under_address_and_undefined_sanitizers(tmp_path):
    cc = _gcc()
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    (tmp_path / "probe.c").write_text("int main(void) { return 0; }\n")
    if _run([cc, *san, str(tmp_path / "probe.c"), "-o", str(tmp_path / "probe")]).returncode != 0:
        pytest.skip("gcc here cannot build with -fsanitize=address,undefined")
    (tmp_path / "harness.c").write_text(_HARNESS)
    exe = tmp_path / "harness"
    r = _run([cc, *_FLAGS, "-O1", "-g", "-fno-omit-frame-pointer", *san, "-I", str(_KERNELS),
              str(_KERNELS / "fused.c"), str(tmp_path / "harness.c"), "-lm", "-o", str(exe)])
    assert r.returncode == 0, r.stderr
    r = _run([str(exe)])
    assert r.returncode == 0 and "harness ok" in r.stdout, r.stdout + r.stderr
