# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Full-sequence and KV-cached forwards: `hidden_states`, `forward`, `forward_with_cache`.

Both are `jaxgrpo.models.layers.run_layers` with one stream; they differ in the attention only (`attention.causal`,
`attention.cached`). Masks: a query attends to key j iff j is a real token (attention_mask / kv_mask) and j is not
in its future; a query row with no visible key (a padding query in a left-padded row) gets zero attention output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxgrpo.models import attention
from jaxgrpo.models.attention import KVCache
from jaxgrpo.models.config import ModelConfig
from jaxgrpo.models.layers import (
    LayerLoop,
    MatmulBackward,
    RematPolicy,
    Stream,
    check_tokens,
    embed,
    final_norm,
    rope_tables,
    run_layers,
)
from jaxgrpo.models.params import Params, lm_head


def hidden_states(
    config: ModelConfig,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    *,
    remat: RematPolicy = "projections",
    matmul_backward: MatmulBackward = "auto",
    attention_kernel: attention.Kernel = attention.DENSE,
    constrain_rows: Callable[[jax.Array], jax.Array] | None = None,
    layer_loop: LayerLoop = "scan",
) -> jax.Array:
    """Final-normed hidden states ``[B, T, D]`` (compute dtype) for a (possibly padded) batch.

    attention_mask ``[B, T]``: 1/True = real token (left or right padding both work). positions default to
    ``cumsum(mask) - 1`` clipped at 0 (so each row's first real token is at position 0). ``remat``: the backward
    pass's policy (`jaxgrpo.models.layers.RematPolicy`); ``matmul_backward``: `jaxgrpo.models.layers.MatmulBackward`;
    ``attention_kernel``: `attention.Kernel` (dense, or chunked: no ``[T, T]`` scores; both mask causally by index,
    whatever the positions); ``constrain_rows``, ``layer_loop``: see `jaxgrpo.models.layers.run_layers`.
    """
    check_tokens(tokens)
    B, T = tokens.shape
    if attention_mask is None:
        mask_BT = jnp.ones((B, T), bool)
    else:
        if attention_mask.shape != (B, T):
            raise ValueError(f"attention_mask shape {attention_mask.shape} != tokens shape {(B, T)}")
        mask_BT = attention_mask.astype(bool)
    if positions is None:
        positions = jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=1) - 1, 0)
    elif positions.shape != (B, T):
        raise ValueError(f"positions shape {positions.shape} != tokens shape {(B, T)}")
    stream = Stream(embed(config, params, tokens), rope_tables(config, positions),
                    attention.causal(mask_BT, attention_kernel))  # fmt: skip
    (x_BTD,), _, _ = run_layers(config, params, [stream], remat=remat, matmul_backward=matmul_backward,
                                   constrain_rows=constrain_rows, layer_loop=layer_loop)  # fmt: skip
    return final_norm(config, params, x_BTD)


def forward(
    config: ModelConfig,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    *,
    remat: RematPolicy = "projections",
    matmul_backward: MatmulBackward = "auto",
) -> jax.Array:
    """Logits ``[B, T, V]`` float32 (see `hidden_states` for the arguments)."""
    h_BTD = hidden_states(config, params, tokens, positions, attention_mask, remat=remat,
                          matmul_backward=matmul_backward)  # fmt: skip
    return jnp.einsum("btd,dv->btv", h_BTD, lm_head(config, params), preferred_element_type=jnp.float32)


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype: Any = None) -> KVCache:
    """Zeroed cache with ``max_len`` slots: k, v ``[L, B, S, K, H]`` (dtype defaults to the model dtype)."""
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    dt = jnp.dtype(config.dtype if dtype is None else dtype)
    return KVCache(k=jnp.zeros(shape, dt), v=jnp.zeros(shape, dt))


def forward_with_cache(
    config: ModelConfig,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array,
    cache: KVCache,
    start: jax.Array | int,
    kv_mask: jax.Array,
) -> tuple[jax.Array, KVCache]:
    """Run a chunk ``tokens [B, t]`` against the cache; returns (final-normed hidden ``[B, t, D]``, new cache).

    The chunk's keys/values are written to slots ``[start, start + t)`` (``start`` an int32 scalar shared by all
    rows; the caller keeps ``start + t <= S``). The query in slot ``start + i`` attends to slots ``j`` with
    ``kv_mask[b, j]`` and ``j <= start + i``. ``kv_mask [B, S]`` is owned by the caller (it must already mark this
    chunk's real tokens). Donate ``cache`` when jitting so the update happens in place.
    """
    check_tokens(tokens)
    B, t = tokens.shape
    L, Bc, S, K, H = cache.k.shape
    if (Bc, K, H, L) != (B, config.num_kv_heads, config.head_dim, config.num_layers):
        raise ValueError(f"cache k shape {cache.k.shape} does not fit batch {B} and config (L, K, H) = "
                         f"{(config.num_layers, config.num_kv_heads, config.head_dim)}")  # fmt: skip
    if positions.shape != (B, t):
        raise ValueError(f"positions shape {positions.shape} != tokens shape {(B, t)}")
    if kv_mask.shape != (B, S):
        raise ValueError(f"kv_mask shape {kv_mask.shape} != (batch, cache slots) {(B, S)}")
    start = jnp.asarray(start, jnp.int32)
    slot_T = start + jnp.arange(t, dtype=jnp.int32)
    mask_BTS = (jnp.arange(S, dtype=jnp.int32)[None, :] <= slot_T[:, None])[None] & kv_mask.astype(bool)[:, None, :]
    stream = Stream(embed(config, params, tokens), rope_tables(config, positions), attention.cached(mask_BTS, start))
    (x_BTD,), cache, _ = run_layers(config, params, [stream], state=cache, remat="none")
    return final_norm(config, params, x_BTD), cache
