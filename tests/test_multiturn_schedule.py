# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The rollout-side rules of a multi-turn run (`jaxgrpo.multiturn_step`), on the tiny random model with SmolLM2's
tokenizer and the calculator environment of tests/test_multiturn_train.py, with scripted policies:

* ``algo.degenerate_groups=resample``: each step trains the informative groups of its rounds, in the order drawn;
* ``rollout.schedule=skip``: the second pass over the prompts spends its samples on the informative ones;
* ``algo.overlong_buffer``: DAPO's soft punishment counts the trajectory's tokens against the token budget.
"""

from __future__ import annotations

import re

import numpy as np
from test_multiturn_train import calculating_policy, completions, small

from jaxgrpo import multiturn_step, trainer


def answering_by_row(tok):
    """A scripted policy that answers at once: trajectory ``r`` (its row in the round, `sampling.generate`'s
    ``key_ids``) is right iff it is its group's first (``r`` even, G = 2) and the question's first number is even. So
    a group of an even first number is informative (one right, one wrong), of an odd one all wrong (degenerate)."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    def generate(config, params, prompts, *, max_new_tokens, eos_token_ids, key, key_ids, **kw):
        rows = []
        for ctx, r in zip(prompts, key_ids, strict=True):
            a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", tok.decode(ctx)).groups())
            wrong = not (a % 2 == 0 and r % 2 == 0)
            rows.append(tok(f"The answer is {a + b + wrong}.", add_special_tokens=False)["input_ids"] + [eos])
        return completions(rows, max_new_tokens)

    return generate


def test_dynamic_sampling_trains_the_informative_groups_of_its_rounds(smollm2_gguf, tok, tmp_path, monkeypatch):
    """``degenerate_groups=resample`` with multi-turn: rounds of P = 2 prompts until 2 informative groups are held (at
    most 4 rounds); each step trains the informative groups of its rounds, in the order drawn (a shortfall filled
    with degenerate ones), and ``tokens/sampled`` counts the policy tokens of every round."""
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", staticmethod(answering_by_row(tok)))
    rounds, trained, real_sample, real_update = [], [], multiturn_step.MultiTurn.sample, trainer.Trainer.update

    def sample(self, *args, **kw):
        scored = real_sample(self, *args, **kw)
        rounds.append(scored)
        return scored

    def update(self, step, batch, packed):
        trained.append(np.asarray(batch.rewards))
        return real_update(self, step, batch, packed)

    monkeypatch.setattr(multiturn_step.MultiTurn, "sample", sample)
    monkeypatch.setattr(trainer.Trainer, "update", update)
    out = trainer.run(small(smollm2_gguf, "train.steps=4", "algo.degenerate_groups=resample",
                            "data.rewards={gsm8k_lenient: 1.0}", "checkpoint.every=0"), tmp_path / "run")  # fmt: skip
    assert len(out) == len(trained) == 4 and len(rounds) == sum(m["resample/rounds"] for m in out)
    mixed = lambda r: r.max(-1) > r.min(-1)  # noqa: E731
    first = 0
    for m, batch in zip(out, trained):
        step_rounds = rounds[first : first + int(m["resample/rounds"])]
        first += int(m["resample/rounds"])
        informative = [s.rewards[p] for s in step_rounds for p in np.flatnonzero(mixed(s.rewards))]
        want = (informative + [s.rewards[p] for s in step_rounds for p in np.flatnonzero(~mixed(s.rewards))])[:2]
        np.testing.assert_array_equal(batch, np.stack(want))  # the informative groups first, in the order drawn
        assert m["resample/informative_frac"] == min(len(informative), 2) / 2
        assert len(informative) >= 2 or m["resample/rounds"] == 4  # stopped at 2 informative groups, or at 4 rounds
        assert m["tokens/sampled"] == sum(sum(h.action) for s in step_rounds for h in s.rollout.histories)
    assert any(m["resample/rounds"] > 1 for m in out) and all(m["resample/informative_frac"] > 0 for m in out)


def test_the_skip_schedule_spends_the_second_pass_on_informative_prompts(smollm2_gguf, tok, tmp_path, monkeypatch):
    """``rollout.schedule=skip`` on a multi-turn run over 8 prompts, two passes of 4 steps (P = 2): in the first pass
    every prompt is drawn once; in the second the prompts whose group was degenerate (odd first number:
    `answering_by_row`) are skipped with probability 0.99 (``schedule_explore=0.01``), so the second pass trains more
    informative groups than the first, and the history the skip rule reads is the multi-turn groups'."""
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", staticmethod(answering_by_row(tok)))
    out = trainer.run(small(smollm2_gguf, "train.steps=8", "data.num_examples=8", "rollout.schedule=skip",
                            "rollout.schedule_explore=0.01", "data.rewards={gsm8k_lenient: 1.0}",
                            "checkpoint.every=0"), tmp_path / "run")  # fmt: skip
    first, second = (sum(m["schedule/informative_groups"] for m in out[s]) for s in (slice(0, 4), slice(4, 8)))
    assert all(m["schedule/skipped"] == 0 for m in out[:4]) and sum(m["schedule/skipped"] for m in out[4:]) > 0
    assert second > first and out[-1]["schedule/skipped_total"] == sum(m["schedule/skipped"] for m in out)
    assert [m["groups/informative"] for m in out] == [m["schedule/informative_groups"] for m in out]


