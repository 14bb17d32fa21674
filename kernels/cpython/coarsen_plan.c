/* dynagraph._coarsen.plan: the cut of kernels/cpython/coarsen.c grouped into patterns, and
 * the unit schedule over them (dynagraph/coarsen/detect.py's find_patterns and
 * run.Coarsened.schedule_py are its Python twins, tested equal).
 *
 * plan(args, sig, ops, data, pending, max_nodes, max_args, n_signatures, min_calls, defer_height)
 *   -> (patterns, batches)
 * patterns: [(key, members, externals, instances)] for each key held by min_calls or more
 * instances, in order of first instance, with that first instance's members and outside
 * arguments (detect.heads); batches: the unit schedule by unit level then first unit
 * (detect.payloads): (-1, [node ids]) for an op-level batch, (pattern index, (members,
 * externals, slots)) for a group, with per member position and per outside argument a tuple
 * of node ids (one per instance) and per instance a tuple of its per-node data. */
#include "coarsen.h"

static size_t hash_words(const Py_ssize_t *k, Py_ssize_t n) {
    size_t h = 1469598103934665603ull ^ (size_t)n;
    for (Py_ssize_t i = 0; i < n; i++) { h ^= (size_t)k[i]; h *= 1099511628211ull; h ^= h >> 29; }
    return h;
}

/* ------------------------------------------------------------------ patterns */
/* Every instance's key and outside arguments (flat, in ascending root order), and the
 * patterns: instances with equal keys. */
typedef struct {
    Py_ssize_t ninst, npat, nkept;
    Py_ssize_t *keybuf, *extbuf, *koff, *eoff, *iroot, *ipat, *pfirst, *pcount, *pkept, *kfirst;
} Found;

static void found_free(Found *f) {
    free(f->keybuf); free(f->extbuf); free(f->koff); free(f->eoff); free(f->iroot); free(f->ipat);
    free(f->pfirst); free(f->pcount); free(f->pkept); free(f->kfirst);
}

/* the pattern of instance i (its key just written at koff[i]): an equal key seen before, or a new one */
static void pattern_of(Found *f, Py_ssize_t *ptab, Py_ssize_t pcap, Py_ssize_t i, Py_ssize_t nkey) {
    const Py_ssize_t *key = f->keybuf + f->koff[i];
    size_t h = hash_words(key, nkey) & (size_t)(pcap - 1);
    for (;; h = (h + 1) & (size_t)(pcap - 1)) {
        Py_ssize_t p = ptab[h];
        if (p < 0) {
            ptab[h] = p = f->npat++;
            f->pfirst[p] = i;
        }
        Py_ssize_t first = f->pfirst[p];
        if (first == i || (f->koff[first + 1] - f->koff[first] == nkey &&
                           memcmp(f->keybuf + f->koff[first], key, sizeof(Py_ssize_t) * nkey) == 0)) {
            f->ipat[i] = p;
            f->pcount[p]++;
            return;
        }
    }
}

static int find_patterns(const Cut *c, PyObject *args, Py_ssize_t min_calls, Found *f) {
    memset(f, 0, sizeof(*f));
    Py_ssize_t total_key = 0, total_ext = 0, n = 0;
    for (Py_ssize_t rk = 0; rk < c->span; rk++) {
        if (c->start[rk + 1] - c->start[rk] < 2) continue;
        n++;
        for (Py_ssize_t t = c->start[rk]; t < c->start[rk + 1]; t++) {
            Py_ssize_t na = PyTuple_GET_SIZE(PyList_GET_ITEM(args, c->mem[t]));
            total_key += 2 + na;
            total_ext += na;
        }
    }
    Py_ssize_t sz = sizeof(Py_ssize_t), pcap = 16;
    while (pcap < 2 * n + 16) pcap <<= 1;
    Py_ssize_t *pos = malloc(sz * c->span), *ptab = malloc(sz * pcap);
    f->keybuf = malloc(sz * (total_key + 1)); f->extbuf = malloc(sz * (total_ext + 1));
    f->koff = malloc(sz * (n + 1)); f->eoff = malloc(sz * (n + 1)); f->iroot = malloc(sz * (n + 1));
    f->ipat = malloc(sz * (n + 1)); f->pfirst = malloc(sz * (n + 1)); f->pcount = calloc(n + 1, sz);
    f->pkept = malloc(sz * (n + 1)); f->kfirst = malloc(sz * (n + 1));
    if (!pos || !ptab || !f->keybuf || !f->extbuf || !f->koff || !f->eoff || !f->iroot || !f->ipat || !f->pfirst ||
        !f->pcount || !f->pkept || !f->kfirst) {
        free(pos); free(ptab);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < c->span; k++) pos[k] = -1;
    for (Py_ssize_t k = 0; k < pcap; k++) ptab[k] = -1;
    Py_ssize_t i = 0, kk = 0, ee = 0;
    f->koff[0] = f->eoff[0] = 0;
    for (Py_ssize_t rk = 0; rk < c->span; rk++) {
        if (c->start[rk + 1] - c->start[rk] < 2) continue;
        Py_ssize_t next = 0, nkey = dgc_instance_key(c, args, rk, pos, f->keybuf + kk, f->extbuf + ee, &next);
        f->iroot[i] = rk;
        kk += nkey;
        ee += next;
        f->koff[i + 1] = kk;
        f->eoff[i + 1] = ee;
        pattern_of(f, ptab, pcap, i, nkey);
        i++;
    }
    f->ninst = n;
    for (Py_ssize_t p = 0; p < f->npat; p++) {
        f->pkept[p] = f->pcount[p] >= min_calls ? f->nkept : -1;
        if (f->pkept[p] >= 0) f->kfirst[f->nkept++] = p;
    }
    free(pos); free(ptab);
    return PyErr_Occurred() ? -1 : 0;
}

