"""The elementwise op table every fused path shares: the C runs and chains
(kernels/fused.inc, enum dg_fused_op) and the CUDA kernels generated from it
(backends/cuda_codegen.py) index their ops by the position of the name here.

The order is the C enum's; tests/backends/test_contract.py checks it against the
compiled module, and the CUDA generator emits one case per entry.
"""
from __future__ import annotations

# op name -> number of arguments (0: any number >= 1)
UNARY = ("neg", "tanh", "logistic", "rectify", "elu", "selu", "exp", "log", "square", "cube", "sqrt",
         "abs", "softsign", "addc", "mulc", "rsubc", "rdivc", "powc", "nobackprop", "flip_gradient")
BINARY = ("add", "sub", "cmult", "cdiv", "pow", "bmax", "bmin")
NARY = ("esum", "average", "emax", "logsumexp")
ARITY = {**{n: 1 for n in UNARY}, **{n: 2 for n in BINARY}, **{n: 0 for n in NARY}}
# Ops whose attrs[0] is a scalar constant of the formula.
WITH_CONST = frozenset(("elu", "addc", "mulc", "rsubc", "rdivc", "powc"))

OPCODE = {name: code for code, name in enumerate(ARITY)}   # enum dg_fused_op
RUN_COPY, RUN_MAX_ARGS = 100, 64                             # enum dg_run_limits
FUSED_TILE, FUSED_MAX_REGS = 256, 512                        # enum dg_fused_limits
