"""CUDA source for fused elementwise programs, generated from the op table the C runs
and chains use (backends/optable.py), so both backends fuse exactly the same ops.

Every op of optable.ARITY has a forward formula and one gradient formula per argument,
written once here as C++ expressions over a tiny vocabulary that is also valid Python
with numpy (`where`, `tanh`, `exp`, `expm1`, `log`, `sqrt`, `fabs`, `pow`, `dg_max`,
`dg_min`, `dg_sign`, `T(...)`): tests evaluate the same strings with numpy against each
op's own forward and backward, and compile the generated kernels with nvcc where it is
installed, so the generator is checked without a GPU.

Names in the formulas: x (unary argument), u, v (binary arguments), xs (n-ary
arguments, handled by the n-ary helpers), c (the op's constant), y (the output), g (the
output's gradient). A chain of m steps over k inputs becomes one kernel with one thread
per element of the (B, n) batch and the program as straight-line code in registers: no
interpreter, no per-op launch. Pure Python: importable without CuPy.
"""
from __future__ import annotations

import re

from . import optable

SELU_SCALE, SELU_ALPHA = 1.0507009873554805, 1.6732632423543772   # kernels/fused.inc

# forward formula per op (n-ary ops: see _nary_forward)
FORWARD = {
    "neg": "-x", "tanh": "tanh(x)", "logistic": "T(1) / (T(1) + exp(-x))",
    "rectify": "where(x < T(0), T(0), x)", "elu": "where(x > T(0), x, c * expm1(x))",
    "selu": f"T({SELU_SCALE!r}) * where(x > T(0), x, T({SELU_ALPHA!r}) * expm1(x))",
    "exp": "exp(x)", "log": "log(x)", "square": "x * x", "cube": "x * x * x", "sqrt": "sqrt(x)",
    "abs": "fabs(x)", "softsign": "x / (T(1) + fabs(x))", "addc": "x + c", "mulc": "x * c", "rsubc": "c - x",
    "rdivc": "c / x", "powc": "pow(x, c)", "nobackprop": "x", "flip_gradient": "x",
    "add": "u + v", "sub": "u - v", "cmult": "u * v", "cdiv": "u / v", "pow": "pow(u, v)",
    "bmax": "dg_max(u, v)", "bmin": "dg_min(u, v)",
}
# per argument, the gradient it receives (None: none, as nobackprop)
BACKWARD = {
    "neg": ("-g",), "tanh": ("(T(1) - y * y) * g",), "logistic": ("(T(1) - y) * y * g",),
    "rectify": ("g * T(x > T(0))",), "elu": ("g * where(x > T(0), T(1), y + c)",),
    "selu": (f"g * where(x > T(0), T({SELU_SCALE!r}), y + T({SELU_SCALE * SELU_ALPHA!r}))",),
    "exp": ("g * y",), "log": ("g / x",), "square": ("T(2) * g * x",), "cube": ("T(3) * g * x * x",),
    "sqrt": ("g / (T(2) * y)",), "abs": ("g * dg_sign(x)",),
    "softsign": ("g / ((T(1) + fabs(x)) * (T(1) + fabs(x)))",), "addc": ("g",), "mulc": ("g * c",),
    "rsubc": ("-g",), "rdivc": ("-g * y / x",), "powc": ("g * c * pow(x, c - T(1))",),
    "nobackprop": (None,), "flip_gradient": ("-g",),
    "add": ("g", "g"), "sub": ("g", "-g"), "cmult": ("g * v", "g * u"), "cdiv": ("g / v", "-g * y / v"),
    "pow": ("g * v * pow(u, v - T(1))", "g * y * log(u)"),
    "bmax": ("g * T(u >= v)", "g * T(u < v)"), "bmin": ("g * T(u <= v)", "g * T(u > v)"),
}
NARY = frozenset(optable.NARY)

PRELUDE = r"""
typedef %(T)s T;
template <typename V> __device__ __forceinline__ V where(bool c, V a, V b) { return c ? a : b; }
__device__ __forceinline__ T dg_max(T u, T v) { return (u >= v || u != u) ? u : v; }
__device__ __forceinline__ T dg_min(T u, T v) { return (u <= v || u != u) ? u : v; }
__device__ __forceinline__ T dg_sign(T v) { return v > 0 ? T(1) : v < 0 ? T(-1) : v == 0 ? T(0) : v; }
"""
CTYPE = {"float32": "float", "float64": "double"}


def _subst(expr: str, names: dict) -> str:
    return re.sub(r"\b(x|u|v|y|g|c)\b", lambda m: names.get(m.group(1), m.group(1)), expr)


