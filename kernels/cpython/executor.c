/* The executor's per-node bookkeeping (part of dynagraph._bookkeeping; see bookkeeping.h).

A batch of B nodes costs the executor a few passes over B Python ints: its argument
columns, where each column's values live, and the output's (block, row) per node. In
Python those passes were a fifth of an op-level TreeLSTM step at H=64. Each function
below is the twin of a Python one in dynagraph/executor.py, which documents it and is
the fallback when this module is not built. Every index is checked (IndexError).
Where an elementwise run reads and writes its rows (runs.py) is in run_tables.c.
*/
#include "bookkeeping.h"
#include "recorder.h"  /* the node table */

/* dg_int(i): a new reference to the int i. Node ids and row numbers above 256 are not
   CPython's cached small ints, so every pending list and every placed row used to
   allocate one int object per node (and free it with the graph): 28,000 allocations for a
   mini-batch of TreeLSTMs. These ints are immutable, so one object per value is shared by
   every graph, created on first use and kept (at most DG_INT_CACHE of them). */
#define DG_INT_CACHE (1 << 22)
#define DG_INT_RUN 1024
static PyObject **int_cache = NULL;
static Py_ssize_t int_cap = 0;

/* The ints from i on, DG_INT_RUN of them made back to back: node ids are read in id order
   (the agenda, the run tables, placement), and ints made one at a time
   while recording sat between that moment's other objects, a cache line each. */
static Py_NO_INLINE PyObject *int_run(Py_ssize_t i) {
    if (i >= int_cap) {
        Py_ssize_t cap = int_cap ? int_cap : 4096;
        while (cap <= i)
            cap *= 2;
        PyObject **grown = PyMem_Realloc(int_cache, (size_t)cap * sizeof(PyObject *));
        if (!grown)
            return PyLong_FromSsize_t(i);  /* no room to cache: an int of its own */
        for (Py_ssize_t k = int_cap; k < cap; k++)
            grown[k] = NULL;
        int_cache = grown;
        int_cap = cap;
    }
    Py_ssize_t end = i + DG_INT_RUN < int_cap ? i + DG_INT_RUN : int_cap;
    for (Py_ssize_t k = i; k < end && !int_cache[k]; k++)
        if (!(int_cache[k] = PyLong_FromSsize_t(k))) {
            PyErr_Clear();  /* no memory for the rest of the run: each is made on its own use */
            break;
        }
    PyObject *v = int_cache[i];
    if (!v)
        return PyErr_NoMemory();
    Py_INCREF(v);
    return v;
}

