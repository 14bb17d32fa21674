/* Internal helpers shared by the kernel families: vectorizable float32 exp/tanh,
 * the multi-ISA clone attribute, and small inline utilities. Not part of the API. */
#ifndef DG_INTERNAL_H
#define DG_INTERNAL_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dg_kernels.h"

/* One binary that uses AVX-512 or AVX2 where the CPU has them: numpy's own SIMD
 * loops do, and a baseline-SSE2 build loses to them on transcendental kernels.
 * target_clones needs ifunc, i.e. GCC on glibc/x86-64; elsewhere plain code. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \
    !defined(DG_NO_CLONES)
#define DG_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DG_CLONES
#endif

#define DG_UNUSED(x) ((void)(x))

/* Helpers must be inlined into each clone to run with its instruction set. */
#if defined(__GNUC__)
#define DG_INLINE static inline __attribute__((always_inline))
#else
#define DG_INLINE static inline
#endif

DG_INLINE float dg_f32_from_bits(int32_t i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

DG_INLINE int32_t dg_bits_from_f32(float f) {
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i;
}

/* 2^k as a float for k in [-126, 127], built from the exponent bits. Unsigned
 * arithmetic: a NaN input makes k garbage, which must not be signed overflow. */
DG_INLINE float dg_pow2i(int32_t k) {
    return dg_f32_from_bits((int32_t)((uint32_t)(k + 127) << 23));
}

/* e^r for |r| <= ln2/2: Taylor to degree 7 (truncation error 5e-9, below float's
 * rounding). */
DG_INLINE float dg_exp_reduced(float r) {
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    return p * r + 1.0f;
}

/* Splits x = k ln2 + r (Cody-Waite: ln2's high part has few bits, so k * hi is
 * exact) and returns k; adding 1.5 * 2^23 rounds to an integer without a
 * float-to-int conversion, which would be undefined for NaN. */
DG_INLINE int32_t dg_reduce_ln2(float x, float *r) {
    const float shift = 12582912.0f;
    float t = x * 1.44269504088896341f + shift;
    float k = t - shift;
    *r = (x - k * 0.693359375f) - k * -2.12194440e-4f;
    return dg_bits_from_f32(t) - dg_bits_from_f32(shift);
}

/* exp(x) for float32 within ~1.2 ulp, branch-free so that loops vectorize (libm's
 * expf is a scalar call). 2^k is applied as two factors so that k = -150..128 stays
 * representable: overflow gives inf, underflow 0. Comparisons, not fminf/fmaxf,
 * keep NaN. */
DG_INLINE float dg_expf(float x) {
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    float r;
    int32_t k = dg_reduce_ln2(xc, &r);
    int32_t k1 = k / 2;
    return dg_exp_reduced(r) * dg_pow2i(k1) * dg_pow2i(k - k1);
}

/* tanh(x) for float32 within ~1.5 ulp: an odd polynomial (fitted for relative
 * error) below |x| = 0.625, where 1 - e^{-2|x|} would cancel, and (1 - t)/(1 + t)
 * with t = e^{-2|x|} above it. Past |x| = 10 tanh rounds to +-1, so the exponent
 * is clamped to [-20, 0] and needs a single scale factor. */
DG_INLINE float dg_tanhf(float x) {
    float a = x < 0.0f ? -x : x;
    float x2 = x * x;
    float p = -0.005704984780954132f;
    p = p * x2 + 0.020639085910986607f;
    p = p * x2 - 0.05373971492600555f;
    p = p * x2 + 0.13331442200235816f;
    p = p * x2 - 0.33333281942301496f;
    float small = x + x * x2 * p;
    float e = a > 10.0f ? -20.0f : -2.0f * a;
    float r;
    int32_t k = dg_reduce_ln2(e, &r);
    float t = dg_exp_reduced(r) * dg_pow2i(k);
    float big = (1.0f - t) / (1.0f + t);
    big = x < 0.0f ? -big : big;
    return a < 0.625f ? small : big;
}

/* float64 keeps libm: its results are what numpy's float64 ufuncs give to the last
 * bit or so, which the float64 model-level parity checks (1e-10) rely on. */
DG_INLINE double dg_exp(double x) { return exp(x); }
DG_INLINE double dg_tanh(double x) { return tanh(x); }

#endif
