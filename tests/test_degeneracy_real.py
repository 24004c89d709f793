# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The real-model study's runners without the model. First edition (benchmarks/degeneracy_real.py): every run's
config is valid and the arms of a part share one token budget and one P x G; ``--arms`` runs a subset of a part; a
finished run (its result.json) is skipped; results are written atomically; the summary's mean and Student-t interval
against hand values. Second edition (benchmarks/degeneracy_real2.py and its analysis): the grid's configs (Dr. GRPO's
own aggregation, the LoRA cell, pair splits, one budget, no two arms alike), parts and errors, per-run training
statistics, the level and design rules, parallel workers skipping a run another process holds, and the first
edition's audit against the figures the README quotes (the verdicts: `test_study_verdicts.py`)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import benchmark_module
import pytest

from jaxgrpo.errors import ConfigError
from jaxgrpo.run_dir import RunLock

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dr():
    return benchmark_module.load("degeneracy_real")


def test_parts_cover_every_arm_and_seed_once_with_one_budget(dr):
    parts = dr.parts(dr.GRID)
    matched = [n for n in parts if n.startswith("matched")]
    assert matched == [f"matched-g{g}-{c}" for g in (4, 8) for c in "abc"]
    for g in (4, dr.GRID.large_group):
        runs = [s for n in matched for s in parts[n] if s.group == g]
        assert sorted((s.arm, s.seed) for s in runs) == sorted((a, k) for a in dr.ARMS for k in dr.GRID.seeds)
    budgets = set()
    for name, specs in parts.items():
        for s in specs:
            cfg = dr.run_config(s, dr.GRID)  # validated by the config loader
            assert cfg.rollout.prompts_per_step * cfg.rollout.group_size == dr.GRID.rows
            assert cfg.data.difficulty == (dr.GRID.hard if name == "hard-g4" else dr.GRID.matched)
            assert cfg.train.steps >= dr.GRID.steps and cfg.train.retain_every == dr.GRID.retain_every
            budgets.add(cfg.train.max_sampled_tokens)
    assert budgets == {dr.GRID.steps * dr.GRID.rows * dr.MAX_NEW_TOKENS}  # >= `steps` steps for keep/mask arms
    assert [len(v) for v in dr.parts(dr.PILOT).values()] == [2, 2]  # two arms, one seed, at G = 4 and 8


