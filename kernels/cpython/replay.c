/* A replayed schedule's evaluation as one C call (part of dynagraph._bookkeeping; see bookkeeping.h).

Why: a per-sentence program evaluates a graph of the same structure again and again, and
run_batch_native re-derives per batch what cannot change between such graphs: the argument
columns (new tuples of node ids), where each column lives (located row by row), the op's
info, whether the batch may split. compile_program (below) derives all of that once, from
the records the schedule's first native evaluation left, as a program; replay_native(ctx,
program) then runs it: per step only the arguments' arrays (this graph's blocks), the kernel
(the same dg_batch_run_kernel as run_batch_native, so the values are identical), the output
placed and recorded.

program is a tuple: (base, steps). base: len(blocks) when the program's first evaluation
began. steps: a tuple of (nodes, cols, specs, plans), one per scheduled batch, in order:
  nodes  the batch's node ids (a tuple; the same in every graph the schedule is replayed for)
  cols   its argument columns (a tuple of tuples of node ids, the record's own)
  specs  bytes: per column four native int64s (kind, a, r0, B):
         (0, first, -1, 0) a parameter's block, blocks[blk[first]];
         (1, j, -1, B) step j's whole output block; (1, j, r0, B) its rows r0:r0 + B
  plans  per column: the plan the first evaluation recorded, (0, b, None) or (1, bid, r0);
         reused as is where this graph's block ids are the same, else made again
Anything a program cannot say (a gather, a batch run in parts, a run of steps) kept the
schedule off this path when the program was compiled. compile_program (below) makes the program
from the records of the schedule's first evaluation; executor._compile_program_py is its twin.
*/
#include "batch_run.h"

enum { SPEC_LEAF = 0, SPEC_STEP = 1 };

/* The column's array (a new reference) and its plan (a new reference), or -1 with an error set.
   spec: the column's four int64s. */
static int step_column(PyObject *ctx, const int64_t *spec, PyObject *plan, Py_ssize_t base, Py_ssize_t bias,
                       PyObject **x, PyObject **p) {
    PyObject *blocks = PyTuple_GET_ITEM(ctx, C_BLOCKS), *blk = PyTuple_GET_ITEM(ctx, C_BLK);
    Py_ssize_t b = -1, nblocks = PyList_GET_SIZE(blocks);
    if (spec[0] == SPEC_LEAF) {
        if (spec[1] >= 0 && spec[1] < PyList_GET_SIZE(blk)) {
            b = dg_index_in(PyList_GET_ITEM(blk, spec[1]), nblocks);
            if (b < 0)
                return -1;
        }
    } else if (spec[0] == SPEC_STEP && spec[1] >= 0 && base + spec[1] < nblocks) {
        b = base + (Py_ssize_t)spec[1];
    }
    if (b < 0) {
        PyErr_SetString(PyExc_ValueError, "replay_native: a step reads a node or block not made yet");
        return -1;
    }
    PyObject *block = PyList_GET_ITEM(blocks, b);
    if (spec[0] == SPEC_LEAF || spec[2] < 0) {
        Py_INCREF(block);
        *x = block;
    } else {
        PyObject *lo = dg_int((Py_ssize_t)spec[2]), *hi = dg_int((Py_ssize_t)(spec[2] + spec[3]));
        PyObject *sl = lo && hi ? PySlice_New(lo, hi, NULL) : NULL;
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        *x = sl ? PyObject_GetItem(block, sl) : NULL;
        Py_XDECREF(sl);
    }
    if (!*x)
        return -1;
    /* the recorded plan names the block the first evaluation used: the same id here unless the
       graph held another number of blocks before (bias) or a parameter moved to another block */
    Py_ssize_t was = PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, 1));
    if ((spec[0] == SPEC_LEAF && was == b) || (spec[0] == SPEC_STEP && bias == 0)) {
        Py_INCREF(plan);
        *p = plan;
        return 0;
    }
    PyObject *bid = dg_int(b);
    *p = bid ? PyTuple_Pack(3, PyTuple_GET_ITEM(plan, 0), bid, PyTuple_GET_ITEM(plan, 2)) : NULL;
    Py_XDECREF(bid);
    if (!*p)
        Py_CLEAR(*x);
    return *p ? 0 : -1;
}

