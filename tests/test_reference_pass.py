# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The KL reference pass (`jaxgrpo.learner.train_step.reference_logprobs_fn`) on the tiny model of
tests/test_train_step.py: the run's perf switches, and micro-batches; against the full-vocabulary log-softmax of
`models.forward`.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_train_step import TEMP, TP, make_batch_np, reference_logprobs, tiny_config, to_batch

from jaxgrpo import models
from jaxgrpo.config import AlgoConfig, PerfConfig
from jaxgrpo.learner import train_step as ts


@pytest.mark.parametrize("perf", [PerfConfig(), PerfConfig(attention="chunked", attention_chunk=4),
                                  PerfConfig(prefix_sharing=False, attention="dense")],
                         ids=["shared", "chunked", "plain"])  # fmt: skip
def test_reference_pass_takes_the_runs_perf_switches(perf):
    """The KL reference pass (`reference_logprobs_fn`) runs the forward the train step runs: with prefix sharing each
    group's prompt is encoded once (the jaxpr holds a ``[P, Tp, D]`` prompt stream, B = P * G rows), with the run's
    attention kernel; the log-probs equal the full-vocabulary log-softmax of `models.forward` (float32)."""
    config = tiny_config()
    params = models.init_params(config, jax.random.key(3))
    raw = make_batch_np(5, 3, 4)
    batch = to_batch(config, params, raw)
    perf, _ = ts.resolve_perf(AlgoConfig(), perf, num_shards=1, platform="cpu")  # as the trainer passes it
    fn = ts.reference_logprobs_fn(config, TEMP, perf, 0, 1.0)
    got = fn(params, batch)
    want, _ = reference_logprobs(config, params, raw["tokens"], raw["prompt_mask"], raw["completion_mask"])
    mask = raw["completion_mask"]
    np.testing.assert_allclose(np.where(mask, got, 0), np.where(mask, want, 0), atol=2e-5)
    text = str(jax.make_jaxpr(fn)(params, batch))
    assert (f"f32[3,{TP},{config.hidden_size}]" in text) == perf.prefix_sharing


def test_reference_pass_in_micro_batches_equals_the_whole_batch_and_holds_less():
    """``chunks``: the reference pass runs the train step's micro-batches one at a time (whole groups of each batch
    shard's rows, `jax.lax.map`): the same log-probs, in the batch's row order, from a program that holds fewer
    temporaries; a group count the chunks do not divide runs whole."""
    config = tiny_config()
    params = models.init_params(config, jax.random.key(3))
    raw = make_batch_np(6, 8, 4)
    batch = to_batch(config, params, raw)
    perf, _ = ts.resolve_perf(AlgoConfig(), PerfConfig(), num_shards=2, platform="cpu")
    whole = ts.reference_logprobs_fn(config, TEMP, perf, 0, 1.0, 2)
    chunked = ts.reference_logprobs_fn(config, TEMP, perf, 0, 1.0, 2, 4)  # 2 shards x 4 chunks of one group each
    mask = raw["completion_mask"]
    np.testing.assert_allclose(np.where(mask, chunked(params, batch), 0), np.where(mask, whole(params, batch), 0),
                               atol=1e-6)  # fmt: skip
    temp = lambda fn: fn.lower(params, batch).compile().memory_analysis().temp_size_in_bytes  # noqa: E731
    assert temp(chunked) < temp(whole) / 2
    odd = ts.reference_logprobs_fn(config, TEMP, perf, 0, 1.0, 2, 3)  # 8 groups over 2 x 3: not divisible, runs whole
    assert temp(odd) == temp(whole)
