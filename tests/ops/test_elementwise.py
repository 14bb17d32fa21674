"""Reference checks for the elementwise ops: value vs numpy, gradients vs finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from cases_elementwise import CASES
from opcases import params, run_reference


@pytest.mark.parametrize("case", params(CASES))
def test_reference(case):
    run_reference(case)


def test_nobackprop_blocks_only_its_own_path(pc):
    x0 = np.array([0.5, -1.0, 2.0])
    p = pc.add_parameters(3, init=x0.copy())
    dy.renew_cg()
    x = dy.parameter(p)
    dy.sum_elems(dy.cmult(x, dy.nobackprop(x))).backward()
    np.testing.assert_allclose(p.grad_as_array(), x0)      # d/dx of x*c with c = x held fixed


def test_flip_gradient_negates_only_its_own_path(pc):
    x0 = np.array([0.5, -1.0, 2.0])
    p = pc.add_parameters(3, init=x0.copy())
    dy.renew_cg()
    x = dy.parameter(p)
    dy.sum_elems(dy.cmult(x, dy.flip_gradient(x)) + 3 * x).backward()
    np.testing.assert_allclose(p.grad_as_array(), x0 - x0 + 3.0)
