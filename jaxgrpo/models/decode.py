# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The rollout engine's forwards: `prefill` the prompts once, then `decode_step` one token per row against a shared
prompt cache.

A GRPO rollout decodes ``B = S * G`` rows (``G`` samples for each of ``S`` prompts, slot-major: row ``b`` belongs
to prompt slot ``b // G``). With one plain KV cache per row, every row would carry and read its own copy of its
prompt's keys/values, G times the same bytes. Here the cache is split in two, one array per layer:

    prefix cache  k ``[S, K, Tp, H]``, v ``[S, K, H, Tp]``: each prompt once (written by `prefill`), read-only while
                  decoding;
    decode cache  k ``[B, K, M, H]``, v ``[B, K, H, M]``: the tokens each row generated, one slot per step.

Both are kv-head-major with the key axis of the values minor (see `jaxgrpo.models.attention`). Row ``b``'s query
attends to the joint key set

    { prefix slot s of prompt b // G : prefix_mask[b // G, s] }  U  { decode slot j of row b : mask[b, j] }

with one softmax over both parts (`attend_decode`), so the result equals attention over the concatenated cache
``[prefix ; decode]``.

`prefill` runs the prompts packed end to end (``packed_width > 0``; `jaxgrpo.padding.pack_layout`): the token-wise
work (projections, MLP, norms) runs on real tokens only and only the attention runs in the padded per-prompt layout.
The prompt stream (`prompt_stream`) is the same one the prefix-shared train step runs (`jaxgrpo.models.prefix`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxgrpo import padding
from jaxgrpo.models import attention, pallas_attention  # at import, not in a step (token_sampling: block_sums)
from jaxgrpo.models.attention import _NEG, KVCache
from jaxgrpo.models.config import ModelConfig
from jaxgrpo.models.layers import (
    Stream,
    apply_rope,
    check_tokens,
    decoder_layer,
    embed,
    final_norm,
    rms_norm,
    rope_tables,
    run_layers,
)
from jaxgrpo.models.params import Params, lm_head


def prompt_stream(
    config: ModelConfig,
    params: Params,
    tokens_PT: jax.Array,
    mask_PT: jax.Array,
    packed_width: int = 0,
    pack_rows: int = 1,
    kernel: attention.Kernel = attention.DENSE,
) -> tuple[Stream, Callable[[jax.Array], jax.Array]]:
    """The prompts ``[P, Tp]`` (left-padded) as a `Stream` with `attention.per_prompt` (its ``out`` per layer: the
    prompts' keys ``[P, K, Tp, H]`` and values ``[P, K, H, Tp]``), and a function taking the stream's output rows to
    each prompt's last-token state ``[P, D]``. ``packed_width = W > 0``: the rows run packed end to end, ``pack_rows``
    rows of width W (`jaxgrpo.padding.packed_width` sizes it; same values, no work on padding). ``kernel``: the
    attention kernel (`attention.Kernel`)."""
    P, Tp = mask_PT.shape
    pm_PT = mask_PT.astype(bool)
    pos_PT = jnp.maximum(jnp.cumsum(pm_PT.astype(jnp.int32), axis=1) - 1, 0)
    if not packed_width:
        stream = Stream(embed(config, params, tokens_PT), rope_tables(config, pos_PT),
                        attention.per_prompt(pm_PT, None, kernel))  # fmt: skip
        return stream, lambda x: x[:, -1]
    pack = padding.pack_layout(mask_PT, int(packed_width), int(pack_rows))
    J = pack["token_slot"].shape[0]
    tokens_JW = attention.take_rows(tokens_PT.reshape(J, -1), pack["token_slot"])
    stream = Stream(embed(config, params, tokens_JW), rope_tables(config, pack["position"]),
                    attention.per_prompt(pm_PT, pack, kernel))  # fmt: skip
    return stream, lambda x: attention.take_rows(x, pack["last"]).reshape(P, -1)


def prefill(
    config: ModelConfig,
    params: Params,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    *,
    packed_width: int = 0,
    pack_rows: int = 1,
    attention_kernel: attention.Kernel = attention.DENSE,
) -> tuple[jax.Array, KVCache]:
    """Encode the prompts ``[P, Tp]`` (left-padded, ``prompt_mask`` their real tokens, at least one each).

    Returns ``(last_hidden [P, D], prefix)``: the final-normed state of each prompt's last token (compute dtype) and
    the prefix cache k ``[L, P, K, Tp, H]``, v ``[L, P, K, H, Tp]`` (the engine keeps it per layer, `decode_step`).
    ``packed_width``, ``pack_rows``, ``attention_kernel``: see `prompt_stream`."""
    check_tokens(prompt_tokens)
    if prompt_mask.shape != prompt_tokens.shape:
        raise ValueError(f"prompt_mask shape {prompt_mask.shape} != prompt_tokens shape {prompt_tokens.shape}")
    stream, last = prompt_stream(config, params, prompt_tokens, prompt_mask, packed_width, pack_rows, attention_kernel)
    (x,), _, (kv,) = run_layers(config, params, [dataclasses.replace(stream, emit=True)], remat="none")
    return final_norm(config, params, last(x)), KVCache(*kv)


# ------------------------------------------------------------------------------------------ the engine's decode step
# The rollout engine (`jaxgrpo.rollout.engine`) decodes one token per row with per-layer buffers: the layer loop is
# unrolled in Python over a list of per-layer weights (q|k|v and gate|up concatenated once per rollout by
# `decode_weights`) and per-layer caches, so no step slices a stacked weight or cache out of a scan carry (the copy
# XLA makes of each layer's weights and cache when a scan over stacked layers runs inside the decode loop).

DecodeWeights = dict[str, Any]


def decode_weights(config: ModelConfig, params: Params) -> DecodeWeights:
    """The parameters re-laid out for `decode_step`, in the compute dtype, once per rollout: ``layers`` a list of L
    per-layer dicts with ``qkv [D, (N + 2K) H]`` and ``gate_up [D, 2F]`` concatenated, ``o [N H, D]``, ``down``, the
    norms and biases; plus ``embed``, ``final_norm`` and ``lm_head [D, V]``. With unmerged LoRA adapters (a
    low-precision compute dtype, `models.compute_params`) the per-layer dicts keep the original projections and their
    adapters instead (`layers.decoder_layer` runs them).

    One small jitted program re-lays out one layer, its index a runtime argument, and runs once per layer: one
    compilation per model shape and L dispatches per rollout (eagerly it was ~15 dispatches per layer; as one program
    over all layers XLA:CPU took minutes to compile it for a 30-layer model)."""
    dt = jnp.dtype(config.dtype)
    layers = [_layer_weights(config, params["layers"], i) for i in range(config.num_layers)]
    embed = params["embed"] if params["embed"].dtype == dt else params["embed"].astype(dt)
    return {"layers": layers, "embed": embed, "final_norm": params["final_norm"],
            "lm_head": lm_head(config, params)}  # fmt: skip


@functools.partial(jax.jit, static_argnames=("config",))
def _layer_weights(config: ModelConfig, stacked: Params, i: jax.Array) -> dict[str, Any]:
    """Layer ``i`` of the stacked layer params in `decode_weights`' layout."""
    dt = jnp.dtype(config.dtype)
    cast = lambda x: x if x.dtype == dt else x.astype(dt)  # noqa: E731
    lp = jax.tree.map(lambda x: x[i], stacked)
    if "lora" in lp:
        return {k: (v if k == "lora" else jax.tree.map(cast, v)) for k, v in lp.items()}
    w = {k: cast(lp[k]) for k in lp if k not in ("q", "k", "v", "o", "gate", "up")}
    w["qkv"] = jnp.concatenate([cast(lp[k]).reshape(config.hidden_size, -1) for k in "qkv"], axis=1)
    w["gate_up"] = jnp.concatenate([cast(lp["gate"]), cast(lp["up"])], axis=1)
    w["o"] = cast(lp["o"]).reshape(-1, config.hidden_size)
    return w


def project(w: Params, name: str, x_BTE: jax.Array) -> jax.Array:
    """``x @ w[name]``: a fused layer's q|k|v (``"qkv"``) or output (``"o"``) product (`LayerOps`' default)."""
    return jnp.einsum("bte,ed->btd", x_BTE, w[name])


def swiglu(w: Params, h_BTD: jax.Array) -> jax.Array:
    """The MLP on `decode_weights`' fused ``gate_up [D, 2F]``: ``(silu(h W_gate) * (h W_up)) W_down``, one gate|up
    product (`LayerOps`' default)."""
    gate, up = jnp.split(jnp.einsum("btd,df->btf", h_BTD, w["gate_up"]), 2, axis=-1)
    return jnp.einsum("btf,fd->btd", jax.nn.silu(gate) * up, w["down"])


class LayerOps(NamedTuple):
    """The weight products of `decode_weights`' fused layers, as a caller places them on a mesh (the rollout engine's
    FSDP split, `jaxgrpo.rollout.engine.split_ops`): ``project(w, name, x)`` for q|k|v and the output projection,
    ``mlp(w, normed x)`` for the MLP; the defaults compute them as written (`project`, `swiglu`)."""

    project: Callable[[Params, str, jax.Array], jax.Array] = project
    mlp: Callable[[Params, jax.Array], jax.Array] = swiglu


AS_WRITTEN = LayerOps()


def _fused_layer(config: ModelConfig, w: Params, x_BTD: jax.Array, rope, attend,
                 ops: LayerOps = AS_WRITTEN) -> jax.Array:  # fmt: skip
    """`layers.decoder_layer`'s math on `decode_weights`' fused per-layer weights (one q|k|v and one gate|up
    product), its weight products as ``ops`` places them."""
    c, eps = config, config.rms_norm_eps
    B, T = x_BTD.shape[:2]
    N, K, H = c.num_heads, c.num_kv_heads, c.head_dim
    h = rms_norm(x_BTD, w["attn_norm"], eps)
    qkv = ops.project(w, "qkv", h)
    q, k, v = jnp.split(qkv, [N * H, (N + K) * H], axis=-1)
    q, k, v = q.reshape(B, T, N, H), k.reshape(B, T, K, H), v.reshape(B, T, K, H)
    if c.qkv_bias:
        q, k, v = q + w["q_bias"].astype(q.dtype), k + w["k_bias"].astype(q.dtype), v + w["v_bias"].astype(q.dtype)
    if c.qk_norm:
        q, k = rms_norm(q, w["q_norm"], eps), rms_norm(k, w["k_norm"], eps)
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    a, _ = attend(q.reshape(B, T, K, c.heads_per_kv, H), k, v)
    x_BTD = x_BTD + ops.project(w, "o", a.reshape(B, T, N * H))
    return x_BTD + ops.mlp(w, rms_norm(x_BTD, w["mlp_norm"], eps))


def attend_decode(q_BKRH: jax.Array, kp_PKSH: jax.Array, vp_PKHS: jax.Array, prefix_mask_PS: jax.Array,
                  ko_BKMH: jax.Array, vo_BKHM: jax.Array, mask_BM: jax.Array) -> jax.Array:
    """One query per row: `attention.attend_shared_prefix` with ``T = 1``, laid out for decode. The own-key products
    take the rows and kv heads as batch axes in the caches' own order (``[B, K, M, H]`` and ``[B, K, H, M]``, each
    contracting its minor axis), so no cache is transposed; only the small score and output tensors are. One softmax
    over both key sets (joint max, masked scores ``-1e30``, a row with no visible key gets 0)."""
    B, K, R, H = q_BKRH.shape
    P = prefix_mask_PS.shape[0]
    G = B // P
    scale = H**-0.5
    sp = jnp.einsum("pgkrh,pksh->pkgrs", q_BKRH.reshape(P, G, K, R, H), kp_PKSH,
                    preferred_element_type=jnp.float32) * scale  # fmt: skip
    so = jnp.einsum("bkrh,bkmh->bkrm", q_BKRH, ko_BKMH, preferred_element_type=jnp.float32) * scale
    mp = prefix_mask_PS.astype(bool)[:, None, None, None, :]
    mo = mask_BM.astype(bool)[:, None, None, :]
    sp, so = jnp.where(mp, sp, _NEG), jnp.where(mo, so, _NEG)
    mp_BKR = jnp.max(sp, axis=-1).transpose(0, 2, 1, 3).reshape(B, K, R)
    m_BKR = jnp.maximum(mp_BKR, jnp.max(so, axis=-1))
    m_PKGR = m_BKR.reshape(P, G, K, R).transpose(0, 2, 1, 3)
    ep, eo = jnp.exp(sp - m_PKGR[..., None]), jnp.exp(so - m_BKR[..., None])
    total = jnp.sum(ep, axis=-1).transpose(0, 2, 1, 3).reshape(B, K, R) + jnp.sum(eo, axis=-1)
    visible = jnp.any(mp, axis=-1).reshape(P, 1, 1, 1) | jnp.any(mo, axis=-1).reshape(P, G, 1, 1)
    inv_BKR = jnp.where(visible.reshape(B, 1, 1), 1.0 / total, 0.0)
    inv_PKGR = inv_BKR.reshape(P, G, K, R).transpose(0, 2, 1, 3)
    out_p = jnp.einsum("pkgrs,pkhs->pkgrh", (ep * inv_PKGR[..., None]).astype(vp_PKHS.dtype), vp_PKHS)
    out_o = jnp.einsum("bkrm,bkhm->bkrh", (eo * inv_BKR[..., None]).astype(vo_BKHM.dtype), vo_BKHM)
    return out_p.transpose(0, 2, 1, 3, 4).reshape(B, K, R, H) + out_o


def _attend(*args: jax.Array) -> jax.Array:
    """`attend_decode` on CPU and TPU; on an NVIDIA GPU the same math as one Pallas kernel per layer
    (`pallas_attention.decode_attend`: no score tensor in HBM, no padded or regrouped queries) where it takes the
    shapes (`pallas_attention.decode_attend_fits`)."""
    q, kp, ko = args[0], args[1], args[4]
    if not pallas_attention.decode_attend_fits(q.shape[2], kp.shape[2], ko.shape[2]):
        return attend_decode(*args)
    return jax.lax.platform_dependent(*args, cuda=pallas_attention.decode_attend, default=attend_decode)


def decode_step(
    config: ModelConfig,
    weights: DecodeWeights,
    tokens_B: jax.Array,
    positions_B: jax.Array,
    prefix: list[KVCache],
    prefix_mask: jax.Array,
    cache: list[KVCache],
    slot: jax.Array,
    mask_BM: jax.Array,
    ops: LayerOps = AS_WRITTEN,
) -> tuple[jax.Array, list[KVCache]]:
    """One token per row: row ``b`` (of ``B = S * G``, slot-major: row ``b`` reads prefix slot ``b // G``) feeds
    ``tokens_B[b]`` at RoPE position ``positions_B[b]``, writes its key/value at decode slot ``slot`` and attends to its
    prompt's prefix (``prefix`` per layer ``k [S, K, Tp, H]``, ``v [S, K, H, Tp]``, masked by ``prefix_mask [S, Tp]``)
    and to its decode slots where ``mask_BM`` (which must include ``slot``; ``cache`` per layer ``k [B, K, M, H]``,
    ``v [B, K, H, M]``). ``slot``: a scalar, one slot for every row (an in-place `lax.dynamic_update_slice`), or
    ``[B]``, a slot per row (an in-place scatter; a row whose slot is past the cache writes nothing: the engines'
    per-row linear caches, `jaxgrpo.rollout.engine` and `jaxgrpo.rollout.turn_engine`). Keys carry their RoPE
    position, so the order of the slots does not matter. Attention: `attend_decode`, or on an NVIDIA GPU its fused
    Pallas kernel (`_attend`). ``ops``: the fused layers' weight products (`LayerOps`; the engine passes its FSDP
    placement of them, `jaxgrpo.rollout.engine.split_ops`). Returns the final-normed hidden state ``[B, D]`` and the
    cache (donate it when jitting)."""
    x = embed(config, weights, tokens_B[:, None])
    rope = rope_tables(config, positions_B[:, None])
    zero = jnp.zeros((), jnp.int32)
    new_cache = []
    for w, (kp, vp), (ck, cv) in zip(weights["layers"], prefix, cache):

        def attend(q, k, v, ck=ck, cv=cv, kp=kp, vp=vp):
            if jnp.ndim(slot):  # a slot per row (a scatter; a slot past the cache drops that row's write), vmapped
                # over the rows: their axis is the scatter's batching dimension, which a mesh splits locally
                ck = jax.vmap(lambda c, u, s: c.at[:, s].set(u, mode="drop"))(ck, k[:, 0].astype(ck.dtype), slot)
                cv = jax.vmap(lambda c, u, s: c.at[:, :, s].set(u, mode="drop"))(cv, v[:, 0].astype(cv.dtype), slot)
            else:
                kt, vt = k.transpose(0, 2, 1, 3).astype(ck.dtype), v.transpose(0, 2, 3, 1).astype(cv.dtype)
                ck = jax.lax.dynamic_update_slice(ck, kt, (zero, zero, slot, zero))
                cv = jax.lax.dynamic_update_slice(cv, vt, (zero, zero, zero, slot))
            new_cache.append(KVCache(ck, cv))
            a = _attend(q[:, 0], kp.astype(q.dtype), vp.astype(q.dtype), prefix_mask, ck.astype(q.dtype),
                        cv.astype(q.dtype), mask_BM)  # fmt: skip
            return a[:, None], None

        if "lora" in w:
            x, _ = decoder_layer(config, w, x, rope, attend, explicit=False)
        else:
            x = _fused_layer(config, w, x, rope, attend, ops)
    return final_norm(config, weights, x[:, 0]), new_cache
