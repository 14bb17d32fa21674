/* dynagraph compute kernels: the public C API (float32 "_f32" and float64 "_f64").
 *
 * Conventions shared by every kernel:
 *  - arrays are C-contiguous; a "batched" array is (B, n): B rows of n elements;
 *  - a `*stride` argument is the distance between batch rows: n for a per-row
 *    operand, 0 for an operand shared by the whole batch (a parameter, a bias);
 *  - the Python wrapper (dynagraph/backends/cpu.py) validates every shape, dtype and
 *    index before calling: the C side trusts its arguments and never allocates.
 *
 * This file is also fed to cffi's cdef (preprocessor lines are stripped), so it
 * holds declarations only, in the subset of C that cffi parses.
 */
#ifndef DG_KERNELS_H
#define DG_KERNELS_H
#include <stdint.h>

enum dg_unary_op {
    DG_NEG = 0, DG_TANH = 1, DG_LOGISTIC = 2, DG_RECTIFY = 3, DG_EXP = 4,
    DG_LOG = 5, DG_SQUARE = 6, DG_SQRT = 7
};

enum dg_binary_op { DG_ADD = 0, DG_SUB = 1, DG_CMULT = 2, DG_CDIV = 3 };

/* ---------------------------------------------------------------- rows.c
 * gather:  out[j] = bases[src[j]][rows[j]]                (rows of `width`)
 * scatter: bases[dst[j]][rows[j]] += vals[j * vstride]     (sequential: repeats add up)
 * take:    out[j] = table[rows[j]]                          (embedding lookup)
 * add:     g[rows[j]] += vals[j * vstride]                  (embedding gradient)
 * embedding_bwd: add, and touched[rows[j]] = 1
 */
void dg_gather_rows_f32(float *out, const float *const *bases, const int64_t *src,
                        const int64_t *rows, int64_t n, int64_t width);
void dg_gather_rows_f64(double *out, const double *const *bases, const int64_t *src,
                        const int64_t *rows, int64_t n, int64_t width);
void dg_scatter_add_rows_f32(float *const *bases, const int64_t *dst, const int64_t *rows,
                             const float *vals, int64_t vstride, int64_t n, int64_t width);
void dg_scatter_add_rows_f64(double *const *bases, const int64_t *dst, const int64_t *rows,
                             const double *vals, int64_t vstride, int64_t n, int64_t width);
void dg_take_rows_f32(float *out, const float *table, const int64_t *rows, int64_t n, int64_t width);
void dg_take_rows_f64(double *out, const double *table, const int64_t *rows, int64_t n, int64_t width);
void dg_add_rows_f32(float *g, const int64_t *rows, const float *vals, int64_t vstride,
                     int64_t n, int64_t width);
void dg_add_rows_f64(double *g, const int64_t *rows, const double *vals, int64_t vstride,
                     int64_t n, int64_t width);
void dg_embedding_bwd_f32(float *grad, unsigned char *touched, const int64_t *rows,
                          const float *vals, int64_t vstride, int64_t n, int64_t width);
void dg_embedding_bwd_f64(double *grad, unsigned char *touched, const int64_t *rows,
                          const double *vals, int64_t vstride, int64_t n, int64_t width);

/* ---------------------------------------------------------- elementwise.c
 * unary:  y = f(x) over n elements;  gx = g * f'(x, y)
 * binary: out[b] = x[b * xstride] op y[b * ystride] for b < B (rows of n);
 *         backward writes gx (B, n) or, when xstride == 0, its sum over the batch (n);
 *         gx or gy may be NULL when that gradient is not needed.
 */
void dg_unary_fwd_f32(int op, float *y, const float *x, int64_t n);
void dg_unary_fwd_f64(int op, double *y, const double *x, int64_t n);
void dg_unary_bwd_f32(int op, float *gx, const float *x, const float *y, const float *g, int64_t n);
void dg_unary_bwd_f64(int op, double *gx, const double *x, const double *y, const double *g, int64_t n);
void dg_binary_fwd_f32(int op, float *out, const float *x, int64_t xstride,
                       const float *y, int64_t ystride, int64_t B, int64_t n);
void dg_binary_fwd_f64(int op, double *out, const double *x, int64_t xstride,
                       const double *y, int64_t ystride, int64_t B, int64_t n);
