/* Fused recurrent cells: the elementwise part of one LSTM, GRU or N-ary TreeLSTM
 * step in a single pass over the gate pre-activations (the GEMMs stay with BLAS). */
#define DG_BODY "gates.inc"
#include "dg_instantiate.h"