def _lit(value: float, ctype: str) -> str:
    return f"T({float(value)!r})"


def _nary_forward(name: str, regs: list, c: str) -> str:
    if name in ("esum", "average"):
        s = " + ".join(regs)
        return f"({s}) * {c}" if name == "average" else s
    if name == "emax":
        e = regs[0]
        for r in regs[1:]:
            e = f"dg_max({e}, {r})"
        return e
    # logsumexp: max first, as the C kernel does
    m = regs[0]
    for r in regs[1:]:
        m = f"dg_max({m}, {r})"
    return f"lse_m + log({' + '.join(f'exp({r} - lse_m)' for r in regs)})", m


def step_forward(name: str, dst: str, args: list, const: float, ctype: str = "double") -> str:
    """One C++ statement computing step `dst` from argument registers."""
    c = _lit(const, ctype)
    if name in NARY:
        got = _nary_forward(name, args, c)
        if isinstance(got, tuple):
            expr, m = got
            return f"T {dst}; {{ T lse_m = {m}; {dst} = {expr}; }}"
        return f"T {dst} = {got};"
    names = {"c": c}
    if len(args) == 1:
        names["x"] = args[0]
    else:
        names["u"], names["v"] = args
    return f"T {dst} = {_subst(FORWARD[name], names)};"


def step_backward(name: str, dst: str, args: list, gdst: str, gargs: list, const: float) -> list:
    """Statements adding step `dst`'s gradient into its live arguments' gradient
    registers (gargs[k] None: argument k needs none)."""
    c = _lit(const, "")
    out = []
    if name in NARY:
        if name == "emax":  # the first argument equal to the maximum (or the first NaN) takes it
            out.append("{ bool taken = false;")
            for a, ga in zip(args, gargs):
                out.append(f"  {{ bool hit = !taken && ({a} == {dst} || {a} != {a}); "
                           + (f"{ga} += {gdst} * T(hit); " if ga else "") + "taken = taken || hit; }")
            out.append("}")
            return out
        for a, ga in zip(args, gargs):
            if ga is None:
                continue
            term = {"esum": gdst, "average": f"{gdst} * {c}", "logsumexp": f"{gdst} * exp({a} - {dst})"}[name]
            out.append(f"{ga} += {term};")
        return out
    names = {"c": c, "y": dst, "g": gdst}
    if len(args) == 1:
        names["x"] = args[0]
    else:
        names["u"], names["v"] = args
    for formula, ga in zip(BACKWARD[name], gargs):
        if ga is not None and formula is not None:
            out.append(f"{ga} += {_subst(formula, names)};")
    return out


def _steps(code, nin: int) -> list:
    """[(op name, [argument registers])] from a FusedChain code array."""
    names = list(optable.OPCODE)
    steps, at = [], 0
    code = [int(v) for v in code]
    while at < len(code):
        op, k = code[at], code[at + 1]
        steps.append((names[op], code[at + 2:at + 2 + k]))
        at += 2 + k
    return steps


def chain_source(code, consts, nin: int, dtype: str, prelude: bool = True) -> str:
    """Forward and backward kernels of one FusedChain program.

    dg_chain_fwd(ins, istride, out, B, n): out holds (nsteps, B, n).
    dg_chain_bwd(ins, istride, outs, gout, gstride, gin, live, B, n): gin[k] (NULL: not
    needed) receives (B, n), or (n) summed over the batch by atomicAdd when input k is
    shared (istride[k] == 0); gout[m] NULL: no gradient from outside; gstride[m] 0:
    one row for every row. `live` is baked in per (which gradients arrive, which inputs
    need one), as FusedChain._live computes it."""
    T = CTYPE[str(dtype)]
    steps = _steps(code, nin)
    ns = len(steps)
    reg = [f"r{i}" for i in range(nin + ns)]
    fwd = [PRELUDE % {"T": T} if prelude else "",
           'extern "C" __global__ void dg_chain_fwd(const T* const* ins, const long long* istride, T* out,',
           "                                        long long B, long long n) {",
           "  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;",
           "  if (i >= B * n) return;",
           "  long long b = i / n, j = i - b * n;"]
    for k in range(nin):
        fwd.append(f"  T {reg[k]} = ins[{k}][b * istride[{k}] + j];")
    for m, (name, args) in enumerate(steps):
        fwd.append("  " + step_forward(name, reg[nin + m], [reg[a] for a in args], consts[m]))
        fwd.append(f"  out[{m} * B * n + i] = {reg[nin + m]};")
    fwd.append("}")
    bwd = ['extern "C" __global__ void dg_chain_bwd(const T* const* ins, const long long* istride,',
           "    const T* const* outs, const T* const* gout, const long long* gstride, T* const* gin,",
           "    long long B, long long n) {",
           "  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;",
           "  if (i >= B * n) return;",
           "  long long b = i / n, j = i - b * n;"]
    for k in range(nin):
        bwd.append(f"  T {reg[k]} = ins[{k}][b * istride[{k}] + j]; T d{k} = T(0);")
    for m in range(ns):
        r = nin + m
        bwd.append(f"  T {reg[r]} = outs[{m}][i]; T d{r} = gout[{m}] ? gout[{m}][b * gstride[{m}] + j] : T(0);")
    for m in range(ns - 1, -1, -1):
        name, args = steps[m]
        r = nin + m
        for s in step_backward(name, reg[r], [reg[a] for a in args], f"d{r}", [f"d{a}" for a in args], consts[m]):
            bwd.append("  " + s)
    for k in range(nin):
        bwd.append(f"  if (gin[{k}]) {{ if (istride[{k}]) gin[{k}][i] = d{k}; else atomicAdd(&gin[{k}][j], d{k}); }}")
    bwd.append("}")
    return "\n".join(fwd + bwd) + "\n"


