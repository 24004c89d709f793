# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`jaxgrpo.eval_schedule`: informative groups per sampled token and the schedule's predictor, against a brute-force
enumeration of every G-subset of the n samples (no hypergeometric formula) and GRESO's keep rule by hand."""

from __future__ import annotations

import dataclasses
import itertools
import json

import jax
import numpy as np
import pytest

from jaxgrpo import checkpoint as ckpt
from jaxgrpo import config as config_lib
from jaxgrpo import data as data_lib
from jaxgrpo import eval as ev
from jaxgrpo import eval_schedule, scheduler


def enumerate_expectations(outcomes: list[list[bool]], lengths: list[list[float]], sizes: list[int],
                           keep: list[float]) -> float:
    """1000 · E[informative groups] / E[sampled tokens] with each prompt's group an equally likely G-subset of its n
    samples (a group costs the lengths of its own members), kept with probability keep[i]."""
    informative = tokens = 0.0
    for out, lens, g, k in zip(outcomes, lengths, sizes, keep):
        subsets = list(itertools.combinations(range(len(out)), g))
        informative += k * np.mean([len({out[j] for j in s}) == 2 for s in subsets])
        tokens += k * np.mean([sum(lens[j] for j in s) for s in subsets])
    return 1000.0 * informative / tokens


def test_informative_per_token_equals_the_enumeration():
    rng = np.random.default_rng(0)
    n = 6
    outcomes = [list(rng.random(n) < p) for p in (0.0, 0.2, 0.5, 0.5, 0.8, 1.0, 0.35)]
    lengths = [list(rng.integers(1, 40, n).astype(float)) for _ in outcomes]
    counts = [int(sum(o)) for o in outcomes]
    means = [float(np.mean(v)) for v in lengths]
    for g in (2, 3, 6):
        want = enumerate_expectations(outcomes, lengths, [g] * len(outcomes), [1.0] * len(outcomes))
        np.testing.assert_allclose(eval_schedule.informative_per_1k_tokens(counts, n, means, g), want, rtol=1e-12)
    sizes, keep = [2, 4, 6, 2, 4, 2, 6], [0.25, 1.0, 0.5, 1.0, 0.01, 0.5, 1.0]
    np.testing.assert_allclose(eval_schedule.informative_per_1k_tokens(counts, n, means, sizes, keep),
                               enumerate_expectations(outcomes, lengths, sizes, keep), rtol=1e-12)  # fmt: skip
    with pytest.raises(ValueError, match="group size 8 > n = 6"):
        eval_schedule.informative_per_1k_tokens(counts, n, means, 8)
    with pytest.raises(ValueError, match="one entry per prompt"):
        eval_schedule.informative_per_1k_tokens(counts, n, means[:3], 2)


@dataclasses.dataclass
class Ex:
    prompt: str
    answer: str


def test_history_indices_match_on_prompt_and_answer():
    trained = [Ex("1+1=", "2"), Ex("2+2=", "4"), Ex("1+1=", "2"), Ex("3+3=", "6")]
    asked = [Ex("3+3=", "6"), Ex("1+1=", "2"), Ex("2+2=", "5"), Ex("9+9=", "18")]
    assert eval_schedule.history_indices(asked, trained) == [3, 0, None, None]


def history(settings: scheduler.Settings) -> scheduler.Scheduler:
    """Prompt 0: two all-fail groups (streak -2); prompt 1: three all-pass (+3); prompt 2: one informative (0)."""
    sch = scheduler.Scheduler(settings)
    g = settings.group_size
    for rows in ([0, 1, 2], [0, 1], [1]):
        rewards = np.asarray([[0.0] * g if p == 0 else [1.0] * g if p == 1 else [1.0] + [0.0] * (g - 1) for p in rows])
        sch.record(rows, rewards, np.ones_like(rewards, bool), np.asarray([p != 2 for p in rows]))
    return sch


