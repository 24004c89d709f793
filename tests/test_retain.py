# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Capability retention (``train.retain``): the trainer's ``retain/<set>/accuracy`` equals `jaxgrpo.eval.evaluate` run
on the same prompts, parameters (the step's checkpoint, and at step 0 the initial policy) and key, every
``retain_every`` steps and at the run's last step; bad entries are clean config errors. The same tiny run checks the
per-step ``diversity/*`` metrics."""

from __future__ import annotations

import math

import jax
import pytest

from jaxgrpo import build, metrics_log, trainer
from jaxgrpo import config as config_lib
from jaxgrpo import data as data_lib
from jaxgrpo import eval as eval_lib
from jaxgrpo import retain as retain_lib

RUN = ["train.steps=3", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=2",
       "checkpoint.every=2", "checkpoint.export_final=false", "log.progress=false", "log.tensorboard=false",
       "log.sample_every=0", "train.retain_every=2",
       "train.retain={copy: {difficulty: 0, split: test, num_examples: 6}, "
       "sums: {difficulty: 2, split: test, num_examples: 5, reward: arithmetic_lenient}}"]  # fmt: skip


@pytest.mark.slow
def test_retain_accuracy_equals_eval_on_the_same_set_and_params(tmp_path):
    cfg = config_lib.load_config("default", RUN)
    run_dir = tmp_path / "run"
    trainer.run(cfg, run_dir)
    recs = metrics_log.read_metrics(run_dir)
    assert [r["step"] for r in recs] == [0, 1, 2, 3]
    base, recs = recs[0], recs[1:]  # step 0: the retention sets before any update, and nothing else
    assert sorted(base) == ["retain/copy/accuracy", "retain/sums/accuracy", "step"]
    # then every 2 steps, and at the last step (3) though 3 is not a multiple of 2
    assert [any(k.startswith("retain/") for k in r) for r in recs] == [False, True, True]
    sets = retain_lib.resolve(cfg)
    assert [(s.name, s.reward) for s in sets] == [("copy", "arithmetic"), ("sums", "arithmetic_lenient")]
    for step in (2, 3):
        policy = eval_lib.load_policy_for_eval(cfg, run_dir, step)  # the params when the sets were evaluated
        for i, rs in enumerate(sets):
            examples = data_lib.load_dataset(rs.data, cfg.seed)
            assert len(examples) == rs.data.num_examples
            ref = eval_lib.evaluate(policy.model_config, policy.params, policy.tokenizer, examples, rs.reward,
                                    num_samples=4, group_sizes=[], max_new_tokens=2, data_config=rs.data,
                                    key=jax.random.fold_in(jax.random.fold_in(jax.random.key(cfg.seed), step), 2 + i))
            assert recs[step - 1][f"retain/{rs.name}/accuracy"] == pytest.approx(ref["mean_success_rate"], abs=1e-12)
        start = eval_lib.evaluate(policy.model_config, build.build_policy(cfg, build.policy_key(cfg))[1],
                                  policy.tokenizer, examples, rs.reward, num_samples=4, group_sizes=[],
                                  max_new_tokens=2, data_config=rs.data,
                                  key=jax.random.fold_in(jax.random.fold_in(jax.random.key(cfg.seed), 0), 2 + i))
        assert base[f"retain/{rs.name}/accuracy"] == pytest.approx(start["mean_success_rate"], abs=1e-12)
    # the step's diversity metrics (jaxgrpo.diversity)
    for rec in recs:
        assert 1 / 4 <= rec["diversity/distinct_frac"] <= 1.0
        assert rec["diversity/distinct"] == pytest.approx(4 * rec["diversity/distinct_frac"])
        assert 0.0 < rec["diversity/entropy"] <= math.log(64)


@pytest.mark.parametrize("override,match", [
    ("train.retain={a: {difficulty: 0, splt: test}}", r"'train.retain.a.splt'; did you mean 'train.retain.a.split'"),
    ("train.retain={a: {source: words, difficulty: 7}}", r"train.retain.a: data.source=words needs difficulty in \["),
    ("train.retain={a: {reward: nope}}", r"train.retain.a.reward: unknown reward function 'nope'"),
    ("train.retain={'a b': {difficulty: 1}}", r"train.retain.a b: a retention set's name becomes the metric"),
    ("train.retain_every=-2", r"train.retain_every must be >= 0"),
])  # fmt: skip
def test_bad_retain_entries_are_clean_errors(override, match):
    with pytest.raises(config_lib.ConfigError, match=match):
        config_lib.load_config("default", [override])


def test_words_retain_set_defaults_to_the_last_number_reward():
    cfg = config_lib.load_config("default", ["train.retain={easy: {source: words, difficulty: 1, split: test}}"])
    (rs,) = retain_lib.resolve(cfg)
    assert rs.reward == "gsm8k_lenient" and rs.data.source == "words" and rs.data.template == "chat"
