# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The train step with prefix sharing (``perf.prefix_sharing=True``, jaxgrpo.models.prefix) equals the step without:
same loss, every metric and the updated params after two steps, within 1e-5 relative, on one device and on the
8-device mesh (data=4 × fsdp=2), with the prompts run packed end to end (``packed_prompt_width``, as the trainer
runs them); and `compute_logprobs(group_size=G)` equals the plain `compute_logprobs`.

The plain step is itself tested against an independent reference (models.forward + advantages + losses) in
test_train_step.py; prefix sharing only changes how the completion tokens' hidden states are computed.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from test_train_step import TEMP, make_batch_np, tiny_config, to_batch

from jaxgrpo import models, sharding
from jaxgrpo.config import AlgoConfig, OptimConfig, PerfConfig
from jaxgrpo.learner import train_step as ts

OPTIM = OptimConfig(learning_rate=1e-3, max_grad_norm=1.0, warmup_steps=1, schedule="cosine", weight_decay=0.01)
# (a): batch-std advantages, degenerate groups masked, KL, clip-higher, grad accumulation; P=16 so the 4x2 mesh works.
# (b): sequence-mean aggregation, RLOO, mu = 2 and two minibatches, an odd group size.
CASES = {
    "a": dict(P=16, G=4, algo=AlgoConfig(estimator_args={"scale": "batch"}, degenerate_groups="mask", kl_coef=0.05,
                                          clip_high=0.28, grad_accum_steps=2)),
    "b": dict(P=4, G=3, algo=AlgoConfig(aggregation="seq-mean-token-mean", estimator="rloo", num_iterations=2,
                                         num_minibatches=2)),
}  # fmt: skip


def packed_width(batch, G: int, parts: int) -> int:
    """A packed row width that holds any P / parts of the batch's prompts (the sum of the longest), not rounded up
    to a bucket (nor replaced by 0 when not narrower) as `packed_prompt_width` does: the tiny prompts run packed."""
    lengths = np.sort(np.asarray(batch.prompt_mask)[::G].sum(1))[::-1]
    return int(lengths[: len(lengths) // parts].sum())


def run(name: str, prefix_sharing: bool, mesh=None) -> tuple[dict, dict]:
    case = CASES[name]
    config = tiny_config()
    params = models.init_params(config, jax.random.key(0))
    algo, perf = case["algo"], PerfConfig(prefix_sharing=prefix_sharing)
    batch = to_batch(config, params, make_batch_np(5, case["P"], case["G"]), kl=algo.kl_coef > 0, noise=0.1)
    init_fn, step_fn = ts.make_train_step(config, algo, OPTIM, perf=perf, mesh=mesh, temperature=TEMP, total_steps=10)
    state = init_fn(params, jax.random.key(1))
    shards = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
    parts = algo.num_minibatches * algo.grad_accum_steps * shards
    width = packed_width(batch, case["G"], parts) if prefix_sharing else 0
    if mesh is not None:
        batch = ts.global_batch(batch, mesh)
    metrics = {}
    for i in range(2):
        state, m = step_fn(state, batch, packed_prompt_width=width)
        metrics.update({f"{k}@{i}": np.asarray(v) for k, v in m.items()})
    return metrics, jax.tree.map(np.asarray, state.params)


def assert_same(got: tuple[dict, dict], want: tuple[dict, dict]) -> None:
    (m1, p1), (m0, p0) = got, want
    assert set(m1) == set(m0)
    for k in m0:
        np.testing.assert_allclose(m1[k], m0[k], rtol=1e-5, atol=1e-6, err_msg=k)
    # As in test_train_step_sharded: Adam normalises each gradient component by its own magnitude, so reduction-order
    # noise in a near-zero component becomes update noise; params get an absolute slack of 1% of one lr step.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-2 * OPTIM.learning_rate), p1, p0)
    assert abs(float(m0["loss@0"])) > 1e-6 and float(m0["grad_norm@0"]) > 1e-6  # not trivially zero


_plain: dict[str, tuple[dict, dict]] = {}


def plain(name: str) -> tuple[dict, dict]:
    if name not in _plain:
        _plain[name] = run(name, prefix_sharing=False)
    return _plain[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_prefix_sharing_step_equals_plain_step(name):
    assert_same(run(name, prefix_sharing=True), plain(name))


@pytest.mark.slow
def test_prefix_sharing_on_mesh_equals_plain_single_device():
    assert len(jax.devices()) == 8
    mesh = sharding.make_mesh(4, 2, 1)
    assert_same(run("a", prefix_sharing=True, mesh=mesh), plain("a"))


def test_compute_logprobs_group_size():
    config = tiny_config()
    params = models.init_params(config, jax.random.key(2))
    batch = to_batch(config, params, make_batch_np(7, 3, 2))
    f = jax.jit(ts.compute_logprobs, static_argnums=(0, 3, 4), static_argnames="group_size")
    logp0, ent0 = f(config, params, batch, TEMP, 3)
    logp1, ent1 = f(config, params, batch, TEMP, 3, group_size=2)
    m = np.asarray(batch.completion_mask)
    np.testing.assert_allclose(np.where(m, logp1, 0), np.where(m, logp0, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.where(m, ent1, 0), np.where(m, ent0, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.where(m, logp1, 0), batch.old_logprobs, atol=0.5)  # old = true logp + noise
    with pytest.raises(ValueError, match="group_size=4 must be 0/1 .no prefix sharing. or divide the 6 rows"):
        ts.compute_logprobs(config, params, batch, TEMP, group_size=4)


def test_packed_prompt_width():
    # P / (minibatches * accum * shards) longest prompts per packed row, rounded up to 64; 0 without prefix sharing
    # or when packing is not narrower than the padded rows.
    lengths = [100, 30, 70, 20, 90, 10, 60, 50]
    algo, perf = AlgoConfig(), PerfConfig(prefix_sharing=True)
    assert ts.packed_prompt_width(lengths, 128, algo, perf) == 448  # 430 -> 448
    accum2 = dataclasses.replace(algo, grad_accum_steps=2)
    assert ts.packed_prompt_width(lengths, 128, accum2, perf) == 320  # 100+90+70+60
    assert ts.packed_prompt_width(lengths, 128, dataclasses.replace(algo, num_minibatches=8), perf) == 0  # 128 >= 128
    assert ts.packed_prompt_width(lengths, 128, algo, PerfConfig(prefix_sharing=False)) == 0
    assert ts.packed_prompt_width(lengths, 128, algo, PerfConfig(prompt_packing=False)) == 0
    mesh = sharding.make_mesh(2, 2, 2)
    assert ts.packed_prompt_width(lengths, 128, algo, perf, mesh) == 192  # 4 shards: rows of the 2 longest
    with pytest.raises(ValueError, match="8 prompts cannot be split into 3 parts"):
        ts.packed_prompt_width(lengths, 128, dataclasses.replace(algo, num_minibatches=3), perf)
