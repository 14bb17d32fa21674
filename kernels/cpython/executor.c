/* The executor's per-node bookkeeping (part of dynagraph._bookkeeping; see bookkeeping.h).

A batch of B nodes costs the executor a few passes over B Python ints: its argument
columns, where each column's values live, and the output's (block, row) per node. In
Python those passes were a fifth of an op-level TreeLSTM step at H=64. Each function
below is the twin of a Python one in dynagraph/executor.py, which documents it and is
the fallback when this module is not built. Every index is checked (IndexError).
*/
#include "bookkeeping.h"

/* Node id `v` as an index into a list of length n, or -1 with IndexError set. */
static Py_ssize_t index_in(PyObject *v, Py_ssize_t n) {
    Py_ssize_t i = PyLong_Check(v) ? PyLong_AsSsize_t(v) : -1;
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (i < 0 || i >= n) {
        PyErr_Format(PyExc_IndexError, "node id %zd out of range [0, %zd)", i, n);
        return -1;
    }
    return i;
}

static int check_args(const char *name, PyObject *const *argv, Py_ssize_t nargs, Py_ssize_t want, int lists) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", name, want);
        return -1;
    }
    for (int k = 0; k < lists; k++)
        if (!PyList_CheckExact(argv[k])) {
            PyErr_Format(PyExc_TypeError, "%s: argument %d must be a list", name, k + 1);
            return -1;
        }
    if (!PyList_CheckExact(argv[lists]) && !PyTuple_CheckExact(argv[lists])) {
        PyErr_Format(PyExc_TypeError, "%s: node ids must be a list or tuple", name);
        return -1;
    }
    return 0;
}

/* columns(args, nodes): tuple(zip(*[args[n] for n in nodes])), every node having the
   same number of arguments (a batch shares one signature). */
PyObject *dg_columns(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (check_args("columns", argv, nargs, 2, 1) < 0)
        return NULL;
    PyObject *args = argv[0], *nodes = argv[1];
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), n = PyList_GET_SIZE(args);
    if (B == 0)
        return PyTuple_New(0);
    PyObject **ids = PySequence_Fast_ITEMS(nodes);
    Py_ssize_t i0 = index_in(ids[0], n);
    if (i0 < 0)
        return NULL;
    PyObject *a0 = PyList_GET_ITEM(args, i0);
    if (!PyTuple_CheckExact(a0)) {
        PyErr_SetString(PyExc_TypeError, "columns: argument lists must be tuples");
        return NULL;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(a0);
    PyObject *cols = PyTuple_New(k);
    if (!cols)
        return NULL;
    for (Py_ssize_t c = 0; c < k; c++) {
        PyObject *col = PyTuple_New(B);
        if (!col) {
            Py_DECREF(cols);
            return NULL;
        }
        PyTuple_SET_ITEM(cols, c, col);
    }
    for (Py_ssize_t j = 0; j < B; j++) {
        Py_ssize_t i = j == 0 ? i0 : index_in(ids[j], n);
        if (i < 0) {
            Py_DECREF(cols);
            return NULL;
        }
        PyObject *a = PyList_GET_ITEM(args, i);
        if (!PyTuple_CheckExact(a) || PyTuple_GET_SIZE(a) != k) {
            PyErr_Format(PyExc_ValueError, "columns: node %zd has %zd arguments, the batch's first has %zd", i,
                         PyTuple_Check(a) ? PyTuple_GET_SIZE(a) : (Py_ssize_t)-1, k);
            Py_DECREF(cols);
            return NULL;
        }
        for (Py_ssize_t c = 0; c < k; c++) {
            PyObject *v = PyTuple_GET_ITEM(a, c);
            Py_INCREF(v);
            PyTuple_SET_ITEM(PyTuple_GET_ITEM(cols, c), j, v);
        }
    }
    return cols;
}

/* place(blk, row, nodes, bid): blk[n] = bid and row[n] = r for the r-th node. */
PyObject *dg_place(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "place(blk, row, nodes, bid)");
        return NULL;
    }
    if (check_args("place", argv, 3, 3, 2) < 0)
        return NULL;
    PyObject *blk = argv[0], *row = argv[1], *nodes = argv[2], *bid = argv[3];
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), n = PyList_GET_SIZE(blk);
    if (PyList_GET_SIZE(row) != n) {
        PyErr_SetString(PyExc_ValueError, "place: blk and row differ in length");
        return NULL;
    }
    PyObject **ids = PySequence_Fast_ITEMS(nodes);
    for (Py_ssize_t r = 0; r < B; r++) {
        Py_ssize_t i = index_in(ids[r], n);
        PyObject *rv = i < 0 ? NULL : PyLong_FromSsize_t(r);
        if (!rv)
            return NULL;
        Py_INCREF(bid);
        PyList_SetItem(blk, i, bid);  /* steals; i is in range */
        PyList_SetItem(row, i, rv);
    }
    Py_RETURN_NONE;
}