void dg_binary_bwd_f32(int op, float *gx, float *gy, const float *x, int64_t xstride,
                       const float *y, int64_t ystride, const float *out, const float *g,
                       int64_t B, int64_t n);
void dg_binary_bwd_f64(int op, double *gx, double *gy, const double *x, int64_t xstride,
                       const double *y, int64_t ystride, const double *out, const double *g,
                       int64_t B, int64_t n);

/* --------------------------------------------------------------- reduce.c
 * sum_args: out[b] = scale * sum_a args[a][b * strides[a]]   (esum, average)
 * row_sums: out[r] = sum_i x[r, i] / divisor                 (sum_elems, mean_elems)
 * col_sums: out[i] = sum_r x[r, i]                           (batch sum: shared grads)
 */
void dg_sum_args_f32(float *out, const float *const *args, const int64_t *strides, int64_t k,
                     int64_t B, int64_t n, double scale);
void dg_sum_args_f64(double *out, const double *const *args, const int64_t *strides, int64_t k,
                     int64_t B, int64_t n, double scale);
void dg_row_sums_f32(float *out, const float *x, int64_t rows, int64_t n, int64_t divisor);
void dg_row_sums_f64(double *out, const double *x, int64_t rows, int64_t n, int64_t divisor);
void dg_col_sums_f32(float *out, const float *x, int64_t rows, int64_t n);
void dg_col_sums_f64(double *out, const double *x, int64_t rows, int64_t n);

/* -------------------------------------------------------------- softmax.c
 * Row-wise over `rows` rows of n classes. pnls = pickneglogsoftmax:
 * loss[r] = logsumexp(x[r]) - x[r, labels[r]], x read at r * xstride (0: shared x);
 * its backward writes gx (rows, n), or (1, n) summed over rows when xstride == 0.
 * `work` is scratch space for n values. Row sums use numpy's pairwise order.
 */
void dg_softmax_fwd_f32(float *y, const float *x, int64_t rows, int64_t n);
void dg_softmax_fwd_f64(double *y, const double *x, int64_t rows, int64_t n);
void dg_softmax_bwd_f32(float *gx, const float *y, const float *g, int64_t rows, int64_t n);
void dg_softmax_bwd_f64(double *gx, const double *y, const double *g, int64_t rows, int64_t n);
void dg_log_softmax_fwd_f32(float *y, const float *x, int64_t rows, int64_t n);
void dg_log_softmax_fwd_f64(double *y, const double *x, int64_t rows, int64_t n);
void dg_log_softmax_bwd_f32(float *gx, const float *y, const float *g, int64_t rows, int64_t n);
void dg_log_softmax_bwd_f64(double *gx, const double *y, const double *g, int64_t rows, int64_t n);
void dg_pnls_fwd_f32(float *loss, float *work, const float *x, int64_t xstride,
                     const int64_t *labels, int64_t rows, int64_t n);
void dg_pnls_fwd_f64(double *loss, double *work, const double *x, int64_t xstride,
                     const int64_t *labels, int64_t rows, int64_t n);
void dg_pnls_bwd_f32(float *gx, const float *x, int64_t xstride, const int64_t *labels,
                     const float *g, int64_t rows, int64_t n);
void dg_pnls_bwd_f64(double *gx, const double *x, int64_t xstride, const int64_t *labels,
                     const double *g, int64_t rows, int64_t n);

/* ---------------------------------------------------------------- gates.c
 * Fused recurrent cells on pre-activations (the GEMMs stay with BLAS). H = hidden size.
 * LSTM:  pre (B, 4H) = [i f o g];  i,f,o = logistic (f with forget_bias), g = tanh;
 *        c = f c_prev + i g;  h = o tanh(c);  act (B, 5H) saves [i f o g tanh(c)].
 *        c_prev NULL means a zero previous cell (first step).
 * GRU:   gates: pre_zr (B, 2H) -> zr = logistic, rh = r * h_prev;
 *        output: cand = tanh(pre_c), h = (1 - z) h_prev + z cand.
 * TreeLSTM (N-ary): pre (B, (N+3)H) = [i f_1..f_N o u];  c_kids (N, B, H);
 *        c = logistic(i) tanh(u) + sum_k logistic(f_k) c_k;  h = logistic(o) tanh(c);
 *        act (B, (N+4)H) saves [i f_1..f_N o u tanh(c)] after their nonlinearities.
 *        kid_rows, if not NULL: child k of row b is row kid_rows[k ldk + b] of the table
 *        c_kids (rows H apart; ldk >= B), and the backward ADDS its gradient to that row
 *        of the table dc_kids (a row may repeat: the adds are sequential). The rows were
 *        checked against both tables' row counts in Python.
 * Backward kernels write every output gradient (dc_prev, dh_prev, dc_kids may be NULL
 * when not needed; dc may be NULL when the cell state has no gradient of its own),
 * except dg_gru_gates_bwd's dh_prev, which it adds to (the output kernel wrote it),
 * and the TreeLSTM's dc_kids with kid_rows.
 */