def test_finished_run_is_skipped_and_results_are_atomic(dr, tmp_path, monkeypatch):
    spec = dr.parts(dr.PILOT)["matched-g4-a"][0]
    result = tmp_path / spec.part / spec.arm / f"seed{spec.seed}" / "result.json"
    dr._write_json(result, {"heldout": {"accuracy": 0.5}})
    assert [p.name for p in result.parent.iterdir()] == ["result.json"]  # no temporary file left behind

    def never(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(dr.trainer_lib, "run", never)
    assert dr.run_one(spec, dr.PILOT, tmp_path) == {"heldout": {"accuracy": 0.5}}


def test_summary_mean_and_t_interval(dr, tmp_path):
    grid = dr.Grid(seeds=(0, 1, 2), arms=("grpo",), hard_arms=())
    for seed, acc in zip(grid.seeds, (0.2, 0.3, 0.7)):
        run = tmp_path / "matched-g4-a" / "grpo" / f"seed{seed}"
        dr._write_json(run / "result.json", {
            "seed": seed, "group": 4, "steps": 100,
            "heldout": {"accuracy": acc, "pass@k": {"1": acc, "2": acc + 0.1},
                        "degeneracy": [{"group_size": 4, "gap": 0.01 * seed}]}})  # fmt: skip
        recs = [{"step": 0, "retain/easy/accuracy": 0.1}, {"step": 1, "degeneracy/all_fail": 0.5}]
        if seed:  # seed 0 ended before its first retention measurement after training
            recs.append({"step": 2, "retain/easy/accuracy": 0.2 * seed})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (row,) = dr.summary(tmp_path, grid)["arms"]
    assert row["accuracy_mean"] == pytest.approx(0.4)
    half = 4.302652729911275 * 0.26457513110645906 / 3**0.5  # t(0.975, 2) * sample std / sqrt(3)
    assert row["accuracy_ci95"] == pytest.approx([0.4 - half, 0.4 + half])
    assert row["pass@k"] == pytest.approx({"1": 0.4, "2": 0.5}) and row["jensen_gap_heldout"] == pytest.approx(0.01)
    assert row["retain_last"]["retain/easy/accuracy"]["mean"] == pytest.approx(0.3)  # seeds 1 and 2: 0.2, 0.4
    lines = (tmp_path / "grid_curves.csv").read_text().splitlines()
    assert len(lines) == 1 + 2 + 3 + 3 and lines[2].startswith("matched-g4-a,grpo,0,1,,0.5")


def test_arms_option_runs_only_those_arms_of_the_part(dr, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(dr, "run_one", lambda spec, grid, root: ran.append((spec.part, spec.arm, spec.seed)))
    monkeypatch.setattr(dr, "summary", lambda root, grid: None)
    assert dr.main(["--part", "matched-g8-a", "--arms", "grpo", "--out", str(tmp_path)]) == 0
    assert ran == [("matched-g8-a", "grpo", k) for k in dr.GRID.seeds]
    with pytest.raises(SystemExit):  # argparse names the valid arms
        dr.main(["--part", "matched-g8-a", "--arms", "grpoo", "--out", str(tmp_path)])


def test_run_one_reads_the_steps_past_the_step_0_retention_record(dr, tmp_path, monkeypatch):
    # the trainer logs the retention sets before the first step as a record of their own (step 0, no timings)
    spec = dr.parts(dr.PILOT)["matched-g4-a"][0]
    budget = dr.run_config(spec, dr.PILOT).train.max_sampled_tokens

    def fake_run(cfg, run_dir):
        recs = [{"step": 0, "retain/easy/accuracy": 0.25}]
        recs += [{"step": s, "tokens/sampled_total": budget * s // 2, "time/sample_s": 1.0, "time/train_s": t}
                 for s, t in ((1, 2.0), (2, 4.0))]  # fmt: skip
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    monkeypatch.setattr(dr.trainer_lib, "run", fake_run)
    monkeypatch.setattr(dr, "heldout_eval", lambda *a, **k: {"accuracy": 0.5})
    result = dr.run_one(spec, dr.PILOT, tmp_path)
    assert (result["steps"], result["sampled_tokens"], result["step_s_median"]) == (2, budget, 4.0)  # median(3, 5)


# ---- the second edition (benchmarks/degeneracy_real2.py, degeneracy_real2_analysis.py) ----

@pytest.fixture(scope="module")
def dr2():
    return benchmark_module.load("degeneracy_real2")  # it puts benchmarks/ on sys.path for its analysis module


DESIGN_KW = dict(matched=4, hard=6, retain=1, max_grad_norm=25.0,
                 lr={"grpo": 1e-5, "dr_grpo": 3e-5, "sign": 3e-6, "grpo_mask": 1e-5, "grpo_resample": 1e-5,
                     "avspo": 1e-5, "sign@lora": 1e-4, "dr_grpo@lora": 3e-4})  # fmt: skip


def test_second_edition_grid_configs(dr2, tmp_path):
    design = dr2.Design(**DESIGN_KW)
    grid = dr2.parts(design)
    assert sum(c.seeds * len(c.arms) for c in dr2.CONDITIONS.values()) == sum(len(v) for v in grid.values())
    assert {c: cond.seeds for c, cond in dr2.CONDITIONS.items()} == {"m4": 8, "m8": 8, "hard": 10, "lora": 8,
                                                                     "m4pool": 8, "hardpool": 10}  # the minimum
    for specs in grid.values():
        cfgs = {s.arm: dr2.run_config(s, design, tmp_path) for s in specs}  # validated by the config loader
        cond = dr2.CONDITIONS[specs[0].cond]
        for arm, cfg in cfgs.items():
            assert cfg.rollout.prompts_per_step * cfg.rollout.group_size == design.rows
            assert cfg.rollout.group_size == cond.group and cfg.lora.rank == cond.lora_rank
            assert cfg.train.max_sampled_tokens == design.steps * design.rows * dr2.MAX_NEW_TOKENS
            assert cfg.data.split == "pair-train" and cfg.data.difficulty == {"matched": 4, "hard": 6}[cond.level]
            assert cfg.optim.max_grad_norm == 25.0
            assert cfg.optim.learning_rate == design.lr[dr2.lr_key(dr2.LR_FROM.get(arm, arm), cond.lora_rank)]
            # amendment 3: the skip arm and the held-out probe; amendment 5: the skip arm trains on a recurring pool
            assert cfg.rollout.schedule == ("skip" if arm == "grpo_skip" else "none")
            assert cfg.data.num_examples == (64 if specs[0].cond.endswith("pool") else None)
            assert (cfg.train.eval_every, cfg.train.eval_examples) == ((10, 64) if cond.probe else (0, 64))
            assert cfg.model.name_or_path == str(tmp_path / "warmup" / "final")
            (held,) = cfg.train.retain.values()
            assert (held["difficulty"], held["split"]) == (1, "pair-test") and cfg.train.retain_every > 2 * design.steps
            # Dr. GRPO with its own aggregation (sum over tokens / (S x max_tokens)), every other arm token-mean
            assert cfg.algo.aggregation == ("seq-mean-token-sum-norm" if arm == "dr_grpo" else "token-mean")
        algos = [(c.algo, c.optim, c.rollout) for c in cfgs.values()]
        assert len({repr(a) for a in algos}) == len(algos)  # no two arms are one configuration
    assert [c for c, cond in dr2.CONDITIONS.items() if "grpo_skip" in cond.arms] == ["m4pool", "hardpool"]
    assert {c for c, cond in dr2.CONDITIONS.items() if cond.probe} == {"m4", "hard", "m4pool", "hardpool"}


def test_second_edition_skip_arm_needs_recurring_prompts(dr2, monkeypatch):
    """Amendment 5: the skip rule reads a prompt's own earlier groups. On a whole pair-train split, the budget's 400
    prompt draws (100 steps x 4) never revisit a prompt, so a skip arm there would be resampling under another name."""
    from jaxgrpo.word_arithmetic import default_size

    design = dr2.Design(**DESIGN_KW)
    drawn = design.steps * design.rows // 4
    assert drawn == 400 and default_size(4, "pair-train") > 10 * drawn  # the whole split: no prompt recurs
    assert drawn / dr2.POOL >= 6  # a pool prompt is visited ~6 times at the budget
    monkeypatch.setitem(dr2.CONDITIONS, "m4", dr2.Condition("matched", 4, ("grpo_resample", "grpo_skip"), 8))
    with pytest.raises(ValueError, match="condition 'm4': arm 'grpo_skip' .* do not recur .* at most 200 problems"):
        dr2.parts(design)
    monkeypatch.setitem(dr2.CONDITIONS, "m4", dr2.Condition("matched", 4, ("grpo_skip",), 8, pool=201))
    with pytest.raises(ValueError, match="at most 200 problems"):
        dr2.parts(design)
    monkeypatch.setitem(dr2.CONDITIONS, "m4", dr2.Condition("matched", 4, ("grpo_skip",), 8, pool=200))
    assert [s.arm for s in dr2.parts(design)["m4-seed0"]] == ["grpo_skip"]


def test_second_edition_parts_and_errors(dr2, tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit, match="design.json is missing: run --part warmup, levels, pilot, design"):
        dr2.main(["--part", "m4-seed0", "--out", str(tmp_path)])
    dr2._write_json(tmp_path / "design.json", {"design": DESIGN_KW})
    ran = []
    monkeypatch.setattr(dr2, "run_one",
                        lambda spec, design, out, work: ran.append((spec.cond, spec.arm, spec.seed)) or {})  # fmt: skip
    assert dr2.main(["--part", "lora-seed3", "--out", str(tmp_path)]) == 0
    assert ran == [("lora", "sign", 3), ("lora", "dr_grpo", 3)]
    ran.clear()
    assert dr2.main(["--part", "hard", "--arms", "grpo", "--out", str(tmp_path)]) == 0
    assert ran == [("hard", "grpo", k) for k in range(10)]
    assert dr2.main(["--part", "m4-seed8", "--out", str(tmp_path)]) == 2  # m4 has seeds 0..7
    assert "unknown part 'm4-seed8'" in capsys.readouterr().err
    ran.clear()
    assert dr2.main(["--part", "grid", "--arms", "sign", "--out", str(tmp_path)]) == 0  # seed by seed, every condition
    order = [(c, k) for k in range(10) for c in ("m4", "m8", "hard", "lora") if k < dr2.CONDITIONS[c].seeds]
    assert ran == [(c, "sign", k) for c, k in order] and len(ran) == 8 + 8 + 10 + 8
    ran.clear()
    assert dr2.main(["--part", "grid", "--arms", "grpo_skip", "--out", str(tmp_path)]) == 0  # amendment 5's pools
    pools = [(c, k) for k in range(10) for c in ("m4pool", "hardpool") if k < dr2.CONDITIONS[c].seeds]
    assert ran == [(c, "grpo_skip", k) for c, k in pools] and len(ran) == 8 + 10


def test_second_edition_train_stats_by_hand(dr2):
    recs = [{"step": 0, "retain/held/accuracy": 0.9}] + [
        {"step": s, "time/train_s": 1.0, "grad_norm": g, "reward/mean": r, "degeneracy/collapse_rate": c,
         "degeneracy/iid_rate": i}
        for s, g, r, c, i in ((1, 0.0, 0.0, 1.0, 0.9), (2, 3.0, 0.5, 0.5, 0.5), (3, 30.0, 1.0, 0.25, 0.0),
                              (4, 5.0, 0.5, 0.75, 0.5))]  # fmt: skip
    s = dr2.train_stats(recs, 10.0)
    assert (s["steps"], s["zero_grad_frac"], s["clip_frac"]) == (4, 0.25, 0.25)
    assert s["jensen_gap_train"] == pytest.approx((0.1 + 0.0 + 0.25 + 0.25) / 4)
    assert (s["reward_mean"], s["reward_last_half"]) == (0.5, 0.75) and s["grad_norm_pcts"]["50"] == 4.0


def test_second_edition_sampling_stats_by_hand(dr2):
    """Amendment 3: informative groups per 1,000 sampled tokens (the schedule's count, P x the resample fraction, or
    the step's informative groups) and the held-out probe with the tokens and step seconds spent by then."""
    recs = [{"step": 0, "retain/held/accuracy": 0.9}] + [
        {"step": 1, "time/train_s": 1.0, "time/sample_s": 2.0, "tokens/sampled": 100, "tokens/sampled_total": 100,
         "groups/informative": 3.0},
        {"step": 2, "time/train_s": 1.5, "time/sample_s": 0.5, "tokens/sampled": 300, "tokens/sampled_total": 400,
         "groups/informative": 4.0, "resample/informative_frac": 0.75, "eval/pass@1": 0.5},
        {"step": 3, "time/train_s": 1.0, "time/sample_s": 1.0, "tokens/sampled": 100, "tokens/sampled_total": 500,
         "groups/informative": 4.0, "schedule/informative_groups": 5.0, "resample/informative_frac": 1.0}]
    s = dr2.sampling_stats(recs, 4)
    assert s["informative_groups"] == 3 + 4 * 0.75 + 5
    assert s["informative_per_1k_tokens"] == pytest.approx(1000 * 11 / 500) and s["step_seconds"] == 7.0
    assert s["probe"] == [{"step": 2, "tokens": 400, "seconds": 5.0, "accuracy": 0.5}]
    probe = {"budget": 1000, "probe": [{"tokens": 200, "accuracy": 0.3}, {"tokens": 400, "accuracy": 0.61}]}
    assert dr2.analysis.tokens_to_target(probe, 0.6) == 400.0
    assert dr2.analysis.tokens_to_target(probe, 0.7) == 2000.0  # never reached: twice the budget


def test_pick_levels_rule(dr2):
    pick = dr2.analysis.pick_levels({1: 0.92, 2: 0.85, 3: 0.55, 4: 0.31, 5: 0.08, 6: 0.04},
                                    {1: 28, 2: 21, 3: 286, 4: 2732, 5: 249, 6: 262})  # fmt: skip
    assert (pick["matched"], pick["hard"], pick["retain"]) == (4, 6, 1)  # |0.31 - 0.4| < |0.55 - 0.4|; 5: < 256
    pick = dr2.analysis.pick_levels({3: 0.3, 6: 0.0}, {3: 286, 6: 262})
    assert (pick["matched"], pick["hard"]) == (3, None)  # never solved: escape impossible
    pick = dr2.analysis.pick_levels({1: 0.5, 3: 0.7}, {1: 28, 3: 286})  # level 1 is too small to be matched
    assert (pick["matched"], pick["hard"], pick["retain"]) == (None, None, None)


def test_resolve_design_from_pilot_files(dr2, tmp_path):
    dr2._write_json(tmp_path / "levels.json", {"pick": {"matched": 4, "hard": 5, "retain": 1}})
    for arm, lr, reward, p99 in (("grpo", 1e-5, 0.4, 8.0), ("grpo", 3e-5, 0.6, 20.0), ("sign", 3e-6, 0.5, 3.0),
                                 ("sign", 1e-5, 0.5, 90.0), ("sign@lora", 1e-4, 0.2, 1.0)):  # fmt: skip
        dr2._write_json(tmp_path / "pilot" / arm / f"lr{lr:g}" / "pilot.json",
                        {"lr": lr, "reward_last_half": reward, "grad_norm_pcts": {"99": p99}})
    out = dr2.analysis.resolve_design(tmp_path, 2.0)
    # grpo: the higher reward (3e-5); sign: a tie goes to the smaller lr (3e-6), so its 90.0 is not a chosen run
    assert out["design"]["lr"] == {"grpo": 3e-5, "sign": 3e-6, "sign@lora": 1e-4}
    assert out["design"]["max_grad_norm"] == 40.0 and (out["design"]["matched"], out["design"]["hard"]) == (4, 5)
    dr2._write_json(tmp_path / "levels.json", {"pick": {"matched": 4, "hard": None, "retain": 1}})
    design = dr2.Design(**dr2.analysis.resolve_design(tmp_path, 2.0)["design"])  # only "hard" has to wait
    with pytest.raises(SystemExit, match="no hard level for condition 'hard'"):
        dr2.run_config(dr2.RunSpec("hard", "grpo", 0), design, tmp_path)
    dr2._write_json(tmp_path / "levels.json", {"pick": {"matched": None, "hard": 5, "retain": 1}})
    with pytest.raises(SystemExit, match="picked no matched level"):
        dr2.analysis.resolve_design(tmp_path, 2.0)


def test_first_edition_audit_backs_the_quoted_figures(dr2):
    audit = dr2.analysis.audit_first_edition()
    assert audit["matched-g4"]["min_p_holm"] == pytest.approx(0.155, abs=5e-4)  # README: smallest adjusted p 0.155
    assert min(a["min_p_holm"] for a in audit.values()) == audit["matched-g4"]["min_p_holm"]
    zero = audit["matched-g4"]["arms"]["grpo"]["zero_grad_frac"] + audit["matched-g8"]["arms"]["grpo"]["zero_grad_frac"]
    assert 0.60 < min(zero) and max(zero) < 0.72  # README: 60-72% of GRPO's steps with an exactly zero gradient
    for cond in ("matched-g4", "matched-g8"):
        for arm in ("grpo", "grpo_mask", "grpo_resample"):
            assert audit[cond]["arms"][arm]["clip_frac_nonzero"] == [1.0, 1.0, 1.0]
        clipped = audit[cond]["arms"]["sign"]["clip_frac"] + audit[cond]["arms"]["avspo"]["clip_frac"]
        assert 0.21 <= min(clipped) and max(clipped) <= 0.91  # README: 21-90% of sign's and AVSPO's steps


def test_the_tiny_study_audit_backs_the_quoted_figures(dr2):
    """docs/degeneracy.md §1 and README: the tiny-model study's mode and estimator comparisons, as quoted (the
    committed tiny_study_audit.json is the function's output), and the 17-of-18 count read from runs.csv here."""
    import csv

    audit = dr2.analysis.audit_tiny_study()
    out = REPO / "benchmarks" / "results" / "degeneracy" / "real2" / "tiny_study_audit.json"
    assert json.loads(out.read_text()) == json.loads(json.dumps(audit))
    modes = {(m["regime"], m["a"], m["b"]): m for m in audit["modes"]}
    quoted = {  # (a above b of 18, difference, pairs p, pairs Holm p, seeds p, seeds Holm p), as the docs round them
        ("too_hard", "resample", "keep"): (17, 0.041, 0.0003, 0.002, 0.088, 0.71),
        ("too_hard", "resample", "mask"): (15, 0.042, 0.0005, 0.004, 0.10, 0.72),
        ("too_easy", "resample", "mask"): (0, -0.030, 0.0, 0.0, 0.062, 0.56)}
    for key, (above, diff, p, q, ps, qs) in quoted.items():
        m = modes[key]
        assert (m["a_above"], m["pairs"]) == (above, 18), key
        assert m["diff"] == pytest.approx(diff, abs=5e-4), key
        assert m["p_pairs"] == pytest.approx(p, abs=5e-4) and m["p_pairs_holm"] == pytest.approx(q, abs=5e-4), key
        assert m["p_seeds"] == pytest.approx(ps, abs=6e-3) and m["p_seeds_holm"] == pytest.approx(qs, abs=6e-3), key
    assert [k for k, m in modes.items() if m["p_seeds_holm"] < 0.05] == []  # nothing significant with seeds as unit
    assert {k for k, m in modes.items() if m["p_pairs_holm"] < 0.05} == set(quoted)  # "no other mode comparison"
    est = audit["estimators_vs_grpo_keep"]
    assert min(e["p"] for e in est) == pytest.approx(0.11, abs=5e-3) and {e["p_holm"] for e in est} == {1.0}
    rows = list(csv.DictReader((REPO / "benchmarks/results/degeneracy/synthetic/runs.csv").open()))
    acc = {(r["estimator"], r["mode"], r["seed"]): float(r["final_acc_sampled"]) for r in rows
           if r["regime"] == "too_hard"}  # fmt: skip
    assert sum(acc[(e, "resample", s)] > acc[(e, "keep", s)] for e, m, s in acc if m == "keep") == 17


def test_second_edition_run_one_records_config_seed_commit(dr2, tmp_path, monkeypatch):
    design = dr2.Design(**DESIGN_KW)
    spec = dr2.RunSpec("m8", "grpo_resample", 5)
    budget = design.steps * design.rows * dr2.MAX_NEW_TOKENS
    recs = [{"step": 0, "retain/held/accuracy": 0.9}] + [
        {"step": s, "time/train_s": 1.0, "grad_norm": g, "reward/mean": 0.5, "degeneracy/collapse_rate": 0.5,
         "degeneracy/iid_rate": 0.4, "tokens/sampled_total": budget * s // 2, "tokens/sampled": budget // 2,
         "time/sample_s": 2.0, "groups/informative": 3.0, "resample/informative_frac": 0.5}
        for s, g in ((1, 0.0), (2, 40.0))]
    recs[-1]["retain/held/accuracy"] = 0.8
    monkeypatch.setattr(dr2, "_train", lambda cfg, run_dir: recs)
    evals = []
    monkeypatch.setattr(dr2, "evaluate_level", lambda cfg, run_dir, level, prompts, samples, group, key: evals.append(
        (level, prompts, samples, group)) or {"accuracy": 0.5 if level == 4 else 0.85})
    weights = tmp_path / "work" / "warmup" / "final" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"abc")
    res = dr2.run_one(spec, design, tmp_path, tmp_path / "work")
    # which warm-up the run started from: SHA-256 of b"abc" (FIPS 180-2's example)
    assert res["warmup_sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert evals == [(4, 256, 8, 8), (1, 256, 16, 4)]  # held-out: 256 problems x 8; retention: the held skill
    assert (res["seed"], res["level"], res["group"], res["sampled_tokens"]) == (5, 4, 8, budget)
    assert res["config"]["algo"]["degenerate_groups"] == "resample" and res["config"]["seed"] == 5
    assert len(res["commit"]) >= 40 and (res["clip_frac"], res["zero_grad_frac"]) == (0.5, 0.5)  # 40 > 25
    assert res["retain_trainer"] == {"0": 0.9, "2": 0.8}
    # amendment 3's measures (m8 has no probe): P = 2 prompts at G = 8, half of them informative each step
    assert (res["informative_groups"], res["step_seconds"], res["probe"]) == (2.0, 6.0, [])
    assert res["informative_per_1k_tokens"] == pytest.approx(1000 * 2.0 / budget)
    assert json.loads((tmp_path / "m8" / "grpo_resample" / "seed5" / "result.json").read_text()) == res


def test_second_edition_workers_side_by_side_skip_a_held_run(dr2, tmp_path, monkeypatch, capsys):
    # several processes may run one part on one results directory: a run another live process holds is skipped, and
    # a killed holder leaves no stale lock (the kernel drops a dead process's flock)
    design, spec = dr2.Design(**DESIGN_KW), dr2.RunSpec("m4", "sign", 0)
    run_dir = tmp_path / "m4" / "sign" / "seed0"
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()", str(run_dir / dr2.STUDY_LOCK)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(dr2, "_run_held", lambda *a: pytest.fail("trained a run another process holds"))
        assert dr2.run_one(spec, design, tmp_path, tmp_path / "work") is None
        assert "held by another process, skipped" in capsys.readouterr().err
        ran = []
        monkeypatch.setattr(dr2, "run_one", lambda s, d, o, w: None if s == spec else ran.append(s.arm) or {})
        dr2._write_json(tmp_path / "design.json", {"design": DESIGN_KW})
        assert dr2.main(["--part", "m4-seed0", "--out", str(tmp_path)]) == 0
        assert ran == [a for a in dr2.CONDITIONS["m4"].arms if a != "sign"]  # the others' runs go on
        assert "1 run(s) were held by other processes" in capsys.readouterr().err
        monkeypatch.undo()
    finally:
        holder.kill()  # SIGKILL: no cleanup runs in the holder
        holder.wait()
    monkeypatch.setattr(dr2, "_run_held", lambda s, d, rd, w: {"ran": str(rd.relative_to(tmp_path))})
    assert dr2.run_one(spec, design, tmp_path, tmp_path / "work") == {"ran": "m4/sign/seed0"}
    lock = RunLock(run_dir, dr2.STUDY_LOCK).acquire()  # released after the run
    with pytest.raises(ConfigError, match="in use by another trainer"):  # a second open conflicts, even in one process
        RunLock(run_dir, dr2.STUDY_LOCK).acquire()
    lock.release()
    dr2._write_json(run_dir / "result.json", {"seed": 0})  # a finished run is read, whoever holds it
    assert dr2.run_one(spec, design, tmp_path, tmp_path / "work") == {"seed": 0}


def test_second_edition_levels_resume_and_pick(dr2, tmp_path, monkeypatch):
    measured = []
    acc = {1: 0.94, 2: 0.53, 3: 0.33, 4: 0.12, 5: 0.2, 6: 0.03, 7: 0.0, 8: 0.02}
    monkeypatch.setattr(dr2, "evaluate_level", lambda cfg, run_dir, level, *a: measured.append(level) or {
        "accuracy": acc[level], "prompts": 28 if level == 1 else 21 if level == 2 else 64})
    dr2._write_json(tmp_path / "levels.json", {"commit": "x", "levels": {"1": {"accuracy": 0.94, "prompts": 28},
                                                                           "2": {"accuracy": 0.53, "prompts": 21}}})
    res = dr2.levels(dr2.Design(), tmp_path, tmp_path / "work")
    assert measured == [3, 4, 5, 6, 7, 8]  # levels 1 and 2 were in the file already
    # the pick reads each split's size (286, 2732, 249, 262, 1327, 2714 at levels 3-8), not the evaluated count (64);
    # too hard is the highest in (0, 0.1]: level 6 (0.03) over level 8 (0.02), never level 7 (0: no escape possible)
    assert (res["pick"]["matched"], res["pick"]["hard"], res["pick"]["retain"]) == (3, 6, 1)
    assert all(len(res["levels"][str(k)]["commit"]) >= 40 for k in measured) and "commit" not in res["levels"]["1"]


def test_second_edition_analyze_needs_the_study_directory(dr2, tmp_path):
    with pytest.raises(SystemExit, match=r"claims.json is missing: --out must name the study's results directory"):
        dr2.main(["--part", "analyze", "--out", str(tmp_path)])