def test_schedule_report_by_hand():
    sch = history(scheduler.Settings(skip=True, adaptive=True, min_group=2, group_size=4, budget=8))
    assert [sch.records[i].streak for i in range(3)] == [-2, 3, 0]
    n = 4
    outcomes = [[False] * 4, [True, True, True, False], [True, False, True, False], [True] * 4, [False, True] * 2]
    lengths = [[3.0, 5, 7, 9], [2.0, 2, 2, 2], [10.0, 1, 1, 1], [4.0, 4, 4, 4], [1.0, 2, 3, 4]]
    result = {"num_samples": n, "success_counts": [sum(o) for o in outcomes]}
    indices = [0, 1, 2, None, 7]  # prompt 7: not in the history, like a prompt the run has no record of
    rep = eval_schedule.schedule_report(result, sch, indices, [float(np.mean(v)) for v in lengths])
    keep = [max(0.5**2, 0.01), max(0.5**3, 0.01), 1.0, 1.0, 1.0]  # GRESO: keep = max(explore^|z|, min_keep)
    assert rep["prompts_with_history"] == 3 and rep["predicted_degenerate"] == 2
    np.testing.assert_allclose(rep["skip_share"], np.mean([1 - k for k in keep]), rtol=1e-12)
    # adaptive sizes from the discounted Beta estimate, by the closed form u·ceil(G·2σ(p)/u) clipped to [u, G]
    ps = [(1 + sch.records[i].successes) / (2 + sch.records[i].successes + sch.records[i].failures) for i in range(3)]
    ps += [0.5, 0.5]
    sizes = [int(np.clip(2 * np.ceil(4 * 2 * np.sqrt(p * (1 - p)) / 2), 2, 4)) for p in ps]
    assert rep["group_sizes"] == {str(v): sizes.count(v) for v in sorted(set(sizes))}
    np.testing.assert_allclose(rep["informative_per_1k_tokens"],
                               enumerate_expectations(outcomes, lengths, [4] * 5, [1.0] * 5), rtol=1e-12)
    np.testing.assert_allclose(rep["informative_per_1k_tokens_scheduled"],
                               enumerate_expectations(outcomes, lengths, sizes, keep), rtol=1e-12)  # fmt: skip
    # at G = n = 4 a fresh group is degenerate iff the prompt's samples all agree: prompts 0 and 3 (and the
    # predicted ones are 0 and 1): precision 1/2, recall 1/2
    assert rep["predictor_precision"] == 0.5 and rep["predictor_recall"] == 0.5
    text = "\n".join(eval_schedule.format_schedule(rep))
    assert "2 predicted degenerate, precision 0.500, recall 0.500" in text
    with pytest.raises(ValueError, match="--num-samples 4 or more"):
        eval_schedule.schedule_report({"num_samples": 2, "success_counts": [0, 1, 2, 0, 1]}, sch, indices, [1.0] * 5)


TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1"]  # fmt: skip  (test_eval's tiny policy: the same programs)


def test_cli_reports_the_schedule_of_a_checkpointed_run(tmp_path, capsys):
    from jaxgrpo import build

    cfg = config_lib.load_config(None, [*TINY, "rollout.schedule=skip", "rollout.group_size=2",
                                        "rollout.max_new_tokens=3", "data.num_examples=6"])  # fmt: skip
    _, params, _ = build.build_policy(cfg, jax.random.key(0))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config_lib.to_yaml(cfg))
    sch = scheduler.from_config(cfg)
    sch.restore(history(sch.settings).state())
    with ckpt.CheckpointManager(ckpt.run_checkpoint_dir(run), keep=2) as mgr:
        mgr.save(3, {"params": params, "step": 3}, {"iterator": {"epoch": 0, "position": 0}, "scheduler": sch.state()})
    rc = ev.main(["--run-dir", str(run), "--split", "train", "--num-prompts", "4", "--num-samples", "2"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    result = json.loads((run / "eval" / "step3-train" / "eval.json").read_text())
    rep = result["schedule"]
    # the first 4 training prompts are the run's prompts 0..3 (the synthetic stream is prefix-stable); 0..2 have
    # history, 0 and 1 have streaks
    assert data_lib.load_dataset(dataclasses.replace(cfg.data, num_examples=4), cfg.seed) == \
        data_lib.load_dataset(cfg.data, cfg.seed)[:4]
    assert (rep["prompts_with_history"], rep["predicted_degenerate"], rep["group_sizes"]) == (3, 2, {"2": 4})
    np.testing.assert_allclose(rep["skip_share"], (0.75 + 0.875) / 4, rtol=1e-12)
    c = result["success_counts"]
    d = [float(ci in (0, 2)) for ci in c]  # G = n = 2: degenerate iff both samples agree
    assert rep["predictor_precision"] == pytest.approx((d[0] + d[1]) / 2)
    lengths = result["completion_length_per_prompt"]
    want = 1000 * sum(1 - x for x in d) / sum(2 * v for v in lengths)
    assert rep["informative_per_1k_tokens"] == pytest.approx(want)
    assert result["degeneracy"][0]["informative_per_1k_tokens"] == pytest.approx(want)
    assert "predicted degenerate" in out.out and "informative groups / 1k sampled tokens" in out.out
