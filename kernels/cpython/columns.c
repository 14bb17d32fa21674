/* A graph's node columns as storage (part of dynagraph._bookkeeping): the append that grows a
large column by half, and the pools of emptied column lists that new graphs reuse. recorder.c's
GraphBase owns the columns; this file only knows lists. */
#include "recorder.h"

/* PyList_Append for the node columns. A column grows by one entry per node to tens of
   thousands (a mini-batch of trees); CPython grows a list by 1/8 at a time, and each growth
   of a large list may copy it (realloc), which measured ~9% of recording. Past 4096 entries
   a column grows by half instead, through the allocator CPython's lists use (PyMem_Realloc,
   as list_resize does), so the copies amortise to a few per column. */
int dg_col_append(PyObject *list, PyObject *v) {
    PyListObject *l = (PyListObject *)list;
    Py_ssize_t n = Py_SIZE(l);
    if (n >= l->allocated) {
        if (n < 4096)
            return PyList_Append(list, v);
        Py_ssize_t cap = n + (n >> 1);
        if ((size_t)cap > PY_SSIZE_T_MAX / sizeof(PyObject *))
            return PyList_Append(list, v);
        PyObject **items = PyMem_Realloc(l->ob_item, (size_t)cap * sizeof(PyObject *));
        if (!items) {
            PyErr_NoMemory();
            return -1;
        }
        l->ob_item = items;
        l->allocated = cap;
    }
    Py_INCREF(v);
    PyList_SET_ITEM(list, n, v);
    Py_SET_SIZE(l, n + 1);
    return 0;
}

/* Emptied column lists of freed graphs, kept with their storage: a per-sentence program
   makes a graph of a few dozen nodes per sentence, and growing a dozen fresh lists to that
   size (a realloc every few appends) cost as much as recording the nodes. One pool per
   column, so each list keeps serving the column it grew for (the storage kept stays that of
   the graphs the program makes, it does not creep); a few per column (the next graph is
   made before the last one is freed), and only when the graph held the last reference to
   the list. Large lists too: a mini-batch of TreeLSTMs grows each column from empty to
   ~30,000 entries, and the reallocations' copies were 2.8% of an inference step's
   instructions (callgrind), besides the fresh pages they touch. At most 1 << 17 entries
   (1 MB) a list, so the pool holds at most 26 MB. */
enum { LIST_POOL = 2, LIST_POOL_MAX_ITEMS = 1 << 17 };
static PyObject *ListPool[DG_LIST_COLUMNS][LIST_POOL];
static int ListPoolSize[DG_LIST_COLUMNS];

void dg_pool_list(int column, PyObject *l) {
    if (ListPoolSize[column] == LIST_POOL || !PyList_CheckExact(l) || Py_REFCNT(l) != 1 ||
        ((PyListObject *)l)->allocated > LIST_POOL_MAX_ITEMS) {
        Py_DECREF(l);
        return;
    }
    /* nothing else can reach l: empty it first, then release the items (which may run code) */
    PyObject **items = ((PyListObject *)l)->ob_item;
    Py_ssize_t n = Py_SIZE(l);
    Py_SET_SIZE(l, 0);
    for (Py_ssize_t k = 0; k < n; k++)
        Py_DECREF(items[k]);
    if (ListPoolSize[column] < LIST_POOL && Py_REFCNT(l) == 1 && Py_SIZE(l) == 0 &&
        ((PyListObject *)l)->ob_item == items)
        ListPool[column][ListPoolSize[column]++] = l;
    else
        Py_DECREF(l);
}

PyObject *dg_pooled_list(int column) {
    return ListPoolSize[column] ? ListPool[column][--ListPoolSize[column]] : PyList_New(0);
}