PyObject *dg_int(Py_ssize_t i) {
    if (i >= 0 && i < int_cap && int_cache[i]) {
        PyObject *v = int_cache[i];
        Py_INCREF(v);
        return v;
    }
    if (i < 0 || i >= DG_INT_CACHE)
        return PyLong_FromSsize_t(i);
    return int_run(i);
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

/* The columns read from the node table: each id is the shared int object of its value. */
static PyObject *columns_from_table(const NodeTable *tab, PyObject **ids, Py_ssize_t B, Py_ssize_t n) {
    Py_ssize_t i0 = dg_index_in(ids[0], n);
    if (i0 < 0)
        return NULL;
    Py_ssize_t k = (Py_ssize_t)(tab->start[i0 + 1] - tab->start[i0]);
    PyObject *cols = PyTuple_New(k);
    for (Py_ssize_t c = 0; cols && c < k; c++) {
        PyObject *col = PyTuple_New(B);
        if (!col)
            Py_CLEAR(cols);
        else
            PyTuple_SET_ITEM(cols, c, col);
    }
    for (Py_ssize_t j = 0; cols && j < B; j++) {
        Py_ssize_t i = j == 0 ? i0 : dg_index_in(ids[j], n);
        if (i < 0) {
            Py_DECREF(cols);
            return NULL;
        }
        const int32_t *a = tab->arg + tab->start[i];
        if (tab->start[i + 1] - tab->start[i] != k) {
            PyErr_Format(PyExc_ValueError, "columns: node %zd has %zd arguments, the batch's first has %zd", i,
                         (Py_ssize_t)(tab->start[i + 1] - tab->start[i]), k);
            Py_DECREF(cols);
            return NULL;
        }
        for (Py_ssize_t c = 0; c < k; c++) {
            PyObject *v = dg_int(a[c]);
            if (!v) {
                Py_DECREF(cols);
                return NULL;
            }
            PyTuple_SET_ITEM(PyTuple_GET_ITEM(cols, c), j, v);
        }
    }
    return cols;
}

/* columns(args, nodes): tuple(zip(*[args[n] for n in nodes])), every node having the
   same number of arguments (a batch shares one signature). dg_columns_of: from the node
   table `tab` (NULL: the tuples), which holds what args holds. */
PyObject *dg_columns_of(PyObject *args, PyObject *nodes, const NodeTable *tab) {
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), n = PyList_GET_SIZE(args);
    if (B == 0)
        return PyTuple_New(0);
    PyObject **ids = PySequence_Fast_ITEMS(nodes);
    if (tab && tab->n >= n)
        return columns_from_table(tab, ids, B, n);
    Py_ssize_t i0 = dg_index_in(ids[0], n);
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
        dg_prefetch_nodes(ids, j, B, args, NULL);
        dg_prefetch_arg_items(ids, j, B, args);
        Py_ssize_t i = j == 0 ? i0 : dg_index_in(ids[j], n);
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

PyObject *dg_columns(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (check_args("columns", argv, nargs, 2, 1) < 0)
        return NULL;
    return dg_columns_of(argv[0], argv[1], NULL);
}

/* A list none of whose items the collector tracks (ints, arrays, bytes, untracked lists and
   records): as it is never changed after its record is made, it can be in no cycle. */
static int untrackable_list(PyObject *l) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(l); i++) {
        PyObject *x = PyList_GET_ITEM(l, i);
        if (PyObject_IS_GC(x) && PyObject_GC_IsTracked(x))
            return 0;
    }
    return 1;
}

/* untrack_record(r): r, a record of the forward pass (a NamedTuple that lives as long as its
   graph and is never changed once made: runs.ExecutedRun), untracked by the collector with the
   lists it holds, each only when nothing it holds is tracked (CPython's rule for tuples,
   dg_untrack_record, extended to the record's own lists). What stays tracked keeps r tracked.
   Returns r. */
PyObject *dg_untrack_record_py(PyObject *self, PyObject *r) {
    (void)self;
    if (!PyTuple_Check(r)) {
        PyErr_SetString(PyExc_TypeError, "untrack_record(r): r must be a tuple record");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r); i++) {
        PyObject *x = PyTuple_GET_ITEM(r, i);
        if (PyList_CheckExact(x) && PyObject_GC_IsTracked(x) && untrackable_list(x))
            PyObject_GC_UnTrack(x);
    }
    dg_untrack_record(r);
    return Py_NewRef(r);
}

/* place()'s common case, in place over the caller's ids: while the values replaced are ints,
   dropping them runs no Python code, so nothing can change the lists or the ids meanwhile.
   The number of nodes placed (stops at the first node whose old value is anything else, or
   at a bad id: the careful loop takes over there), or -1 with an exception set. */
static Py_ssize_t place_over_ints(PyObject *blk, PyObject *row, PyObject *nodes, PyObject *bid) {
    PyObject **ids = PySequence_Fast_ITEMS(nodes);
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), n = PyList_GET_SIZE(blk);
    if (PyList_GET_SIZE(row) != n)
        return 0;
    for (Py_ssize_t r = 0; r < B; r++) {
        dg_prefetch_nodes(ids, r, B, blk, row);
        Py_ssize_t i = dg_peek_index(ids[r], n);
        if (i < 0)
            return r;
        PyObject *old_b = PyList_GET_ITEM(blk, i), *old_r = PyList_GET_ITEM(row, i);
        if (!PyLong_CheckExact(old_b) || !PyLong_CheckExact(old_r))
            return r;
        PyObject *rv = dg_int(r);
        if (!rv)
            return -1;
        Py_INCREF(bid);
        PyList_SET_ITEM(blk, i, bid);
        PyList_SET_ITEM(row, i, rv);
        Py_DECREF(old_b);
        Py_DECREF(old_r);
    }
    return B;
}

