/* Sanitizer harness: runs every kernel on small exactly-sized heap buffers (odd
 * sizes for vector tails, empty batches, repeated rows, NaN/inf inputs, shared
 * operands, NULL optional outputs) so that AddressSanitizer and UBSan see any
 * out-of-bounds access or undefined operation. Built and run by test_build.py.
 * Exits non-zero, naming the check, when a result is wrong. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg_kernels.h"

static int failures = 0;

#define CHECK(cond)                                                   \
    do {                                                              \
        if (!(cond)) {                                                \
            fprintf(stderr, "check failed: %s (line %d)\n", #cond, __LINE__); \
            failures++;                                               \
        }                                                             \
    } while (0)

static int64_t *idx(int64_t n, const int64_t *vals) {
    int64_t *p = malloc((size_t)n * sizeof *p + 1);
    if (n)
        memcpy(p, vals, (size_t)n * sizeof *p);
    return p;
}

#define T float
#define S(name) name##_f32
#define RUN run_f32
#include "harness_body.inc"
#undef T
#undef S
#undef RUN

#define T double
#define S(name) name##_f64
#define RUN run_f64
#include "harness_body.inc"

int main(void) {
    run_f32();
    run_f64();
    if (failures)
        fprintf(stderr, "%d checks failed\n", failures);
    else
        printf("harness ok\n");
    return failures ? 1 : 0;
}
