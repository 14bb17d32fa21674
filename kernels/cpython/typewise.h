/* Shared by typewise_graph.c (the pending graph and G_a) and typewise.c (the simulation).
See typewise.c for what these schedulers do and how the compiled path equals its Python twins. */
#ifndef DYNAGRAPH_TYPEWISE_H
#define DYNAGRAPH_TYPEWISE_H

#include "bookkeeping.h"

#include <stdint.h>

/* One scheduling call's arrays (local node ids v = id - lo), from tw_begin's arena or the heap, freed
   together by tw_free_all. */
typedef struct {
    Py_ssize_t n, T, S;
    /* graph */
    Py_ssize_t *typ, *indeg, *ustart, *users, *argstart, *argv;
    char *pending;
    PyObject **node;
    /* type graph */
    Py_ssize_t *gpar, *gstart, *gch, *fcount;
    /* ready buckets */
    Py_ssize_t *bstart, *blen, *bucket, *lone, ltop, *rlist, *rpos, rn;
    /* near sets */
    Py_ssize_t *pool, pool_len, pool_cap, *pset_off, *pset_len, *stamp, *walk;
    uint64_t *below;
    Py_ssize_t W, depth, steps, unbatchable;
    /* holding the tail (typewise.Simulation's hold_tail): tail[t], pending non-tail batchable nodes */
    char *tail;
    Py_ssize_t nontail;
    /* chain heights (typewise.Simulation's heights, the FSM's chain encoding): height per node; per
       type t, pending and ready counts per height at hoff[t] + h, and its greatest pending height */
    Py_ssize_t *height, *hoff, *hcount, *hready, *top, *crit;  /* crit: typewise.path_lengths */
    PyObject *result;
    /* memory: the shared arena (arena = 1, bytes used) and heap blocks owned by this call */
    int arena;
    size_t used;
    void **owned;
    Py_ssize_t n_owned, cap_owned;
} TW;

void tw_begin(TW *s);
void *tw_zalloc(TW *s, size_t bytes);
Py_ssize_t *tw_alloc(TW *s, Py_ssize_t n);
Py_ssize_t *tw_alloc_raw(TW *s, Py_ssize_t n);
void tw_free_all(TW *s);
int tw_columns(TW *s, PyObject *args, PyObject *sig, PyObject *batchable, PyObject **ids, Py_ssize_t B,
               Py_ssize_t lo, Py_ssize_t *sig_type);
int tw_type_graph(TW *s);
int tw_chain_heights(TW *s); /* typewise_chain.c: after tw_type_graph */
void dg_sort_ids(Py_ssize_t *v, Py_ssize_t m); /* sort_ids.c: ascending, fast when nearly sorted */

#endif
