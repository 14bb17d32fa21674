/* Per-sample matrix-vector products whose matrices are read in place: row j's matrix
 * A_j is row rows[j] of block bases[src[j]] (the (block, row) tables of rows.c), so a
 * batch of products such as MV-RNN's A[r] * a[l], whose matrices come from a lookup
 * table and from earlier outputs, needs no gathered copy of the matrices, and the
 * backward adds g_j x_j^T straight into the matrices' gradient rows. */
#define DG_BODY "rowmm.inc"
#include "dg_instantiate.h"
