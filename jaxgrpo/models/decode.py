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
    per-layer dicts with ``qkv [D, K (R + 2) H]`` (per kv head its R query heads, key and value: `_by_kv_head`), its
    bias ``qkv_bias`` (qkv-bias models) and ``gate_up [D, 2F]`` concatenated, ``o [N H, D]``, ``down``, the norms;
    plus ``embed``, ``final_norm`` and ``lm_head [D, V]``. With unmerged LoRA adapters (a
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
    w = {k: cast(lp[k]) for k in lp if k not in ("q", "k", "v", "o", "gate", "up", "q_bias", "k_bias", "v_bias")}
    w["qkv"] = _by_kv_head(config, *(cast(lp[k]) for k in "qkv")).reshape(config.hidden_size, -1)
    if config.qkv_bias:  # one bias over the q|k|v product: XLA:GPU adds it in the GEMM's epilogue
        w["qkv_bias"] = _by_kv_head(config, *(cast(lp[f"{k}_bias"]) for k in "qkv")).reshape(-1)
    w["gate_up"] = jnp.concatenate([cast(lp["gate"]), cast(lp["up"])], axis=1)
    w["o"] = cast(lp["o"]).reshape(-1, config.hidden_size)
    return w


def _by_kv_head(config: ModelConfig, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """``q [.., N, H]``, ``k``/``v [.., K, H]`` -> ``[.., K, R + 2, H]``: per kv head its ``R`` query heads, its key
    head and its value head (the order of `decode_weights`' fused q|k|v columns)."""
    K, R, H = config.num_kv_heads, config.heads_per_kv, config.head_dim
    lead = q.shape[:-2]
    return jnp.concatenate([q.reshape(*lead, K, R, H), k[..., None, :], v[..., None, :]], axis=-2)


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


def _fused_layer(config: ModelConfig, w: Params, x_BTD: jax.Array, attend, ops: LayerOps = AS_WRITTEN) -> jax.Array:
    """`layers.decoder_layer`'s math on `decode_weights`' fused per-layer weights (one q|k|v and one gate|up
    product), its weight products as ``ops`` places them; ``attend(qkv, norms)`` takes the q|k|v product ``[B, T, K,
    R + 2, H]`` (per kv head its queries, key and value) before the qk-norm (``norms``: its weights, or None) and
    RoPE, and applies them (`write_attend`)."""
    c, eps = config, config.rms_norm_eps
    B, T = x_BTD.shape[:2]
    K, R, H = c.num_kv_heads, c.heads_per_kv, c.head_dim
    h = rms_norm(x_BTD, w["attn_norm"], eps)
    qkv = ops.project(w, "qkv", h)
    if c.qkv_bias:
        qkv = qkv + w["qkv_bias"].astype(qkv.dtype)
    a = attend(qkv.reshape(B, T, K, R + 2, H), (w["q_norm"], w["k_norm"]) if c.qk_norm else None)
    x_BTD = x_BTD + ops.project(w, "o", a.reshape(B, T, K * R * H))
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


def write_attend(qkv_BKXH: jax.Array, cos_Bh: jax.Array, sin_Bh: jax.Array, kp_PKSH: jax.Array, vp_PKHS: jax.Array,
                 prefix_mask_PS: jax.Array, ck_BKMH: jax.Array, cv_BKHM: jax.Array, mask_BM: jax.Array,
                 slot: jax.Array, norms: tuple[jax.Array, jax.Array] | None = None, *,
                 norm_eps: float = 1e-6) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """A decode layer's attention step with XLA, from its q|k|v product ``[B, K, R + 2, H]`` (per kv head its ``R``
    queries, its new key and value; `decode_weights`' layout): the qk-norm (``norms``: the weights ``(q [H], k [H])``
    of Qwen3's `layers.rms_norm` with ``norm_eps``, or None), then RoPE (`layers.apply_rope`, tables ``[B, H/2]``)
    on the queries and the key; the key and value written into the decode cache at decode slot ``slot`` (a scalar: one
    slot for every row, an in-place `lax.dynamic_update_slice`; ``[B]``: a slot per row, an in-place scatter vmapped
    over the rows, whose axis a mesh then splits locally; a slot past the cache writes nothing); then `attend_decode`
    over the prompt's keys and the row's visible slots ``mask_BM``. Returns the output ``[B, K, R, H]`` and the two
    caches. The reference of `pallas_attention.decode_layer`, its one-kernel form on NVIDIA GPUs (`_write_attend`)."""
    rope = cos_Bh[:, None], sin_Bh[:, None]
    B, K, X, H = qkv_BKXH.shape
    R = X - 2
    q, k, v = qkv_BKXH[:, :, :R].reshape(B, 1, K * R, H), qkv_BKXH[:, None, :, R], qkv_BKXH[:, :, R + 1]
    if norms is not None:
        q, k = rms_norm(q, norms[0], norm_eps), rms_norm(k, norms[1], norm_eps)
    q, k = apply_rope(q, *rope).reshape(B, K, R, H), apply_rope(k, *rope)[:, 0]
    if jnp.ndim(slot):
        ck = jax.vmap(lambda c, u, s: c.at[:, s].set(u, mode="drop"))(ck_BKMH, k.astype(ck_BKMH.dtype), slot)
        cv = jax.vmap(lambda c, u, s: c.at[:, :, s].set(u, mode="drop"))(cv_BKHM, v.astype(cv_BKHM.dtype), slot)
    else:
        zero = jnp.zeros((), jnp.int32)
        ck = jax.lax.dynamic_update_slice(ck_BKMH, k[:, :, None].astype(ck_BKMH.dtype), (zero, zero, slot, zero))
        cv = jax.lax.dynamic_update_slice(cv_BKHM, v[..., None].astype(cv_BKHM.dtype), (zero, zero, zero, slot))
    dt = q.dtype
    a = attend_decode(q, kp_PKSH.astype(dt), vp_PKHS.astype(dt), prefix_mask_PS, ck.astype(dt), cv.astype(dt), mask_BM)
    return a, ck, cv


def _write_attend(*args: Any, norm_eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`write_attend` on CPU and TPU; on an NVIDIA GPU the same step as one Pallas kernel per layer
    (`pallas_attention.decode_layer`: the qk-norm, RoPE, the cache writes and attention in one launch, no score
    tensor in HBM, no padded or regrouped queries) where it takes the shapes (`pallas_attention.decode_layer_fits`)."""
    qkv, kp, ck = args[0], args[3], args[6]
    xla = functools.partial(write_attend, norm_eps=norm_eps)
    if not pallas_attention.decode_layer_fits(qkv.shape[2] - 2, qkv.shape[3], kp.shape[2], ck.shape[2]):
        return xla(*args)
    kernel = functools.partial(pallas_attention.decode_layer, norm_eps=norm_eps)
    return jax.lax.platform_dependent(*args, cuda=kernel, default=xla)


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
    ``v [B, K, H, M]``). ``slot``: a scalar, one slot for every row, or ``[B]``, a slot per row (a row whose slot is
    past the cache writes nothing: the engines' per-row linear caches, `jaxgrpo.rollout.engine` and
    `jaxgrpo.rollout.turn_engine`). Keys carry their RoPE position, so the order of the slots does not matter. Each
    layer's RoPE, cache write and attention: `write_attend`, or on an NVIDIA GPU one fused Pallas kernel
    (`_write_attend`). ``ops``: the fused layers' weight products (`LayerOps`; the engine passes its FSDP
    placement of them, `jaxgrpo.rollout.engine.split_ops`). Returns the final-normed hidden state ``[B, D]`` and the
    cache (donate it when jitting)."""
    x = embed(config, weights, tokens_B[:, None])
    rope = rope_tables(config, positions_B[:, None])
    tables = rope[0][:, 0], rope[1][:, 0]
    # a LoRA layer (`layers.decoder_layer`) applies RoPE before it attends: its step rotates by the identity (exact)
    applied = jnp.ones_like(tables[0]), jnp.zeros_like(tables[1])
    new_cache = []
    for w, (kp, vp), (ck, cv) in zip(weights["layers"], prefix, cache):
        lora = "lora" in w

        def attend(qkv, norms=None, ck=ck, cv=cv, kp=kp, vp=vp, tables=applied if lora else tables):
            a, ck, cv = _write_attend(qkv[:, 0], *tables, kp, vp, prefix_mask, ck, cv, mask_BM, slot, norms,
                                      norm_eps=config.rms_norm_eps)  # fmt: skip
            new_cache.append(KVCache(ck, cv))
            return a[:, None]

        def rotated(q_BTKRH, k, v, attend=attend):  # a LoRA layer's rotated q, k, v as the fused layers' product
            return attend(_by_kv_head(config, q_BTKRH.reshape(*k.shape[:2], -1, k.shape[-1]), k, v)), None

        if lora:
            x, _ = decoder_layer(config, w, x, rope, rotated, explicit=False)
        else:
            x = _fused_layer(config, w, x, attend, ops)
    return final_norm(config, weights, x[:, 0]), new_cache