/* the patterns kept, as (key, members, externals, instances) of their first instance */
static PyObject *patterns_out(const Cut *c, const Found *f) {
    PyObject *pats = PyList_New(f->nkept);
    if (!pats) return NULL;
    for (Py_ssize_t k = 0; k < f->nkept; k++) {
        Py_ssize_t p = f->kfirst[k], first = f->pfirst[p], rk = f->iroot[first];
        PyObject *item = Py_BuildValue("(NNNn)", dgc_ssize_tuple(f->keybuf + f->koff[first], f->koff[first + 1] - f->koff[first]),
                                       dgc_ssize_tuple(c->mem + c->start[rk], c->start[rk + 1] - c->start[rk]),
                                       dgc_ssize_tuple(f->extbuf + f->eoff[first], f->eoff[first + 1] - f->eoff[first]),
                                       f->pcount[p]);
        if (!item) { Py_DECREF(pats); return NULL; }
        PyList_SET_ITEM(pats, k, item);
    }
    return pats;
}

/* ------------------------------------------------------------------ schedule */
typedef struct { Py_ssize_t lv, tag, first, count, at; int kind; } Group;

/* The units (a kept instance, or a node left op-level) in order of instance root, with
 * their levels, what they read, and their groups. kind 0: an instance of kept pattern
 * tag; 1: a batchable node of signature tag; 2: an unbatchable node (a batch of its own). */
typedef struct {
    Py_ssize_t nu, ne, ng;
    Py_ssize_t *lv, *kind, *tag, *first, *pay, *group, *height, *efrom, *eto, *gunits, *order;
    char *deferred;
    Group *groups;
} Units;

static void units_free(Units *u) {
    free(u->lv); free(u->kind); free(u->tag); free(u->first); free(u->pay); free(u->group); free(u->height);
    free(u->efrom); free(u->eto); free(u->gunits); free(u->order); free(u->deferred); free(u->groups);
}

/* 1 if op.batchable, cached per signature in bcache (-1 unknown), -1 on error */
static int batchable_of(PyObject *ops, Py_ssize_t n, Py_ssize_t sg, signed char *bcache, Py_ssize_t ncache) {
    if (sg >= 0 && sg < ncache && bcache[sg] >= 0) return bcache[sg];
    int b = dgc_op_flag(PyList_GET_ITEM(ops, n), "batchable");
    if (b >= 0 && sg >= 0 && sg < ncache) bcache[sg] = (signed char)b;
    return b;
}

/* One unit: its as-soon-as-possible level (one after the deepest unit it reads, through
 * uindex: the unit at a span index) and its read edges. */
