# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Decode step against a shared prompt cache: the G samples of a prompt read one copy of its keys and values.

A GRPO rollout decodes ``N = P * R`` rows (``R`` samples for each of ``P`` prompts, prompt-major: row ``n`` belongs to
prompt ``n // R``). With one plain KV cache per row (`forward_with_cache`), every row carries and reads its own copy
of its prompt's keys/values, ``R`` times the same bytes, and its attention is a ``[1, H] x [H, S]`` matrix-vector
product per (row, kv head). Here the cache is split in two:

    prefix cache  k ``[L, P, K, Tp, H]``, v ``[L, P, K, H, Tp]``: each prompt once (written by the prefill),
                  read-only while decoding;
    decode cache  k ``[L, N, K, M, H]``, v ``[L, N, K, H, M]``: the tokens each row generated, written one chunk at a
                  time (`init_decode_cache`).

Both caches are kv-head-major with the key axis of the values minor (not `forward_with_cache`'s ``[L, B, S, K, H]``):
the attention's score and value products then contract the minor axis of both operands, which XLA:CPU's matmul reads
in place, instead of transposing every layer's cache slice at every decode step (with the part-wise softmax of
`transformer._attend_shared_prefix`, `benchmarks/vs_trl.py`'s rollout went 9.2 -> 8.7 s on the 2-core VM).

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

from typing import Any

import jax
import jax.numpy as jnp

from jaxgrpo.models import transformer as tfm
from jaxgrpo.models.config import ModelConfig

Params = tfm.Params


def init_decode_cache(config: ModelConfig, rows: int, slots: int, dtype: Any = None) -> tfm.KVCache:
    """Zeroed decode cache for `forward_with_prefix_cache`: k ``[L, rows, K, slots, H]``, v ``[L, rows, K, H, slots]``
    (the layouts its attention reads in place; dtype defaults to the model dtype)."""
    L, K, H = config.num_layers, config.num_kv_heads, config.head_dim
    dt = tfm._dtype(config) if dtype is None else jnp.dtype(dtype)
    return tfm.KVCache(k=jnp.zeros((L, rows, K, slots, H), dt), v=jnp.zeros((L, rows, K, H, slots), dt))


def init_projection_record(config: ModelConfig, rows: int, slots: int, dtype: Any = None) -> dict[str, jax.Array]:
    """Zeroed buffers for `forward_with_prefix_cache`'s ``record``: for each dense projection name of
    `transformer.PROJECTIONS`, ``[L, rows, slots, out]`` (its flattened output width; dtype defaults to the model
    dtype)."""
    dt = tfm._dtype(config) if dtype is None else jnp.dtype(dtype)
    widths = tfm.projection_widths(config)
    return {name: jnp.zeros((config.num_layers, rows, slots, w), dt) for name, w in widths.items()}


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
    record: dict[str, jax.Array] | None = None,
) -> tuple[jax.Array, tfm.KVCache] | tuple[jax.Array, tfm.KVCache, dict[str, jax.Array]]:
    """Run a chunk ``tokens [N, t]`` of ``N = P * R`` prompt-major rows against a shared prompt cache.

    Args:
      tokens ``[N, t]`` int, positions ``[N, t]`` int: the chunk and its RoPE positions (they continue from each
        prompt's real length).
      prefix: `KVCache` with k ``[L, P, K, Tp, H]`` and v ``[L, P, K, H, Tp]`` holding each prompt's keys (after
        RoPE) and values, as `prefill_packed` returns them. Not modified.
      prefix_mask ``[P, Tp]`` bool: the prompts' real tokens (each prompt needs at least one).
      cache: `KVCache` with k ``[L, N, K, M, H]`` and v ``[L, N, K, H, M]`` (`init_decode_cache`), the rows' own
        generated tokens; the chunk's keys/values are written to slots ``[start, start + t)`` (``start`` an int32
        scalar shared by all rows, ``start + t <= M``).
      kv_mask ``[N, M]`` bool: the real decode slots (it must already mark this chunk's tokens).

      record: optional buffers from `init_projection_record` (``[L, N, slots, out]`` each): every dense projection's
        output for the chunk is written at ``[:, :, start : start + t]``; the train step can then skip those
        products (`transformer._matmul_given`). Donate them when jitting.

    Returns:
      ``(hidden [N, t, D], cache)``, plus the updated ``record`` when given: final-normed hidden states (compute
      dtype) and the updated decode cache. Query ``i`` of row ``n`` attends to the real prefix slots of prompt
      ``n // R`` and to decode slots ``j <= start + i`` with ``kv_mask[n, j]``. Donate ``cache`` when jitting so the
      update happens in place.
    """
    tfm._check_tokens(tokens)
    N, t = tokens.shape
    L, K, H = config.num_layers, config.num_kv_heads, config.head_dim
    if prefix.k.ndim != 5 or (prefix.k.shape[0], prefix.k.shape[2], prefix.k.shape[4]) != (L, K, H):
        raise ValueError(f"prefix k shape {prefix.k.shape} is not [L, P, K, Tp, H] with the config's (L, K, H) = "
                         f"{(L, K, H)} (the layout `prefill_packed` returns)")  # fmt: skip
    P, Tp = prefix.k.shape[1], prefix.k.shape[3]
    if prefix.v.shape != (L, P, K, H, Tp):
        raise ValueError(f"prefix v shape {prefix.v.shape} != [L, P, K, H, Tp] = {(L, P, K, H, Tp)}")
    if P < 1 or N % P:
        raise ValueError(f"{N} rows cannot be split evenly over the prefix cache's {P} prompts (rows must be P * R)")
    if prefix_mask.shape != (P, Tp):
        raise ValueError(f"prefix_mask shape {prefix_mask.shape} != (prompts, prefix slots) {(P, Tp)}")
    M = cache.k.shape[3] if cache.k.ndim == 5 else -1
    if cache.k.shape != (L, N, K, M, H) or cache.v.shape != (L, N, K, H, M):
        raise ValueError(f"decode cache k, v shapes {cache.k.shape}, {cache.v.shape} are not [L, N, K, M, H], "
                         f"[L, N, K, H, M] for {N} rows and (L, K, H) = {(L, K, H)}; make it with init_decode_cache")
    if positions.shape != (N, t):
        raise ValueError(f"positions shape {positions.shape} != tokens shape {(N, t)}")
    if kv_mask.shape != (N, M):
        raise ValueError(f"kv_mask shape {kv_mask.shape} != (rows, decode slots) {(N, M)}")
    start = jnp.asarray(start, jnp.int32)
    cos, sin = tfm._rope_tables(config, positions)
    slot_T = start + jnp.arange(t, dtype=jnp.int32)
    mask_NTM = (jnp.arange(M, dtype=jnp.int32)[None, :] <= slot_T[:, None])[None] & kv_mask.astype(bool)[:, None, :]
    zero = jnp.zeros((), jnp.int32)

    if record is not None:
        tfm._check_projection_arrays(config, record, N, None, "record", "; make it with init_projection_record")

    def block(carry, xs):
        x_NTD, k_LNKMH, v_LNKHM, rec = carry
        lp, kp_PKSH, vp_PKHS, i = xs
        io = None if rec is None else {"record": {}}
        h_NTD = tfm._rms_norm(x_NTD, lp["attn_norm"], config.rms_norm_eps)
        q, k_NTKH, v_NTKH = tfm._qkv(config, lp, h_NTD, cos, sin, io)
        k_NKTH, v_NKHT = tfm._kv_major(k_NTKH, v_NTKH)
        k_new, v_new = k_NKTH[None].astype(k_LNKMH.dtype), v_NKHT[None].astype(v_LNKHM.dtype)
        k_LNKMH = jax.lax.dynamic_update_slice(k_LNKMH, k_new, (i, zero, zero, start, zero))
        v_LNKHM = jax.lax.dynamic_update_slice(v_LNKHM, v_new, (i, zero, zero, zero, start))
        kd = jax.lax.dynamic_index_in_dim(k_LNKMH, i, 0, keepdims=False).astype(q.dtype)
        vd = jax.lax.dynamic_index_in_dim(v_LNKHM, i, 0, keepdims=False).astype(q.dtype)
        kp, vp = kp_PKSH.astype(q.dtype), vp_PKHS.astype(q.dtype)
        a = tfm._attend_shared_prefix(q, kp, vp, prefix_mask, kd, vd, mask_NTM)
        x_NTD = tfm._finish_block(config, lp, x_NTD, a, io)
        if rec is not None:
            rec = {name: jax.lax.dynamic_update_slice(buf, io["record"][name][None].astype(buf.dtype),
                                                      (i, zero, start, zero)) for name, buf in rec.items()}  # fmt: skip
        return (x_NTD, k_LNKMH, v_LNKHM, rec), None

    layer_ids = jnp.arange(config.num_layers, dtype=jnp.int32)
    carry = (tfm._embed(config, params, tokens), cache.k, cache.v, record)
    (x_NTD, k, v, record), _ = jax.lax.scan(block, carry, (params["layers"], prefix.k, prefix.v, layer_ids))
    hidden = tfm._rms_norm(x_NTD, params["final_norm"], config.rms_norm_eps)
    return (hidden, tfm.KVCache(k=k, v=v)) if record is None else (hidden, tfm.KVCache(k=k, v=v), record)


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
      dtype) and the prefix cache, k ``[L, S * Q, K, Tp, H]`` and v ``[L, S * Q, K, H, Tp]``.
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
        return tfm._finish_block(config, lp, x_SWD, a_SWKGH), tfm._kv_major(k_BTKH, v_BTKH)  # prefix cache layout

    x_SWD, (k, v) = jax.lax.scan(block, tfm._embed(config, params, tokens), params["layers"])
    last = gather(x_SWD, slot_index[:, :, -1]).reshape(B, -1)
    return tfm._rms_norm(last, params["final_norm"], config.rms_norm_eps), tfm.KVCache(k=k, v=v)
