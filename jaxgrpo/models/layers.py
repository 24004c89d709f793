# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The decoder layer, written once, and the one `jax.lax.scan` over the stacked layers.

Every forward of the package (full sequences, KV-cached chunks, the sampler's prefill and decode, the prefix-shared
train step) is `run_layers` with a different *attention* (`jaxgrpo.models.attention`); everything else of a layer is
`decoder_layer`, and every dense projection is `dense`.

One layer (pre-norm; Touvron et al. 2023 "LLaMA", HF ``modeling_llama.py`` / ``modeling_qwen2.py`` /
``modeling_qwen3.py``)::

    h = x + W_o Attn(RMSNorm(x));   out = h + W_down (silu(W_gate RMSNorm(h)) * W_up RMSNorm(h))
    RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)                       (Zhang & Sennrich 2019; computed in float32)
    Attn: q = x W_q (+b_q), k, v likewise; qwen3: q, k <- RMSNorm_head(q), RMSNorm_head(k); q, k <- RoPE(q, k, pos)
          a = softmax(q k^T / sqrt(H) + mask) v   (softmax in float32; kv head k serves query heads k*R..k*R+R-1)
    RoPE (Su et al. 2021, "rotate-half" layout as in HF): inv_freq_i = theta^(-2i/H), i < H/2, optionally scaled
          (see config.py); angle = pos * inv_freq; x' = [x1 cos - x2 sin, x2 cos + x1 sin] for halves x1, x2.

