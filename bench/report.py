"""Ratios and the printed table for bench/run.py results."""
from __future__ import annotations

from itertools import groupby

CONFIG_KEYS = ("workload", "mode", "H")
SPLIT = ("record", "schedule", "execute", "memory", "backward", "update", "other")


def _key(r: dict) -> tuple:
    return tuple(r[k] for k in CONFIG_KEYS)


def add_ratios(results: list[dict]) -> None:
    """Set `vs_dynet_best` = samples/s over the best DyNet autobatch mode of the same config."""
    best: dict = {}
    for r in results:
        sps = r.get("samples_per_sec")
        if r["system"] == "dynet" and sps and sps > best.get(_key(r), (0.0, ""))[0]:
            best[_key(r)] = (sps, r["label"])
    for r in results:
        b = best.get(_key(r))
        sps = r.get("samples_per_sec")
        r["dynet_best"] = b[1] if b else None
        r["vs_dynet_best"] = sps / b[0] if b and sps else None


def _fmt_split(r: dict) -> str:
    s = r.get("time_split")
    if not s:
        return ""
    return " ".join(f"{100 * s[k]:4.0f}" for k in SPLIT)


def _fmt_batches(r: dict) -> str:
    last = r.get("last_step")
    return f"{last['batches']}/{last['lower_bound']}" if last else ""


def row(r: dict) -> str:
    head = f"{r['workload']:<13}{r['mode']:<6}{r['H']:>4}  {r['label']:<18}"
    if r.get("error"):
        return head + "error: " + r["error"].splitlines()[0][:90]
    ratio = f"{r['vs_dynet_best']:.2f}x" if r.get("vs_dynet_best") else "-"
    loss = r["losses"][0] if r.get("losses") else float("nan")
    return (head + f"{r['samples_per_sec']:>10.1f}{ratio:>9}{loss:>12.4f}{_fmt_batches(r):>14}   "
            + _fmt_split(r))


def table(results: list[dict]) -> str:
    header = (f"{'workload':<13}{'mode':<6}{'H':>4}  {'system':<18}{'samples/s':>10}{'vs DyNet':>9}"
              f"{'loss[0]':>12}{'batches/LB':>14}   " + " ".join(f"{k[:4]:>4}" for k in SPLIT) + "  (% of step)")
    lines = [header, "-" * len(header)]
    for _, group in groupby(results, key=_key):
        lines += [row(r) for r in group]
        lines.append("")
    return "\n".join(lines).rstrip()
