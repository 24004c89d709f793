# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The rollout half of jaxgrpo: it makes trajectories and hands the learner one record.

    record.py   `Completions` (what `sampling.generate` returns) and `RolloutRecord` (tokens, sampler log-probs,
                context mask, action mask, policy version, group id per row: what the learner takes)
    params.py   `SamplingParams`: temperature, top-k, top-p, EOS ids, G and M, validated once
    engine.py   the engine: public jitted `prefill` (prompts into group slots) and `decode_block` (k token steps,
                cache and state donated, the stop test on the host once per block), static `generate` on top
    driver.py   continuous batching by group: a fixed number of group slots, each refilled with the next pending
                prompt as soon as its G rows have finished; groups are returned whole, streamed to a callback

Multi-turn rollouts: `env.py` (TRL environment_factory-style environments and plain tool functions), `tools.py`
(tool schemas, per-family tool-call parsing, the threaded tool runner), `history.py` (token-in, token-out
conversation histories with context and action masks), `sandbox.py` (the sandboxed Python tool and code reward).

`rollout` never imports the learner (train_step, minibatch, batch, logprobs, optim, perf) nor the YAML loader.
"""

from jaxgrpo.rollout.params import SamplingParams
from jaxgrpo.rollout.record import Completions, RolloutRecord

__all__ = ["Completions", "RolloutRecord", "SamplingParams"]