/* place(blk, row, nodes, bid): blk[n] = bid and row[n] = r for the r-th node.
   Replacing a list item drops the old one, whose __del__ may run Python code that
   changes the lists: past place_over_ints, the ids are a private tuple, the sizes are
   re-read every node and the old items die only after both writes. */
PyObject *dg_place(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "place(blk, row, nodes, bid)");
        return NULL;
    }
    if (check_args("place", argv, 3, 3, 2) < 0)
        return NULL;
    PyObject *blk = argv[0], *row = argv[1], *bid = argv[3];
    Py_ssize_t done = place_over_ints(blk, row, argv[2], bid);
    if (done < 0)
        return NULL;
    if (done == PySequence_Fast_GET_SIZE(argv[2]))
        Py_RETURN_NONE;
    PyObject *nodes = PySequence_Tuple(argv[2]);
    if (!nodes)
        return NULL;
    Py_ssize_t B = PyTuple_GET_SIZE(nodes);
    for (Py_ssize_t r = done; r < B; r++) {
        dg_prefetch_nodes(((PyTupleObject *)nodes)->ob_item, r, B, blk, row);  /* the old values, decref'd below */
        Py_ssize_t n = PyList_GET_SIZE(blk);
        if (PyList_GET_SIZE(row) != n) {
            PyErr_SetString(PyExc_ValueError, "place: blk and row differ in length");
            Py_DECREF(nodes);
            return NULL;
        }
        Py_ssize_t i = dg_index_in(PyTuple_GET_ITEM(nodes, r), n);
        PyObject *rv = i < 0 ? NULL : dg_int(r);
        if (!rv) {
            Py_DECREF(nodes);
            return NULL;
        }
        PyObject *old_b = PyList_GET_ITEM(blk, i), *old_r = PyList_GET_ITEM(row, i);
        Py_INCREF(old_b);
        Py_INCREF(old_r);
        Py_INCREF(bid);
        PyList_SetItem(blk, i, bid);  /* steals; i is in range and nothing ran since the check */
        PyList_SetItem(row, i, rv);
        Py_DECREF(old_b);             /* may run Python code: sizes are re-read next node */
        Py_DECREF(old_r);
    }
    Py_DECREF(nodes);
    Py_RETURN_NONE;
}

/* Whether ids[1:] share ids[0]'s block b0 (*same) and follow its row start one by one
   (*consecutive). A block id's __eq__ may run Python code: each index is checked against the
   lists' sizes as they are at that moment. 0, or -1 with an exception set. */
static int locate_scan(PyObject *blk, PyObject *row, PyObject **ids, Py_ssize_t B, PyObject *b0, Py_ssize_t start,
                       int *same, int *consecutive) {
    *same = *consecutive = 1;
    for (Py_ssize_t j = 1; j < B && *same; j++) {
        dg_prefetch_nodes(ids, j, B, blk, row);
        Py_ssize_t n = PyList_GET_SIZE(blk), i;
        if (PyList_GET_SIZE(row) != n) {
            PyErr_SetString(PyExc_ValueError, "locate: blk and row differ in length");
            return -1;
        }
        if ((i = dg_index_in(ids[j], n)) < 0)
            return -1;
        PyObject *b = PyList_GET_ITEM(blk, i), *r = PyList_GET_ITEM(row, i);
        Py_ssize_t rv = dg_as_ssize(r);
        if (rv == -1 && PyErr_Occurred())
            return -1;
        if (b != b0) {
            Py_INCREF(b);
            int eq = PyObject_RichCompareBool(b, b0, Py_EQ);  /* may run Python code */
            Py_DECREF(b);
            if (eq < 0)
                return -1;
            *same = eq;
        }
        if (*consecutive)
            *consecutive = rv == start + j;
    }
    return 0;
}

