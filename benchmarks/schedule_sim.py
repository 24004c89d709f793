# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""How much can skipping predicted-degenerate prompts gain, and after how many passes over the data set? A simulation
of `jaxgrpo.scheduler` on a fixed policy, calibrated to the second edition's matched level (`m4pool`).

No model is trained. A pool of N prompts starts with success probabilities p_i ~ Beta(a, b), their mean the
warmed-up model's level-4 held-out accuracy (0.402) and their spread set so a G = 4 group is degenerate with
probability E[p^4 + (1 - p)^4] = 0.751, the share of degenerate groups among those GRPO sampled in `m4pool`
(docs/degeneracy.md §4). Each step draws P prompts from `jaxgrpo.data.PromptIterator` (shuffled passes, as the
trainer) through the real `Scheduler.select` and `jaxgrpo.scheduled.record_step`, samples G Bernoulli(p_i) rewards per
kept prompt, and spends G samples per group until a budget of R passes' samples (R·N·G) is spent. The figure is
informative groups per sampled group (per sampled token, up to the mean completion length, equal across arms in
`m4pool`).

``learn`` = 0 is a fixed policy, the predictor's best case: a prompt that was flat stays as likely to be flat. The
real runs learn, so prompts become flat as the policy masters them, and the history describes a policy that is gone.
A crude stand-in for that: each informative group of prompt i (the only groups with a gradient) adds ``learn`` to
the log-odds of p_i. It moves prompts one at a time; a real policy also generalizes across prompts.