static int add_unit(const Cut *c, const Found *f, const Py_ssize_t *kept_inst, Py_ssize_t *uindex, Units *u,
                    Py_ssize_t ecap, PyObject *args, Py_ssize_t i, Py_ssize_t n) {
    Py_ssize_t lo = c->lo, lv = 0, nu = u->nu;
    PyObject *an = i >= 0 ? NULL : PyList_GET_ITEM(args, n);
    Py_ssize_t ndeps = i >= 0 ? f->eoff[i + 1] - f->eoff[i] : PyTuple_GET_SIZE(an);
    for (Py_ssize_t j = 0; j < ndeps; j++) {
        Py_ssize_t x = i >= 0 ? f->extbuf[f->eoff[i] + j] : PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j));
        Py_ssize_t q = x - lo;
        if (q < 0 || q >= c->span) continue;
        Py_ssize_t ow = c->owner[q];
        Py_ssize_t v = uindex[(ow >= 0 && kept_inst[ow - lo] >= 0) ? ow - lo : q];
        if (v < 0) continue;
        if (u->ne < ecap) { u->efrom[u->ne] = v; u->eto[u->ne++] = nu; }
        if (u->lv[v] >= lv) lv = u->lv[v] + 1;
    }
    uindex[i >= 0 ? f->iroot[i] : n - lo] = nu;
    u->lv[nu] = lv;
    u->nu = nu + 1;
    return PyErr_Occurred() ? -1 : 0;
}

/* pass 1: the units in order of instance root, their levels and read edges */
static int unit_levels(const Cut *c, const Found *f, PyObject *args, PyObject *ops, Units *u) {
    Py_ssize_t span = c->span, lo = c->lo, sz = sizeof(Py_ssize_t), maxu = c->np_ + 1, ecap = 0;
    for (Py_ssize_t i = 0; i < f->ninst; i++)
        if (f->pkept[f->ipat[i]] >= 0) ecap += f->eoff[i + 1] - f->eoff[i];
    for (Py_ssize_t k = 0; k < span; k++)
        if (c->ispend[k]) ecap += PyTuple_GET_SIZE(PyList_GET_ITEM(args, k + lo));
    Py_ssize_t *kept_inst = malloc(sz * span), *uindex = malloc(sz * span);
    signed char *bcache = malloc(c->ncache > 0 ? c->ncache : 1);
    u->lv = malloc(sz * maxu); u->kind = malloc(sz * maxu); u->tag = malloc(sz * maxu);
    u->first = malloc(sz * maxu); u->pay = malloc(sz * maxu);
    u->efrom = malloc(sz * (ecap + 1)); u->eto = malloc(sz * (ecap + 1));
    int rc = -1;
    if (!kept_inst || !uindex || !bcache || !u->lv || !u->kind || !u->tag || !u->first || !u->pay || !u->efrom ||
        !u->eto) { PyErr_NoMemory(); goto done; }
    memset(bcache, -1, c->ncache > 0 ? c->ncache : 1);
    for (Py_ssize_t k = 0; k < span; k++) { kept_inst[k] = -1; uindex[k] = -1; }
    for (Py_ssize_t i = 0; i < f->ninst; i++)
        if (f->pkept[f->ipat[i]] >= 0) kept_inst[f->iroot[i]] = i;
    for (Py_ssize_t rk = 0; rk < span; rk++) {
        if (!c->ispend[rk] || c->owner[rk] != rk + lo) continue;
        Py_ssize_t i = kept_inst[rk], b = c->start[rk], e = c->start[rk + 1], single = rk + lo, nunits = 1;
        const Py_ssize_t *nodes = &single;
        if (i < 0 && e - b >= 2) { nodes = c->mem + b; nunits = e - b; }   /* an instance not kept: its nodes */
        for (Py_ssize_t t = 0; t < nunits; t++) {
            Py_ssize_t n = nodes[t], k = u->nu;
            if (add_unit(c, f, kept_inst, uindex, u, ecap, args, i, n) < 0) goto done;
            if (i >= 0) {
                u->kind[k] = 0; u->tag[k] = f->pkept[f->ipat[i]]; u->first[k] = rk + lo; u->pay[k] = i;
            } else {
                int bt = batchable_of(ops, n, c->sigv[n - lo], bcache, c->ncache);
                if (bt < 0) goto done;
                u->kind[k] = bt ? 1 : 2; u->tag[k] = bt ? c->sigv[n - lo] : n; u->first[k] = n; u->pay[k] = n;
            }
        }
    }
    rc = 0;
done:
    free(kept_inst); free(uindex); free(bcache);
    return rc;
}

/* pass 2 (run._defer): heights over the readers, in reverse; the deferred units run at
 * top - height */
