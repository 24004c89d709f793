# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""benchmarks/degeneracy_study.py: the --quick synthetic study writes the documented files, and its numbers obey
facts known without the code under test: a task no completion can solve has reward 0, collapse rate 1 (all-fail 1),
and no GRPO gradient, while the sign advantage still has one; dynamic sampling spends every round; the token budget
is reached and overshot by less than one step; the level split adds up to the per-prompt success counts."""

from __future__ import annotations

import csv
import json
import math
import pathlib

import benchmark_module
import numpy as np
import pytest


def _load_runner():
    return benchmark_module.load("degeneracy_study")


def _read_csv(path: pathlib.Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    runner = _load_runner()
    out = tmp_path_factory.mktemp("degeneracy")
    assert runner.main(["synthetic", "--quick", "--out", str(out)]) == 0
    d = out / "synthetic"
    return (runner, json.loads((d / "base.json").read_text()), _read_csv(d / "runs.csv"), _read_csv(d / "curves.csv"),
            json.loads((d / "jensen_tiny.json").read_text()))


def test_impossible_control_needs_three_digit_answers():
    runner = _load_runner()
    examples = runner.level_examples(-1, 20, 0, "train")
    assert len(examples) == 20 and all(int(e.answer) >= 100 for e in examples)
    for e in examples:  # level-3 problems 'ab+cd=' / 'ab-cd=' whose answer is their value
        a, op, b = e.prompt[:2], e.prompt[2], e.prompt[3:5]
        assert e.prompt[5:] == "=" and int(e.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))


@pytest.mark.slow
def test_quick_study_schema_and_facts(quick):
    runner, base, runs, curves, _ = quick
    s = runner.QUICK
    # schema
    assert set(base) >= {"settings", "level_split", "regimes", "initial_accuracy", "base_curve", "meta"}
    assert set(base["regimes"]) == {"too_hard", "matched", "too_easy", "impossible"}
    assert base["regimes"]["impossible"] == -1
    assert {base["regimes"][k] for k in ("too_hard", "matched", "too_easy")} == set(runner.REGIME_LEVELS)
    assert len(runs) == len(base["regimes"]) * len(s.arms) * len(s.seeds)
    for col in ("regime", "estimator", "mode", "seed", "steps", "tokens_used", "final_acc_sampled", "final_acc_greedy",
                "collapse_mean", "all_pass_mean", "all_fail_mean", "spurious_max", "grad_norm_mean"):
        assert col in runs[0], col
    for col in ("run", "step", "tokens_total", "reward", "collapse", "all_pass", "all_fail", "spurious", "grad_norm",
                "tokens", "rounds", "sampled_collapse"):
        assert col in curves[0], col

    # the level split is the per-prompt success counts, recounted here
    for sp in base["level_split"].values():
        c = np.array(sp["success_counts"])
        assert len(c) == s.probe_prompts
        assert sp["all_fail"] == pytest.approx(np.mean(c == 0))
        assert sp["all_pass"] == pytest.approx(np.mean(c == s.group))
        assert sp["mean_success_rate"] == pytest.approx(c.sum() / (len(c) * s.group))

    by_run: dict[str, list[dict[str, str]]] = {}
    for row in curves:
        by_run.setdefault(row["run"], []).append(row)
    for r in runs:
        rows = by_run[f"{r['regime']}/{r['estimator']}/{r['mode']}/{r['seed']}"]
        tok = np.array([float(x["tokens"]) for x in rows])
        total = np.array([float(x["tokens_total"]) for x in rows])
        assert [int(x["step"]) for x in rows] == list(range(1, int(r["steps"]) + 1))  # curve_every=1 in --quick
        np.testing.assert_array_equal(total, np.cumsum(tok))
        # the budget is reached, and the last step started below it
        assert total[-1] == int(r["tokens_used"]) >= s.token_budget > total[-1] - tok[-1]
        rounds = np.array([int(x["rounds"]) for x in rows])
        # each round samples P x G completions of 1..max_new_tokens tokens
        assert np.all(tok >= rounds * s.prompts * s.group) and np.all(tok <= rounds * s.prompts * s.group * 2)
        assert 0.0 <= float(r["final_acc_sampled"]) <= 1.0 and 0.0 <= float(r["final_acc_greedy"]) <= 1.0

        if r["regime"] != "impossible":
            continue
        # a 3-digit answer in 2 tokens: reward 0 everywhere, every group all-fail
        for x in rows:
            assert float(x["reward"]) == 0.0
            assert float(x["collapse"]) == 1.0 and float(x["all_fail"]) == 1.0 and float(x["all_pass"]) == 0.0
            assert float(x["sampled_collapse"]) == 1.0
        assert float(r["final_acc_sampled"]) == 0.0 and float(r["final_acc_greedy"]) == 0.0
        grad = np.array([float(x["grad_norm"]) for x in rows])
        if r["estimator"] == "grpo":  # zero advantage everywhere (keep) / nothing left to train on (resample)
            assert np.all(grad == 0.0) and int(r["zero_grad_steps"]) == int(r["steps"])
        if r["estimator"] == "sign":  # A = 2r - 1 = -1 for every failure: a gradient every step
            assert np.all(grad > 0.0) and int(r["zero_grad_steps"]) == 0
        if r["mode"] == "resample":  # never an informative group: every step spends all its rounds
            assert np.all(rounds == s.resample_max_rounds)
        else:
            assert np.all(rounds == 1)
    keep = [int(r["steps"]) for r in runs if r["regime"] == "impossible" and r["mode"] == "keep"]
    resample = [int(r["steps"]) for r in runs if r["regime"] == "impossible" and r["mode"] == "resample"]
    assert min(keep) > max(resample)  # the same budget buys fewer steps when every step samples 4 rounds


@pytest.mark.slow
def test_quick_jensen_table_is_the_hypergeometric_recount(quick):
    runner, base, _, _, jensen = quick
    assert set(jensen) == {f"tiny_level{lv}" for lv in runner.LEVELS}
    for r in jensen.values():
        n, c = r["num_samples"], np.array(r["success_counts"])
        assert n == 16 and len(c) == 2 * runner.QUICK.probe_prompts
        assert [d["group_size"] for d in r["degeneracy"]] == [2, 4, 8, 16]
        for d in r["degeneracy"]:
            g = d["group_size"]
            measured = np.mean([(math.comb(int(k), g) + math.comb(n - int(k), g)) / math.comb(n, g) for k in c])
            assert d["measured"] == pytest.approx(measured, abs=1e-12)
            pool, hits = n * len(c), int(c.sum())  # every sample pooled: the i.i.d. rate
            assert d["iid"] == pytest.approx((math.comb(hits, g) + math.comb(pool - hits, g)) / math.comb(pool, g))
    assert jensen[f"tiny_level{base['regimes']['matched']}"]["regime"] == "matched"


def test_choose_regimes_rule():
    runner = _load_runner()
    split = {0: {"all_pass": 0.7, "all_fail": 0.1, "mixed": 0.2}, 1: {"all_pass": 0.2, "all_fail": 0.3, "mixed": 0.5},
             2: {"all_pass": 0.0, "all_fail": 0.9, "mixed": 0.1}}
    assert runner.choose_regimes(split) == {"too_easy": 0, "too_hard": 2, "matched": 1}
