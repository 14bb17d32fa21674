"""Fused recurrent cells over C: LSTM, GRU and the N-ary TreeLSTM (TreeCellPlan, KidRows)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..._kernels import ffi
from .ffi import _BUF, _fn, _in, _out, _p, _real
from .rows import _frozen


# ------------------------------------------------------------------ fused cells
def _gates(pre, k: int, what: str) -> tuple:
    """pre (B, k*H) -> (pre as C-contiguous float array, B, H)."""
    pre = np.asarray(pre)
    dt = _real(pre.dtype, what)
    pre = _in(pre, dt)
    if pre.ndim != 2 or pre.shape[1] % k:
        raise ValueError(f"{what}: pre-activations must be (B, {k}*H), got {pre.shape}")
    return pre, pre.shape[0], pre.shape[1] // k


def _state(a, dt, shape: tuple, what: str, optional: bool = False):
    if a is None:
        if optional:
            return None
        raise ValueError(f"{what} is required")
    a = _in(a, dt)
    if a.shape != shape:
        raise ValueError(f"{what} must have shape {shape}, got {a.shape}")
    return a


def _opt(a):
    return ffi.NULL if a is None else _p(a)


def lstm_forward(pre, c_prev=None, forget_bias: float = 0.0) -> tuple:
    """One LSTM step from pre-activations [i f o g] (B, 4H): returns (h, c, act), act
    being what lstm_backward needs. c_prev None means zeros (the first step)."""
    pre, B, H = _gates(pre, 4, "lstm_forward")
    dt = pre.dtype
    cp = _state(c_prev, dt, (B, H), "c_prev", optional=True)
    c, h, act = np.empty((B, H), dt), np.empty((B, H), dt), np.empty((B, 5 * H), dt)
    _fn("dg_lstm_fwd", dt)(_p(pre), _opt(cp), _p(c), _p(h), _p(act), B, H, float(forget_bias))
    return h, c, act


def lstm_backward(act, c_prev, dh, dc=None) -> tuple:
    """(dpre (B, 4H), dc_prev (B, H) or None when c_prev is None)."""
    act, B, H = _gates(act, 5, "lstm_backward")
    dt = act.dtype
    cp = _state(c_prev, dt, (B, H), "c_prev", optional=True)
    dh = _state(dh, dt, (B, H), "dh")
    dc = _state(dc, dt, (B, H), "dc", optional=True)
    dpre = np.empty((B, 4 * H), dt)
    dcp = np.empty((B, H), dt) if cp is not None else None
    _fn("dg_lstm_bwd", dt)(_p(act), _opt(cp), _p(dh), _opt(dc), _p(dpre), _opt(dcp), B, H)
    return dpre, dcp


def gru_gates_forward(pre_zr, h_prev) -> tuple:
    """GRU stage 1: pre [z r] (B, 2H) -> (zr activations (B, 2H), r * h_prev (B, H))."""
    pre, B, H = _gates(pre_zr, 2, "gru_gates_forward")
    hp = _state(h_prev, pre.dtype, (B, H), "h_prev")
    zr, rh = np.empty_like(pre), np.empty((B, H), pre.dtype)
    _fn("dg_gru_gates_fwd", pre.dtype)(_p(pre), _p(hp), _p(zr), _p(rh), B, H)
    return zr, rh


def gru_output_forward(pre_c, zr, h_prev) -> tuple:
    """GRU stage 2: cand = tanh(pre_c), h = (1 - z) h_prev + z cand -> (h, cand)."""
    pre, B, H = _gates(pre_c, 1, "gru_output_forward")
    zr = _state(zr, pre.dtype, (B, 2 * H), "zr")
    hp = _state(h_prev, pre.dtype, (B, H), "h_prev")
    cand, h = np.empty_like(pre), np.empty_like(pre)
    _fn("dg_gru_out_fwd", pre.dtype)(_p(pre), _p(zr), _p(hp), _p(cand), _p(h), B, H)
    return h, cand


def gru_output_backward(zr, h_prev, cand, dh) -> tuple:
    """(dpre_c, dz, dh_prev) of stage 2; dh_prev is the direct term only."""
    zr, B, H = _gates(zr, 2, "gru_output_backward")
    dt = zr.dtype
    hp, cand, dh = (_state(a, dt, (B, H), w) for a, w in ((h_prev, "h_prev"), (cand, "cand"), (dh, "dh")))
    dpre, dz, dhp = (np.empty((B, H), dt) for _ in range(3))
    _fn("dg_gru_out_bwd", dt)(_p(zr), _p(hp), _p(cand), _p(dh), _p(dpre), _p(dz), _p(dhp), B, H)
    return dpre, dz, dhp


def gru_gates_backward(zr, h_prev, dz, drh, dh_prev: np.ndarray | None = None) -> np.ndarray:
    """dpre_zr (B, 2H) of stage 1; adds r * drh into dh_prev in place when given."""
    zr, B, H = _gates(zr, 2, "gru_gates_backward")
    dt = zr.dtype
    hp, dz, drh = (_state(a, dt, (B, H), w) for a, w in ((h_prev, "h_prev"), (dz, "dz"), (drh, "drh")))
    if dh_prev is not None:
        _out(dh_prev, dt, "dh_prev")
        if dh_prev.shape != (B, H):
            raise ValueError(f"dh_prev must have shape {(B, H)}, got {dh_prev.shape}")
    dpre = np.empty((B, 2 * H), dt)
    _fn("dg_gru_gates_bwd", dt)(_p(zr), _p(hp), _p(dz), _p(drh), _p(dpre), _opt(dh_prev), B, H)
    return dpre


def _kids(c_kids, N: int, B: int, H: int, dt) -> np.ndarray:
    if N == 0:
        return np.zeros((0, B, H), dt)
    if isinstance(c_kids, (list, tuple)):
        c_kids = np.stack([_in(c, dt) for c in c_kids]) if c_kids else np.zeros((0, B, H), dt)
    return _state(c_kids, dt, (N, B, H), "c_kids")


def _rows_out(a, dt, shape: tuple, what: str) -> int:
    """An output written row by row: unit column stride, rows ld elements apart (ld >= width),
    so it may be rows and columns of a wider buffer. Returns ld."""
    if not isinstance(a, np.ndarray) or a.dtype != dt or not a.flags.writeable or a.shape != shape:
        got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"{what} must be a writeable {dt} array of shape {shape}, got {got}")
    it = dt.itemsize
    ld = a.strides[0] // it if shape[0] > 1 else shape[1]
    if shape[0] and shape[1] and (a.strides[1] != it and shape[1] > 1 or a.strides[0] % it or ld < shape[1]):
        raise ValueError(f"{what}: rows must be unit-stride and not overlap, got strides {a.strides}")
    return ld


def _disjoint(outs: list, ins: list, what: str) -> None:
    """The kernels' pointers are restrict: no output may share memory with another array."""
    for i, o in enumerate(outs):
        for x in outs[i + 1:] + ins:
            if x is not None and o.size and x.size and np.shares_memory(o, x):
                raise ValueError(f"{what}: an output overlaps another argument")


