# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`models.pallas_attention.decode_attend_shared_prefix` (jax's Pallas GPU decode kernel, run by its interpreter on
CPU) against the XLA reference `attention.attend_shared_prefix`, on ragged prompts (left-padded, one full, one of a
single token) and decode rows at different slots, both value layouts: float32 within 2e-6 absolute (two
softmax parts merged instead of one; the same float32 arithmetic otherwise), bfloat16 inputs within 2e-2."""

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


@pytest.mark.parametrize("dtype, atol, block_k", [(jnp.float32, 2e-6, 16), (jnp.bfloat16, 2e-2, 16),
                                                  (jnp.float32, 2e-6, 32)])  # fmt: skip
def test_fused_decode_kernel_equals_the_xla_path(dtype, atol, block_k):
    """`pallas_attention.decode_attend` (one kernel, both key sets, one online softmax; run by the Pallas interpreter)
    against `attention.attend_shared_prefix`: 7 query heads per kv head (padded to 16 inside the kernel), ragged
    prompts, rows at different decode slots and one row with no decode key yet (prompt only); the two key sets read
    16 keys at a time, and (``block_k`` 32) the 32-slot prompt in one block beside the 16-slot own cache in one."""
    assert pa.key_blocks(Tp, M, block_k) == ((16, 16) if block_k == 16 else (32, 16))
    q, kp, vp, prefix_mask, k, v, mask = _inputs(dtype)
    q = jnp.tile(q, (1, 1, 1, 4, 1))[:, :, :, :7]  # R = 7
    mask = mask.at[4].set(False)
    ref = attention.attend_shared_prefix(q, kp, vp, prefix_mask, k, v, mask)
    got = pa.decode_attend(q[:, 0], kp, vp, prefix_mask, k, v, mask[:, 0], interpret=True, block_k=block_k)
    assert got.shape == ref[:, 0].shape and got.dtype == ref.dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref[:, 0], np.float32), atol=atol)


def test_key_blocks_and_the_shapes_the_fused_kernel_takes():
    """Each key set in whole blocks of its own (a 384-slot prompt 128 keys at a time beside a 480-slot window's 32);
    a key count with no power-of-two divisor >= 16, or more than 16 query heads per kv head, goes to the XLA path
    (`models.decode._attend`), and the kernel refuses it with one line."""
    assert pa.key_blocks(384, 480) == (128, 32) and pa.key_blocks(384, 512) == (128, 128)
    assert pa.decode_attend_fits(7, 384, 480)
    assert not pa.decode_attend_fits(7, 384, 24) and not pa.decode_attend_fits(7, 40, 32)
    assert not pa.decode_attend_fits(17, 384, 480)
    q, kp, vp, prefix_mask, k, v, mask = _inputs(jnp.float32)
    with pytest.raises(ValueError, match=r"key counts \(32, 8\) each with a power-of-two divisor >= 16"):
        pa.decode_attend(q[:, 0], kp, vp, prefix_mask, k[:, :, :8], v[:, :, :, :8], mask[:, 0, :8], interpret=True)
