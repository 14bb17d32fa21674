"""Bench tables as charts (PNG, SVG or PDF, by the file's extension), with matplotlib as an
optional extra: `pip install -e '.[plot]'`. Without it, asking for a plot raises a clear
error and the bench's table is printed as before.

    grouped_bars(path, rows, group="workload", series="scheduler", value="x_lb", ...)
    lines(path, {"train loss": [..], ...}, xlabel="epoch", ...)
"""
from __future__ import annotations

import os
import tempfile
from typing import Mapping, Sequence


class PlotUnavailable(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise PlotUnavailable("plots need matplotlib: pip install -e '.[plot]'") from e
    matplotlib.use("Agg", force=True)  # files only: no display needed
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str) -> str:
    """Atomic: the chart appears complete or not at all."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in ("png", "svg", "pdf"):
        raise ValueError(f"plot path must end in .png, .svg or .pdf, got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".plot-", suffix="." + ext)
    os.close(fd)
    try:
        fig.savefig(tmp, format=ext, dpi=120, bbox_inches="tight")
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes the file private; the result is an ordinary file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def grouped_bars(path: str, rows: Sequence[Mapping], group: str, series: str, value: str, *,
                 ylabel: str = "", title: str = "", log: bool = False, hline: float | None = None,
                 hline_label: str = "") -> str:
    """One group of bars per distinct rows[group], one bar (and colour) per rows[series];
    rows without a numeric value are skipped."""
    plt = _pyplot()
    groups = list(dict.fromkeys(r[group] for r in rows))
    names = list(dict.fromkeys(r[series] for r in rows))
    val = {(r[group], r[series]): r[value] for r in rows if isinstance(r.get(value), (int, float))}
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 + 0.5 * len(groups) * len(names)), 3.6))
    for k, name in enumerate(names):
        xs = [g + (k - (len(names) - 1) / 2) * width for g in range(len(groups))]
        ys = [val.get((grp, name), 0.0) for grp in groups]
        bars = ax.bar(xs, ys, width, label=str(name))
        for b, y, grp in zip(bars, ys, groups):
            if (grp, name) in val:
                ax.annotate(f"{y:.3g}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    if hline is not None:
        ax.axhline(hline, color="k", linestyle="--", linewidth=0.8, label=hline_label or None)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([str(g) for g in groups])
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel or value)
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=min(4, len(names) + (hline is not None)))
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def lines(path: str, curves: Mapping[str, Sequence[float]], *, xlabel: str = "", ylabel: str = "",
          title: str = "", xs: Sequence[float] | None = None) -> str:
    """One line per named curve (a loss curve, accuracy per epoch)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, ys in curves.items():
        ax.plot(list(xs) if xs is not None else range(1, len(ys) + 1), list(ys), marker="o", markersize=3,
                label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)