/* The step's xs and plans lists (new references, untracked like run_batch_native's). 0 or -1. */
static int step_columns(PyObject *ctx, PyObject *specs, PyObject *plans_was, Py_ssize_t base, Py_ssize_t bias,
                        PyObject **xs, PyObject **plans) {
    Py_ssize_t k = PyTuple_GET_SIZE(plans_was);
    const int64_t *spec = (const int64_t *)PyBytes_AS_STRING(specs);
    if (!(*xs = PyList_New(k)) || !(*plans = PyList_New(k)))
        return -1;
    dg_untrack_list(*xs);
    dg_untrack_list(*plans);
    for (Py_ssize_t c = 0; c < k; c++) {
        PyObject *x, *p;
        if (step_column(ctx, spec + 4 * c, PyTuple_GET_ITEM(plans_was, c), base, bias, &x, &p) < 0)
            return -1;
        PyList_SET_ITEM(*xs, c, x);
        PyList_SET_ITEM(*plans, c, p);
    }
    return 0;
}

/* One step: its columns, then run_batch_native's kernel, placing and recording. 0 or -1. */
static int run_step(PyObject *ctx, PyObject *step, Py_ssize_t base, Py_ssize_t bias) {
    double t0 = dg_now();
    PyObject *nodes = PyTuple_GET_ITEM(step, 0), *cols = PyTuple_GET_ITEM(step, 1);
    PyObject *ops = PyTuple_GET_ITEM(ctx, C_OP);
    Py_ssize_t n0 = dg_index_in(PyTuple_GET_ITEM(nodes, 0), PyList_GET_SIZE(ops));
    if (n0 < 0)
        return -1;
    PyObject *op = PyList_GET_ITEM(ops, n0);
    Py_INCREF(op);
    PyObject *info = dg_batch_op_info(ctx, op);
    Py_XINCREF(info);  /* held: a kernel may clear the dict */
    PyObject *xs = NULL, *plans = NULL, *data = Py_None, *kctx = Py_None, *y = NULL;
    Py_INCREF(data);
    Py_INCREF(kctx);
    int rc = -1;
    if (info && step_columns(ctx, PyTuple_GET_ITEM(step, 2), PyTuple_GET_ITEM(step, 3), base, bias, &xs, &plans) == 0)
        rc = dg_batch_run_kernel(ctx, info, nodes, n0, cols, &xs, &plans, &data, &kctx, &y, t0);
    Py_XDECREF(info);
    Py_DECREF(op);
    Py_XDECREF(xs);
    Py_XDECREF(plans);
    Py_DECREF(data);
    Py_XDECREF(kctx);
    Py_XDECREF(y);
    return rc;
}

/* Whether program is (int, tuple of (tuple, tuple, bytes, tuple)), each step's specs four int64s
   and a plan (a 3-tuple with an int block id) per column. */
static int well_formed(PyObject *program) {
    if (!PyTuple_CheckExact(program) || PyTuple_GET_SIZE(program) != 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(program, 0))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(program, 1)))
        return 0;
    PyObject *steps = PyTuple_GET_ITEM(program, 1);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(steps); i++) {
        PyObject *s = PyTuple_GET_ITEM(steps, i);
        if (!PyTuple_CheckExact(s) || PyTuple_GET_SIZE(s) != 4 || !PyTuple_CheckExact(PyTuple_GET_ITEM(s, 0))
            || !PyTuple_CheckExact(PyTuple_GET_ITEM(s, 1)) || !PyBytes_CheckExact(PyTuple_GET_ITEM(s, 2))
            || !PyTuple_CheckExact(PyTuple_GET_ITEM(s, 3)))
            return 0;
        PyObject *plans = PyTuple_GET_ITEM(s, 3);
        if (PyTuple_GET_SIZE(PyTuple_GET_ITEM(s, 0)) == 0
            || PyBytes_GET_SIZE(PyTuple_GET_ITEM(s, 2)) != 4 * (Py_ssize_t)sizeof(int64_t) * PyTuple_GET_SIZE(plans))
            return 0;
        for (Py_ssize_t c = 0; c < PyTuple_GET_SIZE(plans); c++) {
            PyObject *pl = PyTuple_GET_ITEM(plans, c);
            if (!PyTuple_CheckExact(pl) || PyTuple_GET_SIZE(pl) != 3 || !PyLong_CheckExact(PyTuple_GET_ITEM(pl, 1)))
                return 0;
        }
    }
    return 1;
}

