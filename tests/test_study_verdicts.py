# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The second edition's verdicts (benchmarks/degeneracy_real2_analysis.py) on small made-up study directories: a
family stays pending until every claim has its seeds, then Holm within it; a claim is supported only in its registered
direction; paired retention (amendment 8) per run; the escape threshold; H5's pooled i.i.d. rate (amendment 7) by
hand. The committed study's own figures: `test_study_claims.py`."""

from __future__ import annotations

import json

import benchmark_module
import pytest


@pytest.fixture(scope="module")
def dr2():
    return benchmark_module.load("degeneracy_real2")  # it puts benchmarks/ on sys.path for its analysis module


def _result(cond, arm, seed, acc, retention=0.9, gap=0.05, **extra):
    return {"cond": cond, "arm": arm, "seed": seed, "heldout": {"accuracy": acc}, "retention": {"accuracy": retention},
            "jensen_gap_train": gap, **extra}


def test_verdicts_pending_then_holm_within_condition(dr2, tmp_path):
    claims = [{"id": "x", "cond": "m4", "a": "sign", "b": "grpo", "claim": "a>b", "metric": "accuracy", "seeds": 3},
              {"id": "y", "cond": "m4", "a": "grpo_mask", "b": "grpo", "claim": "a>b", "metric": "accuracy",
               "seeds": 3},
              {"id": "z", "cond": "m4", "a": "grpo@start", "b": "grpo@end", "claim": "a>b",
               "metric": "retention_drop", "seeds": 3}]  # fmt: skip
    dr2._write_json(tmp_path / "claims.json", claims)
    dr2._write_json(tmp_path / "levels.json", {"levels": {"1": {"accuracy": 0.9}, "4": {"accuracy": 0.3}},
                                               "pick": {"matched": 4, "hard": None, "retain": 1}})  # fmt: skip
    runs = {"sign": (0.9, 0.92, 0.94), "grpo": (0.5, 0.52, 0.54), "grpo_mask": (0.54, 0.5, 0.53)}
    for arm, accs in runs.items():
        for seed, acc in enumerate(accs[:2]):
            dr2._write_json(tmp_path / "m4" / arm / f"seed{seed}" / "result.json",
                            _result("m4", arm, seed, acc, retention=0.9 - 0.1 * seed))
    v = dr2.analysis.verdicts(tmp_path)["claims"]
    assert [r["significant"] for r in v] == [None, None, None] and [r["n"] for r in v] == [2, 2, 2]
    for arm, accs in runs.items():
        dr2._write_json(tmp_path / "m4" / arm / "seed2" / "result.json", _result("m4", arm, 2, accs[2], 0.7))
    v = {r["id"]: r for r in dr2.analysis.verdicts(tmp_path)["claims"]}
    # x: Welch with equal spreads (s = 0.02 each), t = 0.4 / sqrt(2 * 0.0004 / 3), df = 4
    t = 0.4 / (2 * 0.0004 / 3) ** 0.5
    ref = dr2.analysis.st.t_two_sided_p(t, 4.0)
    assert v["x"]["p"] == pytest.approx(ref) and v["x"]["diff"] == pytest.approx(0.4)
    # z: drops 0.0, 0.1, 0.2 from the warmed-up 0.9: mean 0.1, s = 0.1, t = sqrt(3), df 2 closed form
    assert v["z"]["p"] == pytest.approx(1 - 3**0.5 / (2 + 3) ** 0.5)
    ps = [v[k]["p"] for k in "xyz"]
    assert [v[k]["p_holm"] for k in "xyz"] == pytest.approx(dr2.analysis.st.holm(ps))
    assert v["x"]["significant"] is True and v["y"]["significant"] is False and v["z"]["significant"] is False
    # amendment 3: claims in their own family ("sched-m4") are adjusted among themselves; the condition's are unchanged
    claims += [{"id": "w", "cond": "m4", "family": "sched-m4", "a": "grpo_skip", "b": "grpo", "claim": "a>b",
                "metric": "informative_per_1k_tokens", "seeds": 3},
               {"id": "t", "cond": "m4", "family": "sched-m4", "a": "grpo", "b": "grpo_skip", "claim": "a>b",
                "metric": "tokens_to_target", "seeds": 3}]  # fmt: skip
    dr2._write_json(tmp_path / "claims.json", claims)
    never = [{"tokens": 400, "accuracy": 0.45}]  # below the target 0.3 + 0.2 = 0.5: counts as 2 x 1,000 tokens
    for seed, acc in enumerate(runs["grpo"]):
        dr2._write_json(tmp_path / "m4" / "grpo" / f"seed{seed}" / "result.json",
                        _result("m4", "grpo", seed, acc, 0.9 - 0.1 * seed if seed < 2 else 0.7,
                                informative_per_1k_tokens=5.0 + seed, budget=1000, probe=never))  # fmt: skip
        dr2._write_json(tmp_path / "m4" / "grpo_skip" / f"seed{seed}" / "result.json",
                        _result("m4", "grpo_skip", seed, 0.6, informative_per_1k_tokens=9.0 + seed, budget=1000,
                                probe=[{"tokens": 200, "accuracy": 0.1},
                                       {"tokens": 500 + 100 * seed, "accuracy": 0.5}]))  # fmt: skip
    v2 = {r["id"]: r for r in dr2.analysis.verdicts(tmp_path)["claims"]}
    for k in "xyz":
        assert (v2[k]["p"], v2[k]["p_holm"]) == (v[k]["p"], v[k]["p_holm"])
    t = 4.0 / (2 * 1.0 / 3) ** 0.5  # equal spreads s = 1, df = 4
    assert v2["w"]["p"] == pytest.approx(dr2.analysis.st.t_two_sided_p(t, 4.0)) and v2["w"]["diff"] == 4.0
    # 2,000 x 3 against 500, 600, 700: of the 20 relabelings only the observed one and its mirror are as extreme
    assert v2["t"]["p"] == pytest.approx(2 / 20) and v2["t"]["diff"] == pytest.approx(2000 - 600)
    assert [v2[k]["p_holm"] for k in "wt"] == pytest.approx(dr2.analysis.st.holm([v2["w"]["p"], v2["t"]["p"]]))


