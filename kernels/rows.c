/* Row movers: the multi-source gather that assembles a batch argument from rows of
 * many earlier output blocks in one call, its scatter-add backward, and the
 * single-table forms used for embedding lookups and their sparse gradients. */
#define DG_BODY "rows.inc"
#include "dg_instantiate.h"
