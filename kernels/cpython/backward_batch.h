/* The backward step's context layout and its helpers shared by backward_batch.c and grad_scatter.c
(part of dynagraph._bookkeeping; backward_batch.c documents the context). */
#ifndef DG_BACKWARD_BATCH_H
#define DG_BACKWARD_BATCH_H
#include "bookkeeping.h"
#include <stdint.h>

enum { B_OP, B_NEEDS, B_DATA, B_ATTRS, B_BLOCKS, B_GB, B_BORROWED, B_INFOS, B_INFO_FN, B_XP, B_FULL, B_DEFER,
       B_ONE_ROW, B_SCATTER, B_LEAF_SUMS, B_NDARRAY, B_FORMAT, B_ACC, B_DEFERRED, B_PRODUCTS,
       B_GRAD_BLOCK, B_ROWINDEX, B_REDUCE_TO, B_EMPTY, B_DTYPE, B_KERNELS, B_LSTM_F64_MAX,
       B_TABLE_ARRAYS, B_ZEROS, B_SIZE };
/* backward_ops.c's op codes (info[6]; backends/cpu/backward.py names them) */
enum { NB_NONE, NB_MATMUL, NB_AFFINE, NB_LSTM_C, NB_LSTM_H, NB_ESUM, NB_ADD, NB_LOOKUP, NB_PNLS, NB_TANH, NB_LOGISTIC, NB_CONCAT,
       NB_LSTM_STEP, NB_RESHAPE, NB_TRANSPOSE, NB_SOFTMAX, NB_COLWISE };
/* NB_TANH, NB_LOGISTIC: batches of fewer elements than this take backward_ops.c's loop; the cpu
   adapter's threshold (overrides.UNARY_BWD_MIN), below which it runs the op's numpy code */
#define NB_UNARY_MAX 16384
/* backends/cpu/direct.py PRODUCT_ROWS_MAX and PRODUCT_MACS_MAX: a product's input gradient
   g @ W[0] with at most these rows and multiply-adds takes dg_rows_matvec_tgrad */
#define NB_PRODUCT_ROWS_MAX 4
#define NB_PRODUCT_MACS_MAX 65536
enum { ACC_KERNELS, ACC_BACKWARD, ACC_MEMORY, ACC_SCATTERS, ACC_SCATTER_BYTES, ACC_SIZE };
enum { LEAF = 0, SLICE = 1, TAKE = 2, MANY = 3 };

#include "row_layout.h"

/* grad_scatter.c: the scatters done in C and the weight-product deferral (see there) */
int dg_scatter_here(PyObject *ctx, PyObject *plan, PyObject *gx, Py_ssize_t B);
int dg_defer_here(PyObject *ctx, PyObject *products_fn, PyObject *xs, PyObject *plans, PyObject *g, PyObject **need);
int dg_defer_pair(PyObject *ctx, PyObject *b, PyObject *g, PyObject *x);

/* grad_rows.c: scatters into gradient blocks made on demand (see there) */
PyObject *dg_writable_grad(PyObject *ctx, Py_ssize_t b);
int dg_array_shape(PyObject *ctx, PyObject *a, int max_nd, Py_ssize_t *shape);
int dg_scatter_many(PyObject *ctx, PyObject *ix, Py_ssize_t B, const Py_buffer *x);
int dg_one_row_here(PyObject *ctx, PyObject *plans, PyObject *gxs, PyObject *need, Py_ssize_t B);

/* backward_ops.c: the commonest ops' backward without a Python frame (see there) */
PyObject *dg_native_grads(PyObject *ctx, long code, PyObject *attrs, PyObject *xs, PyObject *y, PyObject *g,
                          PyObject *need, PyObject *plans, PyObject *data);
PyObject *dg_outer_product(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_outer_add(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
PyObject *dg_add_arrays(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);
/* backward_operands.c (backward_ops.c, backward_products.c): an operand check (an exact ndarray of the
   graph's dtype with ndim dims; with contiguous, C-contiguous and its address), a new (rows, cols)
   block, slot i of the kernel table, reduce_to(g, x.shape) */
int dg_nb_operand(PyObject *ctx, PyObject *a, int ndim, Py_ssize_t *shape, int contiguous, void **buf);
PyObject *dg_nb_new_block(PyObject *ctx, Py_ssize_t rows, Py_ssize_t cols, void **buf);
uintptr_t dg_nb_kernel_address(PyObject *ctx, int i);
PyObject *dg_nb_reduced(PyObject *ctx, PyObject *g, PyObject *x);
enum { DG_NB_MAX_ND = 8 };  /* the most axes dg_nb_array reads */
int dg_nb_array(PyObject *ctx, PyObject *a, Py_ssize_t *shape, int contiguous, void **buf);
PyObject *dg_nb_new_shaped(PyObject *ctx, const Py_ssize_t *shape, int nd, void **buf);

/* backward_products.c: NB_MATMUL and NB_AFFINE (first: the first product's W; 1 for affine's b) */
PyObject *dg_nb_products(PyObject *ctx, PyObject *xs, PyObject *g, PyObject *need, Py_ssize_t first);
PyObject *dg_nb_product_grad(PyObject *ctx, PyObject *g, PyObject *W);
int dg_nb_tgrad_into(PyObject *ctx, void *out, const void *W, const void *g, Py_ssize_t n, Py_ssize_t r, Py_ssize_t c);

/* backward_shaped.c: NB_CONCAT, NB_RESHAPE, NB_TRANSPOSE, NB_SOFTMAX, NB_COLWISE; NB_MATMUL of per-node matrices */
PyObject *dg_nb_shaped(PyObject *ctx, long code, PyObject *attrs, PyObject *xs, PyObject *y, PyObject *g,
                       PyObject *need);
PyObject *dg_nb_matrix_products(PyObject *ctx, PyObject *xs, PyObject *g, PyObject *need);

/* backward_step.c: NB_LSTM_STEP */
PyObject *dg_nb_lstm_step(PyObject *ctx, PyObject *attrs, PyObject *xs, PyObject *y, PyObject *g, PyObject *need,
                          PyObject *plans);

#endif