def _study(dr2, tmp_path, claims, hard=None):
    dr2._write_json(tmp_path / "claims.json", claims)
    dr2._write_json(tmp_path / "levels.json", {"levels": {"1": {"accuracy": 0.9}, "4": {"accuracy": 0.3},
                                                          "7": {"accuracy": 0.0927734375}},
                                               "pick": {"matched": 4, "hard": hard, "retain": 1}})  # fmt: skip


def test_paired_retention_compares_each_run_with_its_own_start(dr2, tmp_path):
    """Amendment 8: H4p's per-run drop is the trainer's step-0 retention minus the run's final retention, whatever
    the warmed-up model's levels.json says; its family is adjusted apart from the condition's registered claims."""
    claims = [{"id": "h4", "cond": "m4", "a": "grpo@start", "b": "grpo@end", "claim": "a>b",
               "metric": "retention_drop", "seeds": 3},
              {"id": "h4p", "cond": "m4", "family": "paired-m4", "a": "grpo@start", "b": "grpo@end", "claim": "a>b",
               "metric": "retention_drop_paired", "seeds": 3},
              {"id": "h4p-sign", "cond": "m4", "family": "paired-m4", "a": "sign@start", "b": "sign@end",
               "claim": "a>b", "metric": "retention_drop_paired", "seeds": 3}]  # fmt: skip
    _study(dr2, tmp_path, claims)  # the registered start: 0.9
    for seed, (start, end) in enumerate(((0.95, 0.85), (0.96, 0.80), (0.97, 0.87))):  # drops 0.10, 0.16, 0.10
        for arm in ("grpo", "sign"):
            dr2._write_json(tmp_path / "m4" / arm / f"seed{seed}" / "result.json",
                            _result("m4", arm, seed, 0.5, retention=end, retain_trainer={"0": start, "104": end}))
    v = {r["id"]: r for r in dr2.analysis.verdicts(tmp_path)["claims"]}
    # paired: mean 0.12, s^2 = 0.0024 / 2, t = 0.12 / (s / sqrt 3) = 6, df 2: p = 2 (1 - F(6)) = 1 - 6 / sqrt(38)
    assert v["h4p"]["diff"] == pytest.approx(0.12)
    assert v["h4p"]["p"] == pytest.approx(1 - 6 / 38**0.5, rel=1e-9)
    assert v["h4"]["diff"] == pytest.approx(0.9 - (0.85 + 0.80 + 0.87) / 3)  # the registered start, 0.9
    assert v["h4"]["p_holm"] == v["h4"]["p"]  # a family of one: the paired claims are not in the condition's
    assert [v[k]["p_holm"] for k in ("h4p", "h4p-sign")] == pytest.approx(dr2.analysis.st.holm([v["h4p"]["p"]] * 2))
    (row,) = dr2.analysis.power_plan([{**claims[1], "effect": 0.05}], {"retention_drop_paired": {"sd": 0.055}})
    assert row["seeds_holm_last"] == dr2.analysis.st.seeds_needed(0.05, 0.055, 0.05, samples=1)  # one-sample plan


