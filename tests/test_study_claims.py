# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The second edition's pre-registered H families (H1-H5) as they complete: every figure docs/degeneracy.md §2c and the
README quote, recomputed from the committed runs (the scheduling families: `test_study_scheduling.py`)."""

from __future__ import annotations

import json

import benchmark_module
import numpy as np
import pytest

from jaxgrpo import metrics_log

OUT = benchmark_module.BENCHMARKS / "results" / "degeneracy" / "real2"


@pytest.fixture(scope="module")
def modules():
    st = benchmark_module.load("study_stats")  # first: the analysis imports it by name
    return benchmark_module.load("degeneracy_real2_analysis"), st


@pytest.fixture(scope="module")
def verdict_rows(modules) -> list[dict]:
    """The analysis's verdict rows from the committed runs, computed once for the module's tests (read only)."""
    return modules[0].verdicts(OUT)["claims"]


def test_the_complete_lora_family_backs_the_quoted_figures(modules, verdict_rows):
    # docs/degeneracy.md §2c, README: H1 under LoRA rank 64 at G = 4, sign vs Dr. GRPO with its own aggregation
    analysis, st = modules
    (row,) = [r for r in verdict_rows if r["cond"] == "lora"]  # a family of one claim
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
    cells = {(c["cond"], c["family"], c["seeds"]) for c in paired}
    assert cells == {("m4", "paired-m4", 8), ("hard", "paired-hard", 10)}
    registered = sorted(c["a"] for c in claims if c["metric"] == "retention_drop")  # H4: m4's six arms
    for family in ("paired-m4", "paired-hard"):  # one paired claim per arm (amendments 8 and 9)
        assert sorted(c["a"] for c in paired if c["family"] == family) == registered, family


def test_amendment_9_adds_its_families_beside_the_registered_hard_claims(modules):
    # PREREGISTRATION.md, amendment 9: held-out accuracy with the escape claims' pairs and directions (acc-hard) and
    # the paired retention drop per arm (paired-hard), in families of their own; the registered hard family unchanged
    analysis, _ = modules
    claims = analysis.read_claims(OUT)
    family = lambda name: [c for c in claims if analysis.family_of(c) == name]  # noqa: E731
    escape = family("hard")
    assert len(escape) == 3 and {c["metric"] for c in escape} == {"escape"}
    assert [(c["a"], c["b"]) for c in family("acc-hard")] == [(c["a"], c["b"]) for c in escape]
    assert {(c["metric"], c["seeds"], c["effect"]) for c in family("acc-hard")} == {("accuracy", 10, 0.05)}
    arms = benchmark_module.load("degeneracy_real2").CONDITIONS["hard"].arms  # the runner's grid
    assert sorted(c["a"] for c in family("paired-hard")) == sorted(f"{arm}@start" for arm in arms) and len(arms) == 6
    power = {c["id"]: c for c in json.loads((OUT / "power.json").read_text())["claims"]}
    assert {c["id"] for c in claims} == set(power)  # a power row per claim
    added = [power[c["id"]] for c in family("acc-hard") + family("paired-hard")]
    assert sorted({round(r["detectable_at_seeds"], 3) for r in added}) == [0.074, 0.102]  # the amendment's figures


def test_the_committed_verdicts_are_those_of_the_committed_runs(modules, verdict_rows):
    # benchmarks/results/degeneracy/real2/verdicts.json (`--part analyze`) is current: every claim has its verdict,
    # and recomputing from the committed runs gives the same rows
    analysis, _ = modules
    committed = json.loads((OUT / "verdicts.json").read_text())
    assert len(committed["claims"]) == len(analysis.read_claims(OUT)) == 44
    assert all(row["verdict"] is not None for row in committed["claims"])
    recomputed = json.loads(json.dumps(verdict_rows))
    assert [row["id"] for row in committed["claims"]] == [row["id"] for row in recomputed]
    for got, want in zip(committed["claims"], recomputed):  # strings and flags exactly, figures to float noise
        figures = [k for k, v in want.items() if isinstance(v, float)]
        assert {k: v for k, v in got.items() if k not in figures} == {k: v for k, v in want.items() if k not in figures}
        assert [got[k] for k in figures] == pytest.approx([want[k] for k in figures], rel=1e-9), got["id"]


def _holm(ps):
    """Holm's step-down adjustment, written out here (the independent reference for the analysis's `st.holm`)."""
    order, adjusted, running = sorted(range(len(ps)), key=lambda i: ps[i]), [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def _check_welch(rows: dict, acc: dict, welch: dict) -> None:
    """Each claim's difference and 95% Welch interval as quoted, and its p as scipy's own Welch test gives it."""
    from scipy import stats  # a dependency of jax

    for cid, (a, b, diff, lo, hi) in welch.items():
        ref = stats.ttest_ind(acc[a], acc[b], equal_var=False)
        half = stats.t.ppf(0.975, ref.df) * (np.mean(acc[a]) - np.mean(acc[b])) / ref.statistic
        got = (rows[cid]["diff"], rows[cid]["diff"] - half, rows[cid]["diff"] + half)
        assert got == pytest.approx((diff, lo, hi), abs=5e-4), cid
        assert rows[cid]["p"] == pytest.approx(ref.pvalue, rel=1e-6), cid


def _train_collapse(cond: str, arm: str, seeds: int) -> float:
    """A cell's training collapse rate: per run, the mean over its training steps of the logged rate; then over runs."""
    logs = [metrics_log.read_metrics(OUT / cond / arm / f"seed{k}") for k in range(seeds)]
    return float(np.mean([np.mean([rec["degeneracy/collapse_rate"] for rec in recs if "time/train_s" in rec])
                          for recs in logs]))  # fmt: skip


