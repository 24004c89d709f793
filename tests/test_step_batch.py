# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Batches sized to what was sampled (`jaxgrpo.step_batch`): the ladders in closed form, the groups kept per part,
and the loss and gradients of the narrowed batch (completion width on its ladder, masked degenerate groups dropped)
against the full batch padded to ``max_new_tokens`` that `groups.make_batch` builds (float32 tolerance), under jit,
with LoRA and on the 8-device mesh."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from test_lora import lora_params
from test_train_step import TEMP, V, assert_trees_close, tiny_config

from jaxgrpo import models, sharding, step_batch
from jaxgrpo.config_sections import AlgoConfig, OptimConfig, PerfConfig
from jaxgrpo.groups import Rollout, make_batch
from jaxgrpo.learner import train_step as ts
from jaxgrpo.rollout.record import Completions

TC = 48  # rollout.max_new_tokens of the hand-built rollouts: completion rungs 16, 32, 48


def test_completion_ladder_closed_form():
    """Rungs ``u · 2^k`` (``u`` = cap / 8 rounded up to 16) capped at ``max_new_tokens``; a cap below the unit is its
    own one rung; at most 5 widths for any cap up to 4096."""
    assert [step_batch.completion_width(n, 48) for n in (0, 1, 16, 17, 32, 33, 48)] == [16, 16, 16, 32, 32, 48, 48]
    assert step_batch.completion_unit(512) == 64 and step_batch.completion_unit(1024) == 128
    assert [step_batch.completion_width(n, 512) for n in (1, 64, 65, 200, 300, 512)] == [64, 64, 128, 256, 512, 512]
    assert {step_batch.completion_width(n, 2) for n in (1, 2)} == {2}
    for cap in (1, 7, 64, 100, 256, 768, 1000, 4096):
        widths = {step_batch.completion_width(n, cap) for n in range(1, cap + 1)}
        assert len(widths) <= 5 and max(widths) == cap and all(w >= 1 for w in widths), (cap, sorted(widths))
    with pytest.raises(ValueError, match="wider than"):
        step_batch.completion_width(49, 48)


def test_kept_groups_stay_in_their_part():
    """12 groups, S = 3 parts (group p in part p mod 3), 1 shard: a part's informative groups come first, then its
    own degenerate ones up to m; m = the rung (1, 2, 4 = P/S) of the fullest part; part s is new groups j·3 + s."""
    deg = np.ones(12, bool)
    deg[[0, 4, 7, 10]] = False  # part 0: {0}; part 1: {4, 7, 10}; part 2: {} (parts hold 0,3,6,9 / 1,4,7,10 / ...)
    kept = step_batch.kept_groups(deg, 3, 1)
    assert len(kept) == 3 * 4  # the fullest part has 3 informative groups: rung 4 = all
    deg[[7, 10]] = True  # now at most one informative group per part: rung 1
    kept = step_batch.kept_groups(deg, 3, 1)
    np.testing.assert_array_equal(kept, [0, 4, 2])  # part 2 has none: its first (degenerate) group fills it
    kept = step_batch.kept_groups(np.ones(12, bool), 3, 1)
    np.testing.assert_array_equal(kept, [0, 1, 2])
    # 2 shards: rungs are multiples of 2 (a quarter of 4 rounded up to 2), so P' = S * m divides by S * shards
    deg = np.ones(12, bool)
    deg[4] = False
    kept = step_batch.kept_groups(deg, 3, 2)
    np.testing.assert_array_equal(kept, [0, 4, 2, 3, 1, 5])
    assert all(k % 3 == i % 3 for i, k in enumerate(kept))
    assert step_batch.row_unit(32, 4) == 8 and step_batch.row_unit(16, 4) == 4 and step_batch.row_unit(2, 8) == 8


def test_rows_are_dropped_only_where_no_other_group_reads_them():
    assert step_batch.row_blocker(AlgoConfig(degenerate_groups="mask")) is None
    assert step_batch.row_blocker(AlgoConfig(degenerate_groups="mask", estimator="avspo")) is None
    assert "scale=batch" in step_batch.row_blocker(
        AlgoConfig(degenerate_groups="mask", estimator_args={"scale": "batch"}))
    assert "Clip-Cov" in step_batch.row_blocker(AlgoConfig(degenerate_groups="mask", objective="clip_cov"))
    assert step_batch.step_algo(AlgoConfig(), 48).max_tokens == 48
    assert step_batch.step_algo(AlgoConfig(max_tokens=7), 48).max_tokens == 7


