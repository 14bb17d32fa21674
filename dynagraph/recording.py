"""The recording fast path: compiled (dynagraph._bookkeeping, kernels/cpython/recorder.c, expr_recorder.c)
when it was built, else the pure-Python twin below. Both do the same thing.

Recording one node is bookkeeping only, but it runs once per op per sample: at H=64 it
was half of a TreeLSTM training step in Python. The compiled path does the common case
(live Expression arguments, a signature the graph has seen) in C and hands anything
else, unchanged, to the Python code it stands for. So the rare cases and every error
message exist once, in Python.

    GraphBase   base of ComputationGraph: the node columns, and add() when compiled
    ExprBase    base of Expression: the two fields cg and i
    recorder(op, form, fallback, attrs=(), row_check=None)
                a function recording `op` (op=None: the op is the first argument) from
                form 1: f(x[, attrs[, data]])   2: f(x, y[, attrs])   3: f([x, ...][, attrs])
                     4: f(x, i, ...) (ints filling attrs)   5: f([x, ...][, d]) (attrs (d,))
                     6: f(x, index) (data index)   7: f(x) alone (the default attrs)
                or, if an argument is not a live Expression of one graph, fallback(*args)

DYNAGRAPH_BOOKKEEPING=python forces the pure-Python path here and in the executor
(tests run both). NATIVE is the compiled module, or None.
"""
from __future__ import annotations

import os
from typing import Any, Callable

try:
    if os.environ.get("DYNAGRAPH_BOOKKEEPING", "").lower() == "python":
        raise ImportError("DYNAGRAPH_BOOKKEEPING=python")
    from . import _bookkeeping as _c
except ImportError:
    _c = None
NATIVE = _c

COMPILED = _c is not None
ONE, TWO, LIST, INTS, LIST_INT, INDEX, BARE = 1, 2, 3, 4, 5, 6, 7


class _PyGraphBase:
    """The node columns are plain attributes; ComputationGraph supplies add = _add_py."""
    retired = False
    immediate_compute = False


class _PyExprBase:
    __slots__ = ("cg", "i")

    def __init__(self, cg, i: int):
        self.cg, self.i = cg, i


# (op, attrs, argument shapes) -> output shape, shared by every
# graph: a shape rule depends on nothing else, so after renew_cg a graph meeting a signature
# again skips the rule (in C, without calling Python). Bounded: cleared when it grows past
# SHAPES_LIMIT (programs whose shapes never repeat would otherwise grow it forever).
SHAPES: dict = {}
SHAPES_LIMIT = 1 << 14

GraphBase: type = _c.GraphBase if COMPILED else _PyGraphBase
ExprBase: type = _c.ExprBase if COMPILED else _PyExprBase
_Expression: Any = None


def plain_expression_type(cls: type) -> type:
    """Expression as the recorder makes it: compiled, a type built again from cls's namespace
    whose instances are not GC objects (kernels/cpython/expr_recorder.c: an expression holds
    only its graph and an int, so it can be in no cycle, and one per op kept Python's collector
    busy); cls itself otherwise."""
    return _c.plain_expression_type(cls) if COMPILED else cls


def configure(expression: type, index_slot: type, random_key: object, draw_rand_base: Callable) -> None:
    """The classes the fast path creates (Expression) and treats specially (IndexSlot), the
    data standing for a random key, and how a graph draws its random key base."""
    global _Expression
    _Expression = expression
    if COMPILED:
        _c.configure(expression, index_slot, random_key, SHAPES, draw_rand_base)


def operators(add, addc, sub, rsubc, matmul, mulc, add_twin: Callable, sub_twin: Callable,
              mul_twin: Callable) -> None:
    """The ops ExprBase's compiled +, - and * record (two expressions: add, sub, matmul; an
    expression and a number: addc, rsubc, mulc), and the Python twins they call for anything
    else (twin(a, b) for `a op b`). Without the compiled module Expression keeps its Python
    operators, so this does nothing."""
    if COMPILED:
        _c.configure_operators(add, addc, sub, rsubc, matmul, mulc, add_twin, sub_twin, mul_twin)