/* locate(blk, row, ids): where a batch argument's values are.
     (1, b, r0)       one block, rows r0, r0+1, ...  (SLICE: used in place)
     (2, b, rows)     one block, other rows          (TAKE)
     (3, blks, rows)  several blocks                 (MANY)
   The kinds are executor.SLICE, TAKE and MANY. */
PyObject *dg_locate(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (check_args("locate", argv, nargs, 3, 2) < 0)
        return NULL;
    PyObject *blk = argv[0], *row = argv[1], *nodes = argv[2];
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), n = PyList_GET_SIZE(blk);
    if (B == 0 || PyList_GET_SIZE(row) != n) {
        PyErr_SetString(PyExc_ValueError, "locate: no ids, or blk and row differ in length");
        return NULL;
    }
    PyObject **ids = PySequence_Fast_ITEMS(nodes);
    Py_ssize_t i = index_in(ids[0], n);
    if (i < 0)
        return NULL;
    PyObject *b0 = PyList_GET_ITEM(blk, i), *r0 = PyList_GET_ITEM(row, i);
    Py_ssize_t start = PyLong_AsSsize_t(r0);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    int same = 1, consecutive = 1;
    for (Py_ssize_t j = 1; j < B && same; j++) {
        if ((i = index_in(ids[j], n)) < 0)
            return NULL;
        PyObject *b = PyList_GET_ITEM(blk, i);
        if (b != b0) {
            int eq = PyObject_RichCompareBool(b, b0, Py_EQ);
            if (eq < 0)
                return NULL;
            same = eq;
        }
        if (consecutive) {
            Py_ssize_t r = PyLong_AsSsize_t(PyList_GET_ITEM(row, i));
            if (r == -1 && PyErr_Occurred())
                return NULL;
            consecutive = r == start + j;
        }
    }
    if (same && consecutive)
        return Py_BuildValue("(iOO)", 1, b0, r0);
    PyObject *rows = PyTuple_New(B), *blks = same ? NULL : PyTuple_New(B);
    if (!rows || (!same && !blks)) {
        Py_XDECREF(rows);
        Py_XDECREF(blks);
        return NULL;
    }
    for (Py_ssize_t j = 0; j < B; j++) {
        i = PyLong_AsSsize_t(ids[j]);  /* every id was checked above, or the loop ended early */
        if (i < 0 || i >= n) {
            if ((i = index_in(ids[j], n)) < 0) {
                Py_DECREF(rows);
                Py_XDECREF(blks);
                return NULL;
            }
        }
        PyObject *r = PyList_GET_ITEM(row, i);
        Py_INCREF(r);
        PyTuple_SET_ITEM(rows, j, r);
        if (blks) {
            PyObject *b = PyList_GET_ITEM(blk, i);
            Py_INCREF(b);
            PyTuple_SET_ITEM(blks, j, b);
        }
    }
    if (same)
        return Py_BuildValue("(iON)", 2, b0, rows);
    return Py_BuildValue("(iNN)", 3, blks, rows);
}

/* any_true(flags, ids): True in [flags[i] for i in ids]. Every id is checked, as the twin does. */
PyObject *dg_any_true(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (check_args("any_true", argv, nargs, 2, 1) < 0)
        return NULL;
    PyObject *flags = argv[0], *nodes = argv[1];
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), n = PyList_GET_SIZE(flags);
    PyObject **ids = PySequence_Fast_ITEMS(nodes);
    int found = 0;
    for (Py_ssize_t j = 0; j < B; j++) {
        Py_ssize_t i = index_in(ids[j], n);
        if (i < 0)
            return NULL;
        PyObject *f = PyList_GET_ITEM(flags, i);
        if (!found) {
            int t = f == Py_True ? 1 : f == Py_False ? 0 : PyObject_RichCompareBool(f, Py_True, Py_EQ);
            if (t < 0)
                return NULL;
            found = t;
        }
    }
    return PyBool_FromLong(found);
}
