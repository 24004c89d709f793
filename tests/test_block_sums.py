# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The draw's per-block softmax sums as a Pallas TPU kernel (`jaxgrpo.block_sums`), run in interpret mode on the CPU:
each 128-token block's max, ``sum exp(z - m)`` and ``sum exp(z - m) z`` of ``z = logits / T`` against float64 NumPy
sums (tiles cut inside a block and past the vocabulary included); rescaled to the row's max they are what the XLA
path of the vocabulary draw computes (`token_sampling._block_sums_two_pass`). On a mesh the engine draws each
device's rows in `jax.shard_map`, the kernel's branch traced there too, and samples the one-device rows. Compiled
for TPU chips (libtpu), the engine's decode runs the kernel, on one chip and on a mesh."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgrpo import block_sums, models, sharding, token_sampling
from jaxgrpo.rollout import SamplingParams, driver

WIDE = models.ModelConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                          num_kv_heads=1, max_position_embeddings=128)  # fmt: skip


def numpy_sums(logits: np.ndarray, temperature: float) -> tuple[np.ndarray, ...]:
    z = logits.astype(np.float64) / temperature
    n, v = z.shape
    nb = -(-v // 128)
    z = np.concatenate([z, np.full((n, nb * 128 - v), -np.inf)], axis=1).reshape(n, nb, 128)
    m = z.max(-1)
    e = np.exp(z - m[..., None])
    return m, e.sum(-1), (e * np.where(e > 0, z, 0.0)).sum(-1)


@pytest.mark.parametrize("rows, vocab", [(8, 128), (16, 300), (8, 2 * 16384 + 130)])
def test_block_sums_equal_float64_sums(rows, vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.normal(size=(rows, vocab)).astype(np.float32) * 4
    logits[1, :200] = -1e30  # a row whose first blocks hold no mass at its max
    got = block_sums.block_sums(jnp.asarray(logits), jnp.float32(0.7), interpret=True)
    for g, want in zip(got, numpy_sums(logits, 0.7)):
        assert g.shape == want.shape == (rows, -(-vocab // 128)) and g.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(g), want, rtol=2e-6, atol=1e-30)


def test_rescaled_they_are_the_draws_xla_sums():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(16, 1000)).astype(np.float32) * 3)
    n, v = logits.shape
    z = jnp.pad(logits / 1.3, ((0, 0), (0, 1024 - v)), constant_values=-jnp.inf).reshape(n, 8, 128)
    want = token_sampling._block_sums_two_pass(z)
    got = token_sampling._to_row_max(*block_sums.block_sums(logits, jnp.float32(1.3), interpret=True))
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-6)
    assert block_sums.BLOCK == token_sampling._CDF_BLOCK  # the kernel's blocks are the draw's


def test_unsupported_shapes_are_refused():
    assert block_sums.supported(256, 151936) and not block_sums.supported(12, 1000)
    assert not block_sums.supported(8, 100)
    with pytest.raises(ValueError, match="multiples of 8"):
        block_sums.block_sums(jnp.zeros((12, 1000)), 1.0, interpret=True)


def test_a_mesh_draws_each_devices_rows_with_the_kernels_branch_traced():
    """16 rows over a 2-device data mesh (8 a device, a vocabulary of 8 blocks: the kernel applies, and its branch of
    the draw is traced inside the engine's `shard_map`; the CPU runs XLA's): the one-device samples, exactly."""
    params = models.init_params(WIDE, jax.random.key(0))
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11, 12], [13], [14, 15], [16]]
    sp = SamplingParams(max_new_tokens=5, num_samples=2, temperature=1.0)
    assert block_sums.supported(len(prompts) * 2 // 2, WIDE.vocab_size)
    ref, _ = driver.run(WIDE, params, prompts, sp, jax.random.key(3))
    mesh = sharding.make_mesh(2, 1, 1, devices=jax.devices()[:2])
    got, _ = driver.run(WIDE, params, prompts, sp, jax.random.key(3), mesh=mesh)
    for p in ref:
        np.testing.assert_array_equal(got[p].tokens, ref[p].tokens)
        np.testing.assert_allclose(got[p].logprobs, ref[p].logprobs, atol=1e-5, rtol=0)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (pip install jaxgrpo[tpu])")
@pytest.mark.parametrize("chips", [1, 2])
def test_the_engine_decode_on_tpu_chips_runs_the_kernel(chips):
    """The decode block compiled for v5p chips (16 rows, no top-k/top-p; on 2 chips a data mesh, 8 rows each): the
    draw is the kernel's custom call, and the float32 [rows, vocab] logits are never copied (XLA's own sums relaid
    them out)."""
    from jaxgrpo import aot
    from jaxgrpo import config as config_lib

    cfg = config_lib.load_config("default", ["rollout.prompts_per_step=8", "rollout.group_size=2",
                                             "rollout.max_new_tokens=4", f"mesh.data={chips}"])  # fmt: skip
    mcfg = aot.model_config(cfg).replace(vocab_size=1000)  # the default model's 60 tokens are less than a block
    texts: dict[str, str] = {}
    aot.compile_rollout(cfg, mcfg, aot.topology_devices("v5p:2x2x1")[:chips], texts, windows=1)
    decode = texts["decode"]
    assert "tpu_custom_call" in decode
    rows = 16 // chips
    assert not [ln for ln in decode.splitlines() if f"= f32[{rows},1000]" in ln and (" copy(" in ln or " pad(" in ln)]
