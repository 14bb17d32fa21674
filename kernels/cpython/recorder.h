/* What recorder.c (GraphBase, the add() fast path) and expr_recorder.c (ExprBase,
Recorder) share: the two object layouts, their types, and the configured Expression class. */
#ifndef DG_RECORDER_H
#define DG_RECORDER_H
#include "bookkeeping.h"

#include <stdint.h>

/* A recent signature lookup, by identity: the same op, the same argument parts (the
   interned shape or shared-parameter tuples of the graph's nodes) and equal attrs have
   the same signature, so the key tuple need not be built, hashed and compared again.
   Entries hold references, so no address they compare against can be reused. */
enum { SIG_CACHE = 256, SIG_CACHE_ARGS = 8 };
typedef struct {
    PyObject *op, *attrs, *known, *parts[SIG_CACHE_ARGS];
    Py_ssize_t n;
} SigEntry;

/* The node table (node_table.c): nodes [0, n)'s argument ids, node v's at arg[start[v]] to
   arg[start[v + 1]], mirroring the args list `of` (a reference held, so that the identity
   compared cannot pass to another list). */
typedef struct {
    int64_t *start;
    int32_t *arg;
    Py_ssize_t n, cap, arg_cap;
    PyObject *of;
} NodeTable;

typedef struct {
    PyObject_HEAD
    PyObject *op, *args, *attrs, *data, *shape, *depth, *sig, *sig_part, *needs_grad;
    PyObject *signatures; /* list: signature id -> key */
    PyObject *leaves;     /* dict: parameter (or (parameter, False)) -> its leaf node id */
    PyObject *sig_id;     /* dict: signature key -> (sid, shape, attrs, check, blocks_grad) */
    PyObject *rand_base;  /* int: data RANDOM_KEY becomes rand_base + node id */
    PyObject *blk, *row;  /* value slot per node: block and row (lists; evaluation fills them) */
    PyObject *blocks;     /* list: value blocks (a parameter leaf's block is a view of its storage) */
    PyObject *block_param;  /* dict: leaf value block -> its parameter */
    SigEntry *cache;      /* SIG_CACHE entries, filled from sig_id (cache_of), or NULL */
    PyObject *cache_of;
    int nused;            /* the filled entries of cache are used[0..nused): clearing and */
    unsigned short used[SIG_CACHE];  /* traversal visit only those, not all SIG_CACHE */
    char retired, immediate;
    NodeTable table;      /* args as int32 arrays, for the per-node loops (node_table.c) */
} GraphObject;

typedef struct {
    PyObject_HEAD
    PyObject *cg, *i;
} ExprObject;

extern PyTypeObject GraphBaseType;  /* recorder.c */
extern PyObject *ExprType;          /* expr_recorder.c: Expression (a subclass of ExprBase), set by configure() */
void dg_graph_configure(PyObject *slot, PyObject *key, PyObject *shapes, PyObject *draw);  /* recorder.c */
/* The leaf node id of parameter p (update: trained) in graph cg, made if it is new (new
   reference; recorder.c). NULL with *slow = 1: Python (ComputationGraph._leaf_py) must make
   it, nothing was touched; NULL with *slow = 0: an error is set. */
PyObject *dg_graph_leaf(PyObject *cg, PyObject *p, int update, int *slow);
/* add() where the caller has done the op's per-node check `checked` (a lookup's row index):
   it is skipped when it is still the op's check; any other check runs. */
PyObject *dg_graph_add_checked(PyObject *cg, PyObject *op, PyObject *ids, PyObject *attrs, PyObject *data,
                               PyObject *checked);
int dg_leaves_configure(PyObject *parameter_op, PyObject *table_op);  /* graph_leaves.c */
void dg_parameter_types(PyObject *params, PyObject *table);  /* graph_leaves.c: set by configure_entries */
int dg_is_parameter_object(PyObject *x);  /* graph_leaves.c: x's class is one of them, exactly */

/* recorder.c, for graph_leaves.c and sig_cache.c */
/* columns.c: a node column's append (grows large lists by half); the pools of emptied column
   lists (one per list column of GraphBase, DG_LIST_COLUMNS of them) */
enum { DG_LIST_COLUMNS = 13 };
int dg_col_append(PyObject *list, PyObject *v);
void dg_pool_list(int column, PyObject *l);
PyObject *dg_pooled_list(int column);
int dg_columns_ready(GraphObject *g);            /* the node columns are lists of one length */

/* sig_cache.c */
void dg_sig_cache_clear(GraphObject *g);
void dg_sig_cache_free(GraphObject *g);
PyObject *dg_sig_cache_get(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *const *parts, Py_ssize_t n);
void dg_sig_cache_put(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *const *parts, Py_ssize_t n,
                      PyObject *known);
void dg_arg_shapes(GraphObject *g, PyObject *ids, PyObject **shapes);
void dg_global_put(PyObject *op, PyObject *attrs, PyObject *const *parts, PyObject *const *shapes, Py_ssize_t n,
                   PyObject *key, PyObject *known);
PyObject *dg_global_get(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *const *parts,
                        PyObject *const *shapes, Py_ssize_t n, int *failed);

/* node_table.c */
void dg_table_start(GraphObject *g);
void dg_table_push(GraphObject *g, Py_ssize_t nid, PyObject *ids, const int32_t *idx);
/* dg_table_push for the recorder's common case, inline: the table is level with the list and
   has room for node nid's k (<= 8) ids idx. */
static inline void dg_table_push_ids(GraphObject *g, Py_ssize_t nid, PyObject *ids, const int32_t *idx,
                                     Py_ssize_t k) {
    NodeTable *t = &g->table;
    if (t->n == nid && t->of == g->args && nid < INT32_MAX && nid + 2 <= t->cap && t->start[nid] + k <= t->arg_cap) {
        int32_t *out = t->arg + t->start[nid];
        for (Py_ssize_t j = 0; j < k; j++)
            out[j] = idx[j];
        t->start[nid + 1] = t->start[nid] + k;
        t->n = nid + 1;
        return;
    }
    dg_table_push(g, nid, ids, idx);
}
void dg_table_truncate(GraphObject *g, Py_ssize_t n);
void dg_table_free(NodeTable *t);
/* The table of graph cg over nodes [0, upto) if `args` is its args list, else NULL (no error). */
const NodeTable *dg_table_of(PyObject *cg, PyObject *args, Py_ssize_t upto);
/* executor.c: a batch's argument columns (columns()), from the node table when tab is not NULL */
PyObject *dg_columns_of(PyObject *args, PyObject *nodes, const NodeTable *tab);

#endif
