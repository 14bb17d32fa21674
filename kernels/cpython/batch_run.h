/* The compiled batch step's context and accumulator (batch_run.c documents both), shared by
batch_run.c and batch_columns.c. */
#ifndef DG_BATCH_RUN_H
#define DG_BATCH_RUN_H
#include "bookkeeping.h"

enum { C_OP, C_BLK, C_ROW, C_ARGS, C_BLOCKS, C_ATTRS, C_DATA, C_SHAPE, C_EXECUTED, C_INFOS, C_INFO_FN, C_XP,
       C_GATHER, C_FINISH, C_RECORD, C_NDARRAY, C_FORMAT, C_LOG, C_ACC, C_DTYPES, C_EMPTY, C_SPLIT_MAX, C_GROUP_MAX, C_INDEX_OF, C_TRANSPOSED, C_GRAPH,
       C_SIZE };
enum { ACC_KERNELS, ACC_BATCHES, ACC_NODES, ACC_MEMORY, ACC_EXECUTE, ACC_GATHERS, ACC_GATHER_BYTES, ACC_SIZE };

/* batch_columns.c: an op's info tuple (borrowed, made by info_fn once); item i of the context's
   list `which` (borrowed; NULL with an IndexError when out of range) */
PyObject *dg_batch_op_info(PyObject *ctx, PyObject *op);
PyObject *dg_batch_list_item(PyObject *ctx, int which, Py_ssize_t i);
/* the batch's argument columns into xs and plans: 0; 1 (node by node) or 2 (per block, the groups
   in *groups) when a column asks for the batch to run in parts instead; -1 on error */
int dg_read_columns(PyObject *ctx, PyObject *cols, PyObject *op, PyObject *info, PyObject *xs, PyObject *plans,
                    int may_split, PyObject *nodes, PyObject **groups);

/* batch_run.c: the batch's kernel run, output placed and recorded (executor.run_batch's tail; the
   xs, plans and kernel ctx are stolen by the record); the context checked (0, or -1 with a
   TypeError) */
int dg_batch_run_kernel(PyObject *ctx, PyObject *info, PyObject *nodes, Py_ssize_t n0, PyObject *cols, PyObject **xs,
                        PyObject **plans, PyObject **data, PyObject **kctx, PyObject **y, double t0);
int dg_batch_check_context(PyObject *ctx);

#endif
