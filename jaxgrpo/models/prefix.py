# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Prefix-shared forward for GRPO groups: each prompt is encoded once for its G completions.

In a GRPO rollout the G completions of a group share one prompt. The plain training forward
(`jaxgrpo.models.hidden_states` on the ``[P*G, Tp+Tc]`` rows) encodes that prompt G times. Here the decoder runs on
``P`` prompt rows and ``P*G`` completion rows in one `jax.lax.scan` over the stacked layers; in each layer

    prompt rows:      h_p = Block(x_p)  with causal self-attention over the (left-padded) prompt only,
    completion rows:  q_c, k_c, v_c from x_c;  attention over keys [k_p of its group (shared, key-padding masked);
                      k_c (causal, key-padding masked)],  then the same output projection and MLP.

A prompt token never attends to a completion token (causality), so the prompt rows' states are exactly those of the
plain path, and each completion token sees exactly the keys it sees in the plain path: the outputs are equal up to
float rounding, in the forward and (through `jax.grad`, which sums the G cotangents of the broadcast prompt keys and
values into the one prompt computation) in the backward. Positions: the plain path uses
``cumsum(mask) - 1`` over the concatenated row, so prompt token ``j`` has position ``cumsum(prompt_mask)_j - 1`` and
completion token ``t`` has ``n_p + cumsum(completion_mask)_t - 1`` (``n_p`` = the prompt's real length), both
clipped at 0 — RoPE positions of the completion continue from the prompt's real length.

Cost per layer (P prompts, G samples, prompt width Tp, completion width Tc): the token-wise matmuls (QKV, output
projection, MLP) run on ``P·Tp + P·G·Tc`` tokens instead of ``P·G·(Tp+Tc)``; attention scores cost
``P·Tp² + P·G·Tc·(Tp+Tc)`` instead of ``P·G·(Tp+Tc)²``. With GSM8K prompts (~150 tokens) and 64-token completions at
G = 4 that is ~2.5x fewer FLOPs for the decoder, forward and backward.

**Packed prompts** (``packed_width = W > 0``): left-padded prompts waste the padding's share of the prompt rows'
token-wise work (GSM8K prompts of 57..137 tokens in a 160-wide batch: 46% padding). With ``pack_rows = S`` the
``Q = P / S`` consecutive prompts of each of ``S`` rows are laid end to end in a packed row of width ``W``; the
token-wise layers (norms, QKV and output projections, MLP) run on ``[S, W]`` tokens, and only the prompt attention
runs in the padded per-prompt layout ``[P, Tp]``: queries, keys and values are gathered into it (the same keys and
values the completions attend to) and the attention outputs are gathered back. Every real prompt token computes
exactly what it computes in the padded layout, so values and gradients are unchanged (tested). ``W`` must hold every
row's prompt tokens (`packed_width` computes it from the prompt lengths); one row per batch shard keeps the gathers
shard-local.

The building blocks (RMSNorm, RoPE, QKV projection, masked attention, output projection + SwiGLU MLP) are those of
`jaxgrpo.models.transformer`, imported, not re-implemented; see that module for the formulas and sources.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.models import transformer as tfm
from jaxgrpo.models.config import ModelConfig

Params = tfm.Params
PACK_BUCKET = 64  # packed prompt rows are a multiple of this wide (bounds the number of compiled widths)


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
    remat: bool = False,
    packed_width: int = 0,
    pack_rows: int = 1,
    completion_given: dict[str, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Final-normed hidden states of G completions per prompt, each prompt encoded once.

    Args:
      prompt_tokens ``[P, Tp]`` int: one row per group, LEFT-padded (real tokens at the end of the row).
      prompt_mask ``[P, Tp]`` bool: real prompt tokens. Each prompt needs at least one real token.
      completion_tokens ``[P, G, Tc]`` int: the G completions of prompt p, RIGHT-padded.
      completion_mask ``[P, G, Tc]`` bool or None (= all real).
      remat: wrap each layer in `jax.checkpoint` (recompute in the backward, as `models.hidden_states(remat=True)`).
      packed_width: 0 = the prompt rows run left-padded ``[P, Tp]``; ``W > 0`` = they run packed end to end, ``S =
        pack_rows`` rows of width ``W`` (see the module docstring; same values). ``W`` must be at least the largest
        number of real prompt tokens among the rows' ``P / S`` consecutive prompts: `packed_width` gives it. Checked
        when the mask is concrete; under `jax.jit` a too small ``W`` would drop prompt tokens.
      pack_rows: ``S``, dividing P (one per batch shard).
      completion_given: optional ``{name: [L, P*G, Tc, out]}`` for the dense projections of
        `transformer.PROJECTIONS`: the completion tokens' projection outputs, already known (recorded by the sampler
        with these params, `sampling.generate(record_projections=True)`); the forward takes them as given
        (`transformer._matmul_given`) instead of computing those products, and the backward is unchanged.

    Returns:
      ``(h_completion [P, G, Tc, D], h_prompt_last [P, D])`` in the compute dtype: ``h_completion[p, g, t]`` equals
      `models.hidden_states` of the concatenated row ``[prompt_p, completion_pg]`` at position ``Tp + t``, and
      ``h_prompt_last[p]`` equals it at position ``Tp - 1`` (the last prompt token, which predicts completion token
      0 of every sample of the group).
    """
    tfm._check_tokens(prompt_tokens)
    Pn, Tp = prompt_tokens.shape
    if completion_tokens.ndim != 3 or completion_tokens.shape[0] != Pn:
        raise ValueError(
            f"completion_tokens must be [P, G, Tc] with P={Pn} (the prompt rows), got shape {completion_tokens.shape}"
        )
    if not jnp.issubdtype(completion_tokens.dtype, jnp.integer):
        raise ValueError(f"completion_tokens must be an integer array, got dtype {completion_tokens.dtype}")
    _, G, Tc = completion_tokens.shape
    if Tp < 1 or Tc < 1:
        raise ValueError(f"need prompt width Tp >= 1 and completion width Tc >= 1, got Tp={Tp}, Tc={Tc}")
    _check("prompt_mask", prompt_mask, (Pn, Tp))
    if completion_mask is None:
        completion_mask = jnp.ones((Pn, G, Tc), bool)
    _check("completion_mask", completion_mask, (Pn, G, Tc))
    pm_PT = prompt_mask.astype(bool)
    cm_BC = completion_mask.astype(bool).reshape(Pn * G, Tc)
    B = Pn * G
    if completion_given is not None:
        tfm._check_projection_arrays(config, completion_given, B, Tc, "completion_given")

    # Positions as in the plain path (cumsum(mask) - 1 over the concatenated row, clipped at 0).
    n_P = jnp.sum(pm_PT, axis=1, dtype=jnp.int32)
    pos_PT = jnp.maximum(jnp.cumsum(pm_PT.astype(jnp.int32), axis=1) - 1, 0)
    pos_BC = jnp.maximum(jnp.repeat(n_P, G)[:, None] + jnp.cumsum(cm_BC.astype(jnp.int32), axis=1) - 1, 0)
    cos_c, sin_c = tfm._rope_tables(config, pos_BC)
    if packed_width:
        pack = _pack_layout(pm_PT, int(packed_width), int(pack_rows))
        S, W = pack["token_slot"].shape
        xp0 = tfm._embed(config, params, tfm._take_rows(prompt_tokens.reshape(S, -1), pack["token_slot"]))
        cos_p, sin_p = tfm._rope_tables(config, tfm._take_rows(pos_PT.reshape(S, -1), pack["token_slot"]))
    else:
        xp0 = tfm._embed(config, params, prompt_tokens)
        cos_p, sin_p = tfm._rope_tables(config, pos_PT)

    # Masks: prompt queries -> causal over prompt keys; completion queries -> all real prompt keys of the group, then
    # causal over the real keys of their own completion.
    mask_PTT = jnp.tril(jnp.ones((Tp, Tp), bool))[None] & pm_PT[:, None, :]
    ckey_BCC = jnp.tril(jnp.ones((Tc, Tc), bool))[None] & cm_BC[:, None, :]
    eps = config.rms_norm_eps

    def prompt_attention(xp, lp):  # -> (new prompt rows, the group prompts' keys and values [P, Tp, K, H])
        qp, kp, vp = tfm._qkv(config, lp, tfm._rms_norm(xp, lp["attn_norm"], eps), cos_p, sin_p)
        if not packed_width:
            return tfm._finish_block(config, lp, xp, tfm._attend(qp, kp, vp, mask_PTT)), kp, vp
        qp_PTKGH, kp_PTKH, vp_PTKH = (tfm._take_rows(x, pack["slot_index"]).reshape(Pn, Tp, *x.shape[2:])
                                      for x in (qp, kp, vp))  # fmt: skip
        a_PTKGH = tfm._attend(qp_PTKGH, kp_PTKH, vp_PTKH, mask_PTT)
        a_SWKGH = tfm._take_rows(a_PTKGH.reshape(S, -1, *a_PTKGH.shape[2:]), pack["token_slot"])
        return tfm._finish_block(config, lp, xp, a_SWKGH), kp_PTKH, vp_PTKH

    def block(carry, xs):
        lp, given = xs
        io = None if given is None else {"given": given}
        xp, xc_BCD = carry
        xp_new, kp_PTKH, vp_PTKH = prompt_attention(xp, lp)
        hc = tfm._rms_norm(xc_BCD, lp["attn_norm"], eps)
        qc, kc_BCKH, vc_BCKH = tfm._qkv(config, lp, hc, cos_c, sin_c, io)
        # The group's prompt keys/values serve its G completions, read once per group (their gradient sums over G).
        a_c = tfm._attend_shared_prefix(qc, *tfm._kv_major(kp_PTKH, vp_PTKH), pm_PT, *tfm._kv_major(kc_BCKH, vc_BCKH),
                                        ckey_BCC)  # fmt: skip
        xc_new = tfm._finish_block(config, lp, xc_BCD, a_c, io)
        return (xp_new, xc_new), None

    x0 = (xp0, tfm._embed(config, params, completion_tokens.reshape(B, Tc)))
    (xp, xc_BCD), _ = jax.lax.scan(tfm.layer_checkpoint(block, remat), x0, (params["layers"], completion_given))
    h_c = tfm._rms_norm(xc_BCD, params["final_norm"], eps).reshape(Pn, G, Tc, -1)
    # the last prompt token: slot Tp - 1 of the left-padded layout
    xp_last = tfm._take_rows(xp, pack["last"]).reshape(Pn, -1) if packed_width else xp[:, -1]
    return h_c, tfm._rms_norm(xp_last, params["final_norm"], eps)


def _pack_layout(pm_PT: jax.Array, width: int, rows: int) -> dict[str, jax.Array]:
    """Index maps between left-padded prompt slots ``[P, Tp]`` and ``rows`` packed rows of ``width`` columns; the
    ``Q = P / rows`` consecutive prompts of a row lie end to end, in order. Returns int32 ``slot_index [S, Q*Tp]``
    (packed column of each slot; 0 for padding slots), ``token_slot [S, W]`` (flat slot ``q*Tp + s`` of each column;
    an arbitrary slot for the unused columns at the end) and ``last [S, Q]`` (column of each prompt's last token)."""
    Pn, Tp = pm_PT.shape
    if rows < 1 or Pn % rows:
        raise ValueError(f"pack_rows={rows} must divide the {Pn} prompts (one packed row per batch shard)")
    Q = Pn // rows
    n_SQ = jnp.sum(pm_PT, axis=1, dtype=jnp.int32).reshape(rows, Q)
    if not isinstance(pm_PT, jax.core.Tracer):
        need = int(jnp.max(jnp.sum(n_SQ, axis=1)))
        if need > width:
            raise ValueError(f"packed_width={width} cannot hold a packed row of {need} prompt tokens; use "
                             "models.prefix.packed_width(prompt_lengths, pack_rows) to size it")  # fmt: skip
    end_SQ = jnp.cumsum(n_SQ, axis=1)
    first_SQ = Tp - n_SQ  # first real slot of each left-padded prompt
    shift_SQ = end_SQ - n_SQ - first_SQ  # packed column = slot + shift
    slot_index = jnp.where(pm_PT.reshape(rows, Q, Tp), jnp.arange(Tp, dtype=jnp.int32) + shift_SQ[..., None], 0)
    c_W = jnp.arange(width, dtype=jnp.int32)
    q_SW = jnp.minimum(jnp.sum(c_W[None, :, None] >= end_SQ[:, None, :], axis=-1, dtype=jnp.int32), Q - 1)
    s_SW = jnp.clip(c_W - jnp.take_along_axis(shift_SQ, q_SW, axis=1), 0, Tp - 1)
    return dict(slot_index=slot_index.reshape(rows, Q * Tp), token_slot=q_SW * Tp + s_SW, last=end_SQ - 1)


def packed_width(prompt_lengths: Sequence[int], pack_rows: int = 1, *, prompt_width: int | None = None) -> int:
    """Packed-row width for `prefix_shared_hidden` (``packed_width``) that holds any ``P / pack_rows`` of these
    prompts: the sum of the ``P / pack_rows`` longest lengths rounded up to `PACK_BUCKET` (so it fits every row
    whatever the grouping, and few distinct widths compile). Returns 0 (do not pack) when packing would not be
    narrower than the padded rows' ``P / pack_rows * prompt_width`` tokens."""
    lengths = np.sort(np.asarray(prompt_lengths, dtype=np.int64))[::-1]
    if pack_rows < 1 or len(lengths) % pack_rows:
        raise ValueError(f"pack_rows={pack_rows} must divide the {len(lengths)} prompts")
    per_row = len(lengths) // pack_rows
    width = PACK_BUCKET * math.ceil(int(lengths[:per_row].sum()) / PACK_BUCKET)
    if prompt_width is not None and width >= per_row * prompt_width:
        return 0
    return max(width, PACK_BUCKET)


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
    import numpy as np

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
            "(set algo.prefix_sharing=false for other layouts)"
        )


def prefix_shared_predictors(
    config: ModelConfig,
    params: Params,
    tokens: jax.Array,
    prompt_mask: jax.Array,
    completion_mask: jax.Array,
    group_size: int,
    *,
    remat: bool = False,
    packed_width: int = 0,
    pack_rows: int = 1,
    completion_given: dict[str, jax.Array] | None = None,
) -> jax.Array:
    """The hidden states that predict each completion token, ``[B, Tc, D]``, for train-step rows.

    ``tokens [B, Tp+Tc]`` (prompt left-padded to Tp, completion right-padded to Tc), ``prompt_mask [B, Tp]``,
    ``completion_mask [B, Tc]``, B = P*G prompt-major (the group's prompt is taken from row ``p*G``; see
    `group_prompts`). Equals ``models.hidden_states(tokens, mask)[:, Tp-1 : Tp+Tc-1]`` of the plain path: position
    ``Tp-1`` (last prompt token) predicts completion token 0, position ``Tp+t`` predicts token ``t+1``.
    ``packed_width``, ``pack_rows``: run the prompts packed (see `prefix_shared_hidden`). ``completion_given``:
    ``{name: [L, B, Tc-1, out]}``, the recorded projections of the completion tokens that are run (all but the last;
    see `prefix_shared_hidden`).
    """
    tfm._check_tokens(tokens)
    B, Tp = prompt_mask.shape
    Tc = completion_mask.shape[1]
    _check("tokens", tokens, (B, Tp + Tc))
    _check("completion_mask", completion_mask, (B, Tc))
    G = int(group_size)
    prompts, pmask = group_prompts(tokens, prompt_mask, G)
    Pn = B // G
    pack = dict(remat=remat, packed_width=packed_width, pack_rows=pack_rows)
    if Tc == 1:  # only the last prompt token predicts anything (no completion token is run: nothing to reuse)
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
        completion_given=completion_given,
        **pack,
    )
    h_first = jnp.repeat(h_last, G, axis=0)[:, None, :]
    return jnp.concatenate([h_first, h_c.reshape(B, Tc - 1, -1)], axis=1)