/* replay_native(ctx, program): every step of program in order (see the top of this file); ctx
   is run_batch_native's. Steps read only blocks made before them, which is checked per column. */
PyObject *dg_replay_native(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "replay_native(ctx: tuple, program: (base, steps))");
        return NULL;
    }
    if (dg_batch_check_context(argv[0]) < 0)
        return NULL;
    if (!well_formed(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "replay_native: a malformed program (compile_program makes it)");
        return NULL;
    }
    PyObject *ctx = argv[0], *steps = PyTuple_GET_ITEM(argv[1], 1);
    Py_ssize_t was = PyLong_AsSsize_t(PyTuple_GET_ITEM(argv[1], 0));
    Py_ssize_t base = PyList_GET_SIZE(PyTuple_GET_ITEM(ctx, C_BLOCKS));
    if (was < 0 && PyErr_Occurred())
        return NULL;
    Py_INCREF(steps);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(steps); i++)
        if (run_step(ctx, PyTuple_GET_ITEM(steps, i), base, base - was) < 0) {
            Py_DECREF(steps);
            return NULL;
        }
    Py_DECREF(steps);
    Py_RETURN_NONE;
}

/* Whether the record's nodes (a tuple or list) are the plan item's, in order. */
static int same_nodes(PyObject *nodes, PyObject *item) {
    if (!PyTuple_Check(nodes) && !PyList_Check(nodes))
        return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(nodes);
    if (n != PyTuple_GET_SIZE(item))
        return 0;
    PyObject **a = PySequence_Fast_ITEMS(nodes);
    for (Py_ssize_t i = 0; i < n; i++) {
        int eq = PyObject_RichCompareBool(a[i], PyTuple_GET_ITEM(item, i), Py_EQ);
        if (eq <= 0)
            return eq;
    }
    return 1;
}

/* One record as a program step (a new reference), Py_None (a new reference) where the program
   cannot say it, NULL on error. j: the step's index, base: the program's first block. */