void dg_lstm_fwd_f32(const float *pre, const float *c_prev, float *c, float *h, float *act,
                     int64_t B, int64_t H, double forget_bias);
void dg_lstm_fwd_f64(const double *pre, const double *c_prev, double *c, double *h, double *act,
                     int64_t B, int64_t H, double forget_bias);
void dg_lstm_bwd_f32(const float *act, const float *c_prev, const float *dh, const float *dc,
                     float *dpre, float *dc_prev, int64_t B, int64_t H);
void dg_lstm_bwd_f64(const double *act, const double *c_prev, const double *dh, const double *dc,
                     double *dpre, double *dc_prev, int64_t B, int64_t H);
void dg_lstmc_fwd_f32(const float *pre, const float *c_prev, float *c, int64_t B, int64_t H, double forget_bias);
void dg_lstmc_bwd_f32(const float *pre, const float *c_prev, const float *g, float *dpre, float *dc_prev, int64_t B,
                       int64_t H, double forget_bias);
void dg_lstmh_fwd_f32(const float *pre, const float *c, float *h, int64_t B, int64_t H);
void dg_lstmh_bwd_f32(const float *pre, const float *c, const float *g, float *dpre, float *dc, int64_t B, int64_t H);
void dg_lstmc_fwd_f64(const double *pre, const double *c_prev, double *c, int64_t B, int64_t H, double forget_bias);
void dg_lstmc_bwd_f64(const double *pre, const double *c_prev, const double *g, double *dpre, double *dc_prev, int64_t B,
                       int64_t H, double forget_bias);
void dg_lstmh_fwd_f64(const double *pre, const double *c, double *h, int64_t B, int64_t H);
void dg_lstmh_bwd_f64(const double *pre, const double *c, const double *g, double *dpre, double *dc, int64_t B, int64_t H);
void dg_gru_gates_fwd_f32(const float *pre_zr, const float *h_prev, float *zr, float *rh,
                          int64_t B, int64_t H);
void dg_gru_gates_fwd_f64(const double *pre_zr, const double *h_prev, double *zr, double *rh,
                          int64_t B, int64_t H);
void dg_gru_out_fwd_f32(const float *pre_c, const float *zr, const float *h_prev, float *cand,
                        float *h, int64_t B, int64_t H);
void dg_gru_out_fwd_f64(const double *pre_c, const double *zr, const double *h_prev, double *cand,
                        double *h, int64_t B, int64_t H);
void dg_gru_out_bwd_f32(const float *zr, const float *h_prev, const float *cand, const float *dh,
                        float *dpre_c, float *dz, float *dh_prev, int64_t B, int64_t H);
void dg_gru_out_bwd_f64(const double *zr, const double *h_prev, const double *cand, const double *dh,
                        double *dpre_c, double *dz, double *dh_prev, int64_t B, int64_t H);
void dg_gru_gates_bwd_f32(const float *zr, const float *h_prev, const float *dz, const float *drh,
                          float *dpre_zr, float *dh_prev, int64_t B, int64_t H);
void dg_gru_gates_bwd_f64(const double *zr, const double *h_prev, const double *dz, const double *drh,
                          double *dpre_zr, double *dh_prev, int64_t B, int64_t H);
void dg_treelstm_fwd_f32(const float *pre, const float *bias, const float *c_kids, const int64_t *kid_rows,
                         int64_t ldk, int64_t N, float *c, int64_t ldc, float *h, int64_t ldh, float *act, int64_t B, int64_t H);
void dg_treelstm_fwd_f64(const double *pre, const double *bias, const double *c_kids, const int64_t *kid_rows,
                         int64_t ldk, int64_t N, double *c, int64_t ldc, double *h, int64_t ldh, double *act, int64_t B, int64_t H);
