/* kernels/cpython/coarsen.h: what coarsen.c (the cut of pending nodes into instances) shares
 * with coarsen_plan.c (patterns and the unit schedule). */
#ifndef DG_COARSEN_H
#define DG_COARSEN_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

/* A growable open-addressing set of one-level shape hashes (never negative: 62 bits). */
typedef struct { Py_ssize_t *slots; Py_ssize_t cap, used; } ShapeSet;

/* The cut of the pending nodes into instances (the per-node pass), and the members of each
 * instance as CSR by root: members of the instance rooted at lo + rk are mem[start[rk] ..
 * start[rk + 1]) in ascending id order (instances of two or more nodes only). */
typedef struct {
    Py_ssize_t lo, span, np_, nnodes, ncache;
    Py_ssize_t *owner, *cmin, *size, *sigv, *csig, *start, *mem;
    Py_ssize_t *shape1, *shape, *head, *next_in;  /* per node its one- and two-level hashes; members per root */
    char *ispend, *cmulti, *excl;
    signed char *cache, *uses;
    ShapeSet repeated;   /* shapes of the repetition outputs cut so far (detect.py's module doc) */
} Cut;

int dgc_op_flag(PyObject *op, const char *name);
int dgc_cut_nodes(Cut *c, PyObject *args, PyObject *sig, PyObject *ops, PyObject *data, PyObject *pending,
                  Py_ssize_t max_nodes, Py_ssize_t max_args, Py_ssize_t ncache);
void dgc_cut_free(Cut *c);
Py_ssize_t dgc_instance_key(const Cut *c, PyObject *args, Py_ssize_t rk, Py_ssize_t *pos, Py_ssize_t *key,
                            Py_ssize_t *ext, Py_ssize_t *next);
PyObject *dgc_instance_slots(const Cut *c, PyObject *data, Py_ssize_t rk);
PyObject *dgc_ssize_list(const Py_ssize_t *v, Py_ssize_t n);
PyObject *dgc_ssize_tuple(const Py_ssize_t *v, Py_ssize_t n);
PyObject *dgc_plan(PyObject *self, PyObject *a);
PyObject *dgc_block_configure(PyObject *self, PyObject *a);                       /* block_call.c */
int dgc_block_type_ready(PyObject *module);                                      /* BlockCall */

#endif
