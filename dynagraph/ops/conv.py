"""DyNet's image ops: conv2d, conv2d_bias, maxpooling2d, kmax_pooling.

DyNet's layout: an image is (H, W, C) (or (H, W), one channel), a filter bank is
(kh, kw, C, O). conv2d is a cross-correlation (no kernel flip), and "SAME" padding
(is_valid=False) follows TensorFlow: out = ceil(H / stride), the odd padding row or
column going to the bottom/right. Max pooling pads with -inf, so padding is never the
maximum. All four were checked against dynet38 (tests/ops/test_dynet_parity.py).

Batched like every op: arrays carry a leading batch axis (1 for a shared filter). A
shared filter bank makes the whole batch one GEMM over im2col patches, forward and
backward.
"""
from __future__ import annotations

from .base import ELEMWISE, GEMM, op, reduce_to


def _pair(v, what: str) -> tuple:
    v = tuple(int(s) for s in v)
    if len(v) != 2 or min(v) < 1:
        raise ValueError(f"{what} must be two positive ints, got {v}")
    return v


def _image(s: tuple, what: str) -> tuple:
    if len(s) == 2:
        return s + (1,)
    if len(s) == 3:
        return s
    raise ValueError(f"{what} needs an (H, W) or (H, W, C) input, got shape {s}")


