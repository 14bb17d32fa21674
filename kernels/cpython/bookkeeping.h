/* dynagraph._bookkeeping: the graph's per-node bookkeeping in C, through the CPython API.

The compute kernels are plain C behind cffi (the kernel families in kernels/). These files are different:
their work is Python objects (the graph's node lists), which cffi cannot hand to C.
Each function here has a pure-Python twin that is the reference and the fallback:
  recorder.c   dynagraph/recording.py and ComputationGraph._add_py (GraphBase, add())
  expr_recorder.c  recording.py (ExprBase, Recorder: dy.* calls on Expressions)
  leaves.c     expression._expression_of
  executor.c   dynagraph/executor.py (_columns_py, _place_py, _locate_py, _any_true_py);
               schedule_cache._same_slice_py
  batch_run.c  executor.run_batch (run_batch_native: one batch per call); its direct kernels in
               direct_batch.c and direct_products.c, their outputs made in direct_output.c (twins:
               backends/cpu/direct.py)
  backward_batch.c  autodiff.backward's step for one batch (backward_batch_native); its scatters
               and weight-product deferral in grad_scatter.c; the commonest ops' backward in
               backward_ops.c and backward_products.c (twins: the ops' backward, backends/cpu)
  run_reads.c  dynagraph/runs.py's run_table (where a run reads every argument row)
  run_tables.c dynagraph/runs.py (addresses, grad_addresses); block_table and
               row_index_small for backends/cpu/rows.py (its Python paths are the twins)
  schedule.c   DepthBatching.schedule_py, engine._pending_py, simple._node_arrays
  agenda.c     AgendaBatching.schedule_py (agenda and lookahead)
  phase_split.c concurrent._users_split_py, graph.needed_within (dy.phase in dy.autobatch_map)
  array_view.c dg_get_buffer: PyObject_GetBuffer with a direct path for plain float arrays
               (no Python twin: the buffer protocol itself is the reference)
*/
#ifndef DG_BOOKKEEPING_H
#define DG_BOOKKEEPING_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <longintrepr.h> /* PyLongObject's digits (dg_as_ssize); Python.h includes it from 3.11 */
#endif

/* The value of int v (PyLong_AsSsize_t), read inline when it fits one digit: the per-node
   loops read two or three ints a node, and the call was ~6% of a mini-batch's forward. */
static inline Py_ssize_t dg_as_ssize(PyObject *v) {
#if PY_VERSION_HEX >= 0x030C0000
    if (PyLong_CheckExact(v) && PyUnstable_Long_IsCompact((PyLongObject *)v))
        return PyUnstable_Long_CompactValue((PyLongObject *)v);
#else
    if (PyLong_CheckExact(v)) {
        Py_ssize_t size = Py_SIZE(v);
        if (size == 0)
            return 0;
        if (size == 1)
            return (Py_ssize_t)((PyLongObject *)v)->ob_digit[0];
        if (size == -1)  /* -1 marks a node without a value (blk) or a leaf's signature */
            return -(Py_ssize_t)((PyLongObject *)v)->ob_digit[0];
    }
#endif
    return PyLong_AsSsize_t(v);
}

/* Node id `v` as an index into a list of length n, or -1 with IndexError set (executor.c,
   run_tables.c: inline, as it runs once per node in their loops). */
static inline Py_ssize_t dg_index_in(PyObject *v, Py_ssize_t n) {
    Py_ssize_t i = PyLong_Check(v) ? dg_as_ssize(v) : -1;
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (i < 0 || i >= n) {
        PyErr_Format(PyExc_IndexError, "node id %zd out of range [0, %zd)", i, n);
        return -1;
    }
    return i;
}

/* o.<s> through a name interned once (*name caches it): PyObject_GetAttrString makes and hashes a
   new string on every call (~1000 instructions), which the backward step paid once per batch. */
static inline PyObject *dg_attr(PyObject *o, PyObject **name, const char *s) {
    if (!*name && !(*name = PyUnicode_InternFromString(s)))
        return NULL;
    return PyObject_GetAttr(o, *name);
}

