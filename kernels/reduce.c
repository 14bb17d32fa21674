/* Reductions: n-ary elementwise sums (esum, average), per-row sums (sum_elems,
 * mean_elems) and batch sums (the gradient of an operand shared by a batch). */
#define DG_BODY "reduce.inc"
#include "dg_instantiate.h"