void dg_treelstm_bwd_f32(const float *act, const float *c_kids, const int64_t *kid_rows, int64_t ldk, int64_t N,
                         const float *dh, const float *dc, float *dpre, float *dc_kids, int64_t B, int64_t H);
void dg_treelstm_bwd_f64(const double *act, const double *c_kids, const int64_t *kid_rows, int64_t ldk, int64_t N,
                         const double *dh, const double *dc, double *dpre, double *dc_kids, int64_t B, int64_t H);

/* ---------------------------------------------------------------- optim.c
 * Trainer rules with DyNet's semantics (dynagraph/nn/trainers.py), in place.
 * rows == NULL: dense update of nrows * width elements; otherwise only rows[j] of
 * (w, g, states) are updated (sparse lookup-table update, rows unique).
 * Scalars arrive as double and are rounded to the array type once, as numpy does.
 */
void dg_sgd_f32(float *w, const float *g, const int64_t *rows, int64_t nrows, int64_t width,
                double lr_scaled);
void dg_sgd_f64(double *w, const double *g, const int64_t *rows, int64_t nrows, int64_t width,
                double lr_scaled);
void dg_momentum_f32(float *w, const float *g, float *v, const int64_t *rows, int64_t nrows,
                     int64_t width, double mom, double lr_scaled);
void dg_momentum_f64(double *w, const double *g, double *v, const int64_t *rows, int64_t nrows,
                     int64_t width, double mom, double lr_scaled);
void dg_adagrad_f32(float *w, const float *g, float *h, const int64_t *rows, int64_t nrows,
                    int64_t width, double lr, double eps, double gscale);
void dg_adagrad_f64(double *w, const double *g, double *h, const int64_t *rows, int64_t nrows,
                    int64_t width, double lr, double eps, double gscale);
void dg_adam_f32(float *w, const float *g, float *m, float *v, const int64_t *rows, int64_t nrows,
                 int64_t width, double beta1, double beta2, double eps, double lr_t, double gscale);
void dg_adam_f64(double *w, const double *g, double *m, double *v, const int64_t *rows, int64_t nrows,
                 int64_t width, double beta1, double beta2, double eps, double lr_t, double gscale);

/* One trainer update() of a whole collection in one call: n parameters, parameter k being
 * w[k], g[k] (and optimizer states s0[k], s1[k], NULL where the rule keeps fewer), nrows[k]
 * rows of width[k]. touched[k]: a lookup table's touched-row mask (NULL for parameters);
 * its norm counts touched rows only. mode[k]: DG_MODE_FROZEN (counted in the norm, left
 * alone), DG_MODE_DENSE (every element; the gradient, and a mask, cleared after) or
 * DG_MODE_ROWS (touched rows only, each cleared after). First the global squared norm
 * (in double), then clipping (clip <= 0: off), then the rule of each parameter.
 * hp: SGD {lr}; momentum {lr, mom}; Adagrad {lr, 0, eps}; Adam {0, 0, eps, beta1, beta2, lr_t}.
 * out: {squared norm, gradient scale, 1 if clipped else 0}. Returns 1, having written nothing, if the norm
 * is not finite (the caller names the bad parameters), else 0. */
enum dg_rule { DG_RULE_SGD = 0, DG_RULE_MOMENTUM = 1, DG_RULE_ADAGRAD = 2, DG_RULE_ADAM = 3 };
enum dg_mode { DG_MODE_FROZEN = 0, DG_MODE_DENSE = 1, DG_MODE_ROWS = 2 };
int dg_optim_step_f32(int64_t n, float *const *w, float *const *g, float *const *s0, float *const *s1,
                      const int64_t *nrows, const int64_t *width, uint8_t *const *touched, const int64_t *mode,
                      int rule, const double *hp, double clip, double *out);
int dg_optim_step_f64(int64_t n, double *const *w, double *const *g, double *const *s0, double *const *s1,
                      const int64_t *nrows, const int64_t *width, uint8_t *const *touched, const int64_t *mode,
                      int rule, const double *hp, double clip, double *out);

