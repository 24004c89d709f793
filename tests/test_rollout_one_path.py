# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""One rollout path: the default trainer config samples on the rollout engine, its rollout/* counters in the step's
metrics, and `sampling.generate` is the same engine: under greedy decoding it returns what the driver returns in
static and in continuous mode. (That the engine gives the previous sampler's tokens and log-probs key for key is
tests/test_engine.py's golden file.)"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_sampling import PROMPTS, tiny_model
from test_train import small_config

from jaxgrpo import sampling, trainer
from jaxgrpo.models.attention import Kernel
from jaxgrpo.rollout import driver
from jaxgrpo.rollout.params import SamplingParams


def test_default_config_trains_on_the_engine_with_the_runs_attention(tmp_path, monkeypatch):
    """The trainer samples on the engine, and its prefill runs the run's ``perf.attention`` (as resolved)."""
    seen, real = [], driver.run
    monkeypatch.setattr(driver, "run", lambda *a, **kw: seen.append(kw["attention"]) or real(*a, **kw))
    tr = trainer.Trainer(small_config("perf.attention=chunked", "perf.attention_chunk=8"), tmp_path / "engine")
    try:
        assert tr.use_engine and not tr.perf_notes
        for rec in [tr.step(s) for s in range(2)]:
            assert 0 < rec["rollout/slot_utilization"] <= 1 and rec["rollout/decode_steps"] >= 1
    finally:
        tr.close()
    assert seen == [Kernel("chunked", 8)] * 2


@pytest.mark.slow
@pytest.mark.parametrize("slots", [None, 2])  # static (one slot per prompt) and continuous (2 slots, 3 prompts)
def test_greedy_generate_equals_the_driver(slots):
    config, params = tiny_model()
    g, m = 2, 6
    old = sampling.generate(config, params, PROMPTS, num_samples=g, max_new_tokens=m, temperature=0.0,
                            eos_token_ids=(7,), key=jax.random.key(0))  # fmt: skip
    sp = SamplingParams(m, g, 0.0, eos_token_ids=(7,))
    groups, _ = driver.run(config, params, PROMPTS, sp, jax.random.key(0), slots=slots, block=4)
    new = driver.completions(groups, range(len(PROMPTS)))
    np.testing.assert_array_equal(new.mask, np.asarray(old.mask))
    np.testing.assert_array_equal(new.tokens, np.asarray(old.tokens))
    np.testing.assert_allclose(new.logprobs, np.asarray(old.logprobs), atol=1e-5)
    np.testing.assert_array_equal(new.truncated, np.asarray(old.truncated))