**Streams.** `run_layers` runs one or more `Stream`\\ s (sets of rows with their own embeddings, RoPE tables and
attention) through each layer in order; a stream's attention sees what the earlier streams' attentions emitted in the
same layer (the prefix-shared train step: the prompt rows' keys and values, read by the completion rows).

**The attention calling convention.** ``attend(q [B,T,K,R,H], k [B,T,K,H], v [B,T,K,H], ctx: LayerContext) ->
(a [B,T,K,R,H], state, out)``: ``ctx.state`` is a pytree carried through the scan (a KV cache written in place),
returned updated; ``out`` is stacked over the layers (the prefill's per-prompt keys and values).

**Remat** (`RematPolicy`, the backward pass's memory/compute trade): ``"none"`` — no `jax.checkpoint`, XLA keeps
what it needs; ``"projections"`` — the dense projections' outputs are kept and the elementwise work between them
(RMSNorm, RoPE, softmax, SwiGLU) is recomputed, so no projection runs twice and a layer keeps 2 MLP-width activations
instead of 6; with cuDNN's fused attention its forward's output and softmax statistics are kept too, so the flash
forward runs once (on an H200 4 x 48 extra calls, ~4% of the Qwen2.5-0.5B step, for ~6% more train-step temporaries);
``"projections+norms"`` — the same plus the two RMSNorm outputs of each layer (``[B, T, D]`` each, in the compute
dtype), so the backward recomputes no norm (2·D more kept per token and layer, no float32 norm pass
re-read); ``"full"`` — only the residual stream between layers is kept, the whole layer is recomputed.

**Matmul backward** (`MatmulBackward`): ``"explicit"`` uses `matmul`'s hand-written VJP (the same math as XLA's
transpose rule; on XLA:CPU it makes the weight gradient transpose the matmul input instead of the elementwise
producer of the cotangent, see docs/perf-log.md); ``"xla"`` uses XLA's own; ``"auto"`` = explicit on CPU only. The
two give the same values up to float rounding.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxgrpo.models.config import ModelConfig
from jaxgrpo.models.params import Params

RematPolicy = Literal["none", "projections", "full", "projections+norms"]
MatmulBackward = Literal["auto", "explicit", "xla"]
# the loop over the layers: "scan" = one compiled layer body (`jax.lax.scan`), the saved activations stacked over the
# layers; "unrolled" = each layer its own code (the scan fully unrolled): no stacked buffers to initialise, update and
# slice, at a compile time that grows with the depth (`jaxgrpo.learner.perf.resolve_perf` picks it on GPUs)
LayerLoop = Literal["scan", "unrolled"]
REMAT_POLICIES: tuple[str, ...] = RematPolicy.__args__
LAYER_LOOPS: tuple[str, ...] = LayerLoop.__args__
MATMUL_BACKWARDS: tuple[str, ...] = MatmulBackward.__args__
_PROJ = "jaxgrpo_projection"  # the name of every dense projection's output, for the "projections" remat policy
_NORM = "jaxgrpo_norm"  # the name of a layer's two RMSNorm outputs, for "projections+norms"


# --------------------------------------------------------------------------------------------------- elementwise
def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """``w * x / sqrt(mean(x^2) + eps)`` over the last axis, in float32, returned in ``x``'s dtype."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * w.astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """RoPE inverse frequencies ``[H/2]`` (float32), with the config's scaling applied (formulas in config.py)."""
    H = config.head_dim
    inv = 1.0 / (config.rope_theta ** (np.arange(0, H, 2, dtype=np.float64) / H))
    rs = config.rope_scaling
    if rs is not None and rs.rope_type == "linear":
        inv = inv / rs.factor
    elif rs is not None and rs.rope_type == "llama3":
        L0 = rs.original_max_position_embeddings
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > L0 / rs.low_freq_factor, inv / rs.factor, inv)
        s = (L0 / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        smoothed = (1 - s) * scaled / rs.factor + s * scaled
        medium = (wavelen >= L0 / rs.high_freq_factor) & (wavelen <= L0 / rs.low_freq_factor)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


def rope_tables(config: ModelConfig, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(cos, sin)`` ``[B, T, H/2]`` float32 of the RoPE angles at these positions."""
    angle_BTh = positions_BT.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(config))
    return jnp.cos(angle_BTh), jnp.sin(angle_BTh)


def apply_rope(x_BTXH: jax.Array, cos_BTh: jax.Array, sin_BTh: jax.Array) -> jax.Array:
    """Rotate-half RoPE on ``[B, T, heads, H]``; math in float32.

    Written as HF's ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = [-x2, x1]`` and the ``[H/2]`` tables
    repeated to ``[H]``: per element the same float32 products and sum as ``[x1 cos - x2 sin, x2 cos + x1 sin]``
    (``a - b`` and ``a + (-b)`` round alike), but the kernel ends in that sum instead of a concatenation of two
    rotated halves, which XLA:GPU would materialise as a copy of the queries and keys."""
    xf = x_BTXH.astype(jnp.float32)
    x1, x2 = jnp.split(xf, 2, axis=-1)
    cos, sin = (jnp.concatenate([t, t], axis=-1)[:, :, None, :] for t in (cos_BTh, sin_BTh))
    return (xf * cos + jnp.concatenate([-x2, x1], axis=-1) * sin).astype(x_BTXH.dtype)


def embed(config: ModelConfig, params: Params, tokens_BT: jax.Array) -> jax.Array:
    """Token embeddings ``[B, T, D]`` in the compute dtype."""
    return jnp.take(params["embed"], tokens_BT, axis=0).astype(jnp.dtype(config.dtype))


def final_norm(config: ModelConfig, params: Params, x: jax.Array) -> jax.Array:
    """The final RMSNorm (what the LM head reads)."""
    return rms_norm(x, params["final_norm"], config.rms_norm_eps)


def check_tokens(tokens: jax.Array) -> None:
    """ValueError unless ``tokens`` is a ``[batch, time]`` integer array."""
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, time] int, got shape {tokens.shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be an integer array, got dtype {tokens.dtype}")


# --------------------------------------------------------------------------------------------------- dense projection
@jax.custom_vjp
def matmul(x_MI: jax.Array, w_IO: jax.Array) -> jax.Array:
    """``x [..., I] @ w [I, O]`` with the hand-written backward ``dx = dy w^T``, ``dw = x^T dy`` (rows flattened).

    Reverse mode only (JAX refuses forward mode through a `jax.custom_vjp`)."""
    return jnp.einsum("...i,io->...o", x_MI, w_IO)


def _matmul_fwd(x_MI, w_IO):
    return matmul(x_MI, w_IO), (x_MI, w_IO)


def _matmul_bwd(res, dy_MO):
    x_MI, w_IO = res
    dx_MI = jnp.einsum("...o,io->...i", dy_MO, w_IO).astype(x_MI.dtype)
    x_NI = x_MI.reshape(-1, x_MI.shape[-1])
    dw_IO = jnp.einsum("ni,no->io", x_NI, dy_MO.reshape(-1, dy_MO.shape[-1])).astype(w_IO.dtype)
    return dx_MI, dw_IO


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _einsum_matmul(x_MI: jax.Array, w_IO: jax.Array) -> jax.Array:
    return jnp.einsum("...i,io->...o", x_MI, w_IO)


def explicit_backward(mode: MatmulBackward) -> bool:
    """Whether `dense` uses `matmul`'s hand-written backward: ``"auto"`` = on the CPU backend only."""
    if mode not in MATMUL_BACKWARDS:
        raise ValueError(f"matmul_backward={mode!r}; choose one of {MATMUL_BACKWARDS}")
    return jax.default_backend() == "cpu" if mode == "auto" else mode == "explicit"


def dense(
    x: jax.Array,
    w: jax.Array,
    n_in: int,
    explicit: bool = True,
    adapter: tuple[jax.Array, jax.Array, float] | None = None,
) -> jax.Array:
    """THE dense projection: contract the last ``n_in`` axes of ``x`` with the first ``n_in`` of ``w`` (the weight
    is read in ``x``'s compute dtype; its gradient flows back to the stored dtype through the cast).

    Returns the flattened output ``[..., prod(w.shape[n_in:])]``. ``adapter = (A [*in, r], B [r, *out], s)`` adds
    LoRA's ``s (x A) B`` (`jaxgrpo.models.lora`) — unmerged, so only the rank-r products are differentiated. The
    output is named for the ``"projections"`` remat policy."""
    in_size = math.prod(w.shape[:n_in])
    x_flat = x.reshape(*x.shape[: x.ndim - n_in], in_size)
    w_flat = w.reshape(in_size, -1).astype(x.dtype)  # stored weights (param_dtype) read in the compute dtype
    y = matmul(x_flat, w_flat) if explicit else _einsum_matmul(x_flat, w_flat)
    if adapter is not None:
        a, b, scale = adapter
        xa = _einsum_matmul(x_flat, a.reshape(in_size, -1).astype(x.dtype))
        y = y + (scale * _einsum_matmul(xa, b.reshape(b.shape[0], -1).astype(x.dtype))).astype(x.dtype)
    return checkpoint_name(y, _PROJ)


# --------------------------------------------------------------------------------------------------- the layer
class LayerContext(NamedTuple):
    """What an attention function sees besides q, k, v (see the module docstring)."""

    index: jax.Array  # int32 layer index
    inputs: Any  # this layer's slice of `run_layers`' ``layer_inputs``
    state: Any  # the pytree carried through the scan (e.g. a stacked KV cache)
    earlier: tuple  # the ``out`` of each stream run before this one in this layer


Attention = Callable[[jax.Array, jax.Array, jax.Array, LayerContext], tuple[jax.Array, Any, Any]]


def decoder_layer(
    config: ModelConfig,
    lp: Params,
    x_BTD: jax.Array,
    rope: tuple[jax.Array, jax.Array],
    attend: Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, Any]],
    explicit: bool = True,
) -> tuple[jax.Array, Any]:
    """One decoder layer (formulas in the module docstring) on ``x [B, T, D]`` with layer params ``lp``.

    ``attend(q [B,T,K,R,H], k, v [B,T,K,H]) -> (a [B,T,K,R,H], aux)``. Returns ``(x_out, aux)``."""
    c, eps = config, config.rms_norm_eps
    B, T = x_BTD.shape[:2]
    adapters = lp.get("lora", {})  # absent when LoRA is off or merged into the weights

    def proj(name: str, x: jax.Array, n_in: int) -> jax.Array:
        ab = adapters.get(name)
        adapter = None if ab is None else (ab["a"], ab["b"], c.lora.scale)
        y = dense(x, lp[name], n_in, explicit, adapter)
        return y.reshape(*x.shape[: x.ndim - n_in], *lp[name].shape[n_in:])

    h_BTD = checkpoint_name(rms_norm(x_BTD, lp["attn_norm"], eps), _NORM)
    q_BTNH, k_BTKH, v_BTKH = proj("q", h_BTD, 1), proj("k", h_BTD, 1), proj("v", h_BTD, 1)
    if c.qkv_bias:
        bias = {k: lp[f"{k}_bias"].astype(x_BTD.dtype) for k in "qkv"}
        q_BTNH, k_BTKH, v_BTKH = q_BTNH + bias["q"], k_BTKH + bias["k"], v_BTKH + bias["v"]
    if c.qk_norm:
        q_BTNH, k_BTKH = rms_norm(q_BTNH, lp["q_norm"], eps), rms_norm(k_BTKH, lp["k_norm"], eps)
    q_BTNH, k_BTKH = apply_rope(q_BTNH, *rope), apply_rope(k_BTKH, *rope)
    a_BTKRH, aux = attend(q_BTNH.reshape(B, T, c.num_kv_heads, c.heads_per_kv, c.head_dim), k_BTKH, v_BTKH)
    x_BTD = x_BTD + proj("o", a_BTKRH.reshape(B, T, c.num_heads, c.head_dim), 2)
    h_BTD = checkpoint_name(rms_norm(x_BTD, lp["mlp_norm"], eps), _NORM)
    u_BTF = jax.nn.silu(proj("gate", h_BTD, 1)) * proj("up", h_BTD, 1)
    return x_BTD + proj("down", u_BTF, 1), aux


# --------------------------------------------------------------------------------------------------- the scan
@dataclasses.dataclass(frozen=True)
class Stream:
    """Rows run through every layer: embeddings ``x [B, T, D]``, RoPE ``(cos, sin)``, their attention, and whether
    to return the attention's ``out`` of every layer (``emit``; later streams of the same layer see it either
    way)."""

    x: jax.Array
    rope: tuple[jax.Array, jax.Array]
    attend: Attention
    emit: bool = False


def _with_context(attend: Attention, ctx: LayerContext, q: jax.Array, k: jax.Array, v: jax.Array):
    a, state, out = attend(q, k, v, ctx)
    return a, (state, out)


def _policy(remat: RematPolicy) -> Any:
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat={remat!r}; choose one of {REMAT_POLICIES}")
    if remat == "none":
        return None
    if remat == "full":
        return jax.checkpoint_policies.nothing_saveable
    names = (_PROJ, _NORM) if remat == "projections+norms" else (_PROJ,)
    return jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.save_only_these_names(*names), _save_fused_attention)


