# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""A run compiles in its first step and never again (issue 34): the train step's prompt width is fixed for the run,
and the packed prompt widths of the train step and of both samplers climb a ladder capped by the run's data
(`padding.ladder_bucket`), so prompts of varying lengths do not make new programs at steps 2, 3, ... XLA compile
events (`jax.monitoring`) are counted per step of a tiny trainer run whose batches' prompt lengths would have given
the former per-batch widths several values."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from jaxgrpo import config as config_lib
from jaxgrpo import padding, trainer
from jaxgrpo.learner import perf

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# a program read from the persistent compilation cache (tests/conftest.py) is a new program too, just not compiled
CACHE_HIT_EVENT = "/jax/compilation_cache/compile_time_saved_sec"


def test_ladder_rungs_closed_form():
    """Rungs are ``unit * 2^k`` (the smallest that holds the need) or the cap; every need up to the cap gets at most
    ``2 + log2(cap / unit)`` distinct widths; a need beyond the cap is refused."""
    unit, cap = 64, 576
    widths = {}
    for need in range(1, cap + 1):
        w = padding.ladder_bucket(need, unit, cap)
        k = max(math.ceil(math.log2(need / unit)), 0) if need > unit else 0
        assert w == min(unit * 2**k, cap) and w >= need, need
        widths[w] = widths.get(w, 0) + 1
    assert sorted(widths) == [64, 128, 256, 512, 576] and len(widths) <= 2 + math.log2(cap / unit)
    with pytest.raises(ValueError, match="wider than the run's widest row"):
        padding.ladder_bucket(cap + 1, unit, cap)
    assert padding.widest_row([5, 9, 3, 7], 2) == 16 and padding.widest_row([5, 9, 3, 7], 9) == 24
    # with a ladder (floor, cap): 64, 128, 256, ... for the train step, 16, 32, 64, ... for the sampler, never below
    # the floor; without: multiples of 64 and 4 buckets per octave
    pw, sw = padding.packed_width, padding.sampler_packed_width
    assert pw([40, 30, 20, 10], 2, ladder=(64, 320)) == 128 and pw([40, 30, 20, 10], 2) == 128
    assert pw([40, 30, 20, 10], 2, ladder=(256, 320)) == 256
    assert pw([100, 90, 20, 10], 2, ladder=(64, 320)) == 256 and pw([100, 90, 20, 10], 2) == 192
    assert sw([30, 40, 50], 1, ladder=(16, 224)) == 128 and sw([30, 40, 50], 1) == 128
    assert sw([50, 60, 50], 1, ladder=(16, 224)) == 224 and sw([50, 60, 50], 1) == 160


def test_a_run_uses_one_rung_for_nearly_every_step():
    """`perf.shape_ladders` on GSM8K-like prompt lengths (a skewed spread, 50-260 tokens): batches drawn afresh (another
    seed) get the floor's width in >= 97% of steps for the train step (2 prompts a packed row, 4 micro-batches) and
    the engine (8 prompts in one row); every width is a rung within the cap; equal prompts give floor == cap."""
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.gamma(6.0, 17.0, 5000).astype(int) + 40, 50, 260)
    algo = config_lib.AlgoConfig(grad_accum_steps=4)
    ladders = perf.shape_ladders(lengths, 8, 8, algo)
    assert ladders["train"][1] == 64 * math.ceil((260 + 259) / 64)  # the two longest prompts, rounded up to 64
    for k, unit in (("train", 64), ("engine", 16)):
        floor, cap = ladders[k]
        assert floor <= cap and (floor == cap or floor & (floor - 1) == 0 and floor % unit == 0), (k, floor, cap)
    fresh = np.random.default_rng(7)
    widths = {"train": [], "engine": []}
    for _ in range(300):
        b = [int(x) for x in fresh.choice(lengths, 8, replace=False)]
        widths["train"].append(perf.packed_prompt_width(b, 288, algo, config_lib.PerfConfig(),
                                                        ladder=ladders["train"]))
        widths["engine"].append(padding.sampler_packed_width(b, 1, ladder=ladders["engine"]))
    for k, w in widths.items():
        assert np.mean(np.asarray(w) == ladders[k][0]) >= 0.97, (k, ladders[k], np.unique(w, return_counts=True))
    # equal prompts: 2 x 30 tokens rounded up to 64; 8 x 30 in the engine's bucket (4 per octave) of 240, 256
    assert perf.shape_ladders([30] * 100, 8, 8, algo) == {"train": (64, 64), "engine": (256, 256)}


