# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""``perf.layer_loop``: the train step's loop over the layers as one scan or unrolled (`jaxgrpo.models.layers`).
Unrolled, the compiled program has no loop over the layers (so no stacked saved activations to initialise, update
and slice: their bytes are BENCHMARKS §12's, judged for an H100 in `test_gpu_aot`), and the step is the same
computation: its update is AdamW of the reference gradient (`jax.grad` of the policy loss on full logits), as the
scan's is (`test_train_step`), with prefix sharing and without, and the KL reference pass gives the same
log-probs. ``auto`` picks unrolled on GPUs only, and not with ``remat="full"``."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_train_step import (
    TEMP,
    assert_trees_close,
    fresh,
    make_batch_np,
    manual_adamw,
    reference_loss_fn,
    tiny_config,
    to_batch,
)

from jaxgrpo import models
from jaxgrpo.config_sections import AlgoConfig, OptimConfig, PerfConfig
from jaxgrpo.learner import train_step as ts
from jaxgrpo.models.transformer import hidden_states


def _loops(layer_loop: str) -> int:
    """``while`` loops of one trip per layer in the CPU-compiled gradient of a 12-layer decoder's hidden states (XLA
    unrolls a loop of a few trips by itself; the embedding's scatter-add may be a loop of its own, one trip per
    token)."""
    config = tiny_config().replace(num_layers=12)
    params = models.init_params(config, jax.random.key(0))
    tokens = jax.numpy.ones((2, 8), jax.numpy.int32)
    loss = lambda p: hidden_states(config, p, tokens, layer_loop=layer_loop).sum()  # noqa: E731
    text = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    return sum(" while(" in line and '"known_trip_count":{"n":"12"}' in line for line in text.splitlines())


def test_unrolled_leaves_no_loop_over_the_layers():
    assert _loops("scan") >= 2  # forward and backward
    assert _loops("unrolled") == 0


@pytest.mark.parametrize("prefix_sharing", [True, False])
def test_unrolled_step_is_adamw_of_the_reference_gradient(prefix_sharing):
    config = tiny_config()
    params = models.init_params(config, jax.random.key(5))
    algo = AlgoConfig()
    optim = OptimConfig(learning_rate=1e-3, max_grad_norm=0.0, weight_decay=0.1)
    batch = to_batch(config, params, make_batch_np(5, 2, 4))
    perf = PerfConfig(layer_loop="unrolled", prefix_sharing=prefix_sharing, attention="dense")
    init_fn, step_fn = ts.make_train_step(config, algo, optim, perf=perf, temperature=TEMP, total_steps=10)
    new_state, metrics = step_fn(init_fn(fresh(params), jax.random.key(7)), batch)
    ref_grads = jax.jit(jax.grad(reference_loss_fn(config, algo, batch)))(params)
    assert_trees_close(new_state.params, manual_adamw(params, [ref_grads], 1e-3, wd=0.1), rtol=1e-4, atol=1e-6)
    assert np.isfinite(float(metrics["loss"]))


def test_reference_pass_unrolled_equals_scan():
    config = tiny_config()
    params = models.init_params(config, jax.random.key(3))
    batch = to_batch(config, params, make_batch_np(5, 3, 4))
    got = {}
    for loop in ("scan", "unrolled"):
        perf, _ = ts.resolve_perf(AlgoConfig(), PerfConfig(layer_loop=loop), num_shards=1, platform="cpu")
        got[loop] = np.asarray(ts.reference_logprobs_fn(config, TEMP, perf, 0, 1.0)(params, batch))
    mask = np.asarray(batch.completion_mask)
    np.testing.assert_allclose(got["unrolled"][mask], got["scan"][mask], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("platform,want", [("gpu", "unrolled"), ("cuda", "unrolled"), ("cpu", "scan"),
                                           ("tpu", "scan")])  # fmt: skip
def test_auto_unrolls_on_gpus_only(platform, want):
    perf, notes = ts.resolve_perf(AlgoConfig(), PerfConfig(), num_shards=1, platform=platform)
    assert perf.layer_loop == want and notes == []
    full, _ = ts.resolve_perf(AlgoConfig(), PerfConfig(remat="full"), num_shards=1, platform=platform)
    assert full.layer_loop == "scan"  # full remat keeps the scan (its memory, BENCHMARKS §12)
    for explicit in ("scan", "unrolled"):  # an explicit choice is kept everywhere
        kept, _ = ts.resolve_perf(AlgoConfig(), PerfConfig(layer_loop=explicit), num_shards=1, platform=platform)
        assert kept.layer_loop == explicit


def test_run_layers_refuses_an_unknown_loop():
    config = tiny_config()
    params = models.init_params(config, jax.random.key(0))
    with pytest.raises(ValueError, match="layer_loop='fori'; choose one of"):
        hidden_states(config, params, jax.numpy.ones((1, 4), jax.numpy.int32), layer_loop="fori")