# the primitive whose outputs are cuDNN's fused attention forward's: the output and softmax statistics its backward
# reads (`jax.nn.dot_product_attention(implementation="cudnn")`'s forward rule binds it)
_FUSED_ATTENTION_FORWARD = "dot_product_attention_fwd_wrapper"


def _save_fused_attention(prim: Any, *_: Any, **__: Any) -> bool:
    """Keep cuDNN's fused attention forward's outputs, so the backward does not run the flash forward again."""
    return prim.name == _FUSED_ATTENTION_FORWARD


def run_layers(
    config: ModelConfig,
    params: Params,
    streams: Sequence[Stream],
    *,
    state: Any = None,
    layer_inputs: Any = None,
    remat: RematPolicy = "projections",
    matmul_backward: MatmulBackward = "auto",
    constrain_rows: Callable[[jax.Array], jax.Array] | None = None,
    layer_loop: LayerLoop = "scan",
) -> tuple[tuple[jax.Array, ...], Any, tuple[Any, ...]]:
    """THE scan over the stacked layers. Returns ``(x_out per stream [B, T, D] (not final-normed), final state,
    attention outs per stream (stacked over layers; None unless ``emit``))``. ``layer_inputs``: a pytree with
    leading axis L, sliced per layer into ``ctx.inputs``. ``constrain_rows``: applied to every stream's rows
    ``[B, T, D]`` at each layer boundary (the train step's batch sharding: without it GSPMD may replicate activations
    over the FSDP axis to avoid gathering weights). ``layer_loop``: `LayerLoop` (the same values either way)."""
    if layer_loop not in LAYER_LOOPS:
        raise ValueError(f"layer_loop={layer_loop!r}; choose one of {LAYER_LOOPS}")
    explicit = explicit_backward(matmul_backward)

    def body(carry, xs):
        xs_in, state = carry
        lp, index, inputs = xs
        xs_out, outs = [], []
        for s, x in zip(streams, xs_in):
            x = x if constrain_rows is None else constrain_rows(x)
            attend = functools.partial(_with_context, s.attend, LayerContext(index, inputs, state, tuple(outs)))
            x, (state, out) = decoder_layer(config, lp, x, s.rope, attend, explicit)
            xs_out.append(x)
            outs.append(out)
        return (tuple(xs_out), state), tuple(out if s.emit else None for s, out in zip(streams, outs))

    policy = _policy(remat)
    if policy is not None:
        body = jax.checkpoint(body, policy=policy)
    layer_ids = jnp.arange(config.num_layers, dtype=jnp.int32)
    carry = (tuple(s.x for s in streams), state)
    xs = (params["layers"], layer_ids, layer_inputs)
    (xs_out, state), outs = jax.lax.scan(body, carry, xs, unroll=layer_loop == "unrolled")
    return xs_out, state, outs
