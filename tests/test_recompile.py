# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""A run compiles in its first step and never again (issue 34): the train step's prompt width is fixed for the run,
and the packed prompt widths of the train step and of both samplers climb a ladder capped by the run's data
(`padding.ladder_bucket`), so prompts of varying lengths do not make new programs at steps 2, 3, ... XLA compile
events (`jax.monitoring`) are counted per step of a tiny trainer run whose batches' prompt lengths would have given
the former per-batch widths several values."""

from __future__ import annotations

import json
import math

import jax
import pytest

from jaxgrpo import config as config_lib
from jaxgrpo import padding, trainer

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


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
    # with a cap the ladder (64, 128, 256, ... for the train step; 16, 32, 64, ... for the sampler), without it
    # multiples of 64 and 4 buckets per octave; the sampler's top rung is the cap's bucket (200 -> 224)
    pw, sw = padding.packed_width, padding.sampler_packed_width
    assert pw([40, 30, 20, 10], 2, cap=300) == 128 and pw([40, 30, 20, 10], 2) == 128
    assert pw([100, 90, 20, 10], 2, cap=300) == 256 and pw([100, 90, 20, 10], 2) == 192
    assert sw([30, 40, 50], 1, cap=200) == 128 and sw([30, 40, 50], 1) == 128
    assert sw([50, 60, 50], 1, cap=200) == 224 and sw([50, 60, 50], 1) == 160


# Five batches of 8 prompts, in order (data.shuffle=false): "1+" k times then "1=" is a prompt of 2k + 6 tokens
# (the chat template's and the character-level tokens), so the batches' prompt lengths sum to 144, 156, 208, 216 and
# 144 tokens (the tiny model of the default config holds 32 positions: prompts up to 30 tokens, 2 sampled).
BATCH_KS = [[6] * 8, [12] + [6] * 7, [10] * 8, [12, 12] + [10] * 6, [6] * 8]


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["legacy", "engine"])
def test_no_compilation_after_the_first_step(tmp_path, sampler):
    """Five steps whose prompts' lengths differ from batch to batch: XLA compiles in step 1 only (sampler, train
    step and everything around them), with the engine and with the legacy sampler; the former per-batch widths (the
    packed prompts rounded up to 64, the sampler's 4 buckets per octave) take two values each over the same
    batches."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question": "1+" * k + "1=", "answer": f"#### {k + 1}"} for ks in BATCH_KS for k in ks]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = ["rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=2",
                 "log.progress=false", "log.tensorboard=false", "log.sample_every=0", "checkpoint.every=0",
                 "checkpoint.export_final=false", f"train.steps={len(BATCH_KS)}", "data.source=gsm8k",
                 f"data.path={data}", "data.shuffle=false", "data.max_prompt_tokens=32", "data.rewards={gsm8k: 1.0}",
                 f"perf.reuse_projections={'true' if sampler == 'legacy' else 'false'}"]  # fmt: skip
    cfg = config_lib.load_config("default", overrides)
    compiles = [0]

    def listener(event: str, secs: float, **kw) -> None:
        compiles[0] += event == COMPILE_EVENT

    jax.monitoring.register_event_duration_secs_listener(listener)
    t = trainer.Trainer(cfg, tmp_path / "run")
    lengths, per_step = [], []
    rollout = t.rollout

    def recorded(step):
        roll, extra = rollout(step)
        lengths.append([len(p) for p in roll.prompt_ids])
        return roll, extra

    t.rollout = recorded
    try:
        assert t.use_engine == (sampler == "engine")
        for step in range(cfg.train.steps):
            before = compiles[0]
            t.step(step)
            per_step.append(compiles[0] - before)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        t.close()
    assert lengths == [[2 * k + 6 for k in ks] for ks in BATCH_KS]
    assert per_step[0] > 0 and per_step[1:] == [0] * (len(BATCH_KS) - 1), per_step
    # the test has teeth: the former per-batch rules give these batches several shapes
    assert len({padding.packed_width(n, 1) for n in lengths}) == 2
    assert len({padding.prompt_bucket(sum(n)) for n in lengths}) == 2