static PyObject *compile_step(PyObject *blocks, PyObject *rec, PyObject *item, Py_ssize_t base, Py_ssize_t j) {
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 6 || !PyTuple_CheckExact(item))
        Py_RETURN_NONE;
    PyObject *nodes = PyTuple_GET_ITEM(rec, 0), *xs = PyTuple_GET_ITEM(rec, 1), *bid_o = PyTuple_GET_ITEM(rec, 2);
    PyObject *plans = PyTuple_GET_ITEM(rec, 3), *cols = PyTuple_GET_ITEM(rec, 4);
    int same = same_nodes(nodes, item);
    if (same < 0)
        return NULL;
    Py_ssize_t bid = PyLong_Check(bid_o) ? PyLong_AsSsize_t(bid_o) : -1;
    if (bid == -1 && PyErr_Occurred())
        return NULL;
    if (!same || bid != base + j || !PyTuple_CheckExact(cols) || !PyList_CheckExact(xs) || !PyList_CheckExact(plans))
        Py_RETURN_NONE;
    Py_ssize_t k = PyList_GET_SIZE(plans);
    if (PyList_GET_SIZE(xs) != k || PyTuple_GET_SIZE(cols) != k)
        Py_RETURN_NONE;
    PyObject *specs = PyBytes_FromStringAndSize(NULL, 4 * (Py_ssize_t)sizeof(int64_t) * k);
    if (!specs)
        return NULL;
    int64_t *spec = (int64_t *)PyBytes_AS_STRING(specs);
    for (Py_ssize_t c = 0; c < k; c++, spec += 4) {
        PyObject *where = PyList_GET_ITEM(plans, c), *ids = PyTuple_GET_ITEM(cols, c);
        if (!PyTuple_CheckExact(where) || PyTuple_GET_SIZE(where) != 3 || !PyTuple_CheckExact(ids)
            || PyTuple_GET_SIZE(ids) == 0 || !PyLong_CheckExact(PyTuple_GET_ITEM(where, 0))
            || !PyLong_CheckExact(PyTuple_GET_ITEM(where, 1)))
            goto cannot;
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(where, 0));
        Py_ssize_t b = PyLong_AsSsize_t(PyTuple_GET_ITEM(where, 1));
        if (kind == SPEC_LEAF) {
            Py_ssize_t first = PyLong_AsSsize_t(PyTuple_GET_ITEM(ids, 0));
            if (first < 0)
                goto cannot;
            spec[0] = SPEC_LEAF, spec[1] = first, spec[2] = -1, spec[3] = 0;
        } else if (kind == SPEC_STEP && base <= b && b < bid && PyLong_CheckExact(PyTuple_GET_ITEM(where, 2))) {
            Py_ssize_t r0 = PyLong_AsSsize_t(PyTuple_GET_ITEM(where, 2));
            int whole = PyList_GET_ITEM(xs, c) == PyList_GET_ITEM(blocks, b);  /* else rows r0:r0 + B of it */
            spec[0] = SPEC_STEP, spec[1] = b - base, spec[2] = whole ? -1 : r0, spec[3] = PyTuple_GET_SIZE(ids);
        } else {
            goto cannot;
        }
        if (PyErr_Occurred()) {
            Py_DECREF(specs);
            return NULL;
        }
    }
    PyObject *frozen = PyList_AsTuple(plans);
    PyObject *step = frozen ? PyTuple_Pack(4, item, cols, specs, frozen) : NULL;
    Py_XDECREF(frozen);
    Py_DECREF(specs);
    return step;
cannot:
    Py_DECREF(specs);
    PyErr_Clear();
    Py_RETURN_NONE;
}

/* compile_program(blocks, executed, plan, base, first): replay_native's program from the records
   executed[first:] of one evaluation of `plan` (a list of node tuples), whose blocks begin at
   `base`; None where a batch did not run as one record reading only parameters and the plan's own
   outputs. executor._compile_program_py is the twin. */
PyObject *dg_compile_program(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1]) || !PyList_CheckExact(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "compile_program(blocks: list, executed: list, plan: list, base, first)");
        return NULL;
    }
    PyObject *blocks = argv[0], *executed = argv[1], *plan = argv[2];
    Py_ssize_t base = PyLong_AsSsize_t(argv[3]), first = PyLong_AsSsize_t(argv[4]);
    if ((base == -1 || first == -1) && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(plan);
    if (base < 0 || first < 0 || PyList_GET_SIZE(executed) - first != n || PyList_GET_SIZE(blocks) != base + n)
        Py_RETURN_NONE;
    PyObject *steps = PyTuple_New(n);
    if (!steps)
        return NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *step = compile_step(blocks, PyList_GET_ITEM(executed, first + j), PyList_GET_ITEM(plan, j), base, j);
        if (!step || step == Py_None) {
            Py_DECREF(steps);
            return step;
        }
        PyTuple_SET_ITEM(steps, j, step);
    }
    PyObject *b = PyLong_FromSsize_t(base);
    PyObject *program = b ? PyTuple_Pack(2, b, steps) : NULL;
    Py_XDECREF(b);
    Py_DECREF(steps);
    if (program)
        dg_untrack_record(program);  /* ints, bytes and tuples only: no work for the collector */
    return program;
}
