# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""One rollout path: the default trainer config samples on the rollout engine (its rollout/* counters in the step's
metrics) with the metrics the previous sampler gives on the same steps; `perf.reuse_projections=true` does not take
the trainer off the engine (it is turned off with a note); under greedy decoding the engine, static and continuous,
returns the previous sampler's tokens and log-probs (`sampling.generate` with ``record_projections`` runs it)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_sampling import PROMPTS, tiny_model
from test_train import assert_records_close, deterministic, small_config

from jaxgrpo import sampling, trainer
from jaxgrpo.rollout import driver
from jaxgrpo.rollout.params import SamplingParams


@pytest.mark.slow
def test_default_config_trains_on_the_engine_like_the_previous_sampler(tmp_path, monkeypatch):
    tr = trainer.Trainer(small_config(), tmp_path / "engine")
    assert tr.use_engine and not tr.reuse_projections and not tr.perf_notes
    got = [tr.step(s) for s in range(2)]
    for rec in got:
        assert 0 < rec["rollout/slot_utilization"] <= 1 and rec["rollout/decode_steps"] >= 1
    real = sampling.generate

    def previous(*args, **kw):  # generate's previous path (its while loop), which record_projections still takes
        comp = real(*args, **kw, record_projections=True)
        assert comp.projections is not None
        return comp.replace(projections=None)

    monkeypatch.setattr(trainer.Trainer, "use_engine", False)
    monkeypatch.setattr(sampling, "generate", previous)  # the previous sampler, same keys
    old = trainer.Trainer(small_config(), tmp_path / "previous")
    want = [old.step(s) for s in range(2)]
    assert not any(k.startswith("rollout/") for k in want[0])
    assert_records_close([{"step": s, **deterministic(r)} for s, r in enumerate(got)],
                         [{"step": s, **deterministic(r)} for s, r in enumerate(want)], rtol=1e-5, atol=1e-6)


def test_reuse_projections_does_not_take_the_trainer_off_the_engine(tmp_path):
    tr = trainer.Trainer(small_config("perf.reuse_projections=true"), tmp_path / "run")
    try:
        assert tr.use_engine and not tr.reuse_projections
        assert [n for n in tr.perf_notes if n.startswith("perf.reuse_projections=true does not apply")] == [
            "perf.reuse_projections=true does not apply: the trainer's rollout engine records no projections; "
            "recomputing the projections"]
    finally:
        tr.close()


@pytest.mark.slow
@pytest.mark.parametrize("slots", [None, 2])  # static (one slot per prompt) and continuous (2 slots, 3 prompts)
def test_greedy_engine_equals_previous_sampler(slots):
    config, params = tiny_model()
    g, m = 2, 6
    old = sampling.generate(config, params, PROMPTS, num_samples=g, max_new_tokens=m, temperature=0.0,
                            eos_token_ids=(7,), key=jax.random.key(0), record_projections=True)  # fmt: skip
    assert old.projections is not None  # the previous sampler's path ran
    sp = SamplingParams(m, g, 0.0, eos_token_ids=(7,))
    groups, _ = driver.run(config, params, PROMPTS, sp, jax.random.key(0), slots=slots, block=4)
    new = driver.completions(groups, range(len(PROMPTS)))
    np.testing.assert_array_equal(new.mask, np.asarray(old.mask))
    np.testing.assert_array_equal(new.tokens, np.asarray(old.tokens))
    np.testing.assert_allclose(new.logprobs, np.asarray(old.logprobs), atol=1e-5)
    np.testing.assert_array_equal(new.truncated, np.asarray(old.truncated))
