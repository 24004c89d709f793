# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Capability retention (``train.retain``) and periodic evaluation (``train.eval_every``): the trainer's
``retain/<set>/accuracy`` and ``eval/*`` metrics recomputed by hand from the completions its sampler returned (decoded,
scored by the reward function, counted per prompt), at the parameters of the step's checkpoint (step 0: the initial
policy), every ``retain_every`` / ``eval_every`` steps (retention also at the run's last step); bad entries are clean
config errors. The same tiny run checks the per-step ``diversity/*`` metrics."""

from __future__ import annotations

import math

import chex
import jax
import numpy as np
import pytest

from jaxgrpo import build, metrics_log, trainer
from jaxgrpo import config as config_lib
from jaxgrpo import data as data_lib
from jaxgrpo import eval as eval_lib
from jaxgrpo import retain as retain_lib
from jaxgrpo import rewards as rewards_lib

# test_precompile's EVAL_RUN but for its step count and checkpoints: the same train step, rollout and evaluation
# programs, compiled once for both tests
RUN = ["train.steps=3", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=3",
       "checkpoint.every=2", "checkpoint.export_final=false", "log.progress=false", "log.tensorboard=false",
       "log.sample_every=0", "train.retain_every=2",
       "train.retain={copy: {difficulty: 0, split: test, num_examples: 6}, "
       "sums: {difficulty: 2, split: test, num_examples: 5, reward: arithmetic_lenient}}"]  # fmt: skip


def _spy_on_evaluations(monkeypatch) -> list[dict]:
    """Every `eval.evaluate` call the trainer makes, with the examples, reward, sample count, a host copy of the
    params it was given and the completions its sampler returned (the metrics themselves are recomputed from these
    by the test, not taken from `evaluate`)."""
    calls: list[dict] = []
    real_evaluate, real_generate = eval_lib.evaluate, eval_lib.sampling.generate
    active = [False]

    def evaluate(model_config, params, tokenizer, examples, reward_fn, **kw):
        calls.append(dict(examples=list(examples), reward=reward_fn, n=kw["num_samples"], tokenizer=tokenizer,
                          params=jax.tree.map(np.asarray, params), samples=[]))  # fmt: skip
        active[0] = True
        try:
            return real_evaluate(model_config, params, tokenizer, examples, reward_fn, **kw)
        finally:
            active[0] = False

    def generate(*args, **kw):
        out = real_generate(*args, **kw)
        if active[0]:
            calls[-1]["samples"].append((np.asarray(out.tokens), np.asarray(out.mask)))
        return out

    monkeypatch.setattr(eval_lib, "evaluate", evaluate)
    monkeypatch.setattr(eval_lib.sampling, "generate", generate)
    return calls


def _successes(call: dict) -> tuple[np.ndarray, np.ndarray]:
    """Rewards ``[P, n]`` of a recorded call, each completion decoded and scored by the reward function itself, and
    the per-prompt success counts ``c`` (success: reward >= 0.5)."""
    tokens = np.concatenate([t for t, _ in call["samples"]])
    mask = np.concatenate([m for _, m in call["samples"]])
    texts = call["tokenizer"].batch_decode([t[m].tolist() for t, m in zip(tokens, mask)], skip_special_tokens=True)
    fn = rewards_lib.resolve(call["reward"])[1]
    n = call["n"]
    r = np.array([float(fn(t, call["examples"][i // n])) for i, t in enumerate(texts)]).reshape(-1, n)
    assert r.shape[0] == len(call["examples"])
    return r, (r >= 0.5).sum(axis=1)


@pytest.mark.slow
def test_retain_and_eval_metrics_recomputed_from_the_sampled_completions(tmp_path, monkeypatch):
    """``retain/<set>/accuracy`` = mean over the set's prompts of c/n, and (``train.eval_every``) ``eval/pass@1`` =
    mean c/n, ``eval/pass@G`` = the fraction of prompts with c > 0 (n = G), ``eval/mean_reward`` and
    ``eval/degeneracy_measured`` = the fraction of prompts with c in {0, n}: recomputed by hand from the completions
    the sampler returned, decoded and scored by the reward function; each evaluated at the params of its step's
    checkpoint (step 0: the initial policy)."""
    calls = _spy_on_evaluations(monkeypatch)
    cfg = config_lib.load_config("default", [*RUN, "train.eval_every=2", "train.eval_examples=6"])
    run_dir = tmp_path / "run"
    trainer.run(cfg, run_dir)
    recs = metrics_log.read_metrics(run_dir)
    assert [r["step"] for r in recs] == [0, 1, 2, 3]
    base, recs = recs[0], recs[1:]  # step 0: the retention sets before any update, and nothing else
    assert sorted(base) == ["retain/copy/accuracy", "retain/sums/accuracy", "step"]
    # then every 2 steps, and at the last step (3) though 3 is not a multiple of 2; eval every 2 steps only
    assert [any(k.startswith("retain/") for k in r) for r in recs] == [False, True, True]
    assert [any(k.startswith("eval/") for k in r) for r in recs] == [False, True, False]
    assert (run_dir / "eval" / "step2" / "eval.json").exists()
    sets = retain_lib.resolve(cfg)
    assert [(s.name, s.reward) for s in sets] == [("copy", "arithmetic"), ("sums", "arithmetic_lenient")]
    # the trainer's evaluations in order: retention at step 0; eval then retention at step 2; retention at step 3
    order = [(0, "copy"), (0, "sums"), (2, "eval"), (2, "copy"), (2, "sums"), (3, "copy"), (3, "sums")]
    assert len(calls) == len(order)
    rec_of = {0: base, 2: recs[1], 3: recs[2]}
    initial = build.build_policy(cfg, build.policy_key(cfg))[1]
    for (step, what), call in zip(order, calls):
        assert call["n"] == cfg.rollout.group_size
        r, c = _successes(call)
        n, rec = call["n"], rec_of[step]
        if what == "eval":
            assert len(call["examples"]) == cfg.train.eval_examples
            assert rec["eval/pass@1"] == pytest.approx(np.mean(c / n), abs=1e-12)
            assert rec[f"eval/pass@{n}"] == pytest.approx(np.mean(c > 0), abs=1e-12)
            assert rec["eval/mean_reward"] == pytest.approx(r.mean(), rel=1e-6)
            assert rec["eval/degeneracy_measured"] == pytest.approx(np.mean((c == 0) | (c == n)), abs=1e-12)
        else:
            rs = next(s for s in sets if s.name == what)
            examples = data_lib.load_dataset(rs.data, cfg.seed)
            assert [e.prompt for e in call["examples"]] == [e.prompt for e in examples]
            assert len(examples) == rs.data.num_examples and call["reward"] == rs.reward
            assert rec[f"retain/{what}/accuracy"] == pytest.approx(np.mean(c / n), abs=1e-12)
        # the params evaluated: the step's checkpoint, and at step 0 the initial policy
        want = initial if step == 0 else eval_lib.load_policy_for_eval(cfg, run_dir, step).params
        chex.assert_trees_all_close(call["params"], jax.tree.map(np.asarray, want), rtol=0, atol=0)
    # the step's diversity metrics (jaxgrpo.diversity)
    for rec in recs:
        assert 1 / 4 <= rec["diversity/distinct_frac"] <= 1.0
        assert rec["diversity/distinct"] == pytest.approx(4 * rec["diversity/distinct_frac"])
        assert 0.0 < rec["diversity/entropy"] <= math.log(64)


@pytest.mark.parametrize("override,match", [
    ("train.retain={a: {difficulty: 0, splt: test}}", r"'train.retain.a.splt'; did you mean 'train.retain.a.split'"),
    ("train.retain={a: {source: words, difficulty: 9}}", r"train.retain.a: data.source=words needs difficulty in \["),
    ("train.retain={a: {reward: nope}}", r"train.retain.a.reward: unknown reward function 'nope'"),
    ("train.retain={'a b': {difficulty: 1}}", r"train.retain.a b: a retention set's name becomes the metric"),
    ("train.retain_every=-2", r"train.retain_every must be >= 0"),
    ("train.retain={a: {split: tset}}", r"train.retain.a: data.source=synthetic needs split train or test"),
    ("train.retain={a: {source: hf, hf_id: x/y}}", r"train.retain.a.reward: data.source=hf has no answer check of "
                                                   r"its own .*name one, e.g. train.retain.a.reward=math_verify"),
])  # fmt: skip
def test_bad_retain_entries_are_clean_errors(override, match):
    with pytest.raises(config_lib.ConfigError, match=match):
        config_lib.load_config("default", [override])


def test_a_retain_set_takes_the_runs_correctness_reward_when_it_fits():
    """math_verify (which fits words) judges a words set as it judges the run's held-out evaluation; a set on the run's
    own hf source takes the run's correctness reward."""
    cfg = config_lib.load_config("default", ["data.rewards={math_verify: 1.0}",
                                             "train.retain={easy: {source: words, difficulty: 1, split: test}}"])
    assert [rs.reward for rs in retain_lib.resolve(cfg)] == ["math_verify"]
    cfg = config_lib.load_config("default", ["data.source=hf", "data.hf_id=x/y", "data.rewards={gsm8k: 1.0}",
                                             "train.retain={same: {split: test}}"])  # fmt: skip
    assert [rs.reward for rs in retain_lib.resolve(cfg)] == ["gsm8k"]


def test_words_retain_set_defaults_to_the_last_number_reward():
    cfg = config_lib.load_config("default", ["train.retain={easy: {source: words, difficulty: 1, split: test}}"])
    (rs,) = retain_lib.resolve(cfg)
    assert rs.reward == "gsm8k_lenient" and rs.data.source == "words" and rs.data.template == "chat"


def test_the_held_out_evaluation_reports_pass_at_g_whatever_g(monkeypatch, tmp_path):
    """G = 6 is not a power of 2: the evaluation is asked for pass@1, 2, 4 and 6, and the metrics carry eval/pass@6."""
    import types

    from jaxgrpo import in_training

    asked = []

    def evaluate(*args, ks=None, **kwargs):
        asked.append(list(ks))
        return {"pass@k": {str(k): 0.5 for k in ks}, "degeneracy": [{"measured": 0.25, "iid": 0.125}],
                "mean_reward": 0.5}  # fmt: skip

    monkeypatch.setattr(eval_lib, "evaluate", evaluate)
    monkeypatch.setattr(eval_lib, "write_report", lambda result, out: None)
    monkeypatch.setattr(in_training, "held_out_examples", lambda tr: [])
    cfg = config_lib.load_config("default", ["rollout.group_size=6"])
    tr = types.SimpleNamespace(cfg=cfg, key=jax.random.key(0), multiturn=None, model_config=None, tokenizer=None,
                               state=types.SimpleNamespace(params=None), eos_token_ids=(0,), mesh=None,
                               prefill_attention=None, run_dir=tmp_path)  # fmt: skip
    out = in_training.evaluate_held_out(tr, 3)
    assert asked == [[1, 2, 4, 6]] and out["eval/pass@6"] == 0.5