def test_overlong_shaping_punishes_the_tokens_the_budget_counts(smollm2_gguf, tok, tmp_path, monkeypatch):
    """``algo.overlong_buffer`` on a multi-turn run: DAPO's soft punishment of each trajectory's tokens after its
    prompt against the token budget (here max_turns × max_new_tokens = 64, the whole of it the buffer, so the
    punishment is -length / 64), added to the rule reward; the evaluation scores the reward alone."""
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", staticmethod(calculating_policy(tok, 0)))
    seen, real_sample = [], multiturn_step.MultiTurn.sample

    def sample(self, *args, **kw):
        seen.append(real_sample(self, *args, **kw))
        return seen[-1]

    monkeypatch.setattr(multiturn_step.MultiTurn, "sample", sample)
    (m,) = trainer.run(small(smollm2_gguf, "train.steps=1", "algo.overlong_buffer=64", "train.eval_every=1",
                             "train.eval_examples=2", "data.rewards={gsm8k_lenient: 1.0}", "checkpoint.every=0"),
                       tmp_path / "run")  # fmt: skip
    rollout, evaluation = seen  # the step's, then the held-out evaluation's
    lengths = np.array([len(h.tokens) for h in rollout.rollout.histories], np.float32)
    assert all(h.tool_calls == 1 for h in rollout.rollout.histories) and lengths.min() > 20  # call, reply, answer
    np.testing.assert_allclose(rollout.rewards.ravel(), 1.0 - lengths / 64, rtol=1e-6)
    np.testing.assert_allclose(m["overlong/penalty_mean"], -lengths.mean() / 64, rtol=1e-5)
    assert (evaluation.rewards == 1.0).all() and m["eval/mean_reward"] == 1.0


def test_the_adaptive_schedule_samples_each_prompt_its_group_size(smollm2_gguf, tok, tmp_path, monkeypatch):
    """``rollout.schedule=adaptive`` on a multi-turn run, P = 2, G = 4, sub-groups of 2, 6 samples a step (so one
    prompt of each step gets 4 trajectories, the other 2: the allocation gives the unit back from the later one of
    equal estimates): the sampler is asked for sub-groups of 2; the trained ``[2, 4]`` rewards are each sub-group's
    (`answering_by_row`: [1, 0] for an even first number, else [0, 0]) side by side, a group of 2 padded with two
    invalid rows; the metrics count the 6 trajectories, not the padding (one turn each)."""
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", staticmethod(answering_by_row(tok)))
    sampled, trained = [], []
    real_sample, real_update = multiturn_step.MultiTurn.sample, trainer.Trainer.update

    def sample(self, *args, group_size=None, **kw):
        sampled.append(group_size)
        return real_sample(self, *args, group_size=group_size, **kw)

    def update(self, step, batch, packed):
        trained.append((np.asarray(batch.rewards), np.asarray(batch.valid), np.asarray(batch.completion_mask)))
        return real_update(self, step, batch, packed)

    monkeypatch.setattr(multiturn_step.MultiTurn, "sample", sample)
    monkeypatch.setattr(trainer.Trainer, "update", update)
    out = trainer.run(small(smollm2_gguf, "train.steps=3", "rollout.group_size=4", "rollout.schedule=adaptive",
                            "rollout.schedule_budget=6", "data.rewards={gsm8k_lenient: 1.0}", "checkpoint.every=0"),
                      tmp_path / "run")  # fmt: skip
    assert sampled == [2, 2, 2]
    for m, (rewards, valid, cmask) in zip(out, trained, strict=True):
        assert (m["schedule/samples"], m["schedule/group_size_min"], m["schedule/group_size_max"]) == (6, 2, 4)
        sizes = valid.sum(-1)
        assert sorted(sizes) == [2, 4] and (valid == (np.arange(4) < sizes[:, None])).all()  # padding at the end
        for r, n in zip(rewards, sizes):  # sub-groups of [1, 0] (or [0, 0]), then 0 for the padding
            assert r.tolist() in ([1, 0] * (n // 2) + [0, 0] * (2 - n // 2), [0.0] * 4)
        assert cmask.reshape(2, 4, -1).any(-1).sum() == 6  # the padding has no completion tokens
        assert m["multiturn/turns"] == 1.0 and m["completion/len_mean"] == m["tokens/sampled"] / 6


def test_the_adaptive_schedule_on_the_multiturn_engine(smollm2_gguf, tmp_path, monkeypatch):
    """The same schedule sampled by the multi-turn engine (``rollout.turn_engine=true``, the tiny random policy):
    one step trains a group of 4 and a group of 2 padded, and the engine's metrics come with it."""
    trained, real_update = [], trainer.Trainer.update
    monkeypatch.setattr(trainer.Trainer, "update", lambda self, step, batch, packed: trained.append(
        np.asarray(batch.valid)) or real_update(self, step, batch, packed))
    (m,) = trainer.run(small(smollm2_gguf, "train.steps=1", "rollout.group_size=4", "rollout.schedule=adaptive",
                             "rollout.schedule_budget=6", "rollout.turn_engine=true", "checkpoint.every=0"),
                       tmp_path / "run")  # fmt: skip
    assert sorted(trained[0].sum(-1)) == [2, 4] and m["schedule/samples"] == 6 and "rollout/row_utilization" in m
    assert np.isfinite(m["loss"])
