"""Error messages: raised when the op is recorded, naming the op, the argument
shapes and the user's own source line (file:line of the offending call).

Each bad call sits in a lambda on the same line as `here()`, so the line the
message must name is known without hard-coding numbers.
"""
from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import dynagraph as dy

THIS_FILE = os.path.basename(__file__)


def here() -> int:
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno


def raised(kind: type, line: int, bad) -> str:
    """Run `bad`, expect `kind`, check nothing was evaluated and the message names file:line."""
    cg = dy.cg()
    n_before = cg.stats.nodes
    with pytest.raises(kind) as ei:
        bad()
    msg = str(ei.value)
    assert f"{THIS_FILE}:{line}" in msg, msg
    assert cg.stats.nodes == n_before, "the error must come from recording, not evaluation"
    return msg


def assert_names(msg: str, *parts: str) -> None:
    for p in parts:
        assert p in msg, f"{p!r} missing from: {msg}"


@pytest.fixture
def model(pc):
    W = pc.add_parameters((3, 4))
    E = pc.add_lookup_parameters((5, 2))
    return W, E


# --------------------------------------------------------------------- shape errors
def test_matmul_shape_mismatch(model):
    W, _ = model
    x = dy.inputVector([1.0, 2.0, 3.0])
    ln, bad = here(), (lambda: W * x)
    assert_names(raised(dy.DynagraphError, ln, bad), "matmul", "(3, 4)", "(3,)")
    ln, bad = here(), (lambda: dy.parameter(W) * dy.parameter(W))
    assert_names(raised(dy.DynagraphError, ln, bad), "matmul", "(3, 4)")


def test_affine_transform_mismatch(model):
    W, _ = model
    x, b = dy.inputVector([1.0, 2.0, 3.0]), dy.inputVector([0.0, 0.0, 0.0])
    ln, bad = here(), (lambda: dy.affine_transform([b, W, x]))
    assert_names(raised(dy.DynagraphError, ln, bad), "affine", "(3, 4)", "(3,)")


@pytest.mark.parametrize("fn", ["cmult", "cdiv", "bmax", "bmin"])
def test_elementwise_incompatible_shapes(fn):
    x, y = dy.inputVector([1.0, 2.0, 3.0]), dy.inputVector([1.0, 2.0])
    ln, bad = here(), (lambda: getattr(dy, fn)(x, y))
    assert_names(raised(dy.DynagraphError, ln, bad), fn, "(3,)", "(2,)")


def test_add_incompatible_shapes():
    x, m = dy.inputVector([1.0, 2.0, 3.0]), dy.inputTensor(np.ones((2, 4)))
    ln, bad = here(), (lambda: x + m)
    assert_names(raised(dy.DynagraphError, ln, bad), "add", "(3,)", "(2, 4)")


def test_nary_shape_mismatch():
    x, y = dy.inputVector([1.0, 2.0, 3.0]), dy.inputVector([1.0, 2.0])
    for fn in ("esum", "average", "emax", "logsumexp"):
        ln, bad = here(), (lambda: getattr(dy, fn)([x, y, x]))
        assert_names(raised(dy.DynagraphError, ln, bad), fn, "(3,)", "(2,)")
    ln, bad = here(), (lambda: dy.dot_product(x, y))
    assert_names(raised(dy.DynagraphError, ln, bad), "dot_product", "(3,)", "(2,)")


def test_concatenate_mismatch():
    x, m = dy.inputVector([1.0, 2.0, 3.0]), dy.inputTensor(np.ones((2, 3)))
    ln, bad = here(), (lambda: dy.concatenate([x, m]))
    assert_names(raised(dy.DynagraphError, ln, bad), "concatenate", "(3,)", "(2, 3)")
    y = dy.inputVector([1.0, 2.0])
    ln, bad = here(), (lambda: dy.concatenate_cols([x, y]))
    assert_names(raised(dy.DynagraphError, ln, bad), "concatenate", "(3,)", "(2,)")


def test_reshape_size_mismatch():
    x = dy.inputVector([1.0, 2.0, 3.0])
    ln, bad = here(), (lambda: dy.reshape(x, (2, 2)))
    assert_names(raised(dy.DynagraphError, ln, bad), "reshape", "(3,)", "(2, 2)")