def all_ops_source(dtype: str) -> str:
    """One kernel per op of the table, forward and backward (for compile checks)."""
    T = CTYPE[str(dtype)]
    parts = [PRELUDE % {"T": T}]
    for name, arity in optable.ARITY.items():
        k = arity or 3
        args = [f"a{q}" for q in range(k)]
        params = ", ".join(f"T {a}" for a in args)
        body = [step_forward(name, "y", args, 0.5)]
        body += step_backward(name, "y", args, "g", [f"d[{q}]" for q in range(k)], 0.5)
        parts.append(f'extern "C" __global__ void dg_op_{name}({params}, T g, T* d, T* out) {{\n  '
                     + "\n  ".join(body) + "\n  out[0] = y;\n}")
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------ the TreeLSTM cell
# The N-ary TreeLSTM cell (the fused_cells capability) as straight-line statements built
# from the same formulas: logistic, tanh, cmult and add of the op table. Each statement is
# (register, expression) in the shared vocabulary, so one program is both rendered as a
# CUDA kernel (treelstm_source) and evaluated with any xp (backends/tree_cell.py, and the
# tests against the C cell). Layouts as the C kernel (kernels/gates.inc): pre (B, (N+3)H)
# = [i f_1..f_N o u], act (B, (N+4)H) = [i f_1..f_N o u tanh(c)].
def _op(name: str, *args: str) -> str:
    return _subst(FORWARD[name], dict(zip(("x",) if len(args) == 1 else ("u", "v"), args)))


def _grad(name: str, k: int, g: str, y: str | None = None, u: str | None = None, v: str | None = None) -> str:
    names = {"g": g}
    names.update({n: a for n, a in (("y", y), ("u", u), ("v", v)) if a is not None})
    return _subst(BACKWARD[name][k], names)


def treelstm_slots(N: int) -> dict:
    """Gate -> its column block in pre and act (tc: act only)."""
    return {"i": 0, **{f"f{k}": k + 1 for k in range(N)}, "o": N + 1, "u": N + 2, "tc": N + 3}


def treelstm_forward_program(N: int, has_bias: bool) -> list:
    """Registers in: p_<gate> (pre), b_<gate> (bias, when has_bias), ck<k> (child k's cell).
    Out: a_<gate> (act), c_out, h_out."""
    st = []
    for gate, fn in [("i", "logistic"), ("u", "tanh")] + [(f"f{k}", "logistic") for k in range(N)] + \
            [("o", "logistic")]:
        x = f"p_{gate}"
        if has_bias:
            st.append((f"z_{gate}", _op("add", x, f"b_{gate}")))
            x = f"z_{gate}"
        st.append((f"a_{gate}", _op(fn, x)))
    st.append(("c_0", _op("cmult", "a_i", "a_u")))  # c = i u + f_1 c_1 + f_2 c_2 + ..., left to right
    for k in range(N):
        st.append((f"fc{k}", _op("cmult", f"a_f{k}", f"ck{k}")))
        st.append((f"c_{k + 1}", _op("add", f"c_{k}", f"fc{k}")))
    st.append(("c_out", f"c_{N}"))
    st.append(("a_tc", _op("tanh", "c_out")))
    st.append(("h_out", _op("cmult", "a_o", "a_tc")))
    return st


