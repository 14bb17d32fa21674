/* Trainer update rules (SGD, momentum, Adagrad, Adam), dense or on a set of rows. */
#include <stdlib.h>

#define DG_BODY "optim.inc"
#include "dg_instantiate.h"