/* TAKE (2, b0, rows) when every id shares block b0, else MANY (3, blks, rows): the tuples of
   each id's row (and block). A new reference, or NULL with an exception set. */
static PyObject *locate_rows(PyObject *blk, PyObject *row, PyObject **ids, Py_ssize_t B, int same, PyObject *b0) {
    PyObject *res = NULL, *rows = PyTuple_New(B), *blks = same ? NULL : PyTuple_New(B);
    if (!rows || (!same && !blks))
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(blk);  /* nothing below runs Python code */
    if (PyList_GET_SIZE(row) != n) {
        PyErr_SetString(PyExc_ValueError, "locate: blk and row differ in length");
        goto done;
    }
    for (Py_ssize_t j = 0; j < B; j++) {
        dg_prefetch_nodes(ids, j, B, row, blks ? blk : NULL);  /* increfs touch the objects */
        Py_ssize_t i = dg_index_in(ids[j], n);
        if (i < 0)
            goto done;
        PyObject *r = PyList_GET_ITEM(row, i);
        Py_INCREF(r);
        PyTuple_SET_ITEM(rows, j, r);
        if (blks) {
            PyObject *b = PyList_GET_ITEM(blk, i);
            Py_INCREF(b);
            PyTuple_SET_ITEM(blks, j, b);
        }
    }
    res = same ? dg_tuple_kab(2, b0, rows) : dg_tuple_kab(3, blks, rows);
done:
    Py_XDECREF(rows);
    Py_XDECREF(blks);
    return res;
}

/* Where the values of ids (a tuple the caller holds) are, from one scan. 1: SLICE (one block, rows
   following the first id's one by one), with new references *b0, *r0 (the block id and first row,
   as executor.SLICE's plan holds them) and no tuple made: the compiled batch step reads every
   column of a one-node batch, and most of a mini-batch's, this way. 0: TAKE or MANY, *loc the new
   (2, b, rows) or (3, blks, rows) tuple. -1 with an exception set. */
int dg_locate_ids(PyObject *blk, PyObject *row, PyObject *ids_tuple, PyObject **b0, PyObject **r0,
                  PyObject **loc) {
    PyObject **ids = &PyTuple_GET_ITEM(ids_tuple, 0);
    Py_ssize_t B = PyTuple_GET_SIZE(ids_tuple), n = PyList_GET_SIZE(blk), i;
    if (B == 0 || PyList_GET_SIZE(row) != n) {
        PyErr_SetString(PyExc_ValueError, "locate: no ids, or blk and row differ in length");
        return -1;
    }
    if ((i = dg_index_in(ids[0], n)) < 0)
        return -1;
    *b0 = Py_NewRef(PyList_GET_ITEM(blk, i));
    *r0 = Py_NewRef(PyList_GET_ITEM(row, i));
    if (B == 1)
        return 1;  /* one id: a slice of its own block, nothing to scan */
    Py_ssize_t start = PyLong_AsSsize_t(*r0);
    int same = 1, consecutive = 1;
    if ((start == -1 && PyErr_Occurred()) || locate_scan(blk, row, ids, B, *b0, start, &same, &consecutive) < 0)
        *loc = NULL;
    else if (same && consecutive)
        return 1;
    else
        *loc = locate_rows(blk, row, ids, B, same, *b0);
    Py_CLEAR(*b0);
    Py_CLEAR(*r0);
    return *loc ? 0 : -1;
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
    /* A block id's __eq__ may change blk, row or the ids: the ids are a private tuple, the
       items compared or kept are owned references, and every index is checked against
       the lists' sizes as they are at that moment. */
    PyObject *nodes = PySequence_Tuple(argv[2]);
    if (!nodes)
        return NULL;
    PyObject *b0 = NULL, *r0 = NULL, *loc = NULL;
    if (dg_locate_ids(argv[0], argv[1], nodes, &b0, &r0, &loc) == 1) {
        loc = dg_tuple_kab(1, b0, r0);
        Py_DECREF(b0);
        Py_DECREF(r0);
    }
    Py_DECREF(nodes);
    return loc;
}

