/* Fused elementwise chains: a straight-line program of elementwise ops (a static
 * subgraph's cell after its GEMM) run in one call, forward and backward, instead of
 * one numpy call and one temporary per op. Python (dynagraph/fusion.py) validates the
 * program, every shape, stride and pointer before calling. */
#include "dg_internal.h"

/* Math the shared instantiation header does not name, picked per type by S(). */
DG_INLINE float dg_fz_expm1_f32(float x) { return expm1f(x); }
DG_INLINE double dg_fz_expm1_f64(double x) { return expm1(x); }
DG_INLINE float dg_fz_pow_f32(float x, float y) { return powf(x, y); }
DG_INLINE double dg_fz_pow_f64(double x, double y) { return pow(x, y); }
DG_INLINE float dg_fz_fabs_f32(float x) { return fabsf(x); }
DG_INLINE double dg_fz_fabs_f64(double x) { return fabs(x); }

/* float64 exp and tanh that vectorize. libm's are scalar calls, ~10x slower per
 * element than a SIMD loop, which left a fused float64 chain slower than numpy's own
 * SIMD ufuncs; these stay within a few ulp of the exact result (as numpy's do). */
DG_INLINE double dg_fz_f64_from_bits(int64_t i) {
    double d;
    memcpy(&d, &i, sizeof d);
    return d;
}

DG_INLINE int64_t dg_fz_bits_from_f64(double d) {
    int64_t i;
    memcpy(&i, &d, sizeof i);
    return i;
}

/* 2^k for k in [-1022, 1023] from the exponent bits; unsigned, as a NaN makes k garbage */
DG_INLINE double dg_fz_pow2i_f64(int64_t k) {
    return dg_fz_f64_from_bits((int64_t)(((uint64_t)k + 1023u) << 52));
}

/* x = k ln2 + r, |r| <= ln2/2 (Cody-Waite: ln2's high part ends in 32 zero bits, so
 * k * hi is exact); adding 1.5 * 2^52 rounds to an integer without a conversion. */
DG_INLINE int64_t dg_fz_reduce_ln2_f64(double x, double *r) {
    const double shift = 6755399441055744.0;
    double t = x * 1.4426950408889634 + shift;
    double k = t - shift;
    *r = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    return dg_fz_bits_from_f64(t) - dg_fz_bits_from_f64(shift);
}

/* e^r - 1 for |r| <= ln2/2: Taylor to degree 14, truncation below 1e-19. */
DG_INLINE double dg_fz_expm1_reduced_f64(double r) {
    double p = 1.0 / 87178291200.0;
    p = p * r + 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    return p * r;
}

/* Clamped so that 2^k splits into two representable factors: past the clamps the
 * result is inf or 0 anyway; comparisons (not fmin/fmax) keep NaN. */
DG_INLINE double dg_fz_vexp_f64(double x) {
    double xc = x < -746.0 ? -746.0 : x, r;
    xc = xc > 710.0 ? 710.0 : xc;
    int64_t k = dg_fz_reduce_ln2_f64(xc, &r);
    int64_t k1 = k / 2;
    return (1.0 + dg_fz_expm1_reduced_f64(r)) * dg_fz_pow2i_f64(k1) * dg_fz_pow2i_f64(k - k1);
}

/* tanh|x| = -e / (2 + e) with e = expm1(-2|x|) = 2^k (expm1(r) + 1) - 1: no
 * cancellation for small |x|; past |x| = 20 tanh rounds to 1. Zeros and NaN pass. */
DG_INLINE double dg_fz_vtanh_f64(double x) {
    double a = x < 0 ? -x : x, r;
    int64_t k = dg_fz_reduce_ln2_f64(a > 20.0 ? -40.0 : -2.0 * a, &r);
    double s = dg_fz_pow2i_f64(k);
    double e = s * dg_fz_expm1_reduced_f64(r) + (s - 1.0);
    double t = -e / (2.0 + e);
    return x < 0 ? -t : x > 0 ? t : x;
}

/* The per-type exp, tanh and logistic of the fused kernels: float32 the shared
 * vectorized ones, float64 the above. */
DG_INLINE float dg_fz_exp_f32(float x) { return dg_expf(x); }
DG_INLINE double dg_fz_exp_f64(double x) { return dg_fz_vexp_f64(x); }
DG_INLINE float dg_fz_tanh_f32(float x) { return dg_tanhf(x); }
DG_INLINE double dg_fz_tanh_f64(double x) { return dg_fz_vtanh_f64(x); }
DG_INLINE float dg_fz_sigm_f32(float x) { return dg_sigmf(x); }
/* float64: numpy's overflow-free form, 0.5 tanh(x/2) + 0.5 */
DG_INLINE double dg_fz_sigm_f64(double x) { return 0.5 * dg_fz_vtanh_f64(0.5 * x) + 0.5; }

/* Where each instruction starts in `code`, and which registers are shared by the
 * whole batch (inputs of stride 0, and instructions whose arguments all are). */
static void dg_fz_scan(const int64_t *code, int64_t nsteps, const int64_t *istride, int64_t nin,
                       int64_t *at, unsigned char *shared) {
    int64_t pos = 0;
    for (int64_t k = 0; k < nin; k++)
        shared[k] = istride[k] == 0;
    for (int64_t m = 0; m < nsteps; m++) {
        int64_t na = code[pos + 1];
        unsigned char s = 1;
        at[m] = pos;
        for (int64_t i = 0; i < na; i++)
            s &= shared[code[pos + 2 + i]];
        shared[nin + m] = s;
        pos += 2 + na;
    }
}

/* A run step's arguments are registers 0..na-1 of the n-ary helpers: the identity map. */
static const int64_t dg_run_ids[DG_RUN_MAX_ARGS] = {
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29,
    30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56,
    57, 58, 59, 60, 61, 62, 63};

#define DG_BODY "fused.inc"
#include "dg_instantiate.h"
