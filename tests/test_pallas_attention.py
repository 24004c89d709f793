# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The Pallas GPU decode kernels, run by the Pallas interpreter on CPU, against their XLA references.

`models.pallas_attention.decode_attend_shared_prefix` (jax's decode kernel, run twice and merged) against
`attention.attend_shared_prefix`, on ragged prompts (left-padded, one full, one of a single token) and decode rows at
different slots, both value layouts: float32 within 2e-6 absolute (two softmax parts merged instead of one; the same
float32 arithmetic otherwise), bfloat16 inputs within 2e-2. `models.pallas_attention.decode_layer` (the engine's
decode-layer kernel: qk-norm, RoPE, cache writes and attention) against `models.decode.write_attend`: outputs within
the same tolerances, the written caches equal."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxgrpo.models import attention
from jaxgrpo.models import pallas_attention as pa

P, G, K, R, H, Tp, M = 2, 3, 2, 2, 16, 32, 16


def _inputs(dtype):
    rng = np.random.default_rng(0)
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    q, kp, vp, k, v = f(P * G, 1, K, R, H), f(P, K, Tp, H), f(P, K, H, Tp), f(P * G, K, M, H), f(P * G, K, H, M)
    lengths = np.array([1, Tp])  # a one-token prompt and a full one
    prefix_mask = jnp.asarray(np.arange(Tp)[None] >= Tp - lengths[:, None])
    slots = np.array([0, 3, 15, 7, 1, 10])  # row b has written decode slots 0 .. slots[b]
    mask = jnp.asarray(np.arange(M)[None] <= slots[:, None])[:, None]
    return q, kp, vp, prefix_mask, k, v, mask


@pytest.mark.slow  # the Pallas interpreter: ~30 s per dtype on CPU
@pytest.mark.parametrize("dtype, atol", [(jnp.float32, 2e-6), (jnp.bfloat16, 2e-2)])
def test_pallas_decode_attention_equals_the_xla_path(dtype, atol):
    q, kp, vp, prefix_mask, k, v, mask = _inputs(dtype)
    ref = attention.attend_shared_prefix(q, kp, vp, prefix_mask, k, v, mask)
    got = pa.decode_attend_shared_prefix(q, kp, vp, prefix_mask, k, v, mask, interpret=True, block_k=16, k_splits=2)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref, np.float32), atol=atol)
    # values stored [.., S, H] (read in place by the kernel): the same result
    kv_first = pa.decode_attend_shared_prefix(q, kp, jnp.swapaxes(vp, 2, 3), prefix_mask, k, jnp.swapaxes(v, 2, 3),
                                              mask, values_key_minor=False, interpret=True, block_k=16, k_splits=2)
    np.testing.assert_array_equal(np.asarray(kv_first, np.float32), np.asarray(got, np.float32))


def test_more_than_one_token_per_row_is_refused():
    q, kp, vp, prefix_mask, k, v, mask = _inputs(jnp.float32)
    with pytest.raises(ValueError, match="one token per row"):
        pa.decode_attend_shared_prefix(jnp.concatenate([q, q], axis=1), kp, vp, prefix_mask, k, v, mask)