/* any_true(flags, ids): True in [flags[i] for i in ids]. Every id is checked, as the twin
   does; a flag's __eq__ may change the lists, so the ids are a private tuple, the flag is
   held while compared and the size is re-read for every id. */
PyObject *dg_any_true(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (check_args("any_true", argv, nargs, 2, 1) < 0)
        return NULL;
    PyObject *flags = argv[0];
    PyObject *nodes = PySequence_Tuple(argv[1]);
    if (!nodes)
        return NULL;
    Py_ssize_t B = PyTuple_GET_SIZE(nodes);
    int found = 0;
    for (Py_ssize_t j = 0; j < B; j++) {
        Py_ssize_t i = dg_index_in(PyTuple_GET_ITEM(nodes, j), PyList_GET_SIZE(flags));
        if (i < 0) {
            Py_DECREF(nodes);
            return NULL;
        }
        PyObject *f = PyList_GET_ITEM(flags, i);
        if (!found) {
            Py_INCREF(f);
            int t = f == Py_True ? 1 : f == Py_False ? 0 : PyObject_RichCompareBool(f, Py_True, Py_EQ);
            Py_DECREF(f);
            if (t < 0) {
                Py_DECREF(nodes);
                return NULL;
            }
            found = t;
        }
    }
    Py_DECREF(nodes);
    return PyBool_FromLong(found);
}

/* Whether a and b are the same int, by value, without a rich comparison where both are exact ints. */
static int same_int(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) {
        int oa, ob;
        long long x = PyLong_AsLongLongAndOverflow(a, &oa), y = PyLong_AsLongLongAndOverflow(b, &ob);
        if (!oa && !ob)
            return x == y;
    }
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* same_slice(items, lo, was): items[lo:lo + len(was)] == was, for lists whose items are ints or
   tuples of ints (the graph's depths and argument lists; schedule_cache compares a new graph's
   with a cached one's), without the slice and with ints compared by value. Anything else is
   compared by ==. */
PyObject *dg_same_slice(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "same_slice(items: list, lo: int, was: list)");
        return NULL;
    }
    PyObject *items = argv[0], *was = argv[2];
    Py_ssize_t lo = PyLong_AsSsize_t(argv[1]), n = PyList_GET_SIZE(was);
    if (lo == -1 && PyErr_Occurred())
        return NULL;
    if (lo < 0)  /* never asked: not Python's negative slice */
        Py_RETURN_FALSE;
    if (lo + n > PyList_GET_SIZE(items))  /* a shorter slice: equal only when both are empty */
        return PyBool_FromLong(n == 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyList_GET_ITEM(items, lo + i), *b = PyList_GET_ITEM(was, i);
        if (a == b)
            continue;
        int same;
        Py_INCREF(a);  /* held: an == of something other than ints could change the lists */
        Py_INCREF(b);
        if (PyTuple_CheckExact(a) && PyTuple_CheckExact(b)) {
            Py_ssize_t k = PyTuple_GET_SIZE(a);
            same = k == PyTuple_GET_SIZE(b);
            for (Py_ssize_t j = 0; same > 0 && j < k; j++)
                same = same_int(PyTuple_GET_ITEM(a, j), PyTuple_GET_ITEM(b, j));
        } else {
            same = same_int(a, b);
        }
        Py_DECREF(a);
        Py_DECREF(b);
        if (same < 0)
            return NULL;
        if (!same)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}