def hand_rollout(seed: int, P: int, G: int, informative: list[int], longest: int) -> Rollout:
    """P groups of G completions padded to TC: groups ``informative`` have rewards 1, 0, 1, ...; the others all 0 or
    all 1 (degenerate). Completions of informative groups are at most ``longest`` tokens (one exactly); degenerate
    groups' may run to TC."""
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(1, V, size=int(rng.integers(3, 9)))] for _ in range(P)]
    lengths = rng.integers(1, TC + 1, size=(P, G))
    rewards = np.repeat(rng.integers(0, 2, size=(P, 1)), G, axis=1).astype(np.float32)
    for p in informative:
        lengths[p] = rng.integers(1, longest + 1, size=G)
        rewards[p] = np.arange(G) % 2 == 0
    lengths[informative[0], 0] = longest
    lengths = lengths.reshape(-1)
    mask = np.arange(TC)[None] < lengths[:, None]
    tokens = np.where(mask, rng.integers(1, V, size=(P * G, TC)), 0).astype(np.int32)
    logprobs = np.where(mask, -rng.uniform(0.5, 4.0, size=(P * G, TC)), 0.0).astype(np.float32)
    comp = Completions(tokens=tokens, logprobs=logprobs, mask=mask, lengths=lengths.astype(np.int32),
                       truncated=lengths >= TC, entropy=None)  # fmt: skip
    return Rollout(prompts, [None] * P, comp, [""] * (P * G), rewards, np.ones((P, G), bool))


def shapes_for(algo: AlgoConfig, mesh, prompt_width: int = 16) -> step_batch.StepShapes:
    return step_batch.StepShapes(algo, PerfConfig(), mesh, TC, prompt_width, {"train": (64, 64)})


@pytest.mark.slow
@pytest.mark.parametrize("case", ["accum_minibatches", "lora_mesh8"])
def test_narrowed_batch_has_the_full_batch_loss_and_gradients(case):
    """The narrowed batch (completion width 32 of 48, 4 or 8 of 16 groups) gives minibatch 0's loss and gradients of the
    full batch padded to 48 with every group (`ts.policy_gradient`, jitted), within float32 tolerance.
    accum_minibatches: no mesh, 2 minibatches × 2 micro-batches (parts must keep their groups), token-mean.
    lora_mesh8: LoRA adapters on the (data 2, fsdp 2, tensor 2) mesh, seq-mean-token-sum-norm (its max_tokens is
    the one place the width enters the loss), 2 micro-batches."""
    P, G = 16, 2
    if case == "accum_minibatches":
        algo = AlgoConfig(degenerate_groups="mask", num_minibatches=2, grad_accum_steps=2)
        config, mesh = tiny_config(), None
        params = models.init_params(config, jax.random.key(0))
        informative, kept = [0, 5, 6, 11], 4  # parts (p mod 4): 0, 1, 2, 3 -> 1 a part: rung 1 of 1, 2, 4
    else:
        algo = AlgoConfig(degenerate_groups="mask", aggregation="seq-mean-token-sum-norm", grad_accum_steps=2)
        config = tiny_config().replace(lora=models.LoraSpec(rank=4, alpha=8.0))
        mesh = sharding.make_mesh(2, 2, 2)
        params = sharding.shard_params(lora_params(config, seed=1, b_scale=0.2), config, mesh)
        informative, kept = [1, 2, 9], 8  # parts (p mod 2): 1, 0, 1 -> 2 a part: rung 4 (a multiple of 4 shards)
    algo = step_batch.step_algo(algo, TC)
    roll = hand_rollout(3, P, G, informative, longest=27)
    shapes = shapes_for(algo, mesh)
    narrow, packed, trained, overrides = shapes.batch(roll)
    assert narrow.completion_mask.shape == (kept * G, 32) and packed == 0
    assert overrides["batch/groups"] == kept and overrides["batch/completion_width"] == 32
    assert overrides["degeneracy/masked_groups"] == P - len(informative)
    assert overrides["tokens/completion"] == roll.completions.mask.sum()
    full = make_batch(roll, 16, 0)
    assert full.completion_mask.shape == (P * G, TC)
    if mesh is not None:
        full = ts.global_batch(full, mesh)
    loss_f, g_f, m_f = ts.policy_gradient(config, algo, params, full, temperature=TEMP, mesh=mesh)
    loss_n, g_n, m_n = ts.policy_gradient(config, algo, params, narrow, temperature=TEMP, mesh=mesh)
    assert abs(float(loss_f)) > 1e-4
    np.testing.assert_allclose(float(loss_n), float(loss_f), rtol=2e-5, atol=1e-7)
    assert_trees_close(g_n, g_f, rtol=2e-4, atol=1e-7)
    assert max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(g_f)) > 1e-4  # a real gradient