static int defer_levels(Units *u, Py_ssize_t defer_height) {
    Py_ssize_t nu = u->nu, sz = sizeof(Py_ssize_t);
    Py_ssize_t *rstart = calloc(nu + 1, sz), *rlist = malloc(sz * (u->ne + 1)), *rfill = malloc(sz * (nu + 1));
    u->height = malloc(sz * (nu + 1));
    u->deferred = malloc(nu + 1);
    if (!rstart || !rlist || !rfill || !u->height || !u->deferred) {
        free(rstart); free(rlist); free(rfill);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < u->ne; k++) rstart[u->efrom[k] + 1]++;
    for (Py_ssize_t k = 0; k < nu; k++) rstart[k + 1] += rstart[k];
    memcpy(rfill, rstart, sz * (nu + 1));
    for (Py_ssize_t k = 0; k < u->ne; k++) rlist[rfill[u->efrom[k]]++] = u->eto[k];
    Py_ssize_t top = 0;
    int any = 0;
    for (Py_ssize_t k = nu - 1; k >= 0; k--) {
        Py_ssize_t h = 0;
        int all = 1;
        for (Py_ssize_t t = rstart[k]; t < rstart[k + 1]; t++) {
            if (u->height[rlist[t]] + 1 > h) h = u->height[rlist[t]] + 1;
            if (!u->deferred[rlist[t]]) all = 0;
        }
        u->height[k] = h;
        u->deferred[k] = (char)(h <= defer_height && all);
        if (u->deferred[k] && (!any || u->lv[k] + h > top)) { top = u->lv[k] + h; any = 1; }
    }
    for (Py_ssize_t k = 0; k < nu; k++) if (u->deferred[k]) u->lv[k] = top - u->height[k];
    free(rstart); free(rlist); free(rfill);
    return 0;
}

static const Group *sort_groups;
static int group_order(const void *x, const void *y) {
    const Group *a = &sort_groups[*(const Py_ssize_t *)x], *b = &sort_groups[*(const Py_ssize_t *)y];
    if (a->lv != b->lv) return a->lv < b->lv ? -1 : 1;
    return a->first < b->first ? -1 : (a->first > b->first);
}

/* pass 3: one group per (level, kind, tag), its units in unit order (CSR), the groups
 * sorted by level then first unit */
static int assign_groups(Units *u) {
    Py_ssize_t nu = u->nu, sz = sizeof(Py_ssize_t), gcap = 16;
    while (gcap < 2 * nu + 16) gcap <<= 1;
    Py_ssize_t *gtab = malloc(sz * gcap);
    u->groups = malloc(sizeof(Group) * (nu + 1));
    u->group = malloc(sz * (nu + 1));
    u->gunits = malloc(sz * (nu + 1));
    u->order = malloc(sz * (nu + 1));
    if (!gtab || !u->groups || !u->group || !u->gunits || !u->order) { free(gtab); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t k = 0; k < gcap; k++) gtab[k] = -1;
    for (Py_ssize_t k = 0; k < nu; k++) {
        Py_ssize_t g = -1;
        size_t h = 0;
        if (u->kind[k] != 2) {
            Py_ssize_t key3[3] = {u->lv[k], u->kind[k], u->tag[k]};
            for (h = hash_words(key3, 3) & (size_t)(gcap - 1); (g = gtab[h]) >= 0; h = (h + 1) & (size_t)(gcap - 1)) {
                const Group *gr = &u->groups[g];
                if (gr->lv == u->lv[k] && gr->kind == u->kind[k] && gr->tag == u->tag[k]) break;
            }
        }
        if (g < 0) {   /* opened by this unit */
            g = u->ng++;
            if (u->kind[k] != 2) gtab[h] = g;
            Group *gr = &u->groups[g];
            gr->lv = u->lv[k]; gr->kind = (int)u->kind[k]; gr->tag = u->tag[k]; gr->first = u->first[k]; gr->count = 0;
        }
        u->groups[g].count++;
        u->group[k] = g;
    }
    free(gtab);
    Py_ssize_t at = 0;
    for (Py_ssize_t g = 0; g < u->ng; g++) { u->groups[g].at = at; at += u->groups[g].count; u->groups[g].count = 0; }
    for (Py_ssize_t k = 0; k < nu; k++) {
        Group *gr = &u->groups[u->group[k]];
        u->gunits[gr->at + gr->count++] = u->pay[k];
    }
    for (Py_ssize_t g = 0; g < u->ng; g++) u->order[g] = g;
    sort_groups = u->groups;   /* the GIL is held: no other thread runs this sort */
    qsort(u->order, u->ng, sizeof(Py_ssize_t), group_order);
    return 0;
}