ARMS = ("grpo", "dr_grpo", "sign", "grpo_mask", "grpo_resample", "avspo")  # m4's and m8's six arms


def _cell(st, rs: list[dict]) -> dict[str, float]:
    """One arm's figures as §2c's per-arm tables quote them: means over its runs, accuracy's 95% Student-t interval
    (`lo`, `hi`), and the largest fraction of clipped steps of any run."""
    acc = [r["heldout"]["accuracy"] for r in rs]
    lo, hi = st.t_interval(acc)
    mean = lambda key: float(np.mean([key(r) for r in rs]))  # noqa: E731
    return {"accuracy": float(np.mean(acc)), "lo": lo, "hi": hi, "pass@8": mean(lambda r: r["heldout"]["pass@k"]["8"]),
            "retention": mean(lambda r: r["retention"]["accuracy"]), "start": mean(lambda r: r["retain_trainer"]["0"]),
            "zero_grad": mean(lambda r: r["zero_grad_frac"]),
            "informative": mean(lambda r: r["informative_per_1k_tokens"]),
            "clip_max": max(r["clip_frac"] for r in rs)}  # fmt: skip


def test_the_complete_m4_family_backs_the_quoted_figures(modules, verdict_rows):
    # docs/degeneracy.md §2c and the README: the matched level at G = 4, full fine-tuning, 6 arms x 8 seeds; the
    # tests recomputed with scipy's own t-tests and Holm by hand, not through the analysis's statistics
    analysis, st = modules
    from scipy import stats  # a dependency of jax

    runs, arms = analysis.load_runs(OUT)["m4"], ARMS
    assert {arm: len(runs[arm]) for arm in arms} == dict.fromkeys(arms, 8)
    acc = {arm: [r["heldout"]["accuracy"] for r in runs[arm]] for arm in arms}
    table = {  # mean, 95% Student-t interval, pass@8, retention at the budget, the runs' own start, zero-gradient steps
        "grpo": (0.694, 0.659, 0.729, 0.863, 0.959, 0.953, 0.214),
        "dr_grpo": (0.708, 0.692, 0.724, 0.891, 0.981, 0.953, 0.171),
        "sign": (0.736, 0.726, 0.746, 0.909, 0.983, 0.953, 0.0),
        "grpo_mask": (0.711, 0.697, 0.725, 0.883, 0.985, 0.955, 0.171),
        "grpo_resample": (0.686, 0.655, 0.716, 0.852, 0.975, 0.955, 0.004),
        "avspo": (0.710, 0.675, 0.746, 0.862, 0.960, 0.955, 0.0),
    }
    for arm, figures in table.items():
        got = _cell(st, runs[arm])
        columns = ("accuracy", "lo", "hi", "pass@8", "retention", "start", "zero_grad")
        assert tuple(got[k] for k in columns) == pytest.approx(figures, abs=5e-4), arm
        assert got["clip_max"] == 0.0, arm  # the design's clip at 52.6 never fired
    rows = {r["id"]: r for r in verdict_rows}
    m4 = [r for r in rows.values() if r["cond"] == "m4" and analysis.family_of(r) == "m4"]
    assert len(m4) == 10 and all(r["n"] == 8 for r in m4)
    # H1-H3 (Welch): sign above Dr. GRPO by 0.028, interval [+0.010, +0.045]; mask and resample within noise of GRPO
    welch = {"H1-m4-sign-dr_grpo": ("sign", "dr_grpo", 0.028, 0.010, 0.045),
             "H2-m4-grpo_mask-grpo": ("grpo_mask", "grpo", 0.017, -0.019, 0.053),
             "H3-m4-grpo_resample-grpo": ("grpo_resample", "grpo", -0.009, -0.051, 0.033)}  # fmt: skip
    _check_welch(rows, acc, welch)
    # H4 against 0.942 and H5's gap (one-sample t); no arm eroded the held skill: every mean drop is negative
    start = analysis._base_accuracy(OUT)["retain"]  # levels.json: the warmed-up model's 0.942
    drop = {arm: [start - r["retention"]["accuracy"] for r in runs[arm]] for arm in arms}
    gap = [r["jensen_gap_train_pooled"] for r in runs["grpo"]]
    for r in (r for r in m4 if r["metric"] in ("retention_drop", "train_jensen_gap")):
        x = gap if r["metric"] == "train_jensen_gap" else drop[r["a"].split("@")[0]]
        assert r["p"] == pytest.approx(stats.ttest_1samp(x, 0.0).pvalue, rel=1e-3, abs=1e-6), r["id"]
    assert [r["p_holm"] for r in m4] == pytest.approx(_holm([r["p"] for r in m4]), rel=1e-9)
    assert {r["id"] for r in m4 if r["significant"]} == {"H1-m4-sign-dr_grpo", "H5-m4-grpo"}
    assert rows["H1-m4-sign-dr_grpo"]["p"] == pytest.approx(0.0046, abs=5e-5)
    assert rows["H1-m4-sign-dr_grpo"]["p_holm"] == pytest.approx(0.027, abs=5e-4)
    assert [round(rows[c]["p_holm"], 2) for c in ("H2-m4-grpo_mask-grpo", "H3-m4-grpo_resample-grpo")] == [1.0, 1.0]
    h4 = [(rows[f"H4-m4-{arm}"]["diff"], rows[f"H4-m4-{arm}"]["p_holm"]) for arm in arms]  # mean drop, Holm p
    expected = [(-0.017, 1.0), (-0.039, 0.0001), (-0.041, 0.0001), (-0.043, 0.0), (-0.033, 0.027), (-0.018, 1.0)]
    for arm, got, want in zip(arms, h4, expected):
        assert got == pytest.approx(want, abs=5e-4), arm
    figures = (np.mean(gap), *st.t_interval(gap), _train_collapse("m4", "grpo", 8))
    assert figures == pytest.approx((0.393, 0.366, 0.419, 0.689), abs=5e-4)
    assert rows["H5-m4-grpo"]["p_holm"] < 1e-6
    # amendment 8's paired family beside H4: the same direction (no erosion); rises distinguishable from zero for
    # Dr. GRPO, sign and grpo + mask; resample's rise is one against 0.942 (Holm 0.027) and not against its own start
    paired = [(rows[f"H4p-m4-{arm}"]["diff"], rows[f"H4p-m4-{arm}"]["p_holm"]) for arm in arms]
    expected = [(-0.006, 1.0), (-0.028, 0.014), (-0.030, 0.024), (-0.029, 0.024), (-0.020, 0.264), (-0.004, 1.0)]
    for arm, got, want in zip(arms, paired, expected):
        assert got == pytest.approx(want, abs=5e-4), arm
    assert not any(rows[f"H4p-m4-{arm}"]["significant"] for arm in arms)
    starts = [r["retain_trainer"]["0"] for arm in arms for r in runs[arm]]
    assert np.mean(starts) == pytest.approx(0.954, abs=5e-4)  # the runs' own starts: above 0.942 by 0.012
    warmups = [analysis.warmup_of(r)[:8] for arm in arms for r in runs[arm]]
    assert (warmups.count("beccf584"), warmups.count("54bdb45a")) == (33, 15)
    assert {arm: runs[arm][0]["config"]["optim"]["learning_rate"] for arm in arms} == {
        "grpo": 1e-5,
        "dr_grpo": 3e-6,
        "sign": 3e-6,
        "grpo_mask": 3e-6,
        "grpo_resample": 1e-5,
        "avspo": 1e-5,
    }


