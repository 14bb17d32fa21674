"""The N-ary TreeLSTM cell (the contract's fused_cells) for array-module backends.

The cell is one straight-line program generated from the op table's formulas
(cuda_codegen.treelstm_forward_program / treelstm_backward_program: logistic, tanh, cmult,
add, the formulas the C runs and the CUDA chains use). `XpCells` evaluates that program
with the backend's `xp` (whole (B, H) blocks per statement); backends/cuda.py's
`CudaCells` renders the same program as one CUDA kernel per (arity, bias, dc) and runs it
with one thread per element. Both share the interface of backends/cpu/cells.py, which is
what dy.cavs (cavs/fused_cell.py) calls: treelstm_forward / treelstm_backward, KidRows
(children as rows of a state table) and TreeCellPlan (a pass's buffers, addressed by rows).

Unlike the C cell these take device arrays: rows are checked on the host once (KidRows),
then kept on the device as well.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import cuda_codegen


class KidRows:
    """Child k of batch row b is row rows[k, b] of a state table (checked once against
    `bound`). `host` is the checked int64 copy, `rows` the same on the device."""
    __slots__ = ("host", "rows", "bound", "N", "B", "ld")

    def __init__(self, rows, bound: int, xp=np):
        self._set(self._checked(rows, bound), int(bound), xp, None)

    @staticmethod
    def _checked(rows, bound: int) -> np.ndarray:
        r = np.array(rows, dtype=np.int64)  # a private copy: nobody can change a checked index
        if r.ndim != 2:
            raise ValueError(f"KidRows: rows must be 2-D (N, B), got shape {r.shape}")
        if r.size and (r.min() < 0 or r.max() >= bound):
            raise IndexError(f"KidRows: a row is outside a table of {bound} rows")
        r.flags.writeable = False
        return r

    def _set(self, host: np.ndarray, bound: int, xp, dev) -> None:
        # ld: elements from one child's rows to the next's (wider than B for a column window)
        ld = host.strides[0] // host.itemsize if host.shape[0] > 1 else host.shape[1]
        self.host, self.bound, self.N, self.B, self.ld = host, bound, host.shape[0], host.shape[1], ld
        self.rows = dev if dev is not None else (host if xp is np else xp.asarray(host))

    @classmethod
    def windows(cls, rows, bound: int, spans: Sequence, axis: int, xp=np) -> list:
        """One KidRows per span [s, e) of a 2-D array checked once (as cpu.KidRows.windows):
        its columns (axis=1) or its rows (axis=0)."""
        r = cls._checked(rows, bound)
        dev = r if xp is np else xp.asarray(r)
        out = []
        for s, e in spans:
            if not 0 <= s <= e <= r.shape[axis]:
                raise ValueError(f"KidRows.windows: span {s}..{e} beyond {r.shape[axis]}")
            k = cls.__new__(cls)
            if axis:
                k._set(r[:, s:e], int(bound), xp, dev[:, s:e])
            else:
                k._set(r[s:e], int(bound), xp, dev[s:e])
            out.append(k)
        return out


def _gates(a, width: int, what: str) -> tuple:
    if a.ndim != 2 or a.shape[1] % width:
        raise ValueError(f"{what}: expected (B, {width}H), got shape {a.shape}")
    return a.shape[0], a.shape[1] // width


def _kid_count(c_kids, kid_rows) -> int:
    if kid_rows is not None:
        return kid_rows.N
    return 0 if c_kids is None else len(c_kids)


class _CellsBase:
    """The fused_cells interface over `_fwd`/`_bwd`, which a subclass computes."""

    def __init__(self, xp):
        self.xp = xp
        owner = self

        class _KidRows(KidRows):  # bound to this backend's array module
            __slots__ = ()

            def __init__(self, rows, bound: int):
                super().__init__(rows, bound, owner.xp)

            @classmethod
            def windows(cls, rows, bound: int, spans: Sequence, axis: int) -> list:
                return KidRows.windows.__func__(cls, rows, bound, spans, axis, owner.xp)

        class _Plan(TreeCellPlan):
            __slots__ = ()

            def __init__(self, *a, **k):
                super().__init__(owner, *a, **k)

        self.KidRows, self.TreeCellPlan = _KidRows, _Plan

    def _kids_block(self, c_kids, kid_rows, N: int, B: int, H: int):
        """(table, kid_rows or None): the children's cells as a table the kernel indexes."""
        if kid_rows is not None:
            if not isinstance(kid_rows, KidRows) or kid_rows.B != B:
                raise ValueError(f"treelstm: kid_rows must be a KidRows of {N} x {B} rows")
            if c_kids.ndim != 2 or c_kids.shape[1] != H or c_kids.shape[0] < kid_rows.bound:
                raise ValueError(f"treelstm: the kids table must be (>= {kid_rows.bound}, {H}), got {c_kids.shape}")
            return c_kids, kid_rows
        if N == 0:
            return None, None
        kids = c_kids if not isinstance(c_kids, (list, tuple)) else self.xp.stack(list(c_kids))
        if kids.shape != (N, B, H):
            raise ValueError(f"treelstm: c_kids must be ({N}, {B}, {H}), got {kids.shape}")
        return self.xp.ascontiguousarray(kids).reshape(N * B, H), None

    def treelstm_forward(self, pre, c_kids, bias=None, out: tuple | None = None, disjoint: bool = False,
                         kid_rows=None) -> tuple:
        """As cpu.treelstm_forward: (h, c, act); out = (h, c, act), any None, written in place."""
        N = _kid_count(c_kids, kid_rows)
        B, H = _gates(pre, N + 3, "treelstm_forward")
        if bias is not None and bias.size != (N + 3) * H:
            raise ValueError(f"treelstm_forward: bias must have {(N + 3) * H} values, got shape {bias.shape}")
        kids, kr = self._kids_block(c_kids, kid_rows, N, B, H)
        xp, dt = self.xp, pre.dtype
        h, c, act = out if out is not None else (None, None, None)
        h = xp.empty((B, H), dt) if h is None else h
        c = xp.empty((B, H), dt) if c is None else c
        act = xp.empty((B, (N + 4) * H), dt) if act is None else act
        if h.shape != (B, H) or c.shape != (B, H) or act.shape != (B, (N + 4) * H):
            raise ValueError(f"treelstm_forward: outputs must be ({B}, {H}) and ({B}, {(N + 4) * H})")
        self._fwd(xp.ascontiguousarray(pre), None if bias is None else xp.ascontiguousarray(bias).reshape(-1),
                  kids, kr, N, h, c, act, B, H)
        return h, c, act

    def treelstm_backward(self, act, c_kids, dh, dc=None, dpre=None, disjoint: bool = False, kid_rows=None,
                          dc_table=None) -> tuple:
        """As cpu.treelstm_backward: (dpre, dc_kids); with kid_rows the children's cell
        gradients are added into dc_table's rows (returned), or not formed without it."""
        N = _kid_count(c_kids, kid_rows)
        B, H = _gates(act, N + 4, "treelstm_backward")
        kids, kr = self._kids_block(c_kids, kid_rows, N, B, H)
        xp, dt = self.xp, act.dtype
        if dh.shape != (B, H) or (dc is not None and dc.shape != (B, H)):
            raise ValueError(f"treelstm_backward: dh and dc must be ({B}, {H})")
        dpre = xp.empty((B, (N + 3) * H), dt) if dpre is None else dpre
        if dpre.shape != (B, (N + 3) * H):
            raise ValueError(f"treelstm_backward: dpre must have shape {(B, (N + 3) * H)}, got {dpre.shape}")
        if kr is None:
            dkids, mode = (xp.empty((N, B, H), dt), 1) if N else (None, 0)
        else:
            dkids, mode = (dc_table, 2) if dc_table is not None else (None, 0)
        self._bwd(xp.ascontiguousarray(act), kids, kr, N, xp.ascontiguousarray(dh),
                  None if dc is None else xp.ascontiguousarray(dc), dpre, dkids, mode, B, H)
        return dpre, dkids


