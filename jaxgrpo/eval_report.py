# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`jaxgrpo.eval`'s report: ``eval.json``, the success histogram and degeneracy figures, and the summary lines."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any


def write_report(result: dict[str, Any], out_dir: str | os.PathLike) -> list[pathlib.Path]:
    """Writes ``eval.json``, ``success_histogram.png`` and ``degeneracy_vs_group_size.png`` to `out_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "eval.json"]
    paths[0].write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")

    hist = result["success_histogram"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    width = 0.8 / max(result["num_samples"], 1)
    ax.bar(hist["rate"], hist["prompts"], width=width, color="tab:blue")
    ax.set_xlabel(f"per-prompt success rate c/n (n = {result['num_samples']})")
    ax.set_ylabel("prompts")
    ax.set_title(f"success rates of {result['num_prompts']} prompts (mean {result['mean_success_rate']:.3f})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "success_histogram.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    deg = result["degeneracy"]
    if deg:
        g = [d["group_size"] for d in deg]
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        ax.plot(g, [d["measured"] for d in deg], "o-", color="black", label="measured (hypergeometric)")
        ax.plot(g, [d["all_fail"] for d in deg], "v:", color="tab:red", label="  all-fail part")
        ax.plot(g, [d["all_pass"] for d in deg], "^:", color="tab:green", label="  all-pass part")
        ax.plot(g, [d["iid"] for d in deg], "s--", color="tab:purple", label="i.i.d. prediction p̄^G+(1−p̄)^G")
        if len(g) > 1 and min(g) > 0 and max(g) / min(g) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(g, [str(x) for x in g])
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("group size G")
        ax.set_ylabel("probability a group is degenerate")
        ax.set_title("degenerate groups vs group size (Jensen gap = measured − i.i.d.)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "degeneracy_vs_group_size.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def format_summary(result: dict[str, Any]) -> str:
    """A few human-readable lines: pass@k and the degeneracy table."""
    lines = [
        f"{result['num_prompts']} prompts × {result['num_samples']} samples, mean success rate "
        f"{result['mean_success_rate']:.4f}",
        "  " + "  ".join(f"pass@{k} {v:.4f}" for k, v in result["pass@k"].items()),
        "  G   measured  i.i.d.   gap      informative groups / 1k sampled tokens",
    ]
    for d in result["degeneracy"]:
        per_tok = f"{d['informative_per_1k_tokens']:.3f}" if "informative_per_1k_tokens" in d else "n/a"
        lines.append(f"  {d['group_size']:<3d} {d['measured']:.4f}    {d['iid']:.4f}   {d['gap']:+.4f}  {per_tok}")
    if "schedule" in result:
        from jaxgrpo.eval_schedule import format_schedule

        lines += format_schedule(result["schedule"])
    return "\n".join(lines)