def test_the_complete_m8_family_backs_the_quoted_figures(modules, verdict_rows):
    # docs/degeneracy.md §2c and the README: the matched level at G = 8 (two prompts a step), 6 arms x 8 seeds, Holm
    # over the family's 3 claims; H2 and H3 within noise of GRPO, H5 supported
    analysis, st = modules
    from scipy import stats  # a dependency of jax

    runs, arms = analysis.load_runs(OUT)["m8"], ARMS
    assert {arm: len(runs[arm]) for arm in arms} == dict.fromkeys(arms, 8)
    acc = {arm: [r["heldout"]["accuracy"] for r in runs[arm]] for arm in arms}
    table = {  # mean, 95% t interval, pass@8, retention at the budget, zero-gradient steps, informative groups / 1k
        "grpo": (0.663, 0.628, 0.698, 0.828, 0.963, 0.294, 4.98),
        "dr_grpo": (0.707, 0.684, 0.731, 0.901, 0.983, 0.250, 5.44),
        "sign": (0.710, 0.697, 0.723, 0.897, 0.984, 0.0, 5.40),
        "grpo_mask": (0.699, 0.682, 0.716, 0.896, 0.982, 0.263, 5.25),
        "grpo_resample": (0.669, 0.643, 0.696, 0.846, 0.979, 0.005, 4.63),
        "avspo": (0.687, 0.670, 0.704, 0.844, 0.973, 0.0, 4.71),
    }
    for arm, figures in table.items():
        rs, got = runs[arm], _cell(st, runs[arm])
        columns = ("accuracy", "lo", "hi", "pass@8", "retention", "zero_grad")
        assert tuple(got[k] for k in columns) == pytest.approx(figures[:-1], abs=5e-4), arm
        assert got["informative"] == pytest.approx(figures[-1], abs=5e-3), arm
        assert got["clip_max"] == 0.0, arm  # the design's clip at 52.6 never fired
        assert {(r["config"]["rollout"]["group_size"], r["config"]["rollout"]["prompts_per_step"]) for r in rs} == {
            (8, 2)
        }, arm
        assert [r["retain_trainer"]["0"] for r in rs] == [r["retain_trainer"]["0"] for r in runs["grpo"]], arm
    assert np.mean([r["retain_trainer"]["0"] for r in runs["grpo"]]) == pytest.approx(0.944, abs=5e-4)
    assert max(r["grad_norm_pcts"]["99"] for arm in arms for r in runs[arm]) == pytest.approx(22.0, abs=0.05)
    rows = {r["id"]: r for r in verdict_rows}
    m8 = [r for r in rows.values() if r["cond"] == "m8"]
    assert sorted(r["id"] for r in m8) == ["H2-m8-grpo_mask-grpo", "H3-m8-grpo_resample-grpo", "H5-m8-grpo"]
    assert all(r["n"] == 8 and analysis.family_of(r) == "m8" for r in m8)
    _check_welch(rows, acc, {"H2-m8-grpo_mask-grpo": ("grpo_mask", "grpo", 0.036, -0.001, 0.073),
                             "H3-m8-grpo_resample-grpo": ("grpo_resample", "grpo", 0.006, -0.034, 0.047)})  # fmt: skip
    gap = [r["jensen_gap_train_pooled"] for r in runs["grpo"]]
    assert rows["H5-m8-grpo"]["p"] == pytest.approx(stats.ttest_1samp(gap, 0.0).pvalue, rel=1e-3)
    collapse = _train_collapse("m8", "grpo", 8)
    assert (np.mean(gap), *st.t_interval(gap), collapse, collapse - np.mean(gap)) == pytest.approx(
        (0.298, 0.275, 0.322, 0.535, 0.236), abs=5e-4
    )
    assert [r["p_holm"] for r in m8] == pytest.approx(_holm([r["p"] for r in m8]), rel=1e-9)
    quoted = {"H2-m8-grpo_mask-grpo": (0.056, 0.11), "H3-m8-grpo_resample-grpo": (0.74, 0.74)}
    for cid, (p, p_holm) in quoted.items():
        assert (rows[cid]["p"], rows[cid]["p_holm"]) == pytest.approx((p, p_holm), abs=5e-3), cid
    assert rows["H5-m8-grpo"]["p_holm"] == pytest.approx(3.7e-8, abs=5e-10)
    assert {r["id"] for r in m8 if r["significant"]} == {"H5-m8-grpo"}
    power = {c["id"]: c for c in json.loads((OUT / "power.json").read_text())["claims"]}
    assert power["H2-m8-grpo_mask-grpo"]["detectable_at_seeds"] == pytest.approx(0.116, abs=5e-4)
    assert {r["id"]: r["verdict"] for r in m8 if not r["significant"]} == dict.fromkeys(
        ("H2-m8-grpo_mask-grpo", "H3-m8-grpo_resample-grpo"), "not distinguishable at n = 8"
    )
    # descriptive figures the report quotes: steps per run, retention's rise from the runs' own start, the one run
    # that lost more than 0.05 of the held skill, and the informative fraction of GRPO's groups at G = 8 and 4
    steps = {arm: [r["steps"] for r in runs[arm]] for arm in ("grpo", "grpo_resample")}
    assert (min(steps["grpo"]), max(steps["grpo"]), min(steps["grpo_resample"]), max(steps["grpo_resample"])) == (
        101, 104, 41, 49
    )
    rise = [np.mean([r["retention"]["accuracy"] - r["retain_trainer"]["0"] for r in runs[arm]]) for arm in arms]
    assert (min(rise), max(rise)) == pytest.approx((0.020, 0.041), abs=5e-4)
    losses = {(arm, r["seed"]): r["retain_trainer"]["0"] - r["retention"]["accuracy"]
              for arm in arms for r in runs[arm]}  # fmt: skip
    assert [k for k, v in losses.items() if v > 0.05] == [("grpo", 3)]
    assert losses["grpo", 3] == pytest.approx(0.056, abs=5e-4)
    assert 1 - collapse == pytest.approx(0.465, abs=5e-4)
    assert 1 - _train_collapse("m4", "grpo", 8) == pytest.approx(0.311, abs=5e-4)
    assert [r["commit"][:7] for r in runs["grpo"]] == ["820ca3f", "750cd90"] + ["b066b24"] * 6
    assert {analysis.warmup_of(r)[:8] for arm in arms for r in runs[arm]} == {"beccf584"}