/* ---------------------------------------------------------------- fused.c
 * A straight-line elementwise program (a chain of elementwise ops of a static
 * subgraph) run over B rows of n elements in one call, forward and backward.
 * Registers: 0..nin-1 are the inputs, nin + m is the value of instruction m.
 * code: per instruction, in order: opcode (enum dg_fused_op), nargs, then nargs
 *       register ids, each below the instruction's own register.
 * consts[m]: instruction m's scalar (elu alpha, addc/mulc/... constant, 1/k for average).
 * ins[k]: input k's row 0; istride[k] its row stride in elements (0: shared by the
 *       batch; rows may be strided slices of a wider array).
 * A register is shared when it is an input of stride 0 or every argument of its
 * instruction is shared: shared instructions run once (row 0) and their rows are
 * copied, and their gradients are summed over the batch before flowing back.
 * Forward writes out (nsteps, B, n): instruction m's values at out + m*B*n.
 * Backward reads outs[m] (row stride ostride[m]) and optional output gradients
 * gout[m] (NULL: none; gstride[m] 0: one row, which applies to every row of an
 * unshared instruction and once to a shared one); live[r] says which registers
 * carry a gradient (inputs: exactly those with gin[k] != NULL). gin[k] receives
 * (B, n), or (n) summed over the batch when input k is shared. work holds
 * (nin + nsteps + 1) * DG_FUSED_TILE + nsteps * n elements.
 */
enum dg_fused_op {
    DG_FZ_NEG = 0, DG_FZ_TANH = 1, DG_FZ_LOGISTIC = 2, DG_FZ_RECTIFY = 3, DG_FZ_ELU = 4,
    DG_FZ_SELU = 5, DG_FZ_EXP = 6, DG_FZ_LOG = 7, DG_FZ_SQUARE = 8, DG_FZ_CUBE = 9,
    DG_FZ_SQRT = 10, DG_FZ_ABS = 11, DG_FZ_SOFTSIGN = 12, DG_FZ_ADDC = 13, DG_FZ_MULC = 14,
    DG_FZ_RSUBC = 15, DG_FZ_RDIVC = 16, DG_FZ_POWC = 17, DG_FZ_NOBACKPROP = 18,
    DG_FZ_FLIP_GRADIENT = 19, DG_FZ_ADD = 20, DG_FZ_SUB = 21, DG_FZ_CMULT = 22, DG_FZ_CDIV = 23,
    DG_FZ_POW = 24, DG_FZ_BMAX = 25, DG_FZ_BMIN = 26, DG_FZ_ESUM = 27, DG_FZ_AVERAGE = 28,
    DG_FZ_EMAX = 29, DG_FZ_LOGSUMEXP = 30, DG_FZ_NOPS = 31
};

/* nin + nsteps <= DG_FUSED_MAX_REGS: the kernels keep per-register tables on the stack */
enum dg_fused_limits { DG_FUSED_TILE = 256, DG_FUSED_MAX_REGS = 512 };

void dg_fused_fwd_f32(const int64_t *code, const double *consts, int64_t nsteps,
                      const float *const *ins, const int64_t *istride, int64_t nin,
                      float *out, int64_t B, int64_t n);
void dg_fused_fwd_f64(const int64_t *code, const double *consts, int64_t nsteps,
                      const double *const *ins, const int64_t *istride, int64_t nin,
                      double *out, int64_t B, int64_t n);
void dg_fused_bwd_f32(const int64_t *code, const double *consts, int64_t nsteps,
                      const float *const *ins, const int64_t *istride, int64_t nin,
                      const float *const *outs, const int64_t *ostride,
                      const float *const *gout, const int64_t *gstride,
                      float *const *gin, const unsigned char *live, float *work, int64_t B, int64_t n);
void dg_fused_bwd_f64(const int64_t *code, const double *consts, int64_t nsteps,
                      const double *const *ins, const int64_t *istride, int64_t nin,
                      const double *const *outs, const int64_t *ostride,
                      const double *const *gout, const int64_t *gstride,
                      double *const *gin, const unsigned char *live, double *work, int64_t B, int64_t n);

/* Runs: consecutive op-level batches of elementwise ops in one call (see fused.inc).
 * code: per step, opcode (enum dg_fused_op, or DG_RUN_COPY: a contiguous slice copy)
 * and nargs (<= DG_RUN_MAX_ARGS); src/gsrc: per step, per argument, per row, a pointer
 * to that row's value / gradient; need: per step and argument (gsrc unused where 0);
 * zero_at[e]: the step whose start zeroes step e's gout first (-1: none). */
