/* Chain heights for the FSM's chain encoding (part of dynagraph._bookkeeping; see typewise.c).
Twins: typewise.chain_heights and typewise.path_lengths (dynagraph/schedulers/typewise.py). */
#include "typewise.h"

/* typewise.chain_heights and path_lengths: each typed node's height over its G_a children (later
   nodes), each node's longest path to a sink (crit), then per type the pending count per height
   and the greatest height. */
int tw_chain_heights(TW *s) {
    Py_ssize_t n = s->n, T = s->T;
    s->height = tw_alloc(s, n);
    s->top = tw_zalloc(s, ((size_t)T + 1) * sizeof(Py_ssize_t));
    s->hoff = tw_alloc(s, T + 1);
    s->crit = tw_alloc(s, n);
    if (!s->height || !s->top || !s->hoff || !s->crit) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t v = n - 1; v >= 0; v--) {
        Py_ssize_t t = s->typ[v], h = 1, c = 1;
        for (Py_ssize_t e = s->ustart[v]; e < s->ustart[v + 1]; e++)
            if (s->crit[s->users[e]] >= c)
                c = s->crit[s->users[e]] + 1;
        s->crit[v] = c;
        if (t < 0) {
            s->height[v] = 0;
            continue;
        }
        for (Py_ssize_t e = s->gstart[v]; e < s->gstart[v + 1]; e++)
            if (s->height[s->gch[e]] >= h)
                h = s->height[s->gch[e]] + 1;
        s->height[v] = h;
        if (h > s->top[t])
            s->top[t] = h;
    }
    s->hoff[0] = 0;
    for (Py_ssize_t t = 0; t < T; t++)
        s->hoff[t + 1] = s->hoff[t] + s->top[t] + 1;
    s->hcount = tw_zalloc(s, ((size_t)s->hoff[T] + 1) * sizeof(Py_ssize_t));
    s->hready = tw_zalloc(s, ((size_t)s->hoff[T] + 1) * sizeof(Py_ssize_t));
    if (!s->hcount || !s->hready) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t v = 0; v < n; v++)
        if (s->typ[v] >= 0)
            s->hcount[s->hoff[s->typ[v]] + s->height[v]]++;
    return 0;
}