# Five batches of 8 prompts, in order (data.shuffle=false): "1+" k times then "1=" is a prompt of 2k + 6 tokens
# (the chat template's and the character-level tokens), so the batches' prompt lengths sum to 144, 156, 208, 216 and
# 144 tokens (the tiny model of the default config holds 32 positions: prompts up to 30 tokens, 2 sampled).
BATCH_KS = [[6] * 8, [12] + [6] * 7, [10] * 8, [12, 12] + [10] * 6, [6] * 8]


def compiles_per_step(t: trainer.Trainer, steps: range, check=None) -> list[int]:
    """XLA compile events (or persistent-cache reads) during each of ``t.step(s)`` for s in ``steps``; ``check(s, m)``
    sees each step's metrics. Closes ``t``."""
    compiles = [0]

    def listener(event: str, secs: float, **kw) -> None:
        compiles[0] += event in (COMPILE_EVENT, CACHE_HIT_EVENT)

    jax.monitoring.register_event_duration_secs_listener(listener)
    per_step = []
    try:
        for step in steps:
            before = compiles[0]
            m = t.step(step)
            per_step.append(compiles[0] - before)
            if check is not None:
                check(step, m)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        t.close()
    return per_step


def _batch_ks_run(tmp_path, sampler: str, *extra: str) -> list[str]:
    """Overrides of a tiny run over `BATCH_KS`'s prompts (a GSM8K-format file written under ``tmp_path``)."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    rows = [{"question": "1+" * k + "1=", "answer": f"#### {k + 1}"} for ks in BATCH_KS for k in ks]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=2", "log.progress=false",
            "log.tensorboard=false", "log.sample_every=0", "checkpoint.every=0", "checkpoint.export_final=false",
            f"train.steps={len(BATCH_KS)}", "data.source=gsm8k", f"data.path={data}", "data.shuffle=false",
            "data.max_prompt_tokens=32", "data.rewards={gsm8k: 1.0}",
            # a mesh: the engine's slots split over it
            *(["mesh.data=4", "mesh.fsdp=2"] if sampler != "engine" else []), *extra]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["engine", "engine_mesh"])
def test_no_compilation_after_the_first_step(tmp_path, sampler):
    """Five steps whose prompts' lengths differ from batch to batch: XLA compiles in step 1 only (sampler, train
    step and everything around them), with the engine on one device and on a data 4 x fsdp 2 mesh; the former
    per-batch widths (the packed prompts rounded up to 64, the sampler's 4 buckets per octave) take two values each
    over the same batches."""
    cfg = config_lib.load_config("default", _batch_ks_run(tmp_path, sampler))
    t = trainer.Trainer(cfg, tmp_path / "run")
    assert t.use_engine and (t.rollout_mesh is None) == (sampler == "engine")
    lengths = []
    rollout = t.rollout

    def recorded(step):
        roll, extra = rollout(step)
        lengths.append([len(p) for p in roll.prompt_ids])
        return roll, extra

    t.rollout = recorded
    per_step = compiles_per_step(t, range(cfg.train.steps))
    assert lengths == [[2 * k + 6 for k in ks] for ks in BATCH_KS]
    assert per_step[0] > 0 and per_step[1:] == [0] * (len(BATCH_KS) - 1), per_step
    # the test has teeth: the former per-batch rules give these batches several shapes
    assert len({padding.packed_width(n, 1) for n in lengths}) == 2
    assert len({padding.prompt_bucket(sum(n)) for n in lengths}) == 2


def test_a_run_resumed_in_the_same_process_compiles_nothing(tmp_path):
    """Two steps, then the same run resumed to five in the same process (as a sweep or a notebook does): the restored
    state is uncommitted like the fresh one (`jaxgrpo.checkpoint`), so the resumed steps use the uninterrupted run's
    programs and compile nothing. A committed restore compiled the step path again (and missed a persistent
    compilation cache filled by the first process)."""
    run = tmp_path / "run"
    trainer.run(config_lib.load_config("default", _batch_ks_run(tmp_path, "engine", "train.steps=2",
                                                                "checkpoint.every=1")), run)  # fmt: skip
    t = trainer.Trainer(config_lib.load_config("default", _batch_ks_run(tmp_path, "engine")), run,
                        allow_config_change=True)  # fmt: skip
    assert t.start_step == 2 and not jax.tree.leaves(t.state.params)[0].committed
    per_step = compiles_per_step(t, range(2, len(BATCH_KS)))
    assert per_step == [0] * (len(BATCH_KS) - 2), per_step


# (longest loss-carrying completion, informative groups) of each step: the first three reach the three (completion
# width, groups) rungs the run uses, (16, 8), (32, 2), (64, 4) of max_new_tokens 64 and 8 groups; the next three are
# other values on the same rungs.
TRIM_SCHEDULE = [(5, 8), (20, 1), (40, 3), (12, 7), (30, 2), (60, 4)]


def trimmed_rollouts(t: trainer.Trainer):
    """``t.rollout`` with each step's rollout cut to `TRIM_SCHEDULE`: masks end at the step's longest completion and
    the first ``informative`` groups get one success (the others stay all-fail, masked as degenerate)."""
    rollout = t.rollout

    def shaped(step):
        roll, extra = rollout(step)
        longest, informative = TRIM_SCHEDULE[step]
        mask = np.asarray(roll.completions.mask).copy()
        mask[:, longest:] = False
        mask[0, :longest] = True  # group 0 is informative: its row 0 is the longest completion that carries loss
        rewards = np.zeros(roll.rewards.shape, np.float32)
        rewards[:informative, 0] = 1.0
        comp = dataclasses.replace(roll.completions, mask=mask, lengths=mask.sum(-1).astype(np.int32))
        return dataclasses.replace(roll, completions=comp, rewards=rewards, valid=np.ones(rewards.shape, bool)), extra

    return shaped


@pytest.mark.slow
def test_trimmed_batches_compile_during_warm_up_only(tmp_path):
    """`perf.trim_batch` with `algo.degenerate_groups=mask`: the step's completion width and group count follow what
    was sampled, on ladders (`jaxgrpo.step_batch`); after three warm-up steps that reach the run's three (width,
    groups) rungs, three steps with other widths and other informative counts compile nothing. Each warm-up step
    compiles (a new shape: the count has teeth). The rollouts are the engine's, their masks cut and their rewards
    set to the schedule."""
    P, G = 8, 2
    # test_precompile's run (`_trim_config`, with its KL term): the same programs, compiled once for both tests
    overrides = ["rollout.prompts_per_step=8", f"rollout.group_size={G}", "rollout.max_new_tokens=64",
                 "model.max_position_embeddings=96", "algo.degenerate_groups=mask", "algo.kl_coef=0.01",
                 "log.progress=false", "log.tensorboard=false", "log.sample_every=0", "checkpoint.every=0",
                 "checkpoint.export_final=false", f"train.steps={len(TRIM_SCHEDULE)}"]  # fmt: skip
    cfg = config_lib.load_config("default", overrides)
    t = trainer.Trainer(cfg, tmp_path / "run")
    t.rollout = trimmed_rollouts(t)
    shapes = []

    def check(step: int, m: dict) -> None:
        shapes.append((m["batch/completion_width"], m["batch/groups"]))
        assert m["degeneracy/masked_groups"] == P - TRIM_SCHEDULE[step][1]

    per_step = compiles_per_step(t, range(cfg.train.steps), check)
    assert shapes == [(16, 8), (32, 2), (64, 4)] * 2
    assert all(n > 0 for n in per_step[:3]) and per_step[3:] == [0, 0, 0], per_step