@pytest.mark.parametrize("args", [(2, 1), (0, 4), (1, 1), (-1, 2)])
def test_pick_range_invalid(args):
    x = dy.inputVector([1.0, 2.0, 3.0])
    ln, bad = here(), (lambda: dy.pick_range(x, *args))
    assert_names(raised(dy.DynagraphError, ln, bad), "pick_range", "(3,)")


def test_pickneglogsoftmax_on_a_matrix():
    m = dy.inputTensor(np.ones((2, 3)))
    ln, bad = here(), (lambda: dy.pickneglogsoftmax(m, 0))
    assert_names(raised(dy.DynagraphError, ln, bad), "pickneglogsoftmax", "(2, 3)")


# -------------------------------------------------------------------- index errors
def test_pick_index_out_of_range():
    x = dy.inputVector([1.0, 2.0, 3.0])
    ln, bad = here(), (lambda: dy.pick(x, 3))
    assert_names(raised(dy.DynagraphIndexError, ln, bad), "pick", "(3,)", "3")
    ln, bad = here(), (lambda: x[7])
    assert_names(raised(dy.DynagraphIndexError, ln, bad), "pick", "(3,)", "7")
    m = dy.inputTensor(np.ones((2, 3)))
    ln, bad = here(), (lambda: dy.pick(m, 3, 1))
    assert_names(raised(dy.DynagraphIndexError, ln, bad), "pick", "(2, 3)")


def test_select_rows_out_of_range():
    m = dy.inputTensor(np.ones((2, 3)))
    ln, bad = here(), (lambda: dy.select_rows(m, [0, 5]))
    assert_names(raised(dy.DynagraphIndexError, ln, bad), "select", "(2, 3)", "5")


@pytest.mark.parametrize("how", ["lookup", "getitem", "const_lookup"])
@pytest.mark.parametrize("index", [5, 100])
def test_lookup_out_of_range_is_an_error_not_a_crash(model, how, index):
    W, E = model
    ok = E[4]
    cg = dy.cg()
    n = len(cg)
    if how == "lookup":
        ln, bad = here(), (lambda: dy.lookup(E, index))
    elif how == "getitem":
        ln, bad = here(), (lambda: E[index])
    else:
        ln, bad = here(), (lambda: dy.const_lookup(E, index))
    assert_names(raised(dy.DynagraphIndexError, ln, bad), "lookup", "(5, 2)", str(index))
    assert len(cg) <= n + 1  # at most the table leaf of the other mode; no bad lookup node
    # The graph is still usable after the error.
    total = dy.sum_elems(ok + E[0])
    np.testing.assert_allclose(total.value(), (E.as_array()[4] + E.as_array()[0]).sum(), rtol=1e-6)
    total.backward()
    assert E.grad_as_array()[[0, 4]].all()


def test_negative_lookup_index_is_an_error(model):
    _, E = model
    ln, bad = here(), (lambda: dy.lookup(E, -1))
    assert_names(raised(dy.DynagraphIndexError, ln, bad), "lookup", "(5, 2)", "-1")


def test_pickneglogsoftmax_label_out_of_range():
    x = dy.inputVector([1.0, 2.0, 3.0])
    ln, bad = here(), (lambda: dy.pickneglogsoftmax(x, 3))
    assert_names(raised(dy.DynagraphIndexError, ln, bad), "pickneglogsoftmax", "(3,)", "3")
    ln, bad = here(), (lambda: dy.hinge(x, 9))
    assert_names(raised(dy.DynagraphIndexError, ln, bad), "hinge", "(3,)", "9")


def test_index_errors_are_index_and_value_errors():
    assert issubclass(dy.DynagraphIndexError, IndexError)
    assert issubclass(dy.DynagraphIndexError, dy.DynagraphError)
    assert issubclass(dy.DynagraphError, ValueError)
    assert issubclass(dy.ShapeError, dy.DynagraphError)
    x = dy.inputVector([1.0])
    with pytest.raises(IndexError):
        x[1]
    with pytest.raises(ValueError):
        dy.reshape(x, (2,))