def test_untrimmed_when_switched_off_or_blocked():
    """perf.trim_batch=false, or Clip-Cov: every group at max_new_tokens; grpo scale=batch: every group, narrowed."""
    roll = hand_rollout(4, 8, 2, [1], longest=5)
    off = dataclasses.replace(shapes_for(AlgoConfig(degenerate_groups="mask"), None), perf=PerfConfig(trim_batch=False))
    groups, width = off.plan(roll)
    assert len(groups) == 8 and width == TC
    groups, width = shapes_for(AlgoConfig(degenerate_groups="mask", objective="clip_cov"), None).plan(roll)
    assert len(groups) == 8 and width == TC
    batch_scale = AlgoConfig(degenerate_groups="mask", estimator_args={"scale": "batch"})
    groups, width = shapes_for(batch_scale, None).plan(roll)
    assert len(groups) == 8 and width == 16  # masked groups carry no loss: their long completions are cut
    groups, width = shapes_for(AlgoConfig(), None).plan(roll)  # keep: every group carries loss
    assert len(groups) == 8 and width == completion_width_of(roll)


def completion_width_of(roll: Rollout) -> int:
    return step_batch.completion_width(int(roll.completions.mask.sum(-1).max()), TC)


@pytest.mark.slow
def test_full_metrics_are_the_untrimmed_steps():
    """The metrics the trainer takes from the host when groups are left out (`full_metrics`: degeneracy diagnostics,
    masked groups, prompt and completion tokens) equal the ones the train step computes on the full padded batch."""
    config = tiny_config()
    algo = step_batch.step_algo(AlgoConfig(degenerate_groups="mask", estimator="rloo"), TC)
    roll = hand_rollout(5, 8, 2, [1, 6], longest=9)
    roll.valid[3, 1] = False  # a dropped sample: group 3 has one valid member
    init_fn, step_fn = ts.make_train_step(config, algo, OptimConfig(), temperature=TEMP, total_steps=2)
    state = init_fn(models.init_params(config, jax.random.key(0)), jax.random.key(1))
    _, want = step_fn(state, make_batch(roll, 16, 0))
    got = step_batch.full_metrics(algo, roll)
    assert {"degeneracy/collapse_rate", "advantage/abs_max", "tokens/completion"} <= set(got)
    for k, v in got.items():
        np.testing.assert_allclose(v, float(want[k]), rtol=1e-6, atol=1e-7, err_msg=k)


def test_degenerate_groups_follow_the_estimator():
    """The host's mask (resampling rounds, ``degeneracy/masked_groups``) is the step's: with pass_at_k (k = 2) a
    group of one wrong answer in four is masked although its rewards differ; with grpo it is informative."""
    from jaxgrpo.config import AlgoConfig
    from jaxgrpo.groups import degenerate_groups

    rewards = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    valid = np.ones_like(rewards, bool)
    pass_k = AlgoConfig(estimator="pass_at_k", estimator_args={"k": 2})
    assert degenerate_groups(pass_k, rewards, valid).tolist() == [True, False, True]
    assert degenerate_groups(AlgoConfig(), rewards, valid).tolist() == [False, False, True]
