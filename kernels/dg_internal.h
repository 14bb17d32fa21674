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
 * target_clones needs ifunc, i.e. GCC on glibc/x86-64; elsewhere plain code. The
 * AVX2 clone is the x86-64-v3 level (AVX2 with FMA, GCC >= 12) because exp, tanh and
 * the logistic below are chains of multiply-adds: fused (and with the logistic's own
 * form), the LSTM and TreeLSTM cells take 27-43% less time (bench/kernels.py --only cells). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \
    !defined(DG_NO_CLONES)
#if __GNUC__ >= 12
#define DG_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#define DG_HAVE_FMA 1
#else
#define DG_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#else
#define DG_CLONES
#endif

/* a * b + c in one rounding where every clone that matters has the instruction (the
 * baseline clone of a clone build calls libm's fmaf: slower, same result). Only the
 * float32 exp/tanh/logistic use it: elsewhere -ffp-contract=off keeps products and
 * sums rounded as numpy rounds them. Without FMA the same formulas round twice; the
 * accuracy bounds below hold either way: every float32 of magnitude below 30 was
 * checked against double libm (tests/backends/csrc/ulp.c with STRIDE=1). */
#if defined(DG_HAVE_FMA) || defined(__FMA__) || defined(__aarch64__)
#define DG_FMAF(a, b, c) __builtin_fmaf(a, b, c)
#else
#define DG_FMAF(a, b, c) ((a) * (b) + (c))
#endif

#define DG_UNUSED(x) ((void)(x))

/* Multiply-adds fused where the clone has the instruction: for kernels whose results need not
 * match numpy's rounding because they are their op's reference on this backend (rowmm.inc's
 * products). The elementwise kernels keep -ffp-contract=off. */
#if defined(__GNUC__) && !defined(__clang__)
#define DG_CONTRACT __attribute__((optimize("fp-contract=fast")))
#else
#define DG_CONTRACT
#endif

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
    p = DG_FMAF(p, r, 1.0f / 720.0f);
    p = DG_FMAF(p, r, 1.0f / 120.0f);
    p = DG_FMAF(p, r, 1.0f / 24.0f);
    p = DG_FMAF(p, r, 1.0f / 6.0f);
    p = DG_FMAF(p, r, 0.5f);
    p = DG_FMAF(p, r, 1.0f);
    return DG_FMAF(p, r, 1.0f);
}

/* Splits x = k ln2 + r (Cody-Waite: ln2's high part has few bits, so k * hi is
 * exact with or without FMA) and returns k; adding 1.5 * 2^23 rounds to an integer
 * without a float-to-int conversion, which would be undefined for NaN. */
DG_INLINE int32_t dg_reduce_ln2(float x, float *r) {
    const float shift = 12582912.0f;
    float t = DG_FMAF(x, 1.44269504088896341f, shift);
    float k = t - shift;
    *r = DG_FMAF(k, 2.12194440e-4f, DG_FMAF(k, -0.693359375f, x));
    return dg_bits_from_f32(t) - dg_bits_from_f32(shift);
}

/* exp(x) for float32 within 0.94 ulp (1.22 without FMA), branch-free so that loops vectorize (libm's
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

/* tanh(x) for float32 within 1.50 ulp (1.57 without FMA): an odd polynomial (fitted for relative
 * error) below |x| = 0.625, where 1 - e^{-2|x|} would cancel, and (1 - t)/(1 + t)
 * with t = e^{-2|x|} above it. Past |x| = 10 tanh rounds to +-1, so the exponent
 * is clamped to [-20, 0] and needs a single scale factor. */
DG_INLINE float dg_tanhf(float x) {
    float a = x < 0.0f ? -x : x;
    float x2 = x * x;
    float p = -0.005704984780954132f;
    p = DG_FMAF(p, x2, 0.020639085910986607f);
    p = DG_FMAF(p, x2, -0.05373971492600555f);
    p = DG_FMAF(p, x2, 0.13331442200235816f);
    p = DG_FMAF(p, x2, -0.33333281942301496f);
    float small = DG_FMAF(x * x2, p, x);
    float e = a > 10.0f ? -20.0f : -2.0f * a;
    float r;
    int32_t k = dg_reduce_ln2(e, &r);
    float t = dg_exp_reduced(r) * dg_pow2i(k);
    float big = (1.0f - t) / (1.0f + t);
    big = x < 0.0f ? -big : big;
    return a < 0.625f ? small : big;
}

/* The logistic 1/(1 + e^-x) for float32 within 1.98 ulp (2.22 without FMA) in
 * relative error, also for x < 0, where numpy's overflow-free form 0.5 tanh(x/2) +
 * 0.5 cancels; and faster than that form, having no small-argument polynomial
 * (bench/kernels.py --only runs: "run step logistic"). With e = e^-|x| in (0, 1]:
 * 1/(1 + e) for x >= 0, e/(1 + e) for x < 0. d = 1 + e rounds; its lost part dl is
 * exact (Fast2Sum, 1 >= e) and taken out as q (1 - dl/d), 1/d from a linear guess
 * (6% is plenty: dl/d < 2^-24). Below x = -87, e^x < 2^-125: 0. */
DG_INLINE float dg_sigmf(float x) {
    float a = x < 0.0f ? -x : x;
    float ac = a > 87.0f ? 87.0f : a;
    float r;
    int32_t k = dg_reduce_ln2(-ac, &r);
    float e = dg_exp_reduced(r) * dg_pow2i(k);
    float d = 1.0f + e;
    float dl = (1.0f - d) + e;
    float q = (x < 0.0f ? e : 1.0f) / d;
    q = DG_FMAF(-q, dl * DG_FMAF(-0.47055319974601645f, d, 1.4116611167629574f), q);
    return x < -87.0f ? 0.0f : q;
}

/* float64 keeps libm: its results are what numpy's float64 ufuncs give to the last
 * bit or so, which the float64 model-level parity checks (1e-10) rely on. */
DG_INLINE double dg_exp(double x) { return exp(x); }
DG_INLINE double dg_tanh(double x) { return tanh(x); }

#endif