class XpCells(_CellsBase):
    """The generated cell program evaluated with xp, a (B, H) block per statement."""

    def __init__(self, xp):
        super().__init__(xp)
        self._env = {"T": lambda v: v, "tanh": xp.tanh, "exp": xp.exp, "where": xp.where}
        self._programs: dict = {}

    def _program(self, kind: str, N: int, flag: bool) -> list:
        key = (kind, N, flag)
        prog = self._programs.get(key)
        if prog is None:
            src = (cuda_codegen.treelstm_forward_program if kind == "f" else cuda_codegen.treelstm_backward_program)
            prog = self._programs[key] = [(r, compile(x, f"<treelstm {kind}{N}>", "eval")) for r, x in src(N, flag)]
        return prog

    def _run(self, prog: list, env: dict) -> dict:
        for reg, code in prog:
            env[reg] = eval(code, self._env, env)  # noqa: S307 (our generated formulas, no user text)
        return env

    def _children(self, kids, kr, N: int, B: int) -> dict:
        if kr is not None:
            return {f"ck{k}": self.xp.take(kids, kr.rows[k], axis=0) for k in range(N)}
        return {f"ck{k}": kids[k * B:(k + 1) * B] for k in range(N)}

    def _fwd(self, pre, bias, kids, kr, N: int, h, c, act, B: int, H: int) -> None:
        slots = cuda_codegen.treelstm_slots(N)
        env = self._children(kids, kr, N, B)
        for gate, s in slots.items():
            if gate != "tc":
                env[f"p_{gate}"] = pre[:, s * H:(s + 1) * H]
                if bias is not None:
                    env[f"b_{gate}"] = bias[s * H:(s + 1) * H]
        env = self._run(self._program("f", N, bias is not None), env)
        for gate, s in slots.items():
            act[:, s * H:(s + 1) * H] = env[f"a_{gate}"]
        c[...] = env["c_out"]
        h[...] = env["h_out"]

    def _bwd(self, act, kids, kr, N: int, dh, dc, dpre, dkids, mode: int, B: int, H: int) -> None:
        slots = cuda_codegen.treelstm_slots(N)
        env = self._children(kids, kr, N, B)
        env.update({f"a_{gate}": act[:, s * H:(s + 1) * H] for gate, s in slots.items()}, dh=dh)
        if dc is not None:
            env["dc"] = dc
        env = self._run(self._program("b", N, dc is not None), env)
        for gate, s in slots.items():
            if gate != "tc":
                dpre[:, s * H:(s + 1) * H] = env[f"d_{gate}"]
        for k in range(N):
            if mode == 1:
                dkids[k] = env[f"dck{k}"]
            elif mode == 2:
                self.xp.add.at(dkids, kr.rows[k], env[f"dck{k}"])