class KidRows:
    """The children of a TreeLSTM batch as rows of a state table: child k of batch row b
    is row rows[k, b]. Checked once, against `bound` (a table passed with it must have at
    least that many rows), so a caller that reuses it every pass pays the check once. The
    rows are a read-only private copy: nobody can change a checked index. ld: the
    elements from one child's rows to the next's (B, or more for a window of a wider
    array, see windows)."""

    __slots__ = ("rows", "bound", "N", "B", "ld", "ptr")

    def __init__(self, rows, bound: int):
        r = self._checked(rows, bound)
        self._set(r, int(bound), r.shape[0], r.shape[1], r.shape[1], ffi.from_buffer("int64_t[]", r))

    def _set(self, rows, bound, N, B, ld, ptr) -> None:
        for name, value in zip(self.__slots__, (rows, bound, N, B, ld, ptr)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        # The kernels trust a KidRows: its rows, bound and pointer are fixed once checked.
        raise AttributeError("a checked cpu.KidRows cannot be changed")

    __delattr__ = __setattr__

    @classmethod
    def windows(cls, rows, bound: int, spans: Sequence, axis: int) -> list:
        """One KidRows per span [s, e) of a 2-D array checked once: its columns s..e-1
        (axis=1: N = the array's rows, B = e - s) or its rows (axis=0: N = e - s, B = its
        columns). What a caller with many small batches a pass (dy.cavs's tasks) wants."""
        r = cls._checked(rows, bound)
        base, (n0, n1) = ffi.from_buffer("int64_t[]", r), r.shape
        out = []
        for s, e in spans:
            if not 0 <= s <= e <= r.shape[axis]:
                raise ValueError(f"KidRows.windows: span {s}..{e} beyond {r.shape[axis]}")
            k = cls.__new__(cls)
            N, B, ld = (n0, e - s, n1) if axis else (e - s, n1, n1)
            k._set(r[:, s:e] if axis else r[s:e], int(bound), N, B, ld, base + (s if axis else s * n1))
            out.append(k)
        return out

    @staticmethod
    def _checked(rows, bound: int) -> np.ndarray:
        r = np.array(rows, dtype=np.int64, order="C", copy=True)
        if r.ndim != 2:
            raise ValueError(f"KidRows: rows must be (N, B), got shape {r.shape}")
        if r.size and (int(r.min()) < 0 or int(r.max()) >= bound):
            bad = int(r.min()) if r.min() < 0 else int(r.max())
            raise IndexError(f"KidRows: row {bad} out of range [0, {bound})")
        return _frozen(r)  # never writeable again, even through .base


def _kid_table(table, rows: KidRows, dt, H: int, B: int, what: str, out: bool = False) -> np.ndarray:
    """A (R, H) state table (or its gradient) that rows index: R >= rows.bound."""
    if type(table) is not np.ndarray or table.dtype != dt or not table.flags.c_contiguous or \
            (out and not table.flags.writeable):
        got = f"{table.dtype} contiguous={table.flags.c_contiguous}" if isinstance(table, np.ndarray) \
            else type(table).__name__
        raise ValueError(f"{what} must be a{' writeable' if out else ''} C-contiguous {dt} array, got {got}")
    if table.ndim != 2 or table.shape[1] != H or table.shape[0] < rows.bound or rows.B != B:
        raise ValueError(f"{what}: a table of >= {rows.bound} rows of {H} for {rows.B} batch rows, "
                         f"got shape {table.shape} for {B}")
    return table


def _kids_arg(c_kids, kid_rows, B: int, H: int, dt, what: str) -> tuple:
    """(N, kids array, row pointer or NULL, its row stride): dense (N, B, H) kids, or a
    table and KidRows."""
    if kid_rows is None:
        N = len(c_kids) if c_kids is not None else 0
        return N, _kids(c_kids, N, B, H, dt), ffi.NULL, 0
    if type(kid_rows) is not KidRows:
        raise TypeError(f"{what}: kid_rows must be a cpu.KidRows, got {type(kid_rows).__name__}")
    return kid_rows.N, _kid_table(c_kids, kid_rows, dt, H, B, f"{what} c_kids"), kid_rows.ptr, kid_rows.ld


def treelstm_forward(pre, c_kids, bias=None, out: tuple | None = None, disjoint: bool = False,
                     kid_rows: "KidRows | None" = None) -> tuple:
    """N-ary TreeLSTM step: pre (B, (N+3)H) = [i f_1..f_N o u], c_kids (N, B, H) or a
    list of N (B, H) arrays (N = 0 for a leaf). Returns (h, c, act).

    kid_rows (a KidRows), if given: c_kids is a state table (R, H) and child k of row b
    is its row kid_rows.rows[k, b], read in place (no gathered copy). The rows must not
    be rows that c or h write (dy.cavs's children are earlier tasks' rows).
    bias ((N+3)H,), if given, is added to pre inside the kernel (the same rounding as
    pre + bias first). out = (h, c, act), any of them None, are written in place: h and
    c may be row blocks of wider arrays (unit column stride), act must be C-contiguous.
    disjoint=True: the caller allocated out in buffers of its own that no input shares
    (dy.cavs's workspace), so the per-call overlap check is skipped; shapes, dtypes and
    strides are still checked."""
    pre = np.asarray(pre)
    dt = _real(pre.dtype, "treelstm_forward")
    N = len(c_kids) if kid_rows is None and c_kids is not None else getattr(kid_rows, "N", 0)
    pre, B, H = _gates(pre, N + 3, "treelstm_forward")
    N, kids, rows_p, ldk = _kids_arg(c_kids, kid_rows, B, H, dt, "treelstm_forward")
    if bias is not None:
        bias = _in(bias, dt)
        if bias.shape not in (((N + 3) * H,), (1, (N + 3) * H)):
            raise ValueError(f"treelstm_forward: bias must have {(N + 3) * H} values, got shape {bias.shape}")
    h, c, act = out if out is not None else (None, None, None)
    h = np.empty((B, H), dt) if h is None else h
    c = np.empty((B, H), dt) if c is None else c
    act = np.empty((B, (N + 4) * H), dt) if act is None else _out(act, dt, "treelstm_forward act")
    if act.shape != (B, (N + 4) * H):
        raise ValueError(f"treelstm_forward: act must have shape {(B, (N + 4) * H)}, got {act.shape}")
    ldh, ldc = _rows_out(h, dt, (B, H), "treelstm_forward h"), _rows_out(c, dt, (B, H), "treelstm_forward c")
    if out is not None and not disjoint:
        _disjoint([h, c, act], [pre, bias] + ([kids] if kid_rows is None else []), "treelstm_forward")
        if kid_rows is not None:
            _disjoint([act], [kids], "treelstm_forward")
            for o in (h, c):
                _not_a_kid_row(o, kids, kid_rows, "treelstm_forward")
    _fn("dg_treelstm_fwd", dt)(_p(pre), _opt(bias), _p(kids), rows_p, ldk, N, _rows_p(c), ldc, _rows_p(h), ldh,
                               _p(act), B, H)
    return h, c, act


def _not_a_kid_row(o: np.ndarray, table: np.ndarray, rows: KidRows, what: str) -> None:
    """An output that shares the kids' table may only write rows that are nobody's child."""
    if not o.size or not np.shares_memory(o, table):
        return
    off = o.__array_interface__["data"][0] - table.__array_interface__["data"][0]
    r0 = off // table.strides[0]
    r1 = (off + (o.shape[0] - 1) * o.strides[0] + o.shape[1] * o.itemsize - 1) // table.strides[0] + 1
    if ((rows.rows >= r0) & (rows.rows < r1)).any():
        raise ValueError(f"{what}: an output row is also a child's row of the kids' table")


def _rows_p(a: np.ndarray):
    """A pointer to a's first element; a may be a strided view (its extent is checked by _rows_out)."""
    if a.flags.c_contiguous:
        return _p(a)
    return ffi.cast(_BUF[a.dtype].replace("[]", "*"), a.ctypes.data)


def treelstm_backward(act, c_kids, dh, dc=None, dpre=None, disjoint: bool = False,
                      kid_rows: "KidRows | None" = None, dc_table=None) -> tuple:
    """(dpre (B, (N+3)H), dc_kids (N, B, H)). dpre, if given, is a C-contiguous array
    written in place (rows of a larger per-run buffer: no copy afterwards); disjoint as
    in treelstm_forward.

    kid_rows, as in treelstm_forward: c_kids is the state table, and the children's
    cell gradients are ADDED to the same rows of dc_table (R, H), which is returned in
    place of dc_kids (None without dc_table). dh and dc may be rows of dc_table that
    are nobody's child."""
    act = np.asarray(act)
    dt = _real(act.dtype, "treelstm_backward")
    N = len(c_kids) if kid_rows is None and c_kids is not None else getattr(kid_rows, "N", 0)
    act, B, H = _gates(act, N + 4, "treelstm_backward")
    N, kids, rows_p, ldk = _kids_arg(c_kids, kid_rows, B, H, dt, "treelstm_backward")
    dh = _state(dh, dt, (B, H), "dh")
    dc = _state(dc, dt, (B, H), "dc", optional=True)
    if dpre is None:
        dpre = np.empty((B, (N + 3) * H), dt)
    elif _out(dpre, dt, "treelstm_backward dpre").shape != (B, (N + 3) * H):
        raise ValueError(f"treelstm_backward: dpre must have shape {(B, (N + 3) * H)}, got {dpre.shape}")
    elif not disjoint:
        _disjoint([dpre], [act, kids, dh, dc], "treelstm_backward")
    if kid_rows is None:
        dkids = np.empty((N, B, H), dt)
    elif dc_table is None:
        dkids = None
    else:
        dkids = _kid_table(dc_table, kid_rows, dt, H, B, "treelstm_backward dc_table", out=True)
        if not disjoint:
            _disjoint([dkids], [act, kids, dpre], "treelstm_backward")
            for g in (dh, dc):
                if g is not None:
                    _not_a_kid_row(g, dkids, kid_rows, "treelstm_backward")
    _fn("dg_treelstm_bwd", dt)(_p(act), _p(kids), rows_p, ldk, N, _p(dh), _opt(dc), _p(dpre), _opt(dkids), B, H)
    return dpre, dkids


class TreeCellPlan:
    """Many TreeLSTM cell calls over the same buffers (a dy.cavs pass: a task per tree
    level): the buffers are checked once here, and each call checks only its integer
    row ranges before the kernel runs, where treelstm_forward/backward check every
    array again (about 10 µs a call inside a dy.cavs step, bench/README.md).

    pre    1-D C-contiguous scratch; a call's (M, (N+3)H) pre-activations at its start
    bias   ((N+3)H,) or None
    kids   (R, H) state table that the calls' KidRows index (bound <= R)
    act    (V, (N+4)H); a call owns rows [l0, l0 + M)
    outs   2-D C-contiguous tables h and c rows are written into, named per call as
           (table index, first row, first column)
    dpre   (V, (N+3)H) written by backward, rows [l0, l0 + M) (None: a fresh array a call)
    gkids  (R, H) table the children's cell gradients are added into (None: not wanted)
    gx     (R', D) table add_inputs_grad adds the rows at the scratch's start into

    Written buffers share no memory with the buffers they are computed from (checked
    here), except that an output table may be the kids table: a call's children must
    then not be rows it writes, and a backward's dh and dc must not be rows of dpre or
    children's rows of gkids. dy.cavs checks both once a run (children are earlier
    rows) and once a pass (its gradient buffers apart)."""

    __slots__ = ("N", "H", "G", "A", "dt", "V", "R", "pre_size", "keep", "p_pre", "p_bias", "p_kids", "p_act",
                 "outs", "p_outs", "dpre", "p_dpre", "p_gkids", "gx", "p_gx", "fwd", "bwd", "add")

    def __init__(self, N: int, H: int, pre, bias, kids, act, outs: Sequence, dpre=None, gkids=None, gx=None):
        dt = _real(act.dtype, "TreeCellPlan")
        G, A = (N + 3) * H, (N + 4) * H
        what = "TreeCellPlan"
        pre, act = _out(pre, dt, f"{what} pre"), _out(act, dt, f"{what} act")
        if pre.ndim != 1 or act.ndim != 2 or act.shape[1] != A:
            raise ValueError(f"{what}: pre must be 1-D and act (V, {A}), got {pre.shape} and {act.shape}")
        kids = _out(kids, dt, f"{what} kids")
        if kids.ndim != 2 or kids.shape[1] != H:
            raise ValueError(f"{what}: kids must be an (R, {H}) table, got {kids.shape}")
        if bias is not None:
            bias = _in(bias, dt)
            if bias.size != G:
                raise ValueError(f"{what}: bias must have {G} values, got shape {bias.shape}")
        outs = [_out(o, dt, f"{what} output table") for o in outs]
        if any(o.ndim != 2 for o in outs):
            raise ValueError(f"{what}: output tables must be 2-D")
        if dpre is not None and (_out(dpre, dt, f"{what} dpre").shape != (act.shape[0], G)):
            raise ValueError(f"{what}: dpre must be {(act.shape[0], G)}, got {dpre.shape}")
        if gkids is not None and _out(gkids, dt, f"{what} gkids").shape != kids.shape:
            raise ValueError(f"{what}: gkids must be {kids.shape}, got {gkids.shape}")
        _disjoint([act, *[o for o in outs if o is not kids]], [pre, bias, kids], what)
        if gx is not None and _out(gx, dt, f"{what} gx").ndim != 2:
            raise ValueError(f"{what}: gx must be a 2-D table, got {gx.shape}")
        _disjoint([g for g in (dpre, gkids, gx) if g is not None], [pre, act, kids, *outs], what)
        self.N, self.H, self.G, self.A, self.dt = N, H, G, A, dt
        self.V, self.R, self.pre_size = act.shape[0], kids.shape[0], pre.size
        self.keep = (pre, bias, kids, act, gkids)  # the pointers below point into these
        self.p_pre, self.p_bias, self.p_kids, self.p_act = _p(pre), _opt(bias), _p(kids), _p(act)
        self.outs, self.p_outs = outs, [_p(o) for o in outs]
        self.dpre, self.p_dpre = dpre, _opt(dpre)
        self.p_gkids = _opt(gkids)
        self.gx, self.p_gx = gx, _opt(gx)
        self.fwd, self.bwd, self.add = _fn("dg_treelstm_fwd", dt), _fn("dg_treelstm_bwd", dt), _fn("dg_add_rows", dt)

    def _rows(self, l0: int, M: int, kr: KidRows) -> None:
        if not (type(kr) is KidRows and kr.N == self.N and kr.B == M and kr.bound <= self.R):
            raise ValueError(f"TreeCellPlan: children must be a KidRows of {self.N} x {M} rows below {self.R}")
        if not (0 <= l0 and l0 + M <= self.V and M * self.G <= self.pre_size):
            raise ValueError(f"TreeCellPlan: rows {l0}..{l0 + M} beyond act's {self.V} or pre's {self.pre_size}")

    def _at(self, at: tuple, M: int) -> tuple:
        """(pointer, row stride) of rows [r0, r0 + M), columns [c0, c0 + H) of output table i."""
        i, r0, c0 = at
        o = self.outs[i]
        rows, ld = o.shape
        if not (0 <= r0 and r0 + M <= rows and 0 <= c0 and c0 + self.H <= ld):
            raise ValueError(f"TreeCellPlan: output rows {r0}..{r0 + M}, columns {c0}..{c0 + self.H} beyond "
                             f"a table of {o.shape}")
        return self.p_outs[i] + (r0 * ld + c0), ld

    def forward(self, l0: int, M: int, kr: KidRows, h_at: tuple, c_at: tuple) -> None:
        """Task rows [l0, l0 + M): pre at the scratch's start, children kr; h and c into
        their tables at h_at and c_at, act into its rows."""
        self._rows(l0, M, kr)
        (ph, ldh), (pc, ldc) = self._at(h_at, M), self._at(c_at, M)
        if h_at[0] == c_at[0] and abs(h_at[1] - c_at[1]) < M and abs(h_at[2] - c_at[2]) < self.H:
            raise ValueError("TreeCellPlan: h and c overlap")
        self.fwd(self.p_pre, self.p_bias, self.p_kids, kr.ptr, kr.ld, self.N, pc, ldc, ph, ldh,
                 self.p_act + l0 * self.A, M, self.H)

    def backward(self, l0: int, M: int, kr: KidRows, dh, dc=None) -> np.ndarray:
        """The pre-activation gradients of task rows [l0, l0 + M) (dpre's rows, or a fresh
        array), the children's cell gradients added into gkids."""
        self._rows(l0, M, kr)
        dh = _state(dh, self.dt, (M, self.H), "dh")
        dc = _state(dc, self.dt, (M, self.H), "dc", optional=True)
        if self.dpre is not None:
            dpre, p = self.dpre[l0:l0 + M], self.p_dpre + l0 * self.G
        else:
            dpre = np.empty((M, self.G), self.dt)
            p = _p(dpre)
        self.bwd(self.p_act + l0 * self.A, self.p_kids, kr.ptr, kr.ld, self.N, _p(dh), _opt(dc), p, self.p_gkids, M,
                 self.H)
        return dpre

    def add_inputs_grad(self, rows: KidRows) -> None:
        """gx[rows[i, k]] += row i k of the scratch's start, in that order (repeats add):
        the x gradients of a task whose x's were rows of one state table."""
        if self.gx is None:
            raise ValueError("TreeCellPlan: no gx table")
        if type(rows) is not KidRows:
            raise TypeError(f"TreeCellPlan: rows must be a KidRows, got {type(rows).__name__}")
        R, D = self.gx.shape
        n = rows.N * rows.B
        if not (rows.bound <= R and n * D <= self.pre_size and rows.ld == rows.B):
            raise ValueError(f"TreeCellPlan: {n} rows of {D} below {R} do not fit the scratch of {self.pre_size}")
        if n:
            self.add(self.p_gx, rows.ptr, self.p_pre, D, n, D)
