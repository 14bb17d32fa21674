"""Fused LSTM cell ops: values against numpy, gradients against finite differences, and
the errors a wrong shape gives at record time."""
from __future__ import annotations

import pytest
from cases_cells import CASES
from opcases import params, run_reference

import dynagraph as dy
from dynagraph.expression import record
from dynagraph.nn.cells import lstm_update
from dynagraph.ops import OPS


@pytest.mark.parametrize("case", params(CASES))
def test_cell_op_matches_reference(case):
    run_reference(case)


def test_wrong_shapes_name_the_op_and_shapes():
    pre, c = dy.inputVector([0.1] * 8), dy.inputVector([0.2] * 3)
    with pytest.raises(dy.DynagraphError, match=r"lstm_c\(\(8,\), \(3,\)\).*previous cell.*\(2,\)"):
        lstm_update(pre, c)
    with pytest.raises(dy.DynagraphError, match=r"lstm_h.*cell must have shape \(2,\)"):
        record(OPS["lstm_h"], (pre, c), (2,))
    with pytest.raises(dy.DynagraphError, match=r"lstm_c.*\(12,\)"):
        record(OPS["lstm_c"], (pre,), (3, 1.0))
    with pytest.raises(TypeError, match="4H"):
        lstm_update(dy.inputVector([0.1] * 6))
