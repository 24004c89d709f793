# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Plots of a training run: ``python -m jaxgrpo.plot RUN_DIR [--out DIR]`` reads ``RUN_DIR/metrics.jsonl`` and writes
PNGs (matplotlib, Agg backend, no display needed) to ``DIR`` (default ``RUN_DIR/plots``):

- ``reward.png``: ``reward/mean`` per step, a ±1 std band when ``reward/std`` is logged, and a moving average;
- ``collapse.png``: the degenerate-group rate split into all-fail (bottom) and all-pass (top) groups as a stacked
  area (``degeneracy/all_fail``, ``degeneracy/all_pass``), the total ``degeneracy/collapse_rate`` (which also counts
  groups whose equal reward is neither the fail nor the pass value) and the i.i.d. prediction
  ``degeneracy/iid_rate`` (p̄^G + (1 − p̄)^G at the step's mean success rate, `jaxgrpo.degeneracy.pooled_iid_rate`);
- ``kl.png``: ``kl`` (the estimator chosen by ``algo.kl_estimator``);
- ``completion_length.png``: ``completion/len_mean`` (tokens) and, on a second axis, ``completion/truncated_frac``;
- ``diversity.png``: ``diversity/distinct_frac`` (distinct completions per group / G) and, on a second axis,
  ``diversity/entropy`` (mean per-token entropy of the sampling distribution, nats; `jaxgrpo.diversity`);
- ``retain.png``: every ``retain/<set>/accuracy`` (held-out capability retention, ``train.retain``);
- ``overview.png``: the panels in one figure.

A panel whose metrics were never logged is skipped (and reported). Exit status: 0 on success, 2 when the metrics
file is missing or holds no records.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxgrpo.files import output_dir_error  # noqa: E402
from jaxgrpo.metrics_log import read_metrics  # noqa: E402


def series(records: Sequence[dict[str, Any]], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of metric `name` over the records that hold it (nan where it was logged as null)."""
    pts = [(r["step"], r[name]) for r in records if name in r]
    if not pts:
        return np.zeros(0), np.zeros(0)
    steps, vals = zip(*pts)
    return np.asarray(steps, float), np.asarray([math.nan if v is None else v for v in vals], float)


def moving_average(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` finite values (nan-aware); the first entries average what exists."""
    finite = np.isfinite(y)
    c = np.concatenate([[0.0], np.cumsum(np.where(finite, y, 0.0))])
    n = np.concatenate([[0], np.cumsum(finite)])
    hi = np.arange(1, len(y) + 1)
    lo = np.maximum(hi - window, 0)
    cnt = n[hi] - n[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, (c[hi] - c[lo]) / np.maximum(cnt, 1), np.nan)


def _reward(ax: plt.Axes, records: Sequence[dict[str, Any]]) -> bool:
    x, y = series(records, "reward/mean")
    if not len(x):
        return False
    ax.plot(x, y, color="tab:blue", lw=1, alpha=0.6 if len(x) >= 20 else 1.0, label="reward/mean")
    xs, sd = series(records, "reward/std")
    if len(xs) == len(x) and np.array_equal(xs, x):
        ax.fill_between(x, y - sd, y + sd, color="tab:blue", alpha=0.15, lw=0, label="± reward/std")
    if len(x) >= 20:
        ax.plot(x, moving_average(y, max(2, len(x) // 20)), color="tab:blue", lw=2, label="moving average")
    ax.set_title("reward")
    ax.set_ylabel("mean reward")
    return True


def _collapse(ax: plt.Axes, records: Sequence[dict[str, Any]]) -> bool:
    xf, fail = series(records, "degeneracy/all_fail")
    xp, npass = series(records, "degeneracy/all_pass")
    xc, total = series(records, "degeneracy/collapse_rate")
    xi, iid = series(records, "degeneracy/iid_rate")
    if not (len(xf) or len(xp) or len(xc)):
        return False
    if len(xf) and len(xp) and np.array_equal(xf, xp):
        ax.stackplot(
            xf,
            np.nan_to_num(fail),
            np.nan_to_num(npass),
            labels=["all-fail groups", "all-pass groups"],
            colors=["tab:red", "tab:green"],
            alpha=0.45,
        )
    else:
        for xs, ys, lab, col in ((xf, fail, "all-fail groups", "tab:red"), (xp, npass, "all-pass groups", "tab:green")):
            if len(xs):
                ax.plot(xs, ys, color=col, label=lab)
    if len(xc):
        ax.plot(xc, total, color="black", lw=1, label="collapse rate (all degenerate)")
    if len(xi):
        ax.plot(xi, iid, color="tab:purple", lw=1, ls="--", label="i.i.d. prediction p̄^G+(1−p̄)^G")
    ax.set_ylim(0, 1.02)
    ax.set_title("degenerate groups")
    ax.set_ylabel("fraction of groups")
    return True


def _kl(ax: plt.Axes, records: Sequence[dict[str, Any]]) -> bool:
    x, y = series(records, "kl")
    if not len(x):
        return False
    ax.plot(x, y, color="tab:orange", label="kl")
    ax.set_title("KL to the reference policy")
    ax.set_ylabel("KL (per token)")
    return True


def _length(ax: plt.Axes, records: Sequence[dict[str, Any]]) -> bool:
    x, y = series(records, "completion/len_mean")
    if not len(x):
        return False
    ax.plot(x, y, color="tab:brown", label="mean completion length")
    ax.set_title("completion length")
    ax.set_ylabel("tokens")
    xt, tr = series(records, "completion/truncated_frac")
    if len(xt):
        ax2 = ax.twinx()
        ax2.plot(xt, tr, color="tab:gray", lw=1, ls=":", label="truncated fraction")
        ax2.set_ylim(0, 1.02)
        ax2.set_ylabel("truncated fraction")
        ax2.legend(loc="upper right", fontsize=8)
    return True


def _diversity(ax: plt.Axes, records: Sequence[dict[str, Any]]) -> bool:
    x, y = series(records, "diversity/distinct_frac")
    xe, ent = series(records, "diversity/entropy")
    if not (len(x) or len(xe)):
        return False
    if len(x):
        ax.plot(x, y, color="tab:cyan", label="distinct completions / G")
    ax.set_ylim(0, 1.02)
    ax.set_title("diversity of the sampled groups")
    ax.set_ylabel("distinct fraction")
    if len(xe):
        ax2 = ax.twinx()
        ax2.plot(xe, ent, color="tab:olive", lw=1, ls="--", label="entropy per token (nats)")
        ax2.set_ylim(bottom=0)
        ax2.set_ylabel("entropy (nats)")
        ax2.legend(loc="upper right", fontsize=8)
    return True


def _retain(ax: plt.Axes, records: Sequence[dict[str, Any]]) -> bool:
    names = sorted({k for r in records for k in r if k.startswith("retain/") and k.endswith("/accuracy")})
    if not names:
        return False
    for name in names:
        x, y = series(records, name)
        ax.plot(x, y, "o-", ms=3, label=name[len("retain/"):-len("/accuracy")])
    ax.set_ylim(0, 1.02)
    ax.set_title("capability retention (held-out accuracy)")
    ax.set_ylabel("accuracy")
    return True


PANELS: dict[str, Callable[[plt.Axes, Sequence[dict[str, Any]]], bool]] = {
    "reward": _reward,
    "collapse": _collapse,
    "kl": _kl,
    "completion_length": _length,
    "diversity": _diversity,
    "retain": _retain,
}


def _finish(ax: plt.Axes) -> None:
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)


def plot_run(run_dir: str | pathlib.Path, out_dir: str | pathlib.Path | None = None) -> list[pathlib.Path]:
    """Writes the PNGs listed in the module docstring for `run_dir`; returns their paths (skipped panels absent).

    Raises FileNotFoundError when `run_dir/metrics.jsonl` is missing and ValueError when it holds no records.
    """
    run_dir = pathlib.Path(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise ValueError(f"{run_dir} has an empty metrics.jsonl: nothing to plot")
    out = pathlib.Path(out_dir) if out_dir is not None else (run_dir if run_dir.is_dir() else run_dir.parent) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written: list[pathlib.Path] = []
    drawn = []
    for name, draw in PANELS.items():
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        if draw(ax, records):
            _finish(ax)
            fig.tight_layout()
            path = out / f"{name}.png"
            fig.savefig(path, dpi=110)
            written.append(path)
            drawn.append(name)
        plt.close(fig)
    if drawn:
        fig, axes = plt.subplots(2, 3, figsize=(18, 7.5))
        for ax, name in zip(axes.flat, PANELS):
            if name in drawn:
                PANELS[name](ax, records)
                _finish(ax)
            else:
                ax.set_axis_off()
                ax.set_title(f"{name}: not logged")
        fig.suptitle(f"{run_dir.name}: {len(records)} logged steps (last step {records[-1]['step']})")
        fig.tight_layout()
        path = out / "overview.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxgrpo.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="run directory holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="output directory for the PNGs (default RUN_DIR/plots)")
    args = parser.parse_args(argv)
    bad_out = output_dir_error(args.out, "--out")
    if bad_out:
        print(f"jaxgrpo.plot: error: {bad_out}", file=sys.stderr)
        return 2
    try:
        paths = plot_run(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"jaxgrpo.plot: error: {e}", file=sys.stderr)
        return 2
    skipped = [n for n in PANELS if not any(p.stem == n for p in paths)]
    for p in paths:
        print(p)
    if skipped:
        print(f"jaxgrpo.plot: not logged, skipped: {', '.join(skipped)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
