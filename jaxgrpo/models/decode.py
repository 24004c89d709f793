# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Decode step against a shared prompt cache: the G samples of a prompt read one copy of its keys and values.

A GRPO rollout decodes ``N = P * R`` rows (``R`` samples for each of ``P`` prompts, prompt-major: row ``n`` belongs to
prompt ``n // R``). With one plain KV cache per row (`forward_with_cache`), every row carries and reads its own copy
of its prompt's keys/values, ``R`` times the same bytes, and its attention is a ``[1, H] x [H, S]`` matrix-vector
product per (row, kv head). Here the cache is split in two:

    prefix cache  k, v ``[L, P, Tp, K, H]``: each prompt once (written by the prefill), read-only while decoding;
    decode cache  k, v ``[L, N, M, K, H]``: the tokens each row generated, written one chunk at a time.

For query ``i`` of row ``n = p * R + r`` (at decode slot ``start + i``) attention runs over the joint key set

    { prefix slot s of prompt p : prefix_mask[p, s] }  U  { decode slot j of row n : kv_mask[n, j], j <= start + i }

with one softmax over both parts, so the result equals attention over the concatenated cache
``[prefix_p ; decode_n]`` (exactly what `forward_with_cache` computes on a cache holding the prompt's keys repeated for
each of its rows). The prefix scores of the ``R`` rows of a prompt are one matrix product per (prompt, kv head):
``[R * t * G, H] x [H, Tp]`` with ``G`` the query heads per kv head (GQA), a real matmul instead of ``R * t * G``
separate vector products, and the prompt's keys are read once instead of ``R`` times.

The building blocks (RMSNorm, RoPE, QKV, output projection + SwiGLU MLP) are `jaxgrpo.models.transformer`'s; see that
module for the formulas and their sources.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.models import transformer as tfm
from jaxgrpo.models.config import ModelConfig

Params = tfm.Params


def forward_with_prefix_cache(
    config: ModelConfig,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array,
    prefix: tfm.KVCache,
    prefix_mask: jax.Array,
    cache: tfm.KVCache,
    start: jax.Array | int,
    kv_mask: jax.Array,
) -> tuple[jax.Array, tfm.KVCache]:
    """Run a chunk ``tokens [N, t]`` of ``N = P * R`` prompt-major rows against a shared prompt cache.

    Args:
      tokens ``[N, t]`` int, positions ``[N, t]`` int: the chunk and its RoPE positions (they continue from each
        prompt's real length).
      prefix: `KVCache` with k, v ``[L, P, Tp, K, H]`` holding each prompt's keys (after RoPE) and values, e.g. the
        cache `forward_with_cache` fills when run over the ``P`` prompts. Not modified.
      prefix_mask ``[P, Tp]`` bool: the prompts' real tokens (each prompt needs at least one).
      cache: `KVCache` with k, v ``[L, N, M, K, H]``, the rows' own generated tokens; the chunk's keys/values are
        written to slots ``[start, start + t)`` (``start`` an int32 scalar shared by all rows, ``start + t <= M``).
      kv_mask ``[N, M]`` bool: the real decode slots (it must already mark this chunk's tokens).

    Returns:
      ``(hidden [N, t, D], cache)``: final-normed hidden states (compute dtype) and the updated decode cache. Query
      ``i`` of row ``n`` attends to the real prefix slots of prompt ``n // R`` and to decode slots ``j <= start + i``
      with ``kv_mask[n, j]``. Donate ``cache`` when jitting so the update happens in place.
    """
    tfm._check_tokens(tokens)
    N, t = tokens.shape
    L, P, Tp, K, H = prefix.k.shape
    if (L, K, H) != (config.num_layers, config.num_kv_heads, config.head_dim):
        raise ValueError(f"prefix k shape {prefix.k.shape} does not fit the config's (L, K, H) = "
                         f"{(config.num_layers, config.num_kv_heads, config.head_dim)}")  # fmt: skip
    if P < 1 or N % P:
        raise ValueError(f"{N} rows cannot be split evenly over the prefix cache's {P} prompts (rows must be P * R)")
    if prefix_mask.shape != (P, Tp):
        raise ValueError(f"prefix_mask shape {prefix_mask.shape} != (prompts, prefix slots) {(P, Tp)}")
    Lc, Nc, M, Kc, Hc = cache.k.shape
    if (Lc, Nc, Kc, Hc) != (L, N, K, H):
        raise ValueError(f"decode cache k shape {cache.k.shape} does not fit {N} rows and (L, K, H) = {(L, K, H)}")
    if positions.shape != (N, t):
        raise ValueError(f"positions shape {positions.shape} != tokens shape {(N, t)}")
    if kv_mask.shape != (N, M):
        raise ValueError(f"kv_mask shape {kv_mask.shape} != (rows, decode slots) {(N, M)}")
    start = jnp.asarray(start, jnp.int32)
    cos, sin = tfm._rope_tables(config, positions)
    slot_T = start + jnp.arange(t, dtype=jnp.int32)
    mask_NTM = (jnp.arange(M, dtype=jnp.int32)[None, :] <= slot_T[:, None])[None] & kv_mask.astype(bool)[:, None, :]
    zero = jnp.zeros((), jnp.int32)

    def block(carry, xs):
        x_NTD, k_LNMKH, v_LNMKH = carry
        lp, kp_PSKH, vp_PSKH, i = xs
        h_NTD = tfm._rms_norm(x_NTD, lp["attn_norm"], config.rms_norm_eps)
        q, k_NTKH, v_NTKH = tfm._qkv(config, lp, h_NTD, cos, sin)
        idx = (i, zero, start, zero, zero)
        k_LNMKH = jax.lax.dynamic_update_slice(k_LNMKH, k_NTKH[None].astype(k_LNMKH.dtype), idx)
        v_LNMKH = jax.lax.dynamic_update_slice(v_LNMKH, v_NTKH[None].astype(v_LNMKH.dtype), idx)
        kd = jax.lax.dynamic_index_in_dim(k_LNMKH, i, 0, keepdims=False).astype(q.dtype)
        vd = jax.lax.dynamic_index_in_dim(v_LNMKH, i, 0, keepdims=False).astype(q.dtype)
        kp, vp = kp_PSKH.astype(q.dtype), vp_PSKH.astype(q.dtype)
        a = tfm._attend_shared_prefix(q, kp, vp, prefix_mask, kd, vd, mask_NTM)
        return (tfm._finish_block(config, lp, x_NTD, a), k_LNMKH, v_LNMKH), None

    layer_ids = jnp.arange(config.num_layers, dtype=jnp.int32)
    carry = (tfm._embed(config, params, tokens), cache.k, cache.v)
    (x_NTD, k, v), _ = jax.lax.scan(block, carry, (params["layers"], prefix.k, prefix.v, layer_ids))
    return tfm._rms_norm(x_NTD, params["final_norm"], config.rms_norm_eps), tfm.KVCache(k=k, v=v)


def prefill_packed(
    config: ModelConfig,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array,
    slot_index: jax.Array,
    prefix_mask: jax.Array,
    token_slot: jax.Array,
) -> tuple[jax.Array, tfm.KVCache]:
    """Prefill prompts packed end to end: token-wise work on real tokens only, attention per prompt.

    A batch of ragged prompts left-padded to a common width ``Tp`` wastes the padding's share of the prefill's
    matmuls (GSM8K prompts of 57..137 tokens padded to 160: 46% of the tokens). Here the ``Q`` prompts of each of
    ``S`` rows (one row per batch shard) are packed end to end into a row of width ``W``; the token-wise layers
    (QKV and output projections, MLP, norms) run on the packed ``[S, W]`` tokens, and only the attention runs in the
    padded per-prompt layout ``[S, Q, Tp]``: queries, keys and values are gathered into it, attention is causal within
    each prompt (masked by ``prefix_mask``), and the outputs are gathered back to the packed layout. The per-prompt
    keys/values are exactly the prefix cache `forward_with_prefix_cache` reads.

    Args:
      tokens, positions ``[S, W]`` int: packed prompt tokens and their positions within their prompt (0, 1, ...);
        unused packed slots hold any token (their states are computed and never read).
      slot_index ``[S, Q, Tp]`` int: for each prefix slot, the packed column of its token (any column when masked).
      prefix_mask ``[S, Q, Tp]`` bool: the real prompt tokens, left-padded (the last slot is each prompt's last token).
      token_slot ``[S, W]`` int: for each packed column, its flat prefix slot ``q * Tp + s`` (any slot when unused).

    Returns:
      ``(last_hidden [S * Q, D], prefix)``: the final-normed hidden state of each prompt's last token (compute
      dtype) and the prefix cache k, v ``[L, S * Q, Tp, K, H]``.
    """
    tfm._check_tokens(tokens)
    S, W = tokens.shape
    _, Q, Tp = slot_index.shape
    for name, x, shape in (("positions", positions, (S, W)), ("slot_index", slot_index, (S, Q, Tp)),
                           ("prefix_mask", prefix_mask, (S, Q, Tp)), ("token_slot", token_slot, (S, W))):  # fmt: skip
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {shape}")
    K, G, H = config.num_kv_heads, config.num_groups, config.head_dim
    B = S * Q
    cos, sin = tfm._rope_tables(config, positions)
    pm_BT = prefix_mask.astype(bool).reshape(B, Tp)
    mask_BTS = jnp.tril(jnp.ones((Tp, Tp), bool))[None] & pm_BT[:, None, :]
    to_slots = slot_index.reshape(S, Q * Tp)
    gather = tfm._take_rows  # [S, X, ...] gathered along axis 1 by idx [S, Y] -> [S, Y, ...]

    def block(x_SWD, lp):
        h_SWD = tfm._rms_norm(x_SWD, lp["attn_norm"], config.rms_norm_eps)
        q, k, v = tfm._qkv(config, lp, h_SWD, cos, sin)  # [S, W, K, G, H], [S, W, K, H]
        q_BTKGH = gather(q, to_slots).reshape(B, Tp, K, G, H)
        k_BTKH = gather(k, to_slots).reshape(B, Tp, K, H)
        v_BTKH = gather(v, to_slots).reshape(B, Tp, K, H)
        a_BTKGH = tfm._attend(q_BTKGH, k_BTKH, v_BTKH, mask_BTS)
        a_SWKGH = gather(a_BTKGH.reshape(S, Q * Tp, K, G, H), token_slot)
        return tfm._finish_block(config, lp, x_SWD, a_SWKGH), (k_BTKH, v_BTKH)

    x_SWD, (k, v) = jax.lax.scan(block, tfm._embed(config, params, tokens), params["layers"])
    last = gather(x_SWD, slot_index[:, :, -1]).reshape(B, -1)
    return tfm._rms_norm(last, params["final_norm"], config.rms_norm_eps), tfm.KVCache(k=k, v=v)
