/* Sorting a batch's node ids ascending, shared by the agenda (schedule.c), the typewise/FSM
simulation (typewise.c) and the batch-merging pass (batch_merge.c); declared in typewise.h.
Part of dynagraph._bookkeeping. */
#include "typewise.h"

#include <stdlib.h>
#include <string.h>

static int cmp_ssize(const void *a, const void *b) {
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return (x > y) - (x < y);
}

/* The passes' last output (src: v or tmp) into v, tmp freed. 0. */
static int settle(Py_ssize_t *v, const Py_ssize_t *src, Py_ssize_t *tmp, Py_ssize_t m) {
    if (src != v)
        memcpy(v, src, (size_t)m * sizeof(Py_ssize_t));
    free(tmp);
    return 0;
}

/* LSD radix sort of m ids, a byte of (id - least) per pass, passes stopping at the span's highest
   byte (three for a 70k-node graph). 0, or -1 having done nothing (negative ids, no memory).
   qsort's comparison calls through a pointer were ~3% of an FSM scheduling call on the NER
   lattices, whose buckets fill out of recording order. */
static int radix_sort_ids(Py_ssize_t *v, Py_ssize_t m) {
    Py_ssize_t least = v[0], most = v[0];
    for (Py_ssize_t i = 1; i < m; i++) {
        if (v[i] < least)
            least = v[i];
        if (v[i] > most)
            most = v[i];
    }
    if (least < 0)
        return -1;
    Py_ssize_t *tmp = malloc((size_t)m * sizeof(Py_ssize_t));
    if (!tmp)
        return -1;
    size_t span = (size_t)(most - least);
    Py_ssize_t *src = v, *dst = tmp;
    for (int shift = 0; shift < 64 && (span >> shift) != 0; shift += 8) {
        Py_ssize_t at[256] = {0};
        for (Py_ssize_t i = 0; i < m; i++)
            at[((size_t)(src[i] - least) >> shift) & 255]++;
        for (Py_ssize_t d = 0, sum = 0; d < 256; d++) {
            Py_ssize_t c = at[d];
            at[d] = sum;
            sum += c;
        }
        for (Py_ssize_t i = 0; i < m; i++)
            dst[at[((size_t)(src[i] - least) >> shift) & 255]++] = src[i];
        Py_ssize_t *t = src;
        src = dst;
        dst = t;
    }
    return settle(v, src, tmp, m);
}

/* Merge sort over the ascending runs already there, the n+1 run bounds in b (b[0] = 0, b[n] = m):
   pairs of neighbouring runs merged into tmp and back until one is left. 0, or -1 having done
   nothing (no memory). */
static int merge_runs(Py_ssize_t *v, Py_ssize_t m, Py_ssize_t *b, Py_ssize_t n) {
    Py_ssize_t *tmp = malloc((size_t)m * sizeof(Py_ssize_t));
    if (!tmp)
        return -1;
    Py_ssize_t *src = v, *dst = tmp;
    while (n > 1) {
        Py_ssize_t k = 0, out = 0;
        for (; k + 1 < n; k += 2) {  /* runs k and k+1 into one */
            Py_ssize_t i = b[k], j = b[k + 1], end = b[k + 2], o = b[k];
            while (i < b[k + 1] && j < end)
                dst[o++] = src[j] < src[i] ? src[j++] : src[i++];  /* ties from the left run: stable */
            while (i < b[k + 1])
                dst[o++] = src[i++];
            while (j < end)
                dst[o++] = src[j++];
            b[out++] = b[k];
        }
        if (k < n) {  /* an odd run out: copied as it is */
            memcpy(dst + b[k], src + b[k], (size_t)(b[k + 1] - b[k]) * sizeof(Py_ssize_t));
            b[out++] = b[k];
        }
        b[out] = m;
        n = out;
        Py_ssize_t *t = src;
        src = dst;
        dst = t;
    }
    return settle(v, src, tmp, m);
}

enum { MERGE_RUNS_MAX = 16 };  /* more runs than this: the radix sort's fixed passes are cheaper */

/* Sort node ids ascending. A bucket mostly fills in recording order already (nodes become
   ready as their arguments' batches run, in order), so one pass checks that first: qsort's
   comparison calls were most of the agenda's time on a 28k-node mini-batch. */
void dg_sort_ids(Py_ssize_t *v, Py_ssize_t m) {
    Py_ssize_t k = 1;
    while (k < m && v[k - 1] <= v[k])
        k++;
    if (k >= m)
        return;
    if (m <= 32) {  /* insertion sort from the first descent */
        for (; k < m; k++) {
            Py_ssize_t x = v[k], j = k;
            while (j > 0 && v[j - 1] > x) {
                v[j] = v[j - 1];
                j--;
            }
            v[j] = x;
        }
        return;
    }
    /* A bucket filled by a few batches' releases is that many ascending runs (a BiLSTM step's
       two directions: two): merging them beat the radix sort's three passes and 256-slot
       histograms: sorting was 2.2% of that mini-batch's forward instructions, 1.0% now. */
    Py_ssize_t bounds[MERGE_RUNS_MAX + 1], n = 1;
    bounds[0] = 0;
    for (Py_ssize_t i = k; i < m && n <= MERGE_RUNS_MAX; i++)
        if (v[i - 1] > v[i])
            bounds[n++] = i;
    if (n <= MERGE_RUNS_MAX) {
        bounds[n] = m;
        if (merge_runs(v, m, bounds, n) == 0)
            return;
    }
    if (radix_sort_ids(v, m) < 0)
        qsort(v, (size_t)m, sizeof(Py_ssize_t), cmp_ssize);
}