enum dg_run_limits { DG_RUN_COPY = 100, DG_RUN_MAX_ARGS = 64 };

void dg_run_fwd_f32(const int64_t *code, const double *consts, int64_t nsteps, const int64_t *rows,
                    const int64_t *width, float *const *out, const float *const *src);
void dg_run_fwd_f64(const int64_t *code, const double *consts, int64_t nsteps, const int64_t *rows,
                    const int64_t *width, double *const *out, const double *const *src);
void dg_run_bwd_f32(const int64_t *code, const double *consts, int64_t nsteps, const int64_t *rows,
                    const int64_t *width, const float *const *out, float *const *gout,
                    const float *const *src, float *const *gsrc, const unsigned char *need,
                    const int64_t *zero_at, float *work);
void dg_run_bwd_f64(const int64_t *code, const double *consts, int64_t nsteps, const int64_t *rows,
                    const int64_t *width, const double *const *out, double *const *gout,
                    const double *const *src, double *const *gsrc, const unsigned char *need,
                    const int64_t *zero_at, double *work);

/* ---------------------------------------------------------------- rowmm.c
 * Per-sample matrix-vector products, matrices read in place through (block, row) tables:
 * A_j = bases[src[j]] + rows[j] * r * c, an (r, c) row-major matrix; x_j = x + j * xstride.
 * matvec:     y[j] = A_j x_j                         (y: (n, r))
 * tgrad:      gx[j] = A_j^T g_j                      (gx: (n, c), overwritten)
 * outer_add:  A_j += g_j x_j^T into gradient rows    (sequential: repeats add up)
 * copy_into:  out[j * ostride ...] = bases[src[j]][rows[j]] (width elements: a slice of an output)
 */
void dg_rows_matvec_f32(float *y, const float *const *bases, const int64_t *src, const int64_t *rows,
                        const float *x, int64_t xstride, int64_t n, int64_t r, int64_t c);
void dg_rows_matvec_f64(double *y, const double *const *bases, const int64_t *src, const int64_t *rows,
                        const double *x, int64_t xstride, int64_t n, int64_t r, int64_t c);
void dg_rows_matvec_tgrad_f32(float *gx, const float *const *bases, const int64_t *src, const int64_t *rows,
                              const float *g, int64_t n, int64_t r, int64_t c);
void dg_rows_matvec_tgrad_f64(double *gx, const double *const *bases, const int64_t *src, const int64_t *rows,
                              const double *g, int64_t n, int64_t r, int64_t c);
void dg_rows_outer_add_f32(float *const *bases, const int64_t *src, const int64_t *rows, const float *g,
                           const float *x, int64_t xstride, int64_t n, int64_t r, int64_t c);
void dg_rows_outer_add_f64(double *const *bases, const int64_t *src, const int64_t *rows, const double *g,
                           const double *x, int64_t xstride, int64_t n, int64_t r, int64_t c);

/* small_matmul: y_j = A_j X_j for per-node matrices (n, r, k) x (n, k, c), strides 0 for a shared one;
 * small_matmul_grads: gA_j = G_j X_j^T, gX_j = A_j^T G_j (either NULL) */
void dg_small_matmul_f32(float *y, const float *A, int64_t astride, const float *X, int64_t xstride,
                         int64_t n, int64_t r, int64_t k, int64_t c);
void dg_small_matmul_f64(double *y, const double *A, int64_t astride, const double *X, int64_t xstride,
                         int64_t n, int64_t r, int64_t k, int64_t c);
void dg_small_matmul_grads_f32(float *gA, float *gX, const float *A, int64_t astride, const float *X,
                               int64_t xstride, const float *G, int64_t n, int64_t r, int64_t k, int64_t c);
void dg_small_matmul_grads_f64(double *gA, double *gX, const double *A, int64_t astride, const double *X,
                               int64_t xstride, const double *G, int64_t n, int64_t r, int64_t k, int64_t c);

void dg_rows_copy_into_f32(float *out, int64_t ostride, const float *const *bases, const int64_t *src,
                           const int64_t *rows, int64_t n, int64_t width);
void dg_rows_copy_into_f64(double *out, int64_t ostride, const double *const *bases, const int64_t *src,
                           const int64_t *rows, int64_t n, int64_t width);

#endif