def _layer_inputs(dtype, rotate: bool):
    """A layer's decode step: 7 query heads per kv head, head size 32 (two 16-wide halves), ragged prompts, rows at
    different slots of a 16-slot window: one at its last slot, one at slot 0 (the new key its only own key), one
    whose slot is past the window (a finished row: no write, prompt only) and one with stale values in its cache
    beyond its slot (masked out)."""
    rng = np.random.default_rng(1)
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    B, R7, H2 = P * G, 7, 32
    qkv = f(B, K, R7 + 2, H2)  # per kv head: 7 queries, the new key, the new value
    kp, vp, ko, vo = f(P, K, Tp, H2), f(P, K, H2, Tp), f(B, K, M, H2), f(B, K, H2, M)
    prefix_mask = jnp.asarray(np.arange(Tp)[None] >= Tp - np.array([1, Tp])[:, None])
    slot = jnp.asarray([0, 3, 15, 7, M, 10], jnp.int32)
    mask = jnp.asarray(np.arange(M)[None] <= np.asarray(slot)[:, None]).at[4].set(False)
    angle = rng.uniform(0, 100, (B, H2 // 2))
    cos, sin = (jnp.asarray(np.cos(angle), jnp.float32), jnp.asarray(np.sin(angle), jnp.float32)) if rotate else (
        jnp.ones((B, H2 // 2)), jnp.zeros((B, H2 // 2)))  # fmt: skip
    return qkv, cos, sin, kp, vp, prefix_mask, ko, vo, mask, slot


@pytest.mark.parametrize("dtype, atol, block_k, rotate, norm", [
    (jnp.float32, 2e-6, 16, True, False), (jnp.bfloat16, 2e-2, 16, True, False), (jnp.float32, 2e-6, 32, True, False),
    (jnp.float32, 2e-6, 16, False, False), (jnp.float32, 2e-6, 16, True, True),
    (jnp.bfloat16, 2e-2, 16, True, True)])  # fmt: skip
def test_fused_decode_layer_kernel_equals_the_xla_path(dtype, atol, block_k, rotate, norm):
    """`pallas_attention.decode_layer` (RoPE, the cache writes and one online softmax over both key sets in one
    kernel; run by the Pallas interpreter) against `models.decode.write_attend` (`layers.apply_rope`, scatters,
    `attend_decode`): the outputs within ``atol``, the updated caches equal (the same rounding of the rotated key;
    a finished row's cache untouched). The two key sets are read 16 keys at a time, and (``block_k`` 32) the 32-slot
    prompt in one block beside the 16-slot own cache in one; ``rotate`` False: identity tables (a LoRA layer's step,
    whose keys arrive rotated) change nothing; ``norm``: Qwen3's qk-norm (`layers.rms_norm` of each query and key head
    before RoPE) inside the kernel."""
    from jaxgrpo.models import decode

    assert pa.key_blocks(Tp, M, block_k) == ((16, 16) if block_k == 16 else (32, 16))
    args = _layer_inputs(dtype, rotate)
    rng = np.random.default_rng(2)
    norms = tuple(jnp.asarray(rng.uniform(0.5, 1.5, 32), jnp.float32) for _ in "qk") if norm else None
    ref = decode.write_attend(*args, norms, norm_eps=1e-2)
    got = pa.decode_layer(*args, norms, norm_eps=1e-2, interpret=True, block_k=block_k)
    assert [(x.shape, x.dtype) for x in got] == [(x.shape, x.dtype) for x in ref]
    np.testing.assert_allclose(np.asarray(got[0], np.float32), np.asarray(ref[0], np.float32), atol=atol)
    for g, r in zip(got[1:], ref[1:]):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=1e-6 if rotate else 0)
    np.testing.assert_array_equal(np.asarray(got[1][4]), np.asarray(args[6][4]))  # slot past the window: no write
    np.testing.assert_array_equal(np.asarray(got[2][1, :, :, 3]), np.asarray(args[0][1, :, 8]))  # the value at slot 3
    if not rotate:  # no rotation: the new key is written as it came
        np.testing.assert_array_equal(np.asarray(got[1][1, :, 3]), np.asarray(args[0][1, :, 7]))


def test_key_blocks_and_the_shapes_the_fused_kernel_takes():
    """Each key set in whole blocks of its own (a 384-slot prompt 128 keys at a time beside a 480-slot window's 32);
    a key count with no power-of-two divisor >= 16, a half head under 16 or more than 16 query heads per kv head goes
    to the XLA path (`models.decode._write_attend`), and the kernel refuses it with one line."""
    assert pa.key_blocks(384, 480) == (128, 32) and pa.key_blocks(384, 512) == (128, 128)
    assert pa.decode_layer_fits(7, 64, 384, 480)
    assert not pa.decode_layer_fits(7, 64, 384, 24) and not pa.decode_layer_fits(7, 64, 40, 32)
    assert not pa.decode_layer_fits(17, 64, 384, 480) and not pa.decode_layer_fits(7, 16, 384, 480)
    args = list(_layer_inputs(jnp.float32, True))
    args[6], args[7], args[8] = args[6][:, :, :8], args[7][..., :8], args[8][:, :8]
    with pytest.raises(ValueError, match=r"key counts \(32, 8\) and a half head \(16\) each with a power-of-two"):
        pa.decode_layer(*args, interpret=True)
