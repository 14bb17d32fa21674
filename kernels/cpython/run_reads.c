/* The run table: where an elementwise run reads every argument row (part of
dynagraph._bookkeeping; see bookkeeping.h, and run_tables.c for a run's other tables).

A run (dynagraph/runs.py) is one C call over consecutive elementwise batches that reads
its arguments in place; its twin in Python is runs._table_py.
*/
#include "bookkeeping.h"
#include "recorder.h"  /* the node table */

/* One value block of a run, seen through the buffer protocol. */
typedef struct {
    Py_buffer view;
    Py_ssize_t rows, width; /* rows, elements per row */
    int held;
} RunSlot;

/* Block b as a run reads it: `format` elements, C-contiguous, at least one row. */
static int run_slot(RunSlot *s, PyObject *block, const char *format, Py_ssize_t itemsize) {
    if (dg_get_buffer(block, &s->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    s->held = 1;
    if (s->view.ndim < 1 || s->view.itemsize != itemsize || !s->view.format || strcmp(s->view.format, format)
        || s->view.shape[0] < 1 || s->view.len == 0)
        return 0;
    s->rows = s->view.shape[0];
    s->width = s->view.len / itemsize / s->rows;
    return 1;
}

/* The state of one run_table call: its inputs (borrowed) and the tables being filled. */
typedef struct {
    PyObject *blk, *row, *args, *flags, *blocks, *slots;
    Py_ssize_t n, nblocks, itemsize, nslots;
    const char *format;
    int *slot_of;  /* block -> slot, or -1 before its first use */
    RunSlot *sl;   /* at most one per block */
    int64_t *o_src, *o_slot, *o_off;
    char *nd;
    const NodeTable *tab;  /* the graph's node table, or NULL: the args tuples are read */
} RunTable;

/* Sizes first, so that each table is one allocation: the pairs (total), the step-argument
   columns (nj, one offs and reach entry each) and the most argument ids of one step (maxBk).
   0, or -1 with an exception set. */
static int run_table_sizes(PyObject *steps, PyObject *args, PyObject *offs, PyObject *reach, Py_ssize_t n,
                           Py_ssize_t *total, Py_ssize_t *nj, Py_ssize_t *maxBk) {
    *total = *nj = 0;
    *maxBk = 1;
    for (Py_ssize_t m = 0; m < PyList_GET_SIZE(steps); m++) {
        PyObject *s = PyList_GET_ITEM(steps, m);
        if (!PyList_CheckExact(s) && !PyTuple_CheckExact(s)) {
            PyErr_SetString(PyExc_TypeError, "run_table: each step must be a list or tuple of node ids");
            return -1;
        }
        Py_ssize_t B = PySequence_Fast_GET_SIZE(s), i;
        if (B == 0) {
            PyErr_SetString(PyExc_ValueError, "run_table: an empty step");
            return -1;
        }
        if ((i = dg_index_in(PySequence_Fast_ITEMS(s)[0], n)) < 0)
            return -1;
        PyObject *a = PyList_GET_ITEM(args, i);
        if (!PyTuple_CheckExact(a)) {
            PyErr_SetString(PyExc_TypeError, "run_table: argument lists must be tuples");
            return -1;
        }
        *total += PyTuple_GET_SIZE(a) * B;
        *nj += PyTuple_GET_SIZE(a);
        if (B * PyTuple_GET_SIZE(a) > *maxBk)
            *maxBk = B * PyTuple_GET_SIZE(a);
    }
    if (PyList_GET_SIZE(offs) != *nj || PyList_GET_SIZE(reach) != *nj) {
        PyErr_SetString(PyExc_ValueError, "run_table: offs and reach need one entry per step and argument");
        return -1;
    }
    return 0;
}

/* The slot of block b, opening it on first use. 1; 0 when the block cannot be read in
   place; -1 with an exception set. A slot whose buffer is held is counted in nslots even
   on failure, so that the caller releases it. */
static inline int run_table_slot(RunTable *t, Py_ssize_t b) {
    if (t->slot_of[b] >= 0)
        return 1;
    RunSlot *s = &t->sl[t->nslots];
    s->held = 0;
    if (!run_slot(s, PyList_GET_ITEM(t->blocks, b), t->format, t->itemsize)) {
        if (s->held)
            t->nslots++;
        return 0;
    }
    PyObject *bo = PyLong_FromSsize_t(b);
    if (!bo || PyList_Append(t->slots, bo) < 0) {
        Py_XDECREF(bo);
        t->nslots++;
        return -1;
    }
    Py_DECREF(bo);
    t->slot_of[b] = (int)t->nslots++;
    return 1;
}

/* needs_grad[x] as 0 or 1, or -1 with an exception set. Only bools and ints: their truth
   runs no Python code, which could otherwise change every list the caller holds borrowed
   items of. */
static inline int run_table_flag(PyObject *flags, Py_ssize_t x) {
    PyObject *f = PyList_GET_ITEM(flags, x);
    int t = f == Py_True ? 1 : f == Py_False ? 0 : PyLong_CheckExact(f) ? PyObject_IsTrue(f) : -2;
    if (t == -2)
        PyErr_Format(PyExc_TypeError, "run_table: needs_grad[%zd] must be a bool, got %s", x, Py_TYPE(f)->tp_name);
    return t < 0 ? -1 : t;
}

/* Column c of a step of B nodes (xs: their k argument ids each, from run_table_ids), whose
   pairs start at `at` and whose step-argument index is jc: every row's address, slot and
   offset, and whether any node needs its gradient. 1; 0 when a block cannot be read in place; -1 on error. */
static inline int run_table_column(RunTable *t, const int64_t *xs, Py_ssize_t B, Py_ssize_t k, Py_ssize_t c,
                                   Py_ssize_t at, Py_ssize_t jc, Py_ssize_t off, Py_ssize_t rch) {
    t->nd[jc] = 0;
    for (Py_ssize_t r = 0; r < B; r++) {
        if (r + DG_AHEAD < B) {  /* blk[x], row[x] of the node DG_AHEAD on */
            int64_t y = xs[(r + DG_AHEAD) * k + c];
            if (y >= 0 && y < t->n) {
                DG_PREFETCH(PyList_GET_ITEM(t->blk, y));
                DG_PREFETCH(PyList_GET_ITEM(t->row, y));
            }
        }
        Py_ssize_t x = (Py_ssize_t)xs[r * k + c];  /* checked by run_table_ids */
        Py_ssize_t b = dg_as_ssize(PyList_GET_ITEM(t->blk, x)), rw = dg_as_ssize(PyList_GET_ITEM(t->row, x));
        if ((b == -1 || rw == -1) && PyErr_Occurred())
            return -1;
        if (b < 0 || b >= t->nblocks) {
            PyErr_Format(PyExc_ValueError, "run_table: argument node %zd has no value (block %zd)", x, b);
            return -1;
        }
        int got = run_table_slot(t, b);
        if (got <= 0)
            return got;
        RunSlot *q = &t->sl[t->slot_of[b]];
        if (rw < 0 || rw >= q->rows || rch > q->width) {
            PyErr_Format(PyExc_ValueError, "run_table: node %zd reads row %zd (elements %zd..%zd) of a block "
                                           "of %zd rows of %zd", x, rw, off, rch, q->rows, q->width);
            return -1;
        }
        int64_t byte_off = (int64_t)rw * q->width * t->itemsize + (int64_t)off * t->itemsize;
        Py_ssize_t p = at + c * B + r;
        t->o_src[p] = (int64_t)(intptr_t)q->view.buf + byte_off;
        t->o_slot[p] = t->slot_of[b];
        t->o_off[p] = byte_off;
        if (!t->nd[jc]) {
            int f = run_table_flag(t->flags, x);
            if (f < 0)
                return -1;
            t->nd[jc] = (char)f;
        }
    }
    return 1;
}

/* The argument ids of a step's B nodes of k arguments each, node by node into xs, every one
   checked to be a node: from the node table when there is one, else from the tuples.
   0, or -1 with an exception set. */
static int run_table_ids(RunTable *t, PyObject **ids, Py_ssize_t B, Py_ssize_t k, int64_t *xs) {
    for (Py_ssize_t r = 0; r < B; r++) {
        Py_ssize_t i = dg_index_in(ids[r], t->n);
        if (i < 0)
            return -1;
        if (t->tab) {
            const int32_t *a = t->tab->arg + t->tab->start[i];
            if (t->tab->start[i + 1] - t->tab->start[i] != k)
                goto differ;
            for (Py_ssize_t c = 0; c < k; c++)
                xs[r * k + c] = a[c];  /* node ids below i: the table holds no other */
            continue;
        }
        dg_prefetch_nodes(ids, r, B, t->args, NULL);
        dg_prefetch_arg_items(ids, r, B, t->args);
        PyObject *a = PyList_GET_ITEM(t->args, i);
        if (!PyTuple_CheckExact(a) || PyTuple_GET_SIZE(a) != k)
            goto differ;
        for (Py_ssize_t c = 0; c < k; c++)
            if ((xs[r * k + c] = dg_index_in(PyTuple_GET_ITEM(a, c), t->n)) < 0)
                return -1;
        continue;
    differ:
        PyErr_Format(PyExc_ValueError, "run_table: node %zd's arguments differ from its step's", i);
        return -1;
    }
    return 0;
}

/* One step: its nodes' argument ids, read once (run_table_ids), then its k columns.
   1; 0 when a block cannot be read in place; -1 on error. */
static int run_table_step(RunTable *t, PyObject *s, PyObject *offs, PyObject *reach, int64_t *xs,
                          Py_ssize_t at, Py_ssize_t j, Py_ssize_t *k_out) {
    Py_ssize_t B = PySequence_Fast_GET_SIZE(s);
    PyObject **ids = PySequence_Fast_ITEMS(s);
    Py_ssize_t k = PyTuple_GET_SIZE(PyList_GET_ITEM(t->args, PyLong_AsSsize_t(ids[0])));  /* checked by sizes */
    *k_out = k;
    if (run_table_ids(t, ids, B, k, xs) < 0)
        return -1;
    for (Py_ssize_t c = 0; c < k; c++) {
        Py_ssize_t off = PyLong_AsSsize_t(PyList_GET_ITEM(offs, j + c));
        Py_ssize_t rch = PyLong_AsSsize_t(PyList_GET_ITEM(reach, j + c));
        if ((off == -1 || rch == -1) && PyErr_Occurred())
            return -1;
        if (off < 0 || rch < off) {
            PyErr_SetString(PyExc_ValueError, "run_table: a negative offset or reach");
            return -1;
        }
        int got = run_table_column(t, xs, B, k, c, at, j + c, off, rch);
        if (got <= 0)
            return got;
    }
    return 1;
}

/* slot_last: per slot, the last step whose needed argument reads it, or -1 (steps in
   order: the last reader wins). A new bytearray, or NULL with an exception set. */
static PyObject *run_table_slot_last(const RunTable *t, PyObject *steps) {
    PyObject *slot_last = PyByteArray_FromStringAndSize(NULL, t->nslots * (Py_ssize_t)sizeof(int64_t));
    if (!slot_last)
        return NULL;
    int64_t *sn = (int64_t *)PyByteArray_AS_STRING(slot_last);
    for (Py_ssize_t q = 0; q < t->nslots; q++)
        sn[q] = -1;
    Py_ssize_t at = 0, j = 0;
    for (Py_ssize_t m = 0; m < PyList_GET_SIZE(steps); m++) {
        PyObject *s = PyList_GET_ITEM(steps, m);
        Py_ssize_t B = PySequence_Fast_GET_SIZE(s);
        Py_ssize_t k = PyTuple_GET_SIZE(PyList_GET_ITEM(t->args, PyLong_AsSsize_t(PySequence_Fast_ITEMS(s)[0])));
        for (Py_ssize_t c = 0; c < k; c++, j++)
            for (Py_ssize_t r = 0; r < B && t->nd[j]; r++)
                sn[t->o_slot[at + c * B + r]] = m;
        at += k * B;
    }
    return slot_last;
}

/* Releases every block buffer the table holds, and its slot arrays. */
static void run_table_release(RunTable *t) {
    for (Py_ssize_t q = 0; t->sl && q < t->nslots; q++)
        if (t->sl[q].held)
            PyBuffer_Release(&t->sl[q].view);
    PyMem_Free(t->sl);
    PyMem_Free(t->slot_of);
}

/* The format's element size (4 for 'f', 8 for 'd'), or 0 with an exception set when the
   arguments are not run_table's. */
static Py_ssize_t run_table_check(PyObject *const *argv, Py_ssize_t nargs, const char **format) {
    if ((nargs != 9 && nargs != 10) || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1]) || !PyList_CheckExact(argv[2])
        || !PyList_CheckExact(argv[3]) || !PyList_CheckExact(argv[4]) || !PyList_CheckExact(argv[5])
        || !PyList_CheckExact(argv[6]) || !PyList_CheckExact(argv[7]) || !PyUnicode_Check(argv[8])) {
        PyErr_SetString(PyExc_TypeError, "run_table(blk, row, args, needs_grad, steps, blocks: lists, "
                                         "offs, reach: lists, format: str[, cg])");
        return 0;
    }
    if (!(*format = PyUnicode_AsUTF8(argv[8])))
        return 0;
    Py_ssize_t itemsize = !strcmp(*format, "f") ? 4 : !strcmp(*format, "d") ? 8 : 0;
    Py_ssize_t n = PyList_GET_SIZE(argv[2]);
    if (!itemsize || PyList_GET_SIZE(argv[0]) != n || PyList_GET_SIZE(argv[1]) != n || PyList_GET_SIZE(argv[3]) != n) {
        PyErr_SetString(PyExc_ValueError, "run_table: format must be 'f' or 'd'; blk, row, args and needs_grad "
                                          "must have one entry per node");
        return 0;
    }
    return itemsize;
}

