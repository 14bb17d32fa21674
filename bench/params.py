"""Initial parameter values, shared by every system so that losses can be compared.

Each model is defined by a dict name -> float32 array. Names in LOOKUPS are
embedding tables (rows indexed by word id); the rest are dense parameters.
Matrices are Glorot-uniform, biases zero, MV-RNN word matrices identity + noise
and its composition matrices 0.5 I + noise (Socher et al., 2012), so that
products along deep trees stay bounded.
"""
from __future__ import annotations

import numpy as np

LOOKUPS = ("E", "M")


def _glorot(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    s = np.sqrt(6.0 / (rows + cols))
    return rng.uniform(-s, s, size=(rows, cols))


def _near(rng: np.random.Generator, base: np.ndarray, noise: float = 0.01) -> np.ndarray:
    return base + rng.uniform(-noise, noise, size=base.shape)


def init_arrays(kind: str, H: int, vocab: int, n_out: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    g = lambda r, c: _glorot(rng, r, c)  # noqa: E731
    z = lambda n: np.zeros(n)  # noqa: E731
    emb = rng.uniform(-0.1, 0.1, size=(vocab, H))
    if kind == "treelstm":
        p = dict(E=emb, W_iou=g(3 * H, H), b_iou=z(3 * H), U_l=g(5 * H, H), U_r=g(5 * H, H), b=z(5 * H))
    elif kind == "treefc":
        p = dict(E=emb, W_l=g(H, H), W_r=g(H, H), b=z(H))
    elif kind == "bilstm":
        p = dict(E=emb, Wx_f=g(4 * H, H), Wh_f=g(4 * H, H), b_f=z(4 * H),
                 Wx_b=g(4 * H, H), Wh_b=g(4 * H, H), b_b=z(4 * H),
                 W_of=g(n_out, H), W_ob=g(n_out, H))
    elif kind == "mvrnn":
        eye = np.eye(H)
        # Column-major flattening (DyNet's reshape); the identity is symmetric anyway.
        M = np.stack([_near(rng, eye).reshape(-1, order="F") for _ in range(vocab)])
        p = dict(E=emb, M=M, W1=g(H, H), W2=g(H, H), b=z(H),
                 WM1=_near(rng, 0.5 * eye), WM2=_near(rng, 0.5 * eye))
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    if kind != "bilstm":  # the tagger's output layer is W_of, W_ob above
        p["W_out"] = g(n_out, H)
    p["b_out"] = z(n_out)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in p.items()}
