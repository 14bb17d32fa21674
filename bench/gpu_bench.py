"""GPU training throughput: dynagraph on the cuda backend against PyTorch on the GPU,
per sample (eager, one node at a time) and hand-batched (tree levels / time steps as
matrix ops written by hand), for TreeLSTM, Tree-FC and BiLSTM.

    python bench/gpu_bench.py                      # H 256,1024; batch 64,256
    python bench/gpu_bench.py --H 256 --batch 64 --models treelstm

Samples/s per system, best of --rounds interleaved rounds, and the ratios the issue's
targets are stated in (dynagraph >= 0.8x hand-batched PyTorch-GPU, >= 30x PyTorch-GPU
per sample). Needs CuPy, torch with CUDA and a device; without them it says so and
exits with status 2.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = {"treelstm": "treelstm", "treefc": "treefc64", "bilstm": "bilstm"}


def _need_gpu() -> None:
    why = []
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            why.append("CuPy sees no CUDA device")
    except Exception as e:  # ImportError, or CUDA's own error without a driver
        why.append(f"CuPy unusable ({type(e).__name__}: {e})")
    try:
        import torch
        if not torch.cuda.is_available():
            why.append("torch has no CUDA device")
    except ImportError:
        why.append("torch not installed")
    if why:
        print(f"gpu_bench: needs a CUDA device with CuPy and torch ({'; '.join(why)}). "
              "Install with pip install -e '.[gpu]' and a CUDA torch, on a GPU machine.", file=sys.stderr)
        sys.exit(2)


def _sync() -> None:
    import cupy
    import torch
    cupy.cuda.Device().synchronize()
    torch.cuda.synchronize()


# ---------------------------------------------------------------- systems
def _dynagraph(kind: str, arrays: dict, lr: float):
    import dynagraph as dy
    from bench.dy_models import DyModel
    dy.config.set(backend="cuda")
    return DyModel(dy, kind, arrays, lr, {"scheduler": "lookahead"}).step


def _torch_per_sample(kind: str, arrays: dict, lr: float):
    import torch
    from bench.torch_models import TorchModel
    m = TorchModel(kind, arrays, lr)
    dev = torch.device("cuda")
    m.p = {k: torch.nn.Parameter(v.detach().to(dev)) for k, v in m.p.items()}
    m.opt = torch.optim.SGD(list(m.p.values()), lr=lr)
    embed = torch.nn.functional.embedding
    m._embed = lambda name, words: embed(torch.tensor(words, device=dev), m.p[name], sparse=True)
    return m.step


def _torch_batched(kind: str, arrays: dict, lr: float):
    """Hand-batched: every tree node of one height (or every time step) of the whole
    minibatch as one matrix op, the way a careful PyTorch user batches by hand."""
    import torch
    import torch.nn.functional as F
    dev = torch.device("cuda")
    p = {k: torch.nn.Parameter(torch.from_numpy(a.copy()).to(dev)) for k, a in arrays.items()}
    opt = torch.optim.SGD(list(p.values()), lr=lr)
    H = arrays["E"].shape[1]

    def trees(batch):
        # node ids of the whole batch by height; children are earlier heights
        words, left, right, height, roots, labels, off = [], [], [], [], [], [], 0
        for t in batch:
            hs = []
            for w, l, r in zip(t.words, t.left, t.right):
                words.append(w)
                left.append(l + off if l >= 0 else -1)
                right.append(r + off if r >= 0 else -1)
                hs.append(0 if l < 0 else 1 + max(hs[l], hs[r]))
            height += hs
            off += len(t.words)
            roots.append(off - 1)
            labels.append(t.label)
        n = len(words)
        h, c = torch.zeros(n + 1, H, device=dev), torch.zeros(n + 1, H, device=dev)
        height, words, left, right = map(np.asarray, (height, words, left, right))
        for lev in range(height.max() + 1):
            ids = torch.as_tensor(np.nonzero(height == lev)[0], device=dev)
            sel = np.nonzero(height == lev)[0]
            if lev == 0:
                x = F.embedding(torch.as_tensor(words[sel], device=dev), p["E"], sparse=True)
                if kind == "treelstm":
                    g = F.linear(x, p["W_iou"], p["b_iou"])
                    cc = torch.sigmoid(g[:, :H]) * torch.tanh(g[:, 2 * H:])
                    hh = torch.sigmoid(g[:, H:2 * H]) * torch.tanh(cc)
                else:
                    hh, cc = x, torch.zeros_like(x)
            else:
                L, R = torch.as_tensor(left[sel], device=dev), torch.as_tensor(right[sel], device=dev)
                if kind == "treelstm":
                    g = F.linear(h[L], p["U_l"], p["b"]) + F.linear(h[R], p["U_r"])
                    i, fl, fr, o = (torch.sigmoid(g[:, k * H:(k + 1) * H]) for k in range(4))
                    cc = i * torch.tanh(g[:, 4 * H:]) + fl * c[L] + fr * c[R]
                    hh = o * torch.tanh(cc)
                else:
                    hh = torch.tanh(F.linear(h[L], p["W_l"], p["b"]) + F.linear(h[R], p["W_r"]))
                    cc = torch.zeros_like(hh)
            h = h.index_copy(0, ids, hh)
            c = c.index_copy(0, ids, cc)
        out = F.linear(h[torch.as_tensor(roots, device=dev)], p["W_out"], p["b_out"])
        return F.cross_entropy(out, torch.as_tensor(labels, device=dev), reduction="sum")

    def lstm(X, mask, d):
        T_ = X.shape[0]
        h = c = None
        hs = []
        for t in range(T_):
            g = F.linear(X[t], p["Wx_" + d], p["b_" + d]) + (0 if h is None else F.linear(h, p["Wh_" + d]))
            iu = torch.sigmoid(g[:, :H]) * torch.tanh(g[:, 3 * H:])
            c2 = iu if c is None else torch.sigmoid(g[:, H:2 * H]) * c + iu
            h2 = torch.sigmoid(g[:, 2 * H:3 * H]) * torch.tanh(c2)
            m = mask[t].unsqueeze(1)
            h = h2 if h is None else m * h2 + (1 - m) * h
            c = c2 if c is None else m * c2 + (1 - m) * c
            hs.append(h2)
        return torch.stack(hs)

    def bilstm(batch):
        T_ = max(len(s.words) for s in batch)
        W = np.zeros((T_, len(batch)), np.int64)
        tags = np.full((T_, len(batch)), -100, np.int64)
        for b, s in enumerate(batch):
            W[:len(s.words), b] = s.words
            W[len(s.words):, b] = s.words[-1]
            tags[:len(s.words), b] = s.tags
        mask = torch.as_tensor((tags >= 0).astype(np.float32), device=dev)
        X = F.embedding(torch.as_tensor(W, device=dev), p["E"], sparse=True)
        rev = [torch.as_tensor(np.r_[np.arange(len(s.words))[::-1], np.arange(len(s.words), T_)], device=dev)
               for s in batch]
        Xb = torch.stack([X[r, b] for b, r in enumerate(rev)], 1)
        fw, bw = lstm(X, mask, "f"), lstm(Xb, torch.stack([mask[r, b] for b, r in enumerate(rev)], 1), "b")
        bw = torch.stack([bw[r, b] for b, r in enumerate(rev)], 1)
        out = F.linear(fw, p["W_of"], p["b_out"]) + F.linear(bw, p["W_ob"])
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), torch.as_tensor(tags.reshape(-1), device=dev),
                               reduction="sum", ignore_index=-100)

    loss_of = bilstm if kind == "bilstm" else trees

    def step(batch, train=True):
        loss = loss_of(batch)
        value = float(loss.detach())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return value
    return step


SYSTEMS = {"dynagraph:cuda": _dynagraph, "torch-gpu:per-sample": _torch_per_sample,
           "torch-gpu:hand-batched": _torch_batched}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="treelstm,treefc,bilstm")
    ap.add_argument("--H", default="256,1024")
    ap.add_argument("--batch", default="64,256")
    ap.add_argument("--batches", type=int, default=3, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args(argv)
    _need_gpu()
    from tqdm import tqdm

    from bench.params import init_arrays
    from bench.workloads import WORKLOADS, load, minibatches
    cases = [(m, int(H), int(B)) for m in args.models.split(",") for H in args.H.split(",")
             for B in args.batch.split(",")]
    print(f"{'model':9} {'H':>5} {'B':>4} " + " ".join(f"{s:>24}" for s in SYSTEMS)
          + f" {'vs hand-batched':>16} {'vs per-sample':>14}", flush=True)
    for model, H, B in (bar := tqdm(cases, desc="gpu bench")):
        w = WORKLOADS[MODELS[model]]
        samples, vocab = load(w.name, B * (args.batches + 1), 0)
        arrays = init_arrays(w.kind, H, vocab, w.n_out)
        batches = minibatches(samples, B)
        steps = {name: make(w.kind, arrays, args.lr) for name, make in SYSTEMS.items()}
        best = {name: 0.0 for name in SYSTEMS}
        for _ in range(args.rounds):  # interleaved: every system once per round
            for name, step in steps.items():
                step(batches[0], True)  # warm-up (kernel compilation, caches)
                _sync()
                t0 = time.perf_counter()
                for b in batches[1:]:
                    step(b, True)
                _sync()
                best[name] = max(best[name], B * (len(batches) - 1) / (time.perf_counter() - t0))
        dg = best["dynagraph:cuda"]
        # each row as soon as it is measured: a run cut short still reports what it had
        bar.write(f"{model:9} {H:5d} {B:4d} " + " ".join(f"{best[s]:24.1f}" for s in SYSTEMS)
                  + f" {dg / best['torch-gpu:hand-batched']:15.2f}x {dg / best['torch-gpu:per-sample']:13.1f}x")
    print("targets: >= 0.8x hand-batched PyTorch-GPU, >= 30x PyTorch-GPU per sample (samples/s, training)")


if __name__ == "__main__":
    main()