def _geometry(H: int, W: int, kh: int, kw: int, stride: tuple, valid: bool) -> tuple:
    """(OH, OW, (top, bottom, left, right) padding)."""
    sh, sw = stride
    if valid:
        if H < kh or W < kw:
            raise ValueError(f"window ({kh}, {kw}) larger than the input ({H}, {W}) with is_valid=True")
        return (H - kh) // sh + 1, (W - kw) // sw + 1, (0, 0, 0, 0)
    OH, OW = -(-H // sh), -(-W // sw)
    ph, pw = max((OH - 1) * sh + kh - H, 0), max((OW - 1) * sw + kw - W, 0)
    return OH, OW, (ph // 2, ph - ph // 2, pw // 2, pw - pw // 2)


def _patches(xp, X, kh: int, kw: int, stride: tuple, OH: int, OW: int):
    """im2col: (B, H, W, C) -> (B, OH, OW, kh, kw, C); one strided slice per window offset."""
    sh, sw = stride
    cols = [X[:, i:i + sh * (OH - 1) + 1:sh, j:j + sw * (OW - 1) + 1:sw, :] for i in range(kh) for j in range(kw)]
    B, C = X.shape[0], X.shape[3]
    return xp.stack(cols, axis=3).reshape(B, OH, OW, kh, kw, C)


def _col2im(xp, gP, shape: tuple, stride: tuple, pads: tuple):
    """The adjoint of _patches followed by padding: add every window's gradient back."""
    B, OH, OW, kh, kw, C = gP.shape
    sh, sw = stride
    g = xp.zeros(shape, dtype=gP.dtype)
    for i in range(kh):
        for j in range(kw):
            g[:, i:i + sh * (OH - 1) + 1:sh, j:j + sw * (OW - 1) + 1:sw, :] += gP[:, :, :, i, j, :]
    t, b, l, r = pads
    return g[:, t:g.shape[1] - b, l:g.shape[2] - r, :]


def _pad(xp, X, pads: tuple, value: float = 0.0):
    t, b, l, r = pads
    if not any(pads):
        return X
    return xp.pad(X, ((0, 0), (t, b), (l, r), (0, 0)), constant_values=value)


# ------------------------------------------------------------------------- conv2d
def _conv_shape(a, sx, sf, sb=None):
    stride, valid = a
    H, W, C = _image(sx, "conv2d")
    if len(sf) != 4:
        raise ValueError(f"conv2d needs a (kh, kw, C_in, C_out) filter, got shape {sf}")
    kh, kw, cf, O = sf
    if cf != C:
        raise ValueError(f"input has {C} channels, filter expects {cf}")
    if sb is not None and sb != (O,):
        raise ValueError(f"bias must have shape ({O},) for {O} output channels, got {sb}")
    OH, OW, _ = _geometry(H, W, kh, kw, _pair(stride, "stride"), valid)
    return (OH, OW, O)


def _conv_forward(xp, a, X, F, Bias=None):
    stride, valid = a
    X4 = X.reshape(X.shape[:3] + (-1,))
    B, H, W, C = X4.shape
    kh, kw, _, O = F.shape[1:]
    OH, OW, pads = _geometry(H, W, kh, kw, stride, valid)
    P = _patches(xp, _pad(xp, X4, pads), kh, kw, stride, OH, OW)
    K = kh * kw * C
    if F.shape[0] == 1:  # a shared filter bank: one GEMM for the batch
        y = (P.reshape(B * OH * OW, K) @ F[0].reshape(K, O)).reshape(B, OH, OW, O)
    else:
        y = xp.matmul(P.reshape(B, OH * OW, K), F.reshape(F.shape[0], K, O)).reshape(-1, OH, OW, O)
    if Bias is not None:
        y = y + Bias[:, None, None, :]
    return y


def _conv_backward(xp, a, xs, g, need):
    stride, valid = a
    X, F = xs[0], xs[1]
    X4 = X.reshape(X.shape[:3] + (-1,))
    B, H, W, C = X4.shape
    kh, kw, _, O = F.shape[1:]
    OH, OW, pads = _geometry(H, W, kh, kw, stride, valid)
    K, n = kh * kw * C, g.shape[0]
    gX = gF = gB = None
    if need[0]:
        if F.shape[0] == 1:
            gP = g.reshape(n * OH * OW, O) @ F[0].reshape(K, O).T
        else:
            gP = xp.matmul(g.reshape(n, OH * OW, O), F.reshape(F.shape[0], K, O).transpose(0, 2, 1))
        gP = gP.reshape(n, OH, OW, kh, kw, C)
        padded = (n, H + pads[0] + pads[1], W + pads[2] + pads[3], C)
        gX = reduce_to(_col2im(xp, gP, padded, stride, pads).reshape((n,) + X.shape[1:]), X.shape)
    if need[1]:
        P = _patches(xp, _pad(xp, X4, pads), kh, kw, stride, OH, OW)
        if F.shape[0] == 1:  # the batch's filter gradient summed in one GEMM
            P2 = xp.broadcast_to(P, (n,) + P.shape[1:]).reshape(n * OH * OW, K)
            gF = (P2.T @ g.reshape(n * OH * OW, O)).reshape(F.shape)
        else:
            gF = xp.matmul(P.reshape(P.shape[0], OH * OW, K).transpose(0, 2, 1), g.reshape(n, OH * OW, O))
            gF = reduce_to(gF.reshape((-1,) + F.shape[1:]), F.shape)
    if len(xs) > 2 and need[2]:
        gB = reduce_to(g.sum(axis=(1, 2)), xs[2].shape)
    return (gX, gF) if len(xs) == 2 else (gX, gF, gB)


@op("conv2d", _conv_shape, cost=GEMM)
class Conv2d:
    """conv2d(x, f, stride, is_valid): attrs = (stride, is_valid)."""
    def forward(xp, a, data, X, F):
        return _conv_forward(xp, a, X, F)

    def backward(xp, a, data, xs, y, g, need):
        return _conv_backward(xp, a, xs, g, need)


@op("conv2d_bias", _conv_shape, cost=GEMM)
class Conv2dBias:
    """conv2d_bias(x, f, b, stride, is_valid): conv2d plus one bias per output channel."""
    def forward(xp, a, data, X, F, Bias):
        return _conv_forward(xp, a, X, F, Bias)

    def backward(xp, a, data, xs, y, g, need):
        return _conv_backward(xp, a, xs, g, need)


# ------------------------------------------------------------------- maxpooling2d
def _pool_shape(a, sx):
    ksize, stride, valid = a
    H, W, C = _image(sx, "maxpooling2d")
    kh, kw = _pair(ksize, "ksize")
    OH, OW, _ = _geometry(H, W, kh, kw, _pair(stride, "stride"), valid)
    return (OH, OW, C)


def _pool_windows(xp, a, X):
    """Each window flattened in DyNet's column-major order (kw outer, kh inner), so that
    argmax's first maximum is the one DyNet picks on ties."""
    (kh, kw), stride, valid = a
    X4 = X.reshape(X.shape[:3] + (-1,))
    B, H, W, C = X4.shape
    OH, OW, pads = _geometry(H, W, kh, kw, stride, valid)
    P = _patches(xp, _pad(xp, X4, pads, -xp.inf), kh, kw, stride, OH, OW)
    return P.transpose(0, 1, 2, 4, 3, 5).reshape(B, OH, OW, kh * kw, C), pads


@op("maxpooling2d", _pool_shape, cost=ELEMWISE)
class MaxPooling2d:
    """maxpooling2d(x, ksize, stride, is_valid): attrs = (ksize, stride, is_valid)."""
    def forward(xp, a, data, X):
        windows, _ = _pool_windows(xp, a, X)
        return windows.max(axis=3)

    def backward(xp, a, data, xs, y, g, need):
        (kh, kw), stride, _ = a
        X = xs[0]
        windows, pads = _pool_windows(xp, a, X)
        B, OH, OW, K, C = windows.shape
        if g.shape[0] != B:  # a shared input: every node pooled the same windows
            g = g.sum(axis=0, keepdims=True)
        first = windows.argmax(axis=3)  # the gradient goes to one maximum per window
        hit = xp.arange(K)[None, None, None, :, None] == first[:, :, :, None, :]
        gW = hit * g.reshape(B, OH, OW, 1, C)
        gP = gW.reshape(B, OH, OW, kw, kh, C).transpose(0, 1, 2, 4, 3, 5)
        padded = (B, X.shape[1] + pads[0] + pads[1], X.shape[2] + pads[2] + pads[3], C)
        return (_col2im(xp, gP, padded, stride, pads).reshape(X.shape),)


# ------------------------------------------------------------------- kmax_pooling
def _kmax_shape(a, sx):
    k, d = a
    if not 0 <= d < len(sx):
        raise ValueError(f"kmax_pooling: dimension {d} out of range for shape {sx}")
    if not 1 <= k <= sx[d]:
        raise ValueError(f"kmax_pooling: k={k} must be in [1, {sx[d]}] (the size of dimension {d})")
    return sx[:d] + (k,) + sx[d + 1:]


def _kmax_index(xp, a, X):
    """Positions of the k largest entries along the dimension, in their original order
    (ties: the earlier entry first, as in DyNet)."""
    k, d = a
    Xm = xp.moveaxis(X, d + 1, -1)
    try:
        order = xp.argsort(-Xm, axis=-1, kind="stable")
    except TypeError:  # array libraries whose argsort has no kind= are stable already
        order = xp.argsort(-Xm, axis=-1)
    return Xm, xp.sort(order[..., :k], axis=-1)


@op("kmax_pooling", _kmax_shape, cost=ELEMWISE)
class KmaxPooling:
    """kmax_pooling(x, k, d): the k largest values along dimension d, order kept."""
    def forward(xp, a, data, X):
        Xm, top = _kmax_index(xp, a, X)
        return xp.moveaxis(xp.take_along_axis(Xm, top, axis=-1), -1, a[1] + 1)

    def backward(xp, a, data, xs, y, g, need):
        Xm, top = _kmax_index(xp, a, xs[0])
        gm = xp.moveaxis(g, a[1] + 1, -1)
        hit = top[..., :, None] == xp.arange(Xm.shape[-1])
        gx = (gm[..., :, None] * hit).sum(axis=-2)
        return (reduce_to(xp.moveaxis(gx, -1, a[1] + 1), xs[0].shape),)