# ---------------------------------------------------------------- wrong argument type
@pytest.mark.parametrize("name, bad", [
    ("tanh", lambda x, W, a: dy.tanh(a)),
    ("cmult", lambda x, W, a: dy.cmult(x, a)),
    ("add", lambda x, W, a: x + a),
    ("add", lambda x, W, a: a + x),
    ("matmul", lambda x, W, a: W * a),
    ("esum", lambda x, W, a: dy.esum([x, a])),
    ("concatenate", lambda x, W, a: dy.concatenate([a, x])),
])
def test_numpy_array_where_an_expression_is_expected(model, name, bad):
    W, _ = model
    x, a = dy.inputVector([1.0, 2.0, 3.0, 4.0]), np.ones(4)
    # The user's line is the one in the table above: the innermost frame outside dynagraph.
    msg = raised(TypeError, bad.__code__.co_firstlineno, lambda: bad(x, W, a))
    assert_names(msg, name, "ndarray")


def test_numpy_array_error_gives_shape_and_hint():
    x = dy.inputVector([1.0, 2.0, 3.0])
    ln, bad = here(), (lambda: dy.cmult(x, np.ones((3, 2))))
    assert_names(raised(TypeError, ln, bad), "cmult", "(3,)", "(3, 2)", "inputTensor")


def test_bad_index_types(model):
    W, E = model
    x = dy.inputVector([1.0, 2.0])
    for bad in (lambda: dy.lookup(E, 1.5), lambda: dy.pick(x, "0"), lambda: dy.pickneglogsoftmax(x, 0.0),
                lambda: dy.lookup(W, 0)):
        with pytest.raises(TypeError):
            bad()


# ---------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("value", [[1.0, float("nan")], [float("inf"), 0.0], [[1.0, 2.0], [float("-inf"), 0.0]]])
def test_input_tensor_with_non_finite_values(value):
    ln, bad = here(), (lambda: dy.inputTensor(value))
    assert_names(raised(dy.DynagraphError, ln, bad), "inputTensor", "NaN")


def test_input_vector_with_nan():
    ln, bad = here(), (lambda: dy.inputVector([0.0, float("nan")]))
    assert_names(raised(dy.DynagraphError, ln, bad), "inputTensor")


def test_input_tensor_nan_error_names_shape():
    ln, bad = here(), (lambda: dy.inputTensor(np.array([[1.0, 2.0], [np.nan, 0.0]])))
    assert_names(raised(dy.DynagraphError, ln, bad), "inputTensor", "(2, 2)")


def test_empty_list_errors():
    for fn in ("esum", "concatenate", "average"):
        ln, bad = here(), (lambda: getattr(dy, fn)([]))
        assert_names(raised(dy.DynagraphError, ln, bad), fn)


def test_bad_dimension_argument():
    ln, bad = here(), (lambda: dy.zeros((0, 3)))
    assert_names(raised(dy.DynagraphError, ln, bad), "zeros")


def test_dropout_probability_out_of_range():
    x = dy.inputVector([1.0])
    ln, bad = here(), (lambda: dy.dropout(x, 1.5))
    assert_names(raised(dy.DynagraphError, ln, bad), "dropout", "1.5")


# ------------------------------------------------------------- evaluation-time errors
@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_non_finite_value_with_check_validity():
    cg = dy.renew_cg(check_validity=True)
    y = dy.log(dy.inputVector([-1.0, 1.0]))  # recording is fine: the value is unknown yet
    with pytest.raises(dy.NonFiniteError, match="log"):
        y.value()
    assert issubclass(dy.NonFiniteError, dy.DynagraphError) and cg.check_validity


def test_errors_name_the_user_line_through_helpers():
    """The reported line is the innermost frame outside dynagraph: here, inside the helper."""
    def layer(x):
        return dy.reshape(x, (5,))

    _, first = inspect.getsourcelines(layer)
    line = first + 1  # the `return` line
    with pytest.raises(dy.DynagraphError) as ei:
        layer(dy.inputVector([1.0, 2.0]))
    assert f"{THIS_FILE}:{line}" in str(ei.value)