/* Small tuples made per batch (a plan (kind, a, b), a shape (n, m), a log entry (o, n)) without
   Py_BuildValue, whose format parsing was ~500 instructions a call: ~3% of a per-sentence epoch
   (callgrind). New references; NULL with an exception set. */
static inline PyObject *dg_tuple_kab(long k, PyObject *a, PyObject *b) {
    PyObject *t = PyTuple_New(3), *kk = t ? PyLong_FromLong(k) : NULL;
    if (!kk) {
        Py_XDECREF(t);
        return NULL;
    }
    Py_INCREF(a);
    Py_INCREF(b);
    PyTuple_SET_ITEM(t, 0, kk);
    PyTuple_SET_ITEM(t, 1, a);
    PyTuple_SET_ITEM(t, 2, b);
    return t;
}

static inline PyObject *dg_tuple_on(PyObject *o, Py_ssize_t n) {
    PyObject *t = PyTuple_New(2), *nn = t ? PyLong_FromSsize_t(n) : NULL;
    if (!nn) {
        Py_XDECREF(t);
        return NULL;
    }
    Py_INCREF(o);
    PyTuple_SET_ITEM(t, 0, o);
    PyTuple_SET_ITEM(t, 1, nn);
    return t;
}

static inline PyObject *dg_tuple_nn(Py_ssize_t n, Py_ssize_t m) {
    PyObject *t = PyTuple_New(2), *a = t ? PyLong_FromSsize_t(n) : NULL, *b = a ? PyLong_FromSsize_t(m) : NULL;
    if (!b) {
        Py_XDECREF(a);
        Py_XDECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, b);
    return t;
}

/* v's shape as a tuple (for numpy.empty of an array like v). A new reference, or NULL with an
   exception set. */
static inline PyObject *dg_shape_of(const Py_buffer *v) {
    PyObject *shape = PyTuple_New(v->ndim);
    for (int d = 0; shape && d < v->ndim; d++) {
        PyObject *e = PyLong_FromSsize_t(v->shape[d]);
        if (!e)
            Py_CLEAR(shape);
        else
            PyTuple_SET_ITEM(shape, d, e);
    }
    return shape;
}

/* Records that live as long as their graph (the scheduler's batches, a batch's gathered
   arguments and plans, ExecutedBatch) hold only ints, None, str, arrays and other such records,
   so they can never be part of a reference cycle. Left tracked, ~15k of them per step on a
   36k-node lattice graph reached Python's oldest generation, and its full collections walked
   every one: the collector took 11-15% of a lattice step and 9% of a per-sentence step
   (gc.callbacks). Untracked here, refcounting still frees them as before; the collector skips them.

   dg_untrack_list: a list of ours whose items are such objects (never a user's list).
   dg_untrack_record: a tuple, or a tuple subclass with no instance dict or slots (a NamedTuple),
   once nothing it holds is tracked (tuples it holds are tried first): CPython's own rule for
   tuples (_PyTuple_MaybeUntrack), applied at creation instead of at the first collection. */
static inline void dg_untrack_list(PyObject *o) {
    if (o && PyObject_GC_IsTracked(o))
        PyObject_GC_UnTrack(o);
}

static inline int dg_untrack_record(PyObject *t) {
    if (!PyObject_GC_IsTracked(t))
        return 1;
    PyTypeObject *tp = Py_TYPE(t);
    if (tp != &PyTuple_Type && (tp->tp_dictoffset != 0 || tp->tp_basicsize != PyTuple_Type.tp_basicsize))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        PyObject *x = PyTuple_GET_ITEM(t, i);
        if (!PyObject_IS_GC(x) || !PyObject_GC_IsTracked(x))
            continue;
        if (!PyTuple_Check(x) || !dg_untrack_record(x))
            return 0;
    }
    PyObject_GC_UnTrack(t);
    return 1;
}