def treelstm_backward_program(N: int, has_dc: bool) -> list:
    """Registers in: a_<gate> (act), ck<k>, dh, dc (when has_dc). Out: d_<gate> (dpre), dck<k>."""
    st = [("d_tc", _grad("cmult", 1, "dh", u="a_o")), ("d_o_g", _grad("cmult", 0, "dh", v="a_tc")),
          ("dcv", _grad("tanh", 0, "d_tc", y="a_tc"))]
    if has_dc:
        st.append(("dcv_t", _op("add", "dcv", "dc")))
    dcv = "dcv_t" if has_dc else "dcv"
    st += [("d_i_g", _grad("cmult", 0, dcv, v="a_u")), ("d_u_g", _grad("cmult", 1, dcv, u="a_i")),
           ("d_i", _grad("logistic", 0, "d_i_g", y="a_i")), ("d_u", _grad("tanh", 0, "d_u_g", y="a_u"))]
    for k in range(N):
        st += [(f"d_f{k}_g", _grad("cmult", 0, dcv, v=f"ck{k}")), (f"dck{k}", _grad("cmult", 1, dcv, u=f"a_f{k}")),
               (f"d_f{k}", _grad("logistic", 0, f"d_f{k}_g", y=f"a_f{k}"))]
    st.append(("d_o", _grad("logistic", 0, "d_o_g", y="a_o")))
    return st


def treelstm_source(N: int, has_bias: bool, has_dc: bool, dck_mode: int, dtype: str) -> str:
    """dg_tree_fwd(pre, bias, kids, kid_rows, ldk, c, ldc, h, ldh, act, B, H) and
    dg_tree_bwd(act, kids, kid_rows, ldk, dh, dc, dpre, dkids, B, H), one thread per
    (row, unit). Child k of row b is kids row kid_rows[k ldk + b], or k B + b when kid_rows
    is NULL. dck_mode: 0 no child gradient, 1 written to dense dkids (N, B, H), 2 added
    into rows of the table dkids (atomicAdd: rows may repeat)."""
    T = CTYPE[str(dtype)]
    slots = treelstm_slots(N)
    head = ["  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;",
            "  if (e >= B * H) return;",
            "  long long b = e / H, j = e - b * H;"]
    kid = [f"  long long kr{k} = (kid_rows ? kid_rows[{k} * ldk + b] : {k} * B + b) * H + j;" for k in range(N)]
    G, A = (N + 3), (N + 4)
    fwd = [PRELUDE % {"T": T},
           'extern "C" __global__ void dg_tree_fwd(const T* pre, const T* bias, const T* kids,',
           "    const long long* kid_rows, long long ldk, T* c, long long ldc, T* h, long long ldh, T* act,",
           "    long long B, long long H) {", *head, *kid]
    for gate, s in slots.items():
        if gate != "tc":
            fwd.append(f"  T p_{gate} = pre[b * {G} * H + {s} * H + j];")
            if has_bias:
                fwd.append(f"  T b_{gate} = bias[{s} * H + j];")
    fwd += [f"  T ck{k} = kids[kr{k}];" for k in range(N)]
    fwd += [f"  T {r} = {x};" for r, x in treelstm_forward_program(N, has_bias)]
    fwd += [f"  act[b * {A} * H + {s} * H + j] = a_{gate};" for gate, s in slots.items()]
    fwd += ["  c[b * ldc + j] = c_out;", "  h[b * ldh + j] = h_out;", "}"]
    bwd = ['extern "C" __global__ void dg_tree_bwd(const T* act, const T* kids, const long long* kid_rows,',
           "    long long ldk, const T* dh_, const T* dc_, T* dpre, T* dkids, long long B, long long H) {",
           *head, *kid]
    bwd += [f"  T a_{gate} = act[b * {A} * H + {s} * H + j];" for gate, s in slots.items()]
    bwd += [f"  T ck{k} = kids[kr{k}];" for k in range(N)]
    bwd.append("  T dh = dh_[b * H + j];")
    if has_dc:
        bwd.append("  T dc = dc_[b * H + j];")
    bwd += [f"  T {r} = {x};" for r, x in treelstm_backward_program(N, has_dc)]
    bwd += [f"  dpre[b * {G} * H + {s} * H + j] = d_{gate};" for gate, s in slots.items() if gate != "tc"]
    for k in range(N):
        if dck_mode == 1:
            bwd.append(f"  dkids[({k} * B + b) * H + j] = dck{k};")
        elif dck_mode == 2:
            bwd.append(f"  atomicAdd(&dkids[kr{k}], dck{k});")
    bwd.append("}")
    return "\n".join(fwd + bwd) + "\n"