def test_a_claim_is_supported_only_in_its_direction_and_only_as_a_greater_than(dr2, tmp_path):
    """sign far below grpo: the two-sided p is tiny, but "sign > grpo" is not supported; "a<b" is refused."""
    _study(dr2, tmp_path, [{"id": "x", "cond": "m4", "a": "sign", "b": "grpo", "claim": "a>b", "metric": "accuracy",
                            "seeds": 4}])  # fmt: skip
    for seed in range(4):
        for arm, acc in (("sign", (0.10, 0.11, 0.12, 0.10)), ("grpo", (0.50, 0.52, 0.54, 0.50))):
            dr2._write_json(tmp_path / "m4" / arm / f"seed{seed}" / "result.json", _result("m4", arm, seed, acc[seed]))
    (v,) = dr2.analysis.verdicts(tmp_path)["claims"]
    assert v["p_holm"] < 1e-4 and v["diff"] < 0 and v["significant"] is False
    assert v["verdict"] == "not supported: the other way (two-sided Holm p < 0.05)"  # not "not distinguishable"
    words = [dr2.analysis.verdict_text({**v, **row}) for row in (
        {"significant": None}, {"significant": True, "diff": 0.1, "p_holm": 0.01},
        {"significant": False, "diff": -0.1, "p_holm": 0.06}, {"significant": False, "diff": 0.1, "p_holm": 0.2})]
    assert words == ["pending", "supported", "not distinguishable at n = 4", "not distinguishable at n = 4"]
    _study(dr2, tmp_path, [{"id": "x", "cond": "m4", "a": "sign", "b": "grpo", "claim": "a<b", "metric": "accuracy",
                            "seeds": 4}])  # fmt: skip
    with pytest.raises(SystemExit, match="claim 'x' is 'a<b'; write it as a>b"):
        dr2.analysis.verdicts(tmp_path)


def test_an_incomplete_family_shows_nothing_then_holm_over_all_its_claims(dr2, tmp_path):
    """Claim a has its 3 seeds, claim b (4 seeds registered) only 3: neither difference nor p is shown; with b's
    fourth seed both are tested and adjusted together."""
    claims = [{"id": "a", "cond": "m4", "a": "sign", "b": "grpo", "claim": "a>b", "metric": "accuracy", "seeds": 3},
              {"id": "b", "cond": "m4", "a": "avspo", "b": "grpo", "claim": "a>b", "metric": "accuracy", "seeds": 4}]
    _study(dr2, tmp_path, claims)
    accs = {"sign": (0.9, 0.92, 0.94, 0.9), "grpo": (0.5, 0.52, 0.54, 0.5), "avspo": (0.6, 0.5, 0.55, 0.6)}
    for arm, acc in accs.items():
        for seed in range(3):
            dr2._write_json(tmp_path / "m4" / arm / f"seed{seed}" / "result.json", _result("m4", arm, seed, acc[seed]))
    got = dr2.analysis.verdicts(tmp_path)["claims"]
    assert [(r["n"], r["diff"], r["p"], r["p_holm"], r["significant"]) for r in got] == [(3, None, None, None,
                                                                                          None)] * 2
    for arm in ("avspo", "grpo"):
        dr2._write_json(tmp_path / "m4" / arm / "seed3" / "result.json", _result("m4", arm, 3, accs[arm][3]))
    a, b = dr2.analysis.verdicts(tmp_path)["claims"]
    assert (a["n"], b["n"]) == (3, 4)  # n: the fewer seeds of the two arms; each test takes all of both
    want_a = dr2.analysis.st.welch(accs["sign"][:3], accs["grpo"])["p"]
    want_b = dr2.analysis.st.welch(accs["avspo"], accs["grpo"])["p"]
    assert (a["p"], b["p"]) == pytest.approx((want_a, want_b))
    assert [a["p_holm"], b["p_holm"]] == pytest.approx(dr2.analysis.st.holm([want_a, want_b]))


