/* Softmax, log-softmax and pickneglogsoftmax (the cross-entropy loss), row-wise. */
#define DG_BODY "softmax.inc"
#include "dg_instantiate.h"
