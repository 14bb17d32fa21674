/* A gradient's rows as strided memory, and the add of such rows into contiguous ones: the layout
helpers of the backward step's C scatters (backward_batch.c, grad_rows.c, grad_scatter.c). A header
of its own, below them all, so that none of those files reaches back into another for it. */
#ifndef DG_ROW_LAYOUT_H
#define DG_ROW_LAYOUT_H
#include <Python.h>

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

#endif
