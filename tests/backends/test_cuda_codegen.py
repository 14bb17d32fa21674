"""The CUDA generator (backends/cuda_codegen.py) against the op table and the ops.

No GPU needed: the formulas are evaluated with numpy against every op's own forward
and backward, every op of the table (the C runs' table) has its formulas, and the
generated sources compile with nvcc --ptx where nvcc is installed."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from dynagraph.backends import cuda_codegen as cg
from dynagraph.backends import optable
from dynagraph.ops.base import OPS

POSITIVE = {"log", "sqrt", "powc", "rdivc", "pow", "cdiv"}


def _env(dtype=np.float64) -> dict:
    T = (lambda v: np.asarray(v, dtype))
    return {"T": T, "where": np.where, "tanh": np.tanh, "exp": np.exp, "expm1": np.expm1, "log": np.log,
            "sqrt": np.sqrt, "fabs": np.abs, "pow": np.power, "dg_sign": np.sign,
            "dg_max": lambda u, v: np.where((u >= v) | (u != u), u, v),
            "dg_min": lambda u, v: np.where((u <= v) | (u != u), u, v)}


def test_every_op_of_the_c_table_has_cuda_formulas():
    for name, arity in optable.ARITY.items():
        if name in cg.NARY:
            continue
        assert name in cg.FORWARD and name in cg.BACKWARD, name
        assert len(cg.BACKWARD[name]) == arity, name
    assert set(cg.FORWARD) | cg.NARY == set(optable.ARITY)


@pytest.mark.parametrize("name", [n for n in optable.ARITY if n not in cg.NARY])
def test_formulas_match_the_ops(name):
    rng = np.random.default_rng(3)
    arity, c = optable.ARITY[name], 0.7
    xs = [rng.uniform(0.2, 2.0, (3, 5)) if name in POSITIVE else rng.standard_normal((3, 5)) for _ in range(arity)]
    attrs = (c,) if name in optable.WITH_CONST else ()
    op = OPS[name]
    y = op.forward(np, attrs, None, *xs)
    env = dict(_env(), c=np.float64(c), g=rng.standard_normal((3, 5)))
    env.update(zip(("x",) if arity == 1 else ("u", "v"), xs))
    np.testing.assert_allclose(eval(cg.FORWARD[name], env), y, rtol=1e-12, atol=1e-14)
    env["y"] = y
    want = op.backward(np, attrs, None, xs, y, env["g"], (True,) * arity) if op.backward else (None,) * arity
    for k, (formula, ref) in enumerate(zip(cg.BACKWARD[name], want)):
        if formula is None or ref is None or op.blocks_grad:
            continue
        np.testing.assert_allclose(eval(formula, env), ref, rtol=1e-10, atol=1e-12, err_msg=f"{name} arg {k}")


def test_chain_source_is_straight_line_per_step():
    code = [optable.OPCODE["logistic"], 1, 0, optable.OPCODE["cmult"], 2, 2, 1, optable.OPCODE["logsumexp"], 3, 3, 0, 1]
    src = cg.chain_source(np.array(code), [0.0, 0.0, 0.0], 2, "float32")
    assert "typedef float T;" in src and len(re.findall(r"\bout\[", src)) == 3  # one store per step
    assert "dg_chain_fwd" in src and "dg_chain_bwd" in src and "atomicAdd" in src


def _nvcc(src: str, tmp_path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    f = tmp_path / "k.cu"
    f.write_text(src)
    r = subprocess.run([nvcc, "--ptx", "-arch=sm_90", str(f), "-o", str(tmp_path / "k.ptx")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_generated_sources_compile(dtype, tmp_path):
    code = []  # one chain with every op of the table, each over the two inputs
    for name, arity in optable.ARITY.items():
        args = [0, 1, 0][:arity or 3]
        code += [optable.OPCODE[name], len(args)] + args
    chain = cg.chain_source(np.array(code), [0.5] * len(optable.ARITY), 2, dtype, prelude=False)
    _nvcc(cg.all_ops_source(dtype) + chain, tmp_path)


def test_gpu_bench_says_why_it_cannot_run():
    """Without CuPy, torch or a device the GPU bench exits 2 with the reason, not a traceback."""
    import os
    import sys
    from backend_params import unavailable
    if not unavailable("cuda"):
        pytest.skip("a device is present: the bench would run")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, os.path.join(root, "bench", "gpu_bench.py")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "needs a CUDA device" in r.stderr, r.stderr[-2000:]