def test_escape_is_the_warmed_up_accuracy_plus_the_margin(dr2, tmp_path):
    """Escape = held-out accuracy >= the warmed-up model's 0.0927734375 + 0.2 on the too-hard level: 0.29296875
    escapes, 0.29248046875 does not."""
    claims = [{"id": "e", "cond": "hard", "a": "grpo_resample", "b": "grpo", "claim": "a>b", "metric": "escape",
               "seeds": 2}]  # fmt: skip
    _study(dr2, tmp_path, claims, hard=7)
    runs = {"grpo_resample": {"grpo_resample": [_result("hard", "grpo_resample", s, 0.29296875) for s in (0, 1)],
                              "grpo": [_result("hard", "grpo", s, 0.29248046875) for s in (0, 1)]}}
    a, b = dr2.analysis._values(claims[0], runs["grpo_resample"], dr2.analysis._base_accuracy(tmp_path))
    assert (a, b) == ([1.0, 1.0], [0.0, 0.0])


def test_pooled_train_gap_by_hand_and_in_the_verdicts(dr2, tmp_path):
    """Amendment 7: per step, collapse rate minus [C(S,G) + C(N-S,G)] / C(N,G) from the logged success rate and
    groups (the logged plug-in iid_rate is not read); H5's verdict takes it from each run's metrics.jsonl."""
    from math import comb

    steps = [{"step": 0, "retain/held/accuracy": 0.9},
             {"step": 1, "time/train_s": 1.0, "groups/num": 4.0, "degeneracy/success_rate": 0.5,
              "degeneracy/collapse_rate": 0.5, "degeneracy/iid_rate": 0.125, "reward/invalid_frac": 0.0},
             {"step": 2, "time/train_s": 1.0, "groups/num": 4.0, "degeneracy/success_rate": 0.25,
              "degeneracy/collapse_rate": 1.0, "degeneracy/iid_rate": 0.33}]  # fmt: skip
    want = ((0.5 - 2 * comb(8, 4) / comb(16, 4)) + (1.0 - (comb(4, 4) + comb(12, 4)) / comb(16, 4))) / 2
    assert dr2.analysis.pooled_train_gap(steps, 4) == pytest.approx(want)
    assert dr2.analysis.pooled_train_gap([{**steps[1], "reward/invalid_frac": 0.0625}], 4) is None  # sizes unknown
    claims = [{"id": "h", "cond": "m4", "a": "grpo:measured", "b": "grpo:iid", "claim": "a>b",
               "metric": "train_jensen_gap", "seeds": 2}]  # fmt: skip
    dr2._write_json(tmp_path / "claims.json", claims)
    dr2._write_json(tmp_path / "levels.json", {"levels": {"1": {"accuracy": 0.9}, "4": {"accuracy": 0.3}},
                                               "pick": {"matched": 4, "hard": None, "retain": 1}})  # fmt: skip
    for seed, rate in enumerate((0.5, 0.25)):
        run = tmp_path / "m4" / "grpo" / f"seed{seed}"
        dr2._write_json(run / "result.json", _result("m4", "grpo", seed, 0.5, gap=-1.0,
                                                     config={"rollout": {"group_size": 4}}))  # fmt: skip
        (run / "metrics.jsonl").write_text(json.dumps({**steps[1], "degeneracy/success_rate": rate}) + "\n")
    (v,) = dr2.analysis.verdicts(tmp_path)["claims"]
    gaps = [0.5 - 2 * comb(8, 4) / comb(16, 4), 0.5 - (comb(4, 4) + comb(12, 4)) / comb(16, 4)]
    assert v["n"] == 2 and v["diff"] == pytest.approx(sum(gaps) / 2)  # not the result files' plug-in -1.0
    (run / "metrics.jsonl").write_text(json.dumps({**steps[1], "reward/invalid_frac": 0.0625}) + "\n")
    with pytest.raises(ValueError, match="H5 reads|invalid samples"):  # only a claim that reads the gap refuses it
        dr2.analysis.verdicts(tmp_path)
