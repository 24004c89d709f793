# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Prefix-shared forward for GRPO groups: each prompt is encoded once for its G completions.

In a GRPO rollout the G completions of a group share one prompt. The plain training forward
(`jaxgrpo.models.hidden_states` on the ``[P*G, Tp+Tc]`` rows) encodes that prompt G times. Here
`jaxgrpo.models.layers.run_layers` runs two streams through each layer: the ``P`` prompt rows (`decode.prompt_stream`,
the sampler's prefill stream: causal attention within each prompt, padded or packed end to end) and then the ``P*G``
completion rows, whose attention (`attention.shared_prefix`) reads the keys and values the prompt rows emitted in the
same layer (shared by the group, key-padding masked) and their own keys (causal, key-padding masked).

A prompt token never attends to a completion token (causality), so the prompt rows' states are exactly those of the
plain path, and each completion token sees exactly the keys it sees in the plain path: the outputs are equal up to
float rounding, in the forward and (through `jax.grad`, which sums the G cotangents of the shared prompt keys and
values into the one prompt computation) in the backward. Positions: the plain path uses ``cumsum(mask) - 1`` over the
concatenated row, so prompt token ``j`` has position ``cumsum(prompt_mask)_j - 1`` and completion token ``t`` has
``n_p + cumsum(completion_mask)_t - 1`` (``n_p`` = the prompt's real length), both clipped at 0.

Cost per layer (P prompts, G samples, prompt width Tp, completion width Tc): the token-wise matmuls (QKV, output
projection, MLP) run on ``P·Tp + P·G·Tc`` tokens instead of ``P·G·(Tp+Tc)``; attention scores cost
``P·Tp² + P·G·Tc·(Tp+Tc)`` instead of ``P·G·(Tp+Tc)²``. Packed prompts (``packed_width > 0``) also skip the prompt
padding's token-wise work.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.models import attention
from jaxgrpo.models.config import ModelConfig
from jaxgrpo.models.decode import prompt_stream
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
from jaxgrpo.models.params import Params


def _check(name: str, x: jax.Array, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")


def prefix_shared_hidden(
    config: ModelConfig,
    params: Params,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    completion_tokens: jax.Array,
    completion_mask: jax.Array | None = None,
    *,
    remat: RematPolicy = "projections",
    matmul_backward: MatmulBackward = "auto",
    attention_kernel: attention.Kernel = attention.DENSE,
    constrain_rows: Callable[[jax.Array], jax.Array] | None = None,
    packed_width: int = 0,
    pack_rows: int = 1,
    layer_loop: LayerLoop = "scan",
) -> tuple[jax.Array, jax.Array]:
    """Final-normed hidden states of G completions per prompt, each prompt encoded once.

    Args:
      prompt_tokens ``[P, Tp]`` int: one row per group, LEFT-padded (real tokens at the end of the row).
      prompt_mask ``[P, Tp]`` bool: real prompt tokens. Each prompt needs at least one real token.
      completion_tokens ``[P, G, Tc]`` int: the G completions of prompt p, RIGHT-padded.
      completion_mask ``[P, G, Tc]`` bool or None (= all real).
      remat, matmul_backward, attention_kernel, constrain_rows, layer_loop: as for `models.hidden_states`.
      packed_width: 0 = the prompt rows run left-padded ``[P, Tp]``; ``W > 0`` = they run packed end to end in
        ``pack_rows`` rows of width ``W`` (same values). ``W`` must hold the real tokens of each row's ``P /
        pack_rows`` consecutive prompts (`jaxgrpo.padding.packed_width` sizes it); checked when the mask is concrete.
      pack_rows: dividing P (one per batch shard).

    Returns:
      ``(h_completion [P, G, Tc, D], h_prompt_last [P, D])`` in the compute dtype: ``h_completion[p, g, t]`` equals
      `models.hidden_states` of the concatenated row ``[prompt_p, completion_pg]`` at position ``Tp + t``, and
      ``h_prompt_last[p]`` equals it at position ``Tp - 1`` (the last prompt token, which predicts completion token
      0 of every sample of the group).
    """
    check_tokens(prompt_tokens)
    P, Tp = prompt_tokens.shape
    if completion_tokens.ndim != 3 or completion_tokens.shape[0] != P:
        raise ValueError(
            f"completion_tokens must be [P, G, Tc] with P={P} (the prompt rows), got shape {completion_tokens.shape}"
        )
    if not jnp.issubdtype(completion_tokens.dtype, jnp.integer):
        raise ValueError(f"completion_tokens must be an integer array, got dtype {completion_tokens.dtype}")
    _, G, Tc = completion_tokens.shape
    if Tp < 1 or Tc < 1:
        raise ValueError(f"need prompt width Tp >= 1 and completion width Tc >= 1, got Tp={Tp}, Tc={Tc}")
    _check("prompt_mask", prompt_mask, (P, Tp))
    if completion_mask is None:
        completion_mask = jnp.ones((P, G, Tc), bool)
    _check("completion_mask", completion_mask, (P, G, Tc))
    pm_PT = prompt_mask.astype(bool)
    cm_BC = completion_mask.astype(bool).reshape(P * G, Tc)
    B = P * G

    prompts, last = prompt_stream(config, params, prompt_tokens, pm_PT, packed_width, pack_rows, attention_kernel)
    # completion positions continue from the prompt's real length (as cumsum(mask) - 1 over the concatenated row)
    n_P = jnp.sum(pm_PT, axis=1, dtype=jnp.int32)
    pos_BC = jnp.maximum(jnp.repeat(n_P, G)[:, None] + jnp.cumsum(cm_BC.astype(jnp.int32), axis=1) - 1, 0)
    completions = Stream(embed(config, params, completion_tokens.reshape(B, Tc)), rope_tables(config, pos_BC),
                         attention.shared_prefix(pm_PT, cm_BC, attention_kernel))
    (xp, xc_BCD), _, _ = run_layers(config, params, [prompts, completions], remat=remat,
                                    matmul_backward=matmul_backward, constrain_rows=constrain_rows,
                                    layer_loop=layer_loop)  # fmt: skip
    h_c = final_norm(config, params, xc_BCD).reshape(P, G, Tc, -1)
    return h_c, final_norm(config, params, last(xp))


def group_prompts(tokens: jax.Array, prompt_mask: jax.Array, group_size: int) -> tuple[jax.Array, jax.Array]:
    """The prompt of each group from prompt-major rows: rows ``p*G .. p*G+G-1`` share prompt p, so row ``p*G``
    holds it. ``tokens [P*G, Tp(+...)]``, ``prompt_mask [P*G, Tp]`` -> ``([P, Tp], [P, Tp])``.

    The train step's batch layout (prompt left-padded to a fixed Tp, prompt-major groups) makes the G prompt rows of
    a group identical; that is not checked here (it cannot be under jit): use `check_groups` on host data.
    """
    B, Tp = prompt_mask.shape
    if group_size < 1 or B % group_size:
        raise ValueError(f"{B} rows cannot be split into groups of group_size={group_size} (rows must be P*G)")
    Pn = B // group_size
    prompts = tokens[:, :Tp].reshape(Pn, group_size, Tp)[:, 0]
    masks = prompt_mask.reshape(Pn, group_size, Tp)[:, 0]
    return prompts, masks


def check_groups(tokens, prompt_mask, group_size: int) -> None:
    """Host-side check (numpy or concrete arrays) that the G rows of each group carry the same prompt and mask;
    raises ValueError naming the first group that does not (the prefix-shared path would silently use row p*G)."""
    tokens, prompt_mask = np.asarray(tokens), np.asarray(prompt_mask).astype(bool)
    B, Tp = prompt_mask.shape
    if group_size < 1 or B % group_size:
        raise ValueError(f"{B} rows cannot be split into groups of group_size={group_size} (rows must be P*G)")
    t = np.where(prompt_mask, tokens[:, :Tp], -1).reshape(B // group_size, group_size, Tp)
    m = prompt_mask.reshape(B // group_size, group_size, Tp)
    bad = np.nonzero(~((t == t[:, :1]).all((1, 2)) & (m == m[:, :1]).all((1, 2))))[0]
    if bad.size:
        raise ValueError(
            f"group {int(bad[0])} (rows {int(bad[0]) * group_size}..{int(bad[0]) * group_size + group_size - 1}) "
            "does not share one prompt: prefix sharing needs prompt-major rows with identical left-padded prompts "
            "(set perf.prefix_sharing=false for other layouts)"
        )


def prefix_shared_predictors(
    config: ModelConfig,
    params: Params,
    tokens: jax.Array,
    prompt_mask: jax.Array,
    completion_mask: jax.Array,
    group_size: int,
    *,
    remat: RematPolicy = "projections",
    matmul_backward: MatmulBackward = "auto",
    attention_kernel: attention.Kernel = attention.DENSE,
    constrain_rows: Callable[[jax.Array], jax.Array] | None = None,
    packed_width: int = 0,
    pack_rows: int = 1,
    layer_loop: LayerLoop = "scan",
) -> jax.Array:
    """The hidden states that predict each completion token, ``[B, Tc, D]``, for train-step rows.

    ``tokens [B, Tp+Tc]`` (prompt left-padded to Tp, completion right-padded to Tc), ``prompt_mask [B, Tp]``,
    ``completion_mask [B, Tc]``, B = P*G prompt-major (the group's prompt is taken from row ``p*G``; see
    `group_prompts`). Equals ``models.hidden_states(tokens, mask)[:, Tp-1 : Tp+Tc-1]`` of the plain path: position
    ``Tp-1`` (last prompt token) predicts completion token 0, position ``Tp+t`` predicts token ``t+1``.
    ``packed_width``, ``pack_rows``: run the prompts packed (see `prefix_shared_hidden`); ``layer_loop``: as there.
    """
    check_tokens(tokens)
    B, Tp = prompt_mask.shape
    Tc = completion_mask.shape[1]
    _check("tokens", tokens, (B, Tp + Tc))
    _check("completion_mask", completion_mask, (B, Tc))
    G = int(group_size)
    prompts, pmask = group_prompts(tokens, prompt_mask, G)
    Pn = B // G
    pack = dict(remat=remat, matmul_backward=matmul_backward, attention_kernel=attention_kernel,
                constrain_rows=constrain_rows, packed_width=packed_width, pack_rows=pack_rows,
                layer_loop=layer_loop)  # fmt: skip
    if Tc == 1:  # only the last prompt token predicts anything (no completion token is run)
        _, h_last = prefix_shared_hidden(config, params, prompts, pmask, tokens[:, Tp:].reshape(Pn, G, 1), **pack)
        return jnp.repeat(h_last, G, axis=0)[:, None, :]
    # The last completion token predicts nothing: it is not run (causality: earlier states do not depend on it).
    h_c, h_last = prefix_shared_hidden(
        config,
        params,
        prompts,
        pmask,
        tokens[:, Tp : Tp + Tc - 1].reshape(Pn, G, Tc - 1),
        completion_mask[:, : Tc - 1].reshape(Pn, G, Tc - 1),
        **pack,
    )
    h_first = jnp.repeat(h_last, G, axis=0)[:, None, :]
    return jnp.concatenate([h_first, h_c.reshape(B, Tc - 1, -1)], axis=1)
