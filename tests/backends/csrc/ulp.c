/* Worst error, in float32 ulps, of the vectorized float32 exp, tanh and logistic of
 * kernels/dg_internal.h against double-precision libm, over every STRIDE-th float32
 * bit pattern of magnitude below 30, both signs (STRIDE = 7 is 4.5 * 10^8 arguments
 * and 30 s; the test uses a sparser odd stride). Built with and without FMA by
 * test_transcendental.py, which checks the bounds the header promises. Prints one
 * line per function: name, worst ulps, the argument. */
#include <math.h>
#include <stdio.h>

#include "dg_internal.h"

#ifndef STRIDE
#define STRIDE 7
#endif

typedef float (*f32fn)(float);
typedef double (*f64fn)(double);

static float v_exp(float x) { return dg_expf(x); }
static float v_tanh(float x) { return dg_tanhf(x); }
static float v_sigm(float x) { return dg_sigmf(x); }
static double r_sigm(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

/* |got - want| in ulps of want rounded to float; results below the smallest normal
 * float count in ulps of it (their spacing is fixed there). */
static double ulps(float got, double want) {
    float w = (float)fabs(want);
    if (w < 1.17549435e-38f)
        w = 1.17549435e-38f;
    double ulp = (double)nextafterf(w, INFINITY) - (double)w;
    return fabs((double)got - want) / ulp;
}

static void sweep(const char *name, f32fn f, f64fn ref, float lo_result) {
    double worst = 0;
    float at = 0;
    for (uint32_t b = 0; b < 0x41F00000u; b += STRIDE)
        for (int s = 0; s < 2; s++) {
            uint32_t bits = b | (s ? 0x80000000u : 0u);
            float x;
            memcpy(&x, &bits, sizeof x);
            double want = ref((double)x);
            if (fabs(want) < lo_result)
                continue;
            double e = ulps(f(x), want);
            if (e > worst)
                worst = e, at = x;
        }
    printf("%s %.4f %.9g\n", name, worst, at);
}

int main(void) {
    sweep("exp", v_exp, exp, 1.17549435e-38f);
    sweep("tanh", v_tanh, tanh, 0.0f);
    sweep("logistic", v_sigm, r_sigm, 1.17549435e-38f);
    return 0;
}
