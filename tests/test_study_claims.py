# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The second edition's pre-registered H families (H1-H5) as they complete: every figure docs/degeneracy.md §2c and the
README quote, recomputed from the committed runs (the scheduling families: `test_study_scheduling.py`)."""

from __future__ import annotations

import json

import benchmark_module
import numpy as np
import pytest

OUT = benchmark_module.BENCHMARKS / "results" / "degeneracy" / "real2"


@pytest.fixture(scope="module")
def modules():
    st = benchmark_module.load("study_stats")  # first: the analysis imports it by name
    return benchmark_module.load("degeneracy_real2_analysis"), st


def test_the_complete_lora_family_backs_the_quoted_figures(modules):
    # docs/degeneracy.md §2c, README: H1 under LoRA rank 64 at G = 4, sign vs Dr. GRPO with its own aggregation
    analysis, st = modules
    (row,) = [r for r in analysis.verdicts(OUT)["claims"] if r["cond"] == "lora"]  # a family of one claim
    assert row["id"] == "H1-lora-sign-dr_grpo" and row["n"] == 8 and row["significant"] is False
    assert row["diff"] == pytest.approx(-0.001, abs=5e-4)
    assert row["p"] == pytest.approx(0.95, abs=5e-3) and row["p_holm"] == row["p"]  # Holm over one claim
    runs = analysis.load_runs(OUT)["lora"]
    acc = {arm: [r["heldout"]["accuracy"] for r in runs[arm]] for arm in ("sign", "dr_grpo")}
    for arm, (mean, lo, hi) in {"sign": (0.706, 0.669, 0.743), "dr_grpo": (0.707, 0.688, 0.727)}.items():
        assert sum(acc[arm]) / 8 == pytest.approx(mean, abs=5e-4), arm
        assert st.t_interval(acc[arm]) == pytest.approx((lo, hi), abs=5e-4), arm
    # the difference's 95% Welch interval, [-0.041, +0.038]: it excludes the expected 0.15 and the detectable 0.098
    w = st.welch(acc["sign"], acc["dr_grpo"])
    half = st.t_quantile(0.975, w["df"]) * w["diff"] / w["t"]  # diff / t: the test's own standard error
    assert (w["diff"] - half, w["diff"] + half) == pytest.approx((-0.041, 0.038), abs=5e-4)
    power = {c["id"]: c for c in json.loads((OUT / "power.json").read_text())["claims"]}
    assert power["H1-lora-sign-dr_grpo"]["detectable_at_seeds"] == pytest.approx(0.098, abs=5e-4)
    pass8 = {arm: [r["heldout"]["pass@k"]["8"] for r in runs[arm]] for arm in acc}
    retention = {arm: [r["retention"]["accuracy"] for r in runs[arm]] for arm in acc}
    figures = {arm: [np.mean(pass8[arm]), np.mean(retention[arm])] + [
        np.mean([r[k] for r in runs[arm]]) for k in ("zero_grad_frac", "clip_frac", "informative_per_1k_tokens")]
        for arm in acc}  # fmt: skip
    assert figures["sign"] == pytest.approx([0.860, 0.972, 0.0, 0.0, 6.25], abs=5e-3)
    assert figures["dr_grpo"] == pytest.approx([0.882, 0.985, 0.154, 0.0, 7.63], abs=5e-3)
    assert analysis._base_accuracy(OUT)["retain"] == pytest.approx(0.942, abs=5e-4)  # retention's start: no erosion
    assert st.welch(pass8["sign"], pass8["dr_grpo"])["p"] > 0.05  # "pass@8 favours neither at this n"
    assert {arm: runs[arm][0]["config"]["optim"]["learning_rate"] for arm in acc} == {"sign": 1e-4, "dr_grpo": 3e-5}
    assert max(r["grad_norm_pcts"]["99"] for arm in acc for r in runs[arm]) == pytest.approx(2.3, abs=0.05)
    commits = {arm: [r["commit"][:7] for r in runs[arm]] for arm in acc}  # by seed
    assert commits["sign"] == commits["dr_grpo"] == ["750cd90"] * 2 + ["b066b24"] * 6
    warmups = {arm: [analysis.warmup_of(r)[:8] for r in runs[arm]] for arm in acc}
    assert warmups["sign"] == warmups["dr_grpo"] == ["beccf584"] + ["54bdb45a"] * 7


def test_the_trainer_and_the_final_evaluation_measure_retention_alike(modules):
    # PREREGISTRATION.md, amendment 8: H4p pairs the trainer's step-0 retention with the final evaluation's; at the
    # end of the budget the two samplers read the same weights, and on the 94 runs outside m4 finished when it was
    # written (m8 and hard: seeds 0-1) they agree: -0.0005, SE 0.002
    analysis, st = modules
    runs = analysis.load_runs(OUT)
    then = [r for cond, arms in runs.items() if cond != "m4" for v in arms.values() for r in v
            if cond not in ("m8", "hard") or r["seed"] < 2]  # fmt: skip
    diffs = [r["retain_trainer"][max(r["retain_trainer"], key=int)] - r["retention"]["accuracy"] for r in then]
    assert len(diffs) == 94
    se = float(np.std(diffs, ddof=1) / np.sqrt(len(diffs)))
    assert (float(np.mean(diffs)), se) == pytest.approx((-0.0005, 0.002), abs=2e-4)
    assert st.one_sample(diffs)["p"] > 0.05
    claims = analysis.read_claims(OUT)
    paired = [c for c in claims if c["metric"] == "retention_drop_paired"]
    assert {c["family"] for c in paired} == {"paired-m4"} and len(paired) == 6 and {c["seeds"] for c in paired} == {8}
    registered = [c["a"] for c in claims if c["metric"] == "retention_drop"]
    assert sorted(c["a"] for c in paired) == sorted(registered)  # one paired claim beside each registered H4 claim
