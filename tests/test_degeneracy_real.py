# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The real-model study's runner (benchmarks/degeneracy_real.py) without the model: every run's config is valid and
the arms of a part share one token budget and one P x G; ``--arms`` runs a subset of a part; a finished run (its
result.json) is skipped; results are written atomically; the summary's mean and Student-t interval against hand
values."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dr():
    spec = importlib.util.spec_from_file_location("degeneracy_real", REPO / "benchmarks" / "degeneracy_real.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["degeneracy_real"] = mod
    spec.loader.exec_module(mod)
    return mod


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