class TreeCellPlan:
    """cpu.TreeCellPlan's interface over device buffers: a dy.cavs pass's tasks address
    rows of pre (a 1-D scratch), act, the output tables, dpre, gkids and gx."""
    __slots__ = ("cells", "N", "H", "G", "pre", "bias", "kids", "act", "outs", "dpre", "gkids", "gx")

    def __init__(self, cells: _CellsBase, N: int, H: int, pre, bias, kids, act, outs: Sequence, dpre=None,
                 gkids=None, gx=None):
        G = (N + 3) * H
        if pre.ndim != 1 or act.ndim != 2 or act.shape[1] != (N + 4) * H:
            raise ValueError(f"TreeCellPlan: pre must be 1-D and act (V, {(N + 4) * H}), got {pre.shape} "
                             f"and {act.shape}")
        if kids.ndim != 2 or kids.shape[1] != H:
            raise ValueError(f"TreeCellPlan: kids must be an (R, {H}) table, got {kids.shape}")
        if any(o.ndim != 2 for o in outs):
            raise ValueError("TreeCellPlan: output tables must be 2-D")
        self.cells, self.N, self.H, self.G = cells, N, H, G
        self.pre, self.bias, self.kids, self.act, self.outs = pre, bias, kids, act, list(outs)
        self.dpre, self.gkids, self.gx = dpre, gkids, gx

    def _rows(self, l0: int, M: int, kr: KidRows) -> None:
        if not (isinstance(kr, KidRows) and kr.N == self.N and kr.B == M and kr.bound <= self.kids.shape[0]):
            raise ValueError(f"TreeCellPlan: children must be a KidRows of {self.N} x {M} rows")
        if not (0 <= l0 and l0 + M <= self.act.shape[0] and M * self.G <= self.pre.size):
            raise ValueError(f"TreeCellPlan: rows {l0}..{l0 + M} beyond act's {self.act.shape[0]} or the scratch")

    def _at(self, at: tuple, M: int):
        i, r0, c0 = at
        o = self.outs[i]
        if not (0 <= r0 and r0 + M <= o.shape[0] and 0 <= c0 and c0 + self.H <= o.shape[1]):
            raise ValueError(f"TreeCellPlan: output rows {r0}..{r0 + M}, columns {c0}..{c0 + self.H} beyond "
                             f"a table of {o.shape}")
        return o[r0:r0 + M, c0:c0 + self.H]

    def forward(self, l0: int, M: int, kr: KidRows, h_at: tuple, c_at: tuple) -> None:
        self._rows(l0, M, kr)
        pre = self.pre[:M * self.G].reshape(M, self.G)
        self.cells.treelstm_forward(pre, self.kids, bias=self.bias, kid_rows=kr,
                                    out=(self._at(h_at, M), self._at(c_at, M), self.act[l0:l0 + M]))

    def backward(self, l0: int, M: int, kr: KidRows, dh, dc=None):
        self._rows(l0, M, kr)
        dpre = None if self.dpre is None else self.dpre[l0:l0 + M]
        dpre, _ = self.cells.treelstm_backward(self.act[l0:l0 + M], self.kids, dh, dc, dpre=dpre, kid_rows=kr,
                                               dc_table=self.gkids)
        return dpre

    def add_inputs_grad(self, rows: KidRows) -> None:
        """gx[rows[i, k]] += row i k of the scratch's start (repeats add)."""
        if self.gx is None:
            raise ValueError("TreeCellPlan: no gx table")
        D = self.gx.shape[1]
        n = rows.N * rows.B
        if n * D > self.pre.size or rows.bound > self.gx.shape[0]:
            raise ValueError(f"TreeCellPlan: {n} rows of {D} do not fit the scratch of {self.pre.size}")
        if n:
            self.cells.xp.add.at(self.gx, rows.rows.reshape(-1), self.pre[:n * D].reshape(n, D))