Usage: ``python benchmarks/schedule_sim.py [--seeds 20] [--out benchmarks/results/schedule_sim.json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import study_stats  # noqa: E402

from jaxgrpo import scheduled, scheduler  # noqa: E402
from jaxgrpo.data import PromptIterator  # noqa: E402

MEAN = 0.402  # the warmed-up model's level-4 held-out accuracy (docs/degeneracy.md §4, `m4pool`)
FLAT_G4 = 0.751  # 1 - 0.249: the share of GRPO's sampled groups that were degenerate in `m4pool`
POOL, P, G = 64, 4, 4
PASSES = (2, 6, 20, 60)  # `m4pool`: ~6 passes over its 64 prompts within the equal budget
LEARN = (0.0, 0.5, 1.0, 2.0)  # log-odds added to a prompt per informative group of it
ARMS = {"grpo": None, "skip": {}, "skip + target 0.25": {"target": 0.25}}


def beta_moment(a: float, b: float, k: int) -> float:
    """E[p^k] of Beta(a, b): prod_{j<k} (a + j) / (a + b + j)."""
    return math.prod((a + j) / (a + b + j) for j in range(k))


def flat_probability(a: float, b: float, g: int) -> float:
    """P(a group of g is degenerate) = E[p^g] + E[(1 - p)^g] under p ~ Beta(a, b)."""
    return beta_moment(a, b, g) + beta_moment(b, a, g)


def calibrate(mean: float = MEAN, flat: float = FLAT_G4, g: int = G) -> tuple[float, float]:
    """Beta(a, b) with mean `mean` whose g-groups are degenerate with probability `flat` (bisection on a + b; a larger
    a + b concentrates p near the mean and makes flat groups rarer)."""
    lo, hi = 1e-4, 1e4
    if not flat_probability(mean * hi, (1 - mean) * hi, g) < flat < flat_probability(mean * lo, (1 - mean) * lo, g):
        raise ValueError(f"no Beta with mean {mean} gives a flat share of {flat} at G = {g}")
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if flat_probability(mean * mid, (1 - mean) * mid, g) > flat else (lo, mid)
    c = math.sqrt(lo * hi)
    return mean * c, (1 - mean) * c


def simulate(p0: np.ndarray, passes: int, seed: int, arm: dict | None, learn: float = 0.0) -> dict[str, float]:
    """One run at a budget of ``passes`` passes: informative groups per sampled group, prompts skipped, the predictor's
    precision (`Scheduler.precision`: of the kept prompts predicted flat, the share that were) and the mean reward of
    the first and last quarter of the steps."""
    n = len(p0)
    logit = np.log(p0) - np.log1p(-p0)
    it = PromptIterator(list(range(n)), P, seed)
    sch = None if arm is None else scheduler.Scheduler(scheduler.Settings(group_size=G, **arm), seed)
    rng = np.random.default_rng([seed, 2])
    informative, reward = 0, []  # reward: each step's mean; its length is the step count
    while len(reward) * P < passes * n:  # the budget: passes * n groups of G samples
        step = len(reward)
        kept = it.next_batch(P) if sch is None else sch.select(it.next_batch, P, step, max_draws=max(100 * P, n))[0]
        rewards = (rng.random((P, G)) < 1.0 / (1.0 + np.exp(-logit[kept]))[:, None]).astype(np.float32)
        flat = rewards.min(axis=1) == rewards.max(axis=1)
        if sch is not None:
            scheduled.record_step(sch, [(kept, rewards, np.ones_like(rewards, bool), flat)])
        np.add.at(logit, np.asarray(kept)[~flat], learn)
        informative += int((~flat).sum())
        reward.append(float(rewards.mean()))
    q = max(len(reward) // 4, 1)
    return {"informative_per_group": informative / (len(reward) * P),
            "skipped": 0 if sch is None else sch.skipped_total,
            "precision": 0.0 if sch is None else sch.precision, "reward_first": float(np.mean(reward[:q])),
            "reward_last": float(np.mean(reward[-q:]))}


def cell(learn: float, passes: int, seeds: int, beta: tuple[float, float]) -> list[dict]:
    """One (learn, passes) cell: every arm on the same pools and seeds (seed s draws its pool from
    ``default_rng([s, 1])``); the ratios to GRPO and the target's difference to the fixed base are paired by seed."""
    per_arm: dict[str, list[dict]] = {name: [] for name in ARMS}
    for seed in range(seeds):
        p0 = np.clip(np.random.default_rng([seed, 1]).beta(*beta, POOL), 1e-6, 1 - 1e-6)
        for name, arm in ARMS.items():
            per_arm[name].append(simulate(p0, passes, seed, arm, learn))
    share = {name: np.asarray([r["informative_per_group"] for r in rs]) for name, rs in per_arm.items()}
    out = []
    for name, rs in per_arm.items():
        ratio = share[name] / share["grpo"]
        row = {"learn": learn, "passes": passes, "arm": name, "informative_per_group": float(share[name].mean()),
               "ratio_to_grpo": float(ratio.mean()),
               "ratio_ci95": list(study_stats.t_interval(ratio)) if name != "grpo" else [1.0, 1.0],
               "skipped_per_run": float(np.mean([r["skipped"] for r in rs])),
               "predictor_precision": float(np.mean([r["precision"] for r in rs])),
               "reward_first_quarter": float(np.mean([r["reward_first"] for r in rs])),
               "reward_last_quarter": float(np.mean([r["reward_last"] for r in rs]))}  # fmt: skip
        if name == "skip + target 0.25":  # paired over seeds against the fixed base
            diff = share[name] - share["skip"]
            row["vs_skip"] = {"diff": float(diff.mean()), "p": study_stats.one_sample(diff)["p"]}
        out.append(row)
    return out


def run(seeds: int) -> dict:
    """Every (learn, passes) cell (`cell`)."""
    a, b = calibrate()
    return {"beta": [a, b], "pool": POOL, "P": P, "G": G, "seeds": seeds, "flat_g4": flat_probability(a, b, G),
            "cells": [row for learn in LEARN for passes in PASSES for row in cell(learn, passes, seeds, (a, b))]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent / "results" / "schedule_sim.json")
    args = ap.parse_args(argv)
    res = run(args.seeds)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"Beta({res['beta'][0]:.3f}, {res['beta'][1]:.3f}): a G = {G} group is flat with probability "
          f"{res['flat_g4']:.3f}; pool {POOL}, P = {P}, {args.seeds} seeds")
    print("| learn | passes | arm | informative groups per sampled group | × GRPO [95% t interval] | prompts skipped "
          "| predictor precision | reward, first → last quarter |")
    print("|---|---|---|---|---|---|---|---|")
    for c in res["cells"]:
        lo, hi = c["ratio_ci95"]
        vs = c.get("vs_skip")
        vs = f" (target − fixed {vs['diff']:+.3f}, paired p {vs['p']:.2g})" if vs else ""
        print(f"| {c['learn']} | {c['passes']} | {c['arm']} | {c['informative_per_group']:.3f} | "
              f"{c['ratio_to_grpo']:.2f} [{lo:.2f}, {hi:.2f}]{vs} | {c['skipped_per_run']:.0f} | "
              f"{c['predictor_precision']:.2f} | {c['reward_first_quarter']:.2f} → {c['reward_last_quarter']:.2f} |")

if __name__ == "__main__":
    main()
