/* The backward step's context layout and its helpers shared by backward_batch.c and grad_scatter.c
(part of dynagraph._bookkeeping; backward_batch.c documents the context). */
#ifndef DG_BACKWARD_BATCH_H
#define DG_BACKWARD_BATCH_H
#include "bookkeeping.h"

enum { B_OP, B_NEEDS, B_DATA, B_ATTRS, B_BLOCKS, B_GB, B_BORROWED, B_INFOS, B_INFO_FN, B_XP, B_FULL, B_DEFER,
       B_ONE_ROW, B_SCATTER, B_LEAF_SUMS, B_NDARRAY, B_FORMAT, B_ACC, B_DEFERRED, B_PRODUCTS,
       B_GRAD_BLOCK, B_ROWINDEX, B_REDUCE_TO, B_EMPTY, B_DTYPE, B_KERNELS, B_LSTM_F64_MAX,
       B_TABLE_ARRAYS, B_ZEROS, B_SIZE };
/* backward_ops.c's op codes (info[6]; backends/cpu/backward.py names them) */
enum { NB_NONE, NB_MATMUL, NB_AFFINE, NB_LSTM_C, NB_LSTM_H, NB_ESUM, NB_ADD, NB_LOOKUP, NB_PNLS };
enum { ACC_KERNELS, ACC_BACKWARD, ACC_MEMORY, ACC_SCATTERS, ACC_SCATTER_BYTES, ACC_SIZE };
enum { LEAF = 0, SLICE = 1, TAKE = 2, MANY = 3 };

/* The loops below at -O3 (vectorised; the extension builds at -O2): each element is still one
   rounded add or multiply, as numpy's, so the results are bit-identical either way. */
#if defined(__GNUC__) && !defined(__clang__)
#define DG_VECTORIZE __attribute__((optimize("O3")))
#else
#define DG_VECTORIZE
#endif

/* x as rows of *width elements: row j at byte j * *stride, element i at byte i * *estride within it.
   1 when x is 2-D (any non-negative strides: a concatenate's or transpose's gradient is a view of a
   wider or transposed one) or its rows (dims 1..) are C-contiguous, else 0. */
static inline int dg_row_layout(const Py_buffer *x, Py_ssize_t *stride, Py_ssize_t *width, Py_ssize_t *estride) {
    if (x->ndim < 1 || !x->strides || x->strides[0] < 0)
        return 0;
    if (x->ndim == 2 && x->strides[1] >= 0) {
        *width = x->shape[1];
        *estride = x->shape[1] > 1 ? x->strides[1] : x->itemsize;
        *stride = x->shape[0] > 1 ? x->strides[0] : *width * *estride;
        return 1;
    }
    Py_ssize_t step = x->itemsize;
    for (int i = x->ndim - 1; i >= 1; i--) {
        if (x->shape[i] > 1 && x->strides[i] != step)
            return 0;
        step *= x->shape[i];
    }
    *width = step / x->itemsize;
    *estride = x->itemsize;
    *stride = x->shape[0] > 1 ? x->strides[0] : step;
    return 1;
}

/* The bytes x's rows span (for overlap checks), from x->buf, in the layout above. */
static inline Py_ssize_t dg_row_extent(const Py_buffer *x, Py_ssize_t stride, Py_ssize_t width, Py_ssize_t estride) {
    return x->shape[0] > 0 && width > 0 ? (x->shape[0] - 1) * stride + (width - 1) * estride + x->itemsize : 0;
}

/* dst rows (contiguous, width elements each) += n rows of x from `src` in the layout above, in row order
   (callers check that dst and x do not overlap: restrict). */
DG_VECTORIZE static inline void dg_add_rows(char *dst, const char *src, int itemsize, Py_ssize_t stride,
                                            Py_ssize_t estride, Py_ssize_t n, Py_ssize_t width) {
    for (Py_ssize_t j = 0; j < n; j++) {
        const char *r = src + j * stride;
        if (itemsize == 4) {
            float *restrict o = (float *)dst + j * width;
            if (estride == 4) {
                const float *restrict a = (const float *)r;
                for (Py_ssize_t i = 0; i < width; i++)
                    o[i] += a[i];
            } else {
                for (Py_ssize_t i = 0; i < width; i++)
                    o[i] += *(const float *)(r + i * estride);
            }
        } else {
            double *restrict o = (double *)dst + j * width;
            if (estride == 8) {
                const double *restrict a = (const double *)r;
                for (Py_ssize_t i = 0; i < width; i++)
                    o[i] += a[i];
            } else {
                for (Py_ssize_t i = 0; i < width; i++)
                    o[i] += *(const double *)(r + i * estride);
            }
        }
    }
}

/* grad_scatter.c: the scatters done in C and the weight-product deferral (see there) */
int dg_scatter_here(PyObject *ctx, PyObject *plan, PyObject *gx, Py_ssize_t B);
int dg_defer_here(PyObject *ctx, PyObject *products_fn, PyObject *xs, PyObject *plans, PyObject *g, PyObject **need);

/* grad_rows.c: scatters into gradient blocks made on demand (see there) */
PyObject *dg_writable_grad(PyObject *ctx, Py_ssize_t b);
int dg_scatter_many(PyObject *ctx, PyObject *ix, Py_ssize_t B, const Py_buffer *x);
int dg_one_row_here(PyObject *ctx, PyObject *plans, PyObject *gxs, PyObject *need, Py_ssize_t B);

/* backward_ops.c: the commonest ops' backward without a Python frame (see there) */
PyObject *dg_native_grads(PyObject *ctx, long code, PyObject *attrs, PyObject *xs, PyObject *g, PyObject *need,
                          PyObject *plans, PyObject *data);
PyObject *dg_outer_product(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);

#endif