/* Prefetching in the per-node loops. A mini-batch's graph has tens of thousands of nodes,
   each an argument tuple and int objects scattered over the heap; the loops that walk a batch's
   nodes (run_table, columns, place, agenda_batches) stalled on those loads, not on their
   arithmetic (perf, TreeLSTM H=64: ~70% of run_table's and agenda_batches' time at one load
   each). Asking for the objects of the node DG_AHEAD places later overlaps the misses. A hint
   only: it never faults and changes no result. */
#if defined(__GNUC__) || defined(__clang__)
#define DG_PREFETCH(p) __builtin_prefetch((const void *)(p))
#else
#define DG_PREFETCH(p) ((void)(p))
#endif
enum { DG_AHEAD = 8 };

/* The value of int object v when it is an index into [0, n), else -1; never sets an
   exception (the loop's own check reports a bad id when it reaches it). */
static inline Py_ssize_t dg_peek_index(PyObject *v, Py_ssize_t n) {
    if (!PyLong_CheckExact(v))
        return -1;
    Py_ssize_t i = dg_as_ssize(v);
    if (i == -1 && PyErr_Occurred())
        PyErr_Clear();
    return i >= 0 && i < n ? i : -1;
}

/* list[v] (and list2[v]) for node id v, whose int object is in the cache. */
static inline void dg_prefetch_item(PyObject *v, PyObject *list, PyObject *list2) {
    Py_ssize_t i = dg_peek_index(v, PyList_GET_SIZE(list));
    if (i >= 0) {
        DG_PREFETCH(PyList_GET_ITEM(list, i));
        if (list2 && i < PyList_GET_SIZE(list2))
            DG_PREFETCH(PyList_GET_ITEM(list2, i));
    }
}

/* Before the node ids[r] of a loop over ids[0..B) is read: the int object of the node
   2*DG_AHEAD places on, and list[id] of the one DG_AHEAD places on (its int object is in
   the cache by then). `list` may be NULL (ids only); a second list `list2` is optional. */
static inline void dg_prefetch_nodes(PyObject *const *ids, Py_ssize_t r, Py_ssize_t B, PyObject *list,
                                     PyObject *list2) {
    if (r + 2 * DG_AHEAD < B)
        DG_PREFETCH(ids[r + 2 * DG_AHEAD]);
    if (list && r + DG_AHEAD < B)
        dg_prefetch_item(ids[r + DG_AHEAD], list, list2);
}

/* The argument int objects of node ids[r + DG_AHEAD/2] (its tuple args[id] was asked for
   DG_AHEAD/2 nodes earlier by dg_prefetch_nodes): loops that read or count them next. */
static inline void dg_prefetch_arg_items(PyObject *const *ids, Py_ssize_t r, Py_ssize_t B, PyObject *args) {
    if (r + DG_AHEAD / 2 >= B)
        return;
    Py_ssize_t i = dg_peek_index(ids[r + DG_AHEAD / 2], PyList_GET_SIZE(args));
    PyObject *t = i >= 0 ? PyList_GET_ITEM(args, i) : NULL;
    if (t && PyTuple_CheckExact(t))
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t) && k < 4; k++)
            DG_PREFETCH(PyTuple_GET_ITEM(t, k));
}

/* all[i] for each node id i of the tuple `ids`, as a new list (a batch's data list, forward and
   backward), or NULL with an exception set. */
static inline PyObject *dg_pick_list(PyObject *all, PyObject *ids) {
    Py_ssize_t B = PyTuple_GET_SIZE(ids);
    PyObject *out = PyList_New(B);
    if (!out)
        return NULL;
    for (Py_ssize_t j = 0; j < B; j++) {
        Py_ssize_t i = dg_index_in(PyTuple_GET_ITEM(ids, j), PyList_GET_SIZE(all));
        if (i < 0) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *d = PyList_GET_ITEM(all, i);
        Py_INCREF(d);
        PyList_SET_ITEM(out, j, d);
    }
    return out;
}