def test_the_complete_hard_family_backs_the_quoted_figures(modules, verdict_rows):
    # docs/degeneracy.md §2c and the README: the too-hard level at G = 4, 6 arms x 10 seeds; the registered escape
    # family (exact permutation, Holm over its 3) first, amendment 9's acc-hard (Welch, Holm over 3) and paired-hard
    # (one-sample t of each run's own start minus its end, Holm over 6) beside it; tests recomputed with scipy's own
    analysis, st = modules
    from scipy import stats  # a dependency of jax

    runs, arms = analysis.load_runs(OUT)["hard"], ARMS
    assert {arm: len(runs[arm]) for arm in arms} == dict.fromkeys(arms, 10)
    acc = {arm: [r["heldout"]["accuracy"] for r in runs[arm]] for arm in arms}
    table = {  # mean, 95% t interval, pass@8, retention: own start, at the budget; zero-gradient steps, informative/1k
        "grpo": (0.053, 0.026, 0.079, 0.108, 0.958, 0.778, 0.661, 2.40),
        "dr_grpo": (0.182, 0.156, 0.207, 0.396, 0.960, 0.940, 0.310, 5.92),
        "sign": (0.151, 0.134, 0.167, 0.352, 0.960, 0.934, 0.0, 5.24),
        "grpo_mask": (0.188, 0.167, 0.210, 0.405, 0.960, 0.931, 0.321, 5.72),
        "grpo_resample": (0.144, 0.128, 0.160, 0.307, 0.960, 0.889, 0.027, 4.85),
        "avspo": (0.047, 0.023, 0.071, 0.102, 0.960, 0.565, 0.0, 1.95),
    }
    for arm, figures in table.items():
        got = _cell(st, runs[arm])
        columns = ("accuracy", "lo", "hi", "pass@8", "start", "retention", "zero_grad")
        assert tuple(got[k] for k in columns) == pytest.approx(figures[:-1], abs=5e-4), arm
        assert got["informative"] == pytest.approx(figures[-1], abs=5e-3), arm
        assert got["clip_max"] == 0.0, arm  # the design's clip at 52.6 never fired
        shapes = {(r["config"]["rollout"]["group_size"], r["config"]["rollout"]["prompts_per_step"]) for r in runs[arm]}
        assert shapes == {(4, 4)}, arm
    g99 = {arm: max(r["grad_norm_pcts"]["99"] for r in runs[arm]) for arm in arms}
    assert max(g99, key=g99.get) == "grpo_mask" and g99["grpo_mask"] == pytest.approx(31.3, abs=0.05)
    rows = {r["id"]: r for r in verdict_rows}
    family = lambda name: [r for r in rows.values() if analysis.family_of(r) == name]  # noqa: E731
    three = [r for name in ("hard", "acc-hard", "paired-hard") for r in family(name)]
    assert len(three) == 12 and all(r["cond"] == "hard" and r["n"] == 10 for r in three)
    # the registered escape family: held-out accuracy at least 0.2 above the warmed-up model's 0.093 (levels.json)
    base = analysis._base_accuracy(OUT)["hard"]
    threshold = base + analysis.ESCAPE_MARGIN
    assert threshold == pytest.approx(0.293, abs=5e-4)
    escaped = {arm: [float(a >= threshold) for a in acc[arm]] for arm in arms}
    assert {arm: sum(v) for arm, v in escaped.items()} == dict.fromkeys(arms, 0.0)  # no run of the 60 escaped
    best = max((a, arm) for arm in arms for a in acc[arm])
    assert best[1] == "grpo_mask" and best[0] == pytest.approx(0.234, abs=5e-4)
    assert len(family("hard")) == 3
    for r in family("hard"):
        ref = stats.permutation_test(
            (escaped[r["a"]], escaped[r["b"]]), lambda x, y, axis: np.mean(x, axis) - np.mean(y, axis),
            permutation_type="independent", n_resamples=np.inf, alternative="two-sided", vectorized=True,
        )  # fmt: skip
        assert (r["diff"], r["p"], r["p_holm"]) == pytest.approx((0.0, ref.pvalue, 1.0), abs=1e-9), r["id"]
        assert r["verdict"] == "not distinguishable at n = 10", r["id"]
    power = {c["id"]: c for c in json.loads((OUT / "power.json").read_text())["claims"]}
    assert power["H3-hard-grpo_resample-grpo"]["detectable_at_seeds"] == pytest.approx(0.78, abs=5e-3)
    # acc-hard: resample above GRPO; GRPO above sign reads the other way; GRPO and AVSPO within noise
    acc_hard = family("acc-hard")
    _check_welch(rows, acc, {"H3acc-hard-grpo_resample-grpo": ("grpo_resample", "grpo", 0.091, 0.062, 0.120),
                             "H3acc-hard-grpo-sign": ("grpo", "sign", -0.098, -0.127, -0.068),
                             "H3acc-hard-grpo-avspo": ("grpo", "avspo", 0.006, -0.027, 0.039)})  # fmt: skip
    assert [r["p_holm"] for r in acc_hard] == pytest.approx(_holm([r["p"] for r in acc_hard]), rel=1e-9)
    quoted = {"H3acc-hard-grpo_resample-grpo": (8.6e-6, 1.7e-5), "H3acc-hard-grpo-sign": (3.7e-6, 1.1e-5)}
    for cid, (p, p_holm) in quoted.items():
        assert (rows[cid]["p"], rows[cid]["p_holm"]) == pytest.approx((p, p_holm), rel=0.03), cid
    assert rows["H3acc-hard-grpo-avspo"]["p_holm"] == pytest.approx(0.71, abs=5e-3)
    assert {r["id"]: r["verdict"].split(" (")[0] for r in acc_hard} == {
        "H3acc-hard-grpo_resample-grpo": "supported",
        "H3acc-hard-grpo-sign": "not supported: the other way",
        "H3acc-hard-grpo-avspo": "not distinguishable at n = 10",
    }
    # paired-hard: GRPO and AVSPO erode the held skill; the other four arms' drops are within noise after Holm
    paired = family("paired-hard")
    drop = {arm: [r["retain_trainer"]["0"] - r["retention"]["accuracy"] for r in runs[arm]] for arm in arms}
    quoted = {  # mean drop, 95% t interval, p, Holm p
        "grpo": (0.180, 0.106, 0.254, 0.00037, 0.0022), "dr_grpo": (0.020, -0.003, 0.044, 0.080, 0.17),
        "sign": (0.026, -0.008, 0.061, 0.12, 0.17), "grpo_mask": (0.028, -0.001, 0.058, 0.058, 0.17),
        "grpo_resample": (0.071, 0.017, 0.125, 0.015, 0.060), "avspo": (0.394, 0.207, 0.582, 0.0010, 0.0051),
    }  # fmt: skip
    for arm, (mean, lo, hi, p, p_holm) in quoted.items():
        row = rows[f"H4p-hard-{arm}"]
        assert (row["diff"], *st.t_interval(drop[arm])) == pytest.approx((mean, lo, hi), abs=5e-4), arm
        assert np.mean(drop[arm]) == pytest.approx(row["diff"], abs=1e-12), arm
        assert row["p"] == pytest.approx(stats.ttest_1samp(drop[arm], 0.0).pvalue, rel=1e-6), arm
        assert (row["p"], row["p_holm"]) == pytest.approx((p, p_holm), rel=0.05), arm
    assert [r["p_holm"] for r in paired] == pytest.approx(_holm([r["p"] for r in paired]), rel=1e-9)
    assert {r["id"] for r in paired if r["significant"]} == {"H4p-hard-grpo", "H4p-hard-avspo"}
    # descriptive figures the report quotes: runs that lost more than 0.1, AVSPO's worst, runs below the warmed-up
    # model, optimizer steps, and the training collapse rates
    assert {arm: sum(d > 0.1 for d in drop[arm]) for arm in ("grpo", "avspo")} == {"grpo": 7, "avspo": 9}
    worst = min(runs["avspo"], key=lambda r: r["retention"]["accuracy"])
    assert (worst["retain_trainer"]["0"], worst["retention"]["accuracy"]) == pytest.approx((0.964, 0.147), abs=5e-4)
    below = {arm: sum(a < base for a in acc[arm]) for arm in arms}
    assert below == {"grpo": 9, "dr_grpo": 0, "sign": 0, "grpo_mask": 0, "grpo_resample": 0, "avspo": 9}
    steps = {arm: (min(r["steps"] for r in runs[arm]), max(r["steps"] for r in runs[arm])) for arm in arms}
    assert (steps["grpo"], steps["grpo_resample"]) == ((103, 113), (29, 32))
    assert {arm: round(_train_collapse("hard", arm, 10), 3) for arm in ("grpo", "avspo")} == {
        "grpo": 0.894, "avspo": 0.912
    }  # fmt: skip
    low_lr = [_train_collapse("hard", arm, 10) for arm in ("dr_grpo", "sign", "grpo_mask")]
    assert (min(low_lr), max(low_lr)) == pytest.approx((0.74, 0.77), abs=5e-3)
    assert all([r["commit"][:7] for r in runs[arm]] == ["750cd90"] * 2 + ["b066b24"] * 8 for arm in arms)
    warmups = {arm: [analysis.warmup_of(r)[:8] for r in runs[arm]] for arm in arms}
    assert warmups["grpo"] == ["beccf584"] * 10
    assert all(warmups[arm] == ["beccf584", "54bdb45a"] + ["beccf584"] * 8 for arm in arms[1:])
    assert {arm: runs[arm][0]["config"]["optim"]["learning_rate"] for arm in arms} == {
        "grpo": 1e-5, "dr_grpo": 3e-6, "sign": 3e-6, "grpo_mask": 3e-6, "grpo_resample": 1e-5, "avspo": 1e-5
    }  # fmt: skip
