# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The skip-rule simulation (`benchmarks/schedule_sim.py`, docs/degeneracy.md §4): its calibration against Monte
Carlo draws, GRPO's informative share against the closed form, and the committed results it quotes reproduced."""

from __future__ import annotations

import json

import benchmark_module
import numpy as np
import pytest

sim = benchmark_module.load("schedule_sim")
RESULTS = benchmark_module.BENCHMARKS / "results" / "schedule_sim.json"


def test_calibration_matches_monte_carlo_beta_draws():
    a, b = sim.calibrate()
    p = np.random.default_rng(0).beta(a, b, 2_000_000)
    assert p.mean() == pytest.approx(0.402, abs=1e-3)  # the warmed-up model's level-4 accuracy
    assert np.mean(p**4 + (1 - p) ** 4) == pytest.approx(0.751, abs=1e-3)  # m4pool's flat share under GRPO
    assert sim.flat_probability(a, b, 4) == pytest.approx(0.751, abs=1e-9)
    with pytest.raises(ValueError, match="no Beta"):
        sim.calibrate(0.5, 0.05)  # below the flat share of a point mass at 1/2 (2/16)


def test_grpo_informative_share_is_the_closed_form():
    # without a schedule every prompt is drawn once a pass: the expected share is mean_i(1 - p_i^G - (1 - p_i)^G)
    p0 = np.linspace(0.02, 0.98, 64)
    runs = [sim.simulate(p0, 20, seed, None)["informative_per_group"] for seed in range(10)]
    want = np.mean(1 - p0**4 - (1 - p0) ** 4)
    se = np.sqrt(want * (1 - want) / (20 * 64 * 10))
    assert np.mean(runs) == pytest.approx(want, abs=4 * se)


def test_committed_results_reproduce_and_back_the_quoted_figures():
    res = json.loads(RESULTS.read_text())
    rows = {(c["learn"], c["passes"], c["arm"]): c for c in res["cells"]}
    fresh = sim.cell(0.0, 6, res["seeds"], tuple(res["beta"]))  # the fixed policy at m4pool's ~6 passes
    assert fresh == [rows[(0.0, 6, arm)] for arm in sim.ARMS]  # deterministic: equal to the last digit
    # docs/degeneracy.md §4, "What a skip rule can gain"
    q = lambda learn, arm, f="ratio_to_grpo": rows[(learn, 6, arm)][f]  # noqa: E731
    assert q(0.0, "skip") == pytest.approx(1.60, abs=5e-3) and q(0.0, "skip", "predictor_precision") == pytest.approx(
        0.77, abs=5e-3)  # fmt: skip
    assert rows[(0.0, 6, "skip")]["ratio_ci95"] == pytest.approx([1.53, 1.66], abs=5e-3)
    assert [round(q(learn, "skip"), 2) for learn in sim.LEARN] == [1.60, 1.33, 1.16, 1.04]
    assert rows[(0.0, 6, "skip + target 0.25")]["vs_skip"]["diff"] == pytest.approx(0.023, abs=5e-4)
    assert rows[(0.0, 6, "skip + target 0.25")]["vs_skip"]["p"] == pytest.approx(0.00005, abs=5e-6)
    assert all(rows[(learn, 6, "skip + target 0.25")]["vs_skip"]["p"] > 0.05 for learn in sim.LEARN[1:])
    assert [round(q(learn, "grpo", "reward_last_quarter"), 2) for learn in sim.LEARN] == [0.41, 0.50, 0.56, 0.60]


def test_the_real_m4pool_grpo_trajectory_quoted_beside_it():
    # "GRPO's training reward rose from 0.56 in the first quarter of its steps to 0.88 in the last, and its share of
    # flat groups from 0.63 to 0.85": per run, the mean over each quarter of its steps; then the mean over seeds
    runs = sorted((benchmark_module.BENCHMARKS / "results" / "degeneracy" / "real2" / "m4pool" / "grpo").glob(
        "seed*/metrics.jsonl"))  # fmt: skip
    assert len(runs) == 8
    quarters = []
    for path in runs:
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        recs = [x for x in recs if x["step"] > 0 and "tokens/sampled" in x]
        q = len(recs) // 4
        quarters.append([np.mean([x[k] for x in part]) for k in ("reward/mean", "degeneracy/collapse_rate")
                         for part in (recs[:q], recs[3 * q:])])  # fmt: skip
    assert np.mean(quarters, axis=0) == pytest.approx([0.56, 0.88, 0.63, 0.85], abs=5e-3)