/* run_table(blk, row, args, needs_grad, steps, blocks, offs, reach, format[, cg]): where a run
   (dynagraph/runs.py) reads every argument row; the twin of runs._table_py. cg, the graph
   whose args these are: its node table is read instead of the tuples.
   offs[j] / reach[j], per step and argument: the first element read in a source row and
   the elements that row must hold. Returns None when some block cannot be read in place
   (another dtype, not contiguous), else
     src        bytearray of row addresses (int64), per step, per argument, per node;
     pair_slot  bytearray of int64: the slot each address is in;
     pair_off   bytearray of int64: its byte offset from the slot's start;
     slots      the blocks read (ids), in order of first use;
     need       bytes per step and argument: whether any of its nodes needs a gradient;
     slot_last  bytearray of int64 per slot: the last step whose needed argument reads it, or -1.
   Every node id, block id, row and width is checked against the block's own size. */
PyObject *dg_run_table(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    const char *format;
    Py_ssize_t itemsize = run_table_check(argv, nargs, &format);
    if (!itemsize)
        return NULL;
    RunTable t = {.blk = argv[0], .row = argv[1], .args = argv[2], .flags = argv[3], .blocks = argv[5],
                  .format = format, .itemsize = itemsize};
    PyObject *steps = argv[4], *offs = argv[6], *reach = argv[7];
    t.n = PyList_GET_SIZE(t.args);
    t.nblocks = PyList_GET_SIZE(t.blocks);
    Py_ssize_t total, nj, maxBk, nsteps = PyList_GET_SIZE(steps);
    if (run_table_sizes(steps, t.args, offs, reach, t.n, &total, &nj, &maxBk) < 0)
        return NULL;
    t.tab = nargs == 10 ? dg_table_of(argv[9], t.args, t.n) : NULL;
    PyObject *res = NULL, *need = PyBytes_FromStringAndSize(NULL, nj);
    t.slots = PyList_New(0);
    Py_ssize_t bytes = total * (Py_ssize_t)sizeof(int64_t);
    PyObject *src = PyByteArray_FromStringAndSize(NULL, bytes), *pslot = PyByteArray_FromStringAndSize(NULL, bytes);
    PyObject *poff = PyByteArray_FromStringAndSize(NULL, bytes);
    /* a slot per distinct block read: at most one per pair. Sized by the graph's blocks, a tree
       mini-batch's thousands of blocks made each run zero ~300 KB, most of its table's cost */
    Py_ssize_t cap = total < t.nblocks ? total : t.nblocks;
    t.slot_of = PyMem_Malloc((size_t)(t.nblocks ? t.nblocks : 1) * sizeof(int));
    t.sl = PyMem_Malloc((size_t)(cap ? cap : 1) * sizeof(RunSlot));  /* each slot set as it opens */
    int64_t *xs = PyMem_Malloc((size_t)maxBk * sizeof(int64_t));
    if (!t.slots || !need || !src || !pslot || !poff || !t.slot_of || !t.sl || !xs) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t b = 0; b < t.nblocks; b++)
        t.slot_of[b] = -1;
    t.o_src = (int64_t *)PyByteArray_AS_STRING(src);
    t.o_slot = (int64_t *)PyByteArray_AS_STRING(pslot);
    t.o_off = (int64_t *)PyByteArray_AS_STRING(poff);
    t.nd = PyBytes_AS_STRING(need);
    for (Py_ssize_t m = 0, at = 0, j = 0, k; m < nsteps; m++) {
        PyObject *s = PyList_GET_ITEM(steps, m);
        int got = run_table_step(&t, s, offs, reach, xs, at, j, &k);
        if (got == 0) {
            Py_INCREF(Py_None);  /* not readable in place: the caller runs batch by batch */
            res = Py_None;
        }
        if (got <= 0)
            goto done;
        at += k * PySequence_Fast_GET_SIZE(s);
        j += k;
    }
    PyObject *slot_last = run_table_slot_last(&t, steps);
    if (slot_last)
        res = Py_BuildValue("(OOOOON)", src, pslot, poff, t.slots, need, slot_last);
done:
    run_table_release(&t);
    PyMem_Free(xs);
    Py_XDECREF(t.slots);
    Py_XDECREF(need);
    Py_XDECREF(src);
    Py_XDECREF(pslot);
    Py_XDECREF(poff);
    return res;
}

