/* Elementwise kernels: unary activations forward/backward, and binary arithmetic
 * where either operand may be shared by the whole batch (a bias, a parameter). */
#define DG_BODY "elementwise.inc"
#include "dg_instantiate.h"
