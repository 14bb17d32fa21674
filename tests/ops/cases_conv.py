"""conv2d, conv2d_bias, maxpooling2d, kmax_pooling against direct loop formulas (no im2col,
no shared code with dynagraph/ops/conv.py): one output element at a time."""
from __future__ import annotations

import numpy as np

import dynagraph as dy
from opcases import A, Case


def _same_pads(n: int, k: int, s: int) -> tuple:
    out = -(-n // s)
    total = max((out - 1) * s + k - n, 0)
    return out, total // 2, total - total // 2


def _windows(x, kh, kw, stride, valid, fill):
    """Yields (a, b, window) over the output grid of an (H, W, C) image."""
    x = x if x.ndim == 3 else x[:, :, None]
    H, W, _ = x.shape
    if valid:
        OH, OW = (H - kh) // stride[0] + 1, (W - kw) // stride[1] + 1
        padded = x
    else:
        OH, t, b = _same_pads(H, kh, stride[0])
        OW, l, r = _same_pads(W, kw, stride[1])
        padded = np.pad(x, ((t, b), (l, r), (0, 0)), constant_values=fill)
    for a in range(OH):
        for c in range(OW):
            yield a, c, OH, OW, padded[a * stride[0]:a * stride[0] + kh, c * stride[1]:c * stride[1] + kw, :]


def conv_ref(x, f, stride, valid, bias=None):
    kh, kw, _, O = f.shape
    out = None
    for a, c, OH, OW, win in _windows(x, kh, kw, stride, valid, 0.0):
        if out is None:
            out = np.zeros((OH, OW, O))
        for o in range(O):
            out[a, c, o] = float((win * f[:, :, :, o]).sum()) + (0.0 if bias is None else bias[o])
    return out


def maxpool_ref(x, ksize, stride, valid):
    out = None
    for a, c, OH, OW, win in _windows(x, ksize[0], ksize[1], stride, valid, -np.inf):
        if out is None:
            out = np.zeros((OH, OW, win.shape[2]))
        out[a, c] = win.max(axis=(0, 1))
    return out


def kmax_ref(x, k, d):
    moved = np.moveaxis(x, d, -1)
    out = np.empty(moved.shape[:-1] + (k,))
    for idx in np.ndindex(moved.shape[:-1]):
        row = moved[idx]
        keep = sorted(sorted(range(len(row)), key=lambda i: -row[i])[:k])
        out[idx] = row[keep]
    return np.moveaxis(out, -1, d)


def _conv(cid, xs, fs, stride, valid):
    return Case(cid, "conv2d", lambda k, x, f: dy.conv2d(x, f, list(stride), valid), [A(xs), A(fs)],
                lambda k, x, f: conv_ref(x, f, stride, valid))


def _pool(cid, xs, ksize, stride, valid):
    return Case(cid, "maxpooling2d", lambda k, x: dy.maxpooling2d(x, list(ksize), list(stride), valid), [A(xs)],
                lambda k, x: maxpool_ref(x, ksize, stride, valid))


CASES = [
    _conv("conv2d_valid", (5, 6, 2), (3, 2, 2, 3), (1, 1), True),
    _conv("conv2d_valid_strided", (5, 7, 2), (2, 3, 2, 2), (2, 3), True),
    _conv("conv2d_same", (4, 5, 2), (3, 2, 2, 2), (1, 1), False),
    _conv("conv2d_same_strided_odd", (5, 7, 1), (2, 3, 1, 2), (2, 2), False),
    _conv("conv2d_one_channel_2d_input", (4, 4), (2, 2, 1, 3), (1, 1), True),
    Case("conv2d_bias_same", "conv2d_bias", lambda k, x, f, b: dy.conv2d_bias(x, f, b, [1, 2], False),
         [A((4, 5, 2)), A((2, 2, 2, 3)), A((3,))], lambda k, x, f, b: conv_ref(x, f, (1, 2), False, b)),
    Case("conv2d_bias_valid", "conv2d_bias", lambda k, x, f, b: dy.conv2d_bias(x, f, b, [1, 1]),
         [A((3, 4, 1)), A((2, 2, 1, 2)), A((2,))], lambda k, x, f, b: conv_ref(x, f, (1, 1), True, b)),
    _pool("maxpooling2d_valid", (5, 6, 2), (2, 2), (2, 2), True),
    _pool("maxpooling2d_overlapping", (4, 5, 2), (3, 2), (1, 2), True),
    _pool("maxpooling2d_same", (5, 7, 2), (2, 3), (2, 2), False),
    _pool("maxpooling2d_2d_input", (4, 4), (2, 2), (1, 1), True),
    Case("kmax_pooling_d1", "kmax_pooling", lambda k, x: dy.kmax_pooling(x, 2), [A((3, 5))],
         lambda k, x: kmax_ref(x, 2, 1)),
    Case("kmax_pooling_d0_vector", "kmax_pooling", lambda k, x: dy.kmax_pooling(x, 3, 0), [A((6,))],
         lambda k, x: kmax_ref(x, 3, 0)),
    Case("kmax_pooling_3d", "kmax_pooling", lambda k, x: dy.kmax_pooling(x, 2, 2), [A((2, 3, 4))],
         lambda k, x: kmax_ref(x, 2, 2)),
]
