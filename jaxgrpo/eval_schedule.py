# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""What a degeneracy-aware schedule buys, measured by `jaxgrpo.eval`: informative groups per sampled token, and the
schedule's predictor judged against fresh samples.

From ``n`` samples of each of P prompts (c_i successes, mean completion length L_i tokens), ``d_i(G)`` is the
probability that G draws without replacement are all-pass or all-fail (`jaxgrpo.eval.degenerate_probability`, the
unbiased estimate of the i.i.d. rate at the prompt's true success probability). A group of G samples of prompt i then
costs ``G·L_i`` sampled tokens in expectation and is informative with probability ``1 − d_i(G)``; over a set of
prompts sampled with keep probability ``k_i`` and group size ``G_i`` (the schedule's decisions,
`jaxgrpo.scheduler`), the informative groups per 1,000 sampled tokens are the ratio of expectations

    I = 1000 · Σ_i k_i (1 − d_i(G_i)) / Σ_i k_i G_i L_i

(``k_i = 1``, ``G_i = G`` without a schedule). The ratio of two such figures for the same prompts is the schedule's
gain in the quantity issue "degeneracy-aware scheduling" targets (≥ 1.5× resample's). The predictor: a prompt whose
history ends in a streak of all-pass or all-fail groups is predicted degenerate (GRESO's rule); its precision here is
the mean of ``d_i(G)`` over the predicted prompts at the run's G (how often a fresh group of the current policy is in
fact flat), and its recall the share of ``Σ_i d_i(G)`` they hold. Prompts are matched to the run's history by their
text (prompt and answer) in the run's own training data, so any split whose prompts the run trained on works
(``--split train``); prompts the run never saw have no history (keep 1, G at the prior's size).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxgrpo import scheduler as scheduler_lib
from jaxgrpo.eval_stats import degenerate_probability


def informative_per_1k_tokens(counts: Sequence[int] | np.ndarray, n: int, lengths: Sequence[float] | np.ndarray,
                              group_sizes: int | Sequence[int] | np.ndarray,
                              keep: Sequence[float] | np.ndarray | None = None) -> float:
    """``I = 1000 · Σ k_i (1 − d_i(G_i)) / Σ k_i G_i L_i`` (module docstring) from each prompt's success count
    ``counts[i]`` of ``n`` samples, mean completion length ``lengths[i]``, group size ``group_sizes`` (one G or one
    per prompt, each <= n) and keep probability ``keep`` (None = every prompt sampled). 0.0 when nothing is sampled."""
    c = np.asarray(counts, np.int64)
    sizes = np.broadcast_to(np.asarray(group_sizes, np.int64), c.shape)
    k = np.ones(c.shape) if keep is None else np.asarray(keep, np.float64)
    lengths = np.asarray(lengths, np.float64)
    if not (c.shape == lengths.shape == k.shape):
        raise ValueError(f"counts {c.shape}, lengths {lengths.shape} and keep {k.shape} must have one entry per prompt")
    if sizes.size and int(sizes.max()) > n:
        raise ValueError(f"group size {int(sizes.max())} > n = {n} samples per prompt: evaluate with more samples")
    d = np.asarray([degenerate_probability(n, int(ci), int(g)) for ci, g in zip(c, sizes)], np.float64)
    tokens = float(np.sum(k * sizes * lengths))
    return 1000.0 * float(np.sum(k * (1.0 - d))) / tokens if tokens > 0 else 0.0


def history_indices(examples: Sequence[Any], trained_on: Sequence[Any]) -> list[int | None]:
    """Each example's index in the run's training examples (the keys of the schedule's history), matched on
    (prompt, answer); None for an example the run's data does not hold."""
    where: dict[tuple[str, str], int] = {}
    for i, ex in enumerate(trained_on):
        where.setdefault((ex.prompt, ex.answer), i)
    return [where.get((ex.prompt, ex.answer)) for ex in examples]


def schedule_report(result: dict[str, Any], sched: scheduler_lib.Scheduler, indices: Sequence[int | None],
                    lengths: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """The schedule's figures on an evaluation (`jaxgrpo.eval.summarize`'s ``result`` with ``success_counts``,
    ``num_samples``; the history `sched`; each prompt's history index and mean completion length): the expected
    skip share and keep probabilities, the group sizes it would draw, informative groups per 1,000 sampled tokens with
    and without it, and the predictor's precision and recall at the run's G (module docstring)."""
    s, n = sched.settings, int(result["num_samples"])
    c = np.asarray(result["success_counts"], np.int64)
    if len(indices) != len(c) or len(lengths) != len(c):
        raise ValueError(f"{len(indices)} history indices and {len(lengths)} lengths for {len(c)} prompts")
    if s.group_size > n:
        raise ValueError(f"the run's group size {s.group_size} > n = {n} samples per prompt: evaluate with "
                         f"--num-samples {s.group_size} or more")  # fmt: skip
    known = [i is not None and i in sched.records for i in indices]
    keep = np.asarray([sched.keep_probability(i) if k else 1.0 for i, k in zip(indices, known)])
    if s.adaptive:  # each prompt's own Neyman size (no per-step budget: the evaluation is not one step)
        ps = [sched.records[i].p if k else 0.5 for i, k in zip(indices, known)]
        sizes = scheduler_lib.allocate(ps, s.group_size, s.min_group)
    else:
        sizes = np.full(len(c), s.group_size, np.int64)
    d = np.asarray([degenerate_probability(n, int(ci), s.group_size) for ci in c], np.float64)
    predicted = np.asarray([k and sched.predicts_degenerate(i) for i, k in zip(indices, known)], bool)
    values, counts = np.unique(sizes, return_counts=True)
    return {
        "group_size": int(s.group_size),
        "prompts_with_history": int(sum(known)),
        "skip_share": float(np.mean(1.0 - keep)),
        "group_sizes": {str(int(v)): int(m) for v, m in zip(values, counts)},
        "informative_per_1k_tokens": informative_per_1k_tokens(c, n, lengths, s.group_size),
        "informative_per_1k_tokens_scheduled": informative_per_1k_tokens(c, n, lengths, sizes, keep),
        "predicted_degenerate": int(predicted.sum()),
        "predictor_precision": float(d[predicted].mean()) if predicted.any() else None,
        "predictor_recall": float(d[predicted].sum() / d.sum()) if d.sum() > 0 else None,
    }


def format_schedule(rep: dict[str, Any]) -> list[str]:
    """Human-readable lines for `schedule_report`'s dict."""
    ratio = (rep["informative_per_1k_tokens_scheduled"] / rep["informative_per_1k_tokens"]
             if rep["informative_per_1k_tokens"] > 0 else float("nan"))  # fmt: skip
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    return [
        f"  schedule at G={rep['group_size']}: {rep['prompts_with_history']} prompts with history, expected skip "
        f"{rep['skip_share']:.3f}, sizes {rep['group_sizes']}",
        f"  informative groups / 1k sampled tokens: {rep['informative_per_1k_tokens']:.3f} unscheduled, "
        f"{rep['informative_per_1k_tokens_scheduled']:.3f} scheduled ({ratio:.2f}x)",
        f"  predictor: {rep['predicted_degenerate']} predicted degenerate, "
        f"precision {fmt(rep['predictor_precision'])}, recall {fmt(rep['predictor_recall'])}",
    ]


def load_history(cfg: Any, run_dir: Any, step: int | None) -> scheduler_lib.Scheduler | None:
    """The schedule history saved with checkpoint `step` (None = the latest) of `run_dir`; None when the run has no
    schedule (``rollout.schedule=none``) or the checkpoint holds none."""
    from jaxgrpo import checkpoint as ckpt_lib

    sched = scheduler_lib.from_config(cfg)
    if sched is None or run_dir is None:
        return None
    with ckpt_lib.CheckpointManager(ckpt_lib.run_checkpoint_dir(run_dir), keep=10**6, save_interval=0) as mgr:
        extra = mgr.read_extra(step)
    if "scheduler" not in extra:
        return None
    sched.restore(extra["scheduler"])
    return sched