def leaf_recorder(fallback: Callable, graph_state, lookup_op, parameter_op, table_op) -> Callable:
    """expression_of(p, update=True, lookup=None, graph=None), the expression of a parameter
    or of one row of a lookup table: compiled for an ordinary trained parameter (its leaf
    made in C on its first use in a graph, the row checked in C), else `fallback` itself,
    the reference."""
    if COMPILED:
        _c.configure_leaves(fallback, graph_state, lookup_op, parameter_op, table_op)
        return _c.expression_of
    return fallback


def entry_recorders(parameters: type, lookup_parameters: type, integer: type, parameter: Callable,
                    lookup: Callable) -> tuple:
    """(dy.parameter, dy.lookup, E[i]): compiled for an exact `parameters` / `lookup_parameters`
    (and an int or `integer` row) in the current graph, else the Python functions given,
    which are the reference and word every error. E[i] is a method descriptor for
    `lookup_parameters.__getitem__` (its Python twin is expression_of(E, True, lookup=i)),
    or None without the compiled module."""
    if COMPILED:
        getitem = _c.configure_entries(parameters, lookup_parameters, integer, parameter, lookup)
        return _c.parameter, _c.lookup, getitem
    return parameter, lookup, None


def recorder(op, form: int, fallback: Callable, attrs: tuple = (), row_check: Callable | None = None) -> Callable:
    """row_check (form INDEX): the op's check when it is exactly `0 <= index < shape(x)[0]`,
    which the compiled recorder then does itself."""
    if COMPILED:
        return _c.Recorder(op, form, fallback, attrs, row_check)
    if form in (INTS, LIST_INT, INDEX, BARE):  # the Python function is its own twin
        return fallback
    return (_bound if op is not None else _unbound)[form](op, fallback, attrs)


# Pure-Python twins, one closure per form so the common case costs one frame.
def _unbound_one(_, fallback, attrs0):
    def rec(op, x, attrs=attrs0, data=None):
        if type(x) is _Expression:
            cg = x.cg
            if not cg.retired:
                return _Expression(cg, cg.add(op, (x.i,), attrs, data))
        return fallback(op, x, attrs, data)
    return rec


def _unbound_two(_, fallback, attrs0):
    def rec(op, x, y, attrs=attrs0):
        if type(x) is _Expression and type(y) is _Expression:
            cg = x.cg
            if y.cg is cg and not cg.retired:
                return _Expression(cg, cg.add(op, (x.i, y.i), attrs))
        return fallback(op, x, y, attrs)
    return rec


def _list_ids(xs) -> tuple | None:
    """(graph, ids) when xs is a non-empty list of live Expressions of one graph."""
    if type(xs) is not list or not xs or type(xs[0]) is not _Expression:
        return None
    cg = xs[0].cg
    if cg.retired:
        return None
    ids = []
    for a in xs:
        if type(a) is not _Expression or a.cg is not cg:
            return None
        ids.append(a.i)
    return cg, tuple(ids)


def _unbound_list(_, fallback, attrs0):
    def rec(op, xs, attrs=attrs0):
        found = _list_ids(xs)
        if found is None:
            return fallback(op, xs, attrs)
        return _Expression(found[0], found[0].add(op, found[1], attrs))
    return rec


def _bound_one(op, fallback, attrs0):
    def rec(x, attrs=attrs0, data=None):
        if type(x) is _Expression:
            cg = x.cg
            if not cg.retired:
                return _Expression(cg, cg.add(op, (x.i,), attrs, data))
        return fallback(x, attrs, data)
    return rec


def _bound_two(op, fallback, attrs0):
    def rec(x, y, attrs=attrs0):
        if type(x) is _Expression and type(y) is _Expression:
            cg = x.cg
            if y.cg is cg and not cg.retired:
                return _Expression(cg, cg.add(op, (x.i, y.i), attrs))
        return fallback(x, y, attrs)
    return rec


def _bound_list(op, fallback, attrs0):
    def rec(xs, attrs=attrs0):
        found = _list_ids(xs)
        if found is None:
            return fallback(xs, attrs)
        return _Expression(found[0], found[0].add(op, found[1], attrs))
    return rec


_unbound = {ONE: _unbound_one, TWO: _unbound_two, LIST: _unbound_list}
_bound = {ONE: _bound_one, TWO: _bound_two, LIST: _bound_list}