int dg_recorder_add_types(PyObject *module);
int dg_block_pool_add_type(PyObject *module);  /* block_pool.c: BlockPool */
int dg_graph_leaves_add(void);  /* graph_leaves.c: GraphBase.leaf, after dg_recorder_add_types */
int dg_expr_add_types(PyObject *module);
PyObject *dg_configure(PyObject *self, PyObject *args);
PyObject *dg_plain_expression_type(PyObject *self, PyObject *cls);
PyObject *dg_configure_leaves(PyObject *self, PyObject *args);
int dg_leaves_add(PyObject *module);
/* recorder.c and expr_recorder.c, for leaves.c: whether configure() ran; a live graph's leaf dict (borrowed) or
   NULL; an Expression for (cg, nid) (steals nid); add() on a live graph (a node id or NULL) */
int dg_recorder_ready(void);
PyObject *dg_live_leaves(PyObject *cg);
PyObject *dg_make_expr(PyObject *cg, PyObject *nid);
PyObject *dg_graph_add(PyObject *cg, PyObject *op, PyObject *ids, PyObject *attrs, PyObject *data);
PyObject *dg_columns(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_place(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_untrack_record_py(PyObject *self, PyObject *r);
PyObject *dg_locate(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
int dg_locate_ids(PyObject *blk, PyObject *row, PyObject *ids_tuple, PyObject **b0, PyObject **r0,
                  PyObject **loc);
PyObject *dg_any_true(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_same_slice(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_run_batch_native(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_replay_native(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);  /* replay.c */
double dg_now(void);  /* time.perf_counter's clock (batch_run.c) */
PyObject *dg_compile_program(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_set_direct_kernels(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
/* the direct kernels' kinds (backends/cpu/direct.py's DIRECT_*): the first DIRECT_KINDS through
   direct_batch.c's kernel table */
enum { DIRECT_UNARY = 1, DIRECT_BINARY, DIRECT_SUM, DIRECT_PNLS, DIRECT_TAKE, DIRECT_LSTMC, DIRECT_LSTMH,
       DIRECT_KINDS = DIRECT_LSTMH,
       DIRECT_CONCAT, DIRECT_AFFINE, DIRECT_MATMUL,  /* copies; numpy's products: no kernel pointer */
       DIRECT_LSTM_STEP,                             /* direct_step.c, its kernel set apart */
       DIRECT_COPY, DIRECT_SOFTMAX, DIRECT_COLWISE }; /* direct_shaped.c */
/* direct_batch.c, for batch_run.c: numpy's array type and allocators, then one batch's direct kernel
   (1 with *y its output, 0 when the batch does not fit it, -1 on error) */
typedef struct {
    PyTypeObject *ndarray;
    PyObject *dtypes[2], *empty;  /* numpy's float32 and float64 dtypes; numpy.empty */
    PyObject *shape;              /* the node's shape; the batch's rows; the graph's dtype (0, 1; -1 other) */
    Py_ssize_t rows;
    int want_t;
    int *ready;                   /* set on success: whether the output is the batch's block as it is */
    PyObject *transposed;         /* the evaluation's transposed shared weights (direct_products.c), or NULL */
} dg_direct_ctx;
/* column_gather.c (batch_run.c): an argument column's TAKE or MANY gather (executor.gather's) */
typedef struct {
    PyObject *blocks;             /* the graph's block list */
    PyTypeObject *ndarray;        /* numpy.ndarray: only exact arrays are read */
    PyObject *empty;              /* numpy.empty */
    PyObject *dtype;              /* the graph's dtype */
    const char *format;           /* its buffer format, 'f' or 'd' */
    PyObject *index_of;           /* (row index type, numpy.frombuffer, int64): the backend's; None: no gathers here */
    double *acc;                  /* [gathers, bytes gathered], added to */
} dg_gather_ctx;
/* 1 with *x and *plan made, 0 not taken (nothing made, no error), -1 with an error set */
int dg_gather_column(const dg_gather_ctx *g, PyObject *loc, PyObject **x, PyObject **plan);
/* direct_output.c (direct_batch.c, direct_products.c): numpy.empty(shape, dtype t); whether w is the batch's block */
PyObject *dg_direct_empty_of(const dg_direct_ctx *ctx, PyObject *shape, int t);
void dg_direct_mark_ready(const dg_direct_ctx *ctx, const Py_buffer *w, int t);
PyObject *dg_direct_new_rows(const dg_direct_ctx *ctx, Py_ssize_t rows, Py_ssize_t cols, int t, Py_buffer *w);
PyObject *dg_direct_new_batch(const dg_direct_ctx *ctx, PyObject *shape, Py_ssize_t B, int t, Py_ssize_t bytes,
                              Py_buffer *w);
/* direct_products.c: affine (affine 1) or matmul of shared matrices (as dg_direct_batch: 1 with *y, 0, -1) */
int dg_direct_products(const dg_direct_ctx *ctx, int affine, const Py_ssize_t *bound, int t, PyObject *xs,
                       const Py_buffer *v, PyObject **y);
void dg_set_matvec_kernels(void *f32, void *f64);
int dg_shared_matvec(int t, void *y, const void *W, const void *x, Py_ssize_t xstride, Py_ssize_t n, Py_ssize_t r,
                     Py_ssize_t c);
void dg_add_row_block(int t, void *dst, const void *src, Py_ssize_t rows, Py_ssize_t width, Py_ssize_t step);
/* direct_step.c: lstm_step's forward (as dg_direct_batch: 1 with *y, 0, -1) and its cell kernels */
int dg_direct_lstm_step(const dg_direct_ctx *ctx, const Py_ssize_t *bound, int t, PyObject *xs, const Py_buffer *v,
                        PyObject *attrs, PyObject **y);
void dg_set_step_kernels(void *f32, void *f64);
/* direct_shaped.c: reshape's copy, softmax of columns, colwise_add, products of per-node matrices (as dg_direct_batch) */
int dg_direct_shaped(const dg_direct_ctx *ctx, long kind, long code, const Py_ssize_t *bound, int t, PyObject *xs,
                     const Py_buffer *v, PyObject *attrs, PyObject *shape, Py_ssize_t B, PyObject **y);
int dg_order_kept(PyObject *attrs, const Py_ssize_t *s, int nd);
int dg_same_squeezed(const Py_ssize_t *a, int na, const Py_ssize_t *b, int nb);
void dg_set_shaped_kernels(void *softmax_f32, void *softmax_f64, void *matmul_f32, void *matmul_f64);
int dg_direct_batch(const dg_direct_ctx *ctx, PyObject *desc, PyObject *xs, PyObject *data, PyObject *attrs,
                    PyObject *shape, Py_ssize_t nodes, PyObject **y);
PyObject *dg_backward_batch_native(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_backward_batches_native(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_place_steps(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_run_table(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_block_table(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_row_index_small(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_addresses(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_int(Py_ssize_t i);  /* a shared int object per value (executor.c) */
/* PyObject_GetBuffer with a direct path for plain float32/float64 numpy arrays (array_view.c);
   released with PyBuffer_Release like any view. */
int dg_get_buffer(PyObject *o, Py_buffer *v, int flags);
/* An ndarray's ndim and dims without a buffer export where the direct view is on (array_view.c). */
int dg_array_dims(PyObject *o, int max_nd, Py_ssize_t *shape);
/* An exact native float32/float64 ndarray's fields, read without a buffer export (array_view.c). */
typedef struct {
    char *data;
    int nd;
    const Py_ssize_t *shape, *strides;
    Py_ssize_t itemsize;
    char format;  /* 'f' or 'd' */
    int writable;
} dg_array_fields;
int dg_array_peek(PyObject *o, dg_array_fields *f);
/* dg_array_peek, else a buffer export held in *v (*exported 1: released by the caller) (array_view.c). */
int dg_array_read(PyObject *o, dg_array_fields *f, Py_buffer *v, int *exported);
PyObject *dg_array_view_state(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_grad_addresses(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_pending(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_depth_batches(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_node_arrays(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_agenda_batches(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_typewise_batches(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_merge_batches(PyObject *self, PyObject *const *argv, Py_ssize_t nargs); /* batch_merge.c */
PyObject *dg_users_split(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_needed_within(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);

#endif
