/* Includes the kernel bodies named by DG_BODY twice: once with T = float (names
 * ending in _f32), once with T = double (_f64). A body writes each kernel once
 * against T, S(name) and the math macros below. */
#include "dg_internal.h"

#define S(name) name##_f32
#define T float
#define EXP(x) dg_expf(x)
#define TANH(x) dg_tanhf(x)
#define SIGM(x) dg_sigmf(x)
#define LOG(x) logf(x)
#define SQRT(x) sqrtf(x)
#include DG_BODY
#undef S
#undef T
#undef EXP
#undef TANH
#undef SIGM
#undef LOG
#undef SQRT

#define S(name) name##_f64
#define T double
#define EXP(x) dg_exp(x)
#define TANH(x) dg_tanh(x)
/* float64: numpy's overflow-free form, 0.5 tanh(x/2) + 0.5, as the numpy op computes it */
#define SIGM(x) (0.5 * dg_tanh(0.5 * (x)) + 0.5)
#define LOG(x) log(x)
#define SQRT(x) sqrt(x)
#include DG_BODY
#undef S
#undef T
#undef EXP
#undef TANH
#undef SIGM
#undef LOG
#undef SQRT
