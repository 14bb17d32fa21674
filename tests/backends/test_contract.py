"""The backend contract (backends/contract.py): capabilities, not names.

Structure checks over the package source: no caller outside backends/ branches on a
backend's name or imports the compiled module; every backend satisfies the Protocol
and says which optional capabilities it has (None where absent)."""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from dynagraph.backends import contract, get_backend, optable

PKG = pathlib.Path(__file__).resolve().parents[2] / "dynagraph"
OUTSIDE = [p for p in PKG.rglob("*.py") if "backends" not in p.relative_to(PKG).parts]


def _offending(pattern: str) -> list:
    rx = re.compile(pattern)
    return [f"{p.relative_to(PKG)}:{i}: {line.strip()}" for p in OUTSIDE
            for i, line in enumerate(p.read_text().splitlines(), 1) if rx.search(line)]


def test_the_structure_scan_sees_the_package():
    names = {p.relative_to(PKG).as_posix() for p in OUTSIDE}
    assert {"runs.py", "fusion.py", "executor.py", "nn/trainers.py"} <= names
    assert not any(n.startswith("backends/") for n in names)


def test_no_caller_branches_on_a_backend_name():
    # be.name / backend.name / get_backend().name / getattr(be, "name") compared with anything
    assert _offending("|".join((r"(\bbe|backend|get_backend\([^)]*\))\.name\s*[!=]=",
                                r"""["'](cpu|cuda|numpy)["']\s*[!=]=\s*\w*\.name""",
                                r"""getattr\(\w+,\s*["']name["'][^)]*\)\s*[!=]="""))) == []


def test_no_compiled_module_import_outside_backends():
    assert _offending(r"(from\s+\.+\s*_kernels|import\s+dynagraph\._kernels|from\s+dynagraph\._kernels"
                      r"|from\s+dynagraph\s+import\s+_kernels|from\s+\.+backends\s+import\s+cpu\b"
                      r"|backends\.cpu\b)") == []


@pytest.mark.parametrize("name", ["numpy", "cpu"])
def test_backends_satisfy_the_protocol(name):
    be = get_backend(name)
    assert isinstance(be, contract.Backend)
    for cap, proto in (("elementwise_runs", contract.ElementwiseRuns), ("fused_chains", contract.FusedChains),
                       ("fused_cells", contract.FusedCells), ("optimizer_rules", contract.OptimizerRules)):
        got = getattr(be, cap)
        assert got is None or isinstance(got, proto), cap
    assert be.row_add is None or callable(be.row_add)


def test_numpy_backend_has_no_optional_capability():
    be = get_backend("numpy")
    assert all(getattr(be, cap) is None for cap in contract.CAPABILITIES)


def test_op_table_matches_the_compiled_enum():
    """optable's order is the C enum's: the runs, the chains and the CUDA generator agree."""
    lib = pytest.importorskip("dynagraph._kernels").lib
    assert {n: getattr(lib, "DG_FZ_" + n.upper()) for n in optable.ARITY} == optable.OPCODE
    assert lib.DG_FZ_NOPS == len(optable.OPCODE)
    assert (lib.DG_RUN_COPY, lib.DG_RUN_MAX_ARGS) == (optable.RUN_COPY, optable.RUN_MAX_ARGS)
    assert (lib.DG_FUSED_TILE, lib.DG_FUSED_MAX_REGS) == (optable.FUSED_TILE, optable.FUSED_MAX_REGS)


def test_capabilities_are_used_not_names(monkeypatch):
    """A cpu backend whose runs capability is removed runs op by op: same values."""
    import dynagraph as dy
    from dynagraph.backends import cpu  # noqa: F401  (skip below when not built)
    be = get_backend("cpu")
    if be.elementwise_runs is None:
        pytest.skip("compiled kernels not built")
    monkeypatch.setattr(dy.config.config, "backend", "cpu")

    def loss():
        dy.renew_cg(scheduler="agenda")
        xs = [dy.inputVector([0.1 * k, -0.2, 0.3]) for k in range(4)]
        return dy.esum([dy.sum_elems(dy.cmult(dy.tanh(x), dy.logistic(x))) for x in xs])

    with_runs = loss()
    v1, runs1 = with_runs.value(), dy.cg().stats.runs
    monkeypatch.setattr(be, "elementwise_runs", None)
    without = loss()
    v2, runs2 = without.value(), dy.cg().stats.runs
    assert runs1 >= 1 and runs2 == 0
    np.testing.assert_allclose(v1, v2, rtol=1e-6)