/* a tuple of B tuples: for each of the group's instances us[w], column j of its rows */
static PyObject *columns(const Py_ssize_t *us, Py_ssize_t B, Py_ssize_t ncols, const Py_ssize_t *base,
                         const Py_ssize_t *off_of, const Py_ssize_t *map) {
    PyObject *out = PyTuple_New(ncols);
    if (!out) return NULL;
    for (Py_ssize_t j = 0; j < ncols; j++) {
        PyObject *col = PyTuple_New(B);
        if (!col) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, j, col);
        for (Py_ssize_t w = 0; w < B; w++) {
            Py_ssize_t inst = us[w];
            PyObject *x = PyLong_FromSsize_t(base[off_of[map ? map[inst] : inst] + j]);
            if (!x) { Py_DECREF(out); return NULL; }
            PyTuple_SET_ITEM(col, w, x);
        }
    }
    return out;
}

/* one scheduled batch: (-1, [node ids]) or (pattern, (members, externals, slots)) */
static PyObject *batch_out(const Cut *c, const Found *f, const Group *g, const Py_ssize_t *us, PyObject *data) {
    Py_ssize_t B = g->count;
    if (g->kind != 0) return Py_BuildValue("(nN)", (Py_ssize_t)-1, dgc_ssize_list(us, B));
    Py_ssize_t first = f->pfirst[f->kfirst[g->tag]], rk = f->iroot[first];
    Py_ssize_t M = c->start[rk + 1] - c->start[rk], E = f->eoff[first + 1] - f->eoff[first];
    PyObject *bm = columns(us, B, M, c->mem, c->start, f->iroot);
    PyObject *be = columns(us, B, E, f->extbuf, f->eoff, NULL);
    PyObject *sl = PyTuple_New(B);
    if (!bm || !be || !sl) { Py_XDECREF(bm); Py_XDECREF(be); Py_XDECREF(sl); return NULL; }
    for (Py_ssize_t w = 0; w < B; w++) {
        PyObject *x = dgc_instance_slots(c, data, f->iroot[us[w]]);
        if (!x) { Py_DECREF(bm); Py_DECREF(be); Py_DECREF(sl); return NULL; }
        PyTuple_SET_ITEM(sl, w, x);
    }
    return Py_BuildValue("(n(NNN))", g->tag, bm, be, sl);
}

PyObject *dgc_plan(PyObject *self, PyObject *a) {
    (void)self;
    PyObject *args, *sig, *ops, *data, *pending;
    Py_ssize_t max_nodes, max_args, ncache, min_calls, defer_height;
    if (!PyArg_ParseTuple(a, "O!O!O!O!O!nnnnn", &PyList_Type, &args, &PyList_Type, &sig, &PyList_Type, &ops,
                          &PyList_Type, &data, &PyList_Type, &pending, &max_nodes, &max_args, &ncache, &min_calls,
                          &defer_height))
        return NULL;
    if (PyList_GET_SIZE(pending) == 0) return Py_BuildValue("([][])");
    Cut c;
    Found f;
    Units u;
    memset(&f, 0, sizeof(f));
    memset(&u, 0, sizeof(u));
    PyObject *pats = NULL, *batches = NULL, *result = NULL;
    if (dgc_cut_nodes(&c, args, sig, ops, data, pending, max_nodes, max_args, ncache) < 0 ||
        find_patterns(&c, args, min_calls, &f) < 0 || !(pats = patterns_out(&c, &f)) ||
        unit_levels(&c, &f, args, ops, &u) < 0 || defer_levels(&u, defer_height) < 0 || assign_groups(&u) < 0 ||
        !(batches = PyList_New(u.ng)))
        goto done;
    for (Py_ssize_t k = 0; k < u.ng; k++) {
        const Group *g = &u.groups[u.order[k]];
        PyObject *t = batch_out(&c, &f, g, u.gunits + g->at, data);
        if (!t) goto done;
        PyList_SET_ITEM(batches, k, t);
    }
    result = PyTuple_Pack(2, pats, batches);
done:
    Py_XDECREF(pats);
    Py_XDECREF(batches);
    units_free(&u);
    found_free(&f);
    dgc_cut_free(&c);
    return result;
}
