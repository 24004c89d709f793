# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The Llama / Qwen2 / Qwen3 decoder as a pytree of arrays plus pure functions.

Shape letters: B batch, T query length, S key length (cache slots), D hidden, N query heads, K key/value heads,
G = N / K query heads per kv head (GQA), H head dim, F MLP width, V vocab, L layers.

Parameters (layers stacked on axis 0, the forward is a `jax.lax.scan` over them)::

    embed [V,D]; layers: attn_norm [L,D], q [L,D,N,H], k [L,D,K,H], v [L,D,K,H], o [L,N,H,D],
    (qwen2) q_bias [L,N,H], k_bias [L,K,H], v_bias [L,K,H]; (qwen3) q_norm [L,H], k_norm [L,H];
    mlp_norm [L,D], gate [L,D,F], up [L,D,F], down [L,F,D]; final_norm [D]; (untied) lm_head [D,V]

One block (pre-norm; Touvron et al. 2023 "LLaMA", HF ``modeling_llama.py`` / ``modeling_qwen2.py`` /
``modeling_qwen3.py``)::

    h = x + Attn(RMSNorm(x));   out = h + W_down (silu(W_gate RMSNorm(h)) * W_up RMSNorm(h))
    RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)                       (Zhang & Sennrich 2019; computed in float32)
    Attn: q = x W_q (+b_q), k, v likewise; qwen3: q, k <- RMSNorm_head(q), RMSNorm_head(k); q, k <- RoPE(q, k, pos)
          a = softmax(q k^T / sqrt(H) + mask) v   (softmax in float32; kv head k serves query heads k*G..k*G+G-1)
    RoPE (Su et al. 2021, "rotate-half" layout as in HF): inv_freq_i = theta^(-2i/H), i < H/2, optionally scaled
          (see config.py); angle = pos * inv_freq; x' = [x1 cos - x2 sin, x2 cos + x1 sin] for halves x1, x2.

Masks: a query attends to key j iff j is a real token (attention_mask / kv_mask) and j is not in its future. A query
row with no visible key (a padding query in a left-padded row) gets zero attention output instead of NaN.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxgrpo.models.config import ModelConfig

Params = dict[str, Any]
_NEG = -1e30  # finite "minus infinity" for masked scores (exp underflows to exactly 0; no inf - inf = NaN)


class KVCache(NamedTuple):
    """Per-layer keys (after RoPE) and values: k, v ``[L, B, S, K, H]``."""

    k: jax.Array
    v: jax.Array


def _dtype(config: ModelConfig) -> jnp.dtype:
    return jnp.dtype(config.dtype)


# --------------------------------------------------------------------------------------------------- parameters
def param_axes(config: ModelConfig) -> Params:
    """Same tree as the parameters, leaves are tuples of logical axis names (see jaxgrpo.sharding.RULES)."""
    layers = {
        "attn_norm": ("layers", "embed"),
        "q": ("layers", "embed", "heads", "head_dim"),
        "k": ("layers", "embed", "kv_heads", "head_dim"),
        "v": ("layers", "embed", "kv_heads", "head_dim"),
        "o": ("layers", "heads", "head_dim", "embed"),
        "mlp_norm": ("layers", "embed"),
        "gate": ("layers", "embed", "mlp"),
        "up": ("layers", "embed", "mlp"),
        "down": ("layers", "mlp", "embed"),
    }
    if config.qkv_bias:
        layers.update(
            q_bias=("layers", "heads", "head_dim"),
            k_bias=("layers", "kv_heads", "head_dim"),
            v_bias=("layers", "kv_heads", "head_dim"),
        )
    if config.qk_norm:
        layers.update(q_norm=("layers", "head_dim"), k_norm=("layers", "head_dim"))
    axes: Params = {"embed": ("vocab", "embed"), "layers": layers, "final_norm": ("embed",)}
    if not config.tie_word_embeddings:
        axes["lm_head"] = ("embed", "vocab")
    return axes


def param_shapes(config: ModelConfig) -> Params:
    """Same tree as the parameters, leaves are shape tuples."""
    c = config
    L, D, N, K, H, F, V = (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                           c.intermediate_size, c.vocab_size)  # fmt: skip
    layers = {
        "attn_norm": (L, D),
        "q": (L, D, N, H),
        "k": (L, D, K, H),
        "v": (L, D, K, H),
        "o": (L, N, H, D),
        "mlp_norm": (L, D),
        "gate": (L, D, F),
        "up": (L, D, F),
        "down": (L, F, D),
    }
    if c.qkv_bias:
        layers.update(q_bias=(L, N, H), k_bias=(L, K, H), v_bias=(L, K, H))
    if c.qk_norm:
        layers.update(q_norm=(L, H), k_norm=(L, H))
    shapes: Params = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
    if not c.tie_word_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def init_params(config: ModelConfig, key: jax.Array) -> Params:
    """Random parameters: weights ~ N(0, 0.02^2) (HF ``initializer_range``), norms 1, biases 0."""
    shapes = param_shapes(config)
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
        shapes, is_leaf=lambda x: isinstance(x, tuple))[0]]  # fmt: skip
    keys = jax.random.split(key, len(leaves))
    dtype = _dtype(config)
    out = []
    for path, shape, k in zip(paths, leaves, keys):
        if "norm" in path:
            out.append(jnp.ones(shape, dtype))
        elif "bias" in path:
            out.append(jnp.zeros(shape, dtype))
        else:
            out.append((0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dtype))
    return jax.tree.unflatten(treedef, out)


def count_params(config: ModelConfig) -> int:
    """Number of parameters (from `jax.eval_shape(init_params)`, nothing allocated)."""
    abstract = jax.eval_shape(lambda k: init_params(config, k), jax.random.key(0))
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(abstract)))


def lm_head(config: ModelConfig, params: Params) -> jax.Array:
    """The output projection ``[D, V]`` (the transposed embedding when tied)."""
    return params["embed"].T if config.tie_word_embeddings else params["lm_head"]


# --------------------------------------------------------------------------------------------------- building blocks
def _rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
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


def _rope_tables(config: ModelConfig, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    angle_BTh = positions_BT.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(config))
    return jnp.cos(angle_BTh), jnp.sin(angle_BTh)


def _apply_rope(x_BTXH: jax.Array, cos_BTh: jax.Array, sin_BTh: jax.Array) -> jax.Array:
    """Rotate-half RoPE on ``[B, T, heads, H]``; math in float32."""
    xf = x_BTXH.astype(jnp.float32)
    x1, x2 = jnp.split(xf, 2, axis=-1)
    cos, sin = cos_BTh[:, :, None, :], sin_BTh[:, :, None, :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTXH.dtype)


@jax.custom_vjp
def _matmul(x_MI: jax.Array, w_IO: jax.Array) -> jax.Array:
    """``x [..., I] @ w [I, O]`` with a hand-written backward (see `_matmul_bwd`).

    A `jax.custom_vjp`: reverse mode (`jax.grad`, `jax.vjp`) works, forward mode (`jax.jvp`, `jax.jacfwd`) through the
    model does not (JAX refuses it for custom-VJP functions)."""
    return jnp.einsum("...i,io->...o", x_MI, w_IO)


def _matmul_fwd(x_MI: jax.Array, w_IO: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _matmul(x_MI, w_IO), (x_MI, w_IO)


def _matmul_bwd(res: tuple[jax.Array, jax.Array], dy_MO: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``dx = dy w^T``, ``dw = x^T dy`` (rows flattened). The same math as the automatic transpose rule, spelled out
    so that XLA:CPU transposes the matmul *input* for the weight gradient instead of writing the elementwise
    producer of ``dy`` (SwiGLU's backward, RMSNorm's, ...) in a transposed layout, which it does ~3x slower
    (measured: a SwiGLU MLP's backward 0.62 s -> 0.40 s, BENCHMARKS.md)."""
    x_MI, w_IO = res
    dx_MI = jnp.einsum("...o,io->...i", dy_MO, w_IO).astype(x_MI.dtype)
    x_NI = x_MI.reshape(-1, x_MI.shape[-1])
    dw_IO = jnp.einsum("ni,no->io", x_NI, dy_MO.reshape(-1, dy_MO.shape[-1])).astype(w_IO.dtype)
    return dx_MI, dw_IO


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


@jax.custom_vjp
def _matmul_given(x_MI: jax.Array, w_IO: jax.Array, y_MO: jax.Array) -> jax.Array:
    """`_matmul` whose forward value ``y = x @ w`` is already known (``y_MO``, e.g. recorded by the sampler with the
    same parameters): returns ``y_MO`` without the product; the backward is `_matmul`'s (``dx = dy w^T``,
    ``dw = x^T dy``; no gradient to ``y_MO``)."""
    return y_MO


def _matmul_given_fwd(x_MI, w_IO, y_MO):
    return y_MO, (x_MI, w_IO)


def _matmul_given_bwd(res, dy_MO):
    return (*_matmul_bwd(res, dy_MO), jnp.zeros_like(dy_MO))


_matmul_given.defvjp(_matmul_given_fwd, _matmul_given_bwd)


PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")  # `_proj`'s names, in a layer's order


def projection_widths(config: ModelConfig) -> dict[str, int]:
    """Each dense projection's flattened output width, by `PROJECTIONS` name."""
    D, F, H = config.hidden_size, config.intermediate_size, config.head_dim
    return dict(zip(PROJECTIONS, (config.num_heads * H, config.num_kv_heads * H, config.num_kv_heads * H, D, F, F, D)))


def _check_projection_arrays(
    config: ModelConfig, arrays: dict[str, jax.Array], rows: int, slots: int | None, what: str, hint: str = ""
) -> None:
    """ValueError unless ``arrays`` holds every `PROJECTIONS` name, each ``[L, rows, slots, width]`` (``slots=None``:
    any). ``what`` names the argument in the message, ``hint`` says how to make a right one."""
    widths = projection_widths(config)
    if set(arrays) != set(widths):
        raise ValueError(f"{what} has projections {sorted(arrays)}, expected {sorted(widths)}{hint}")
    for name, x in arrays.items():
        n = x.shape[2] if slots is None and x.ndim == 4 else slots
        if x.shape != (config.num_layers, rows, n, widths[name]):
            want = (config.num_layers, rows, "any" if slots is None else n, widths[name])
            raise ValueError(f"{what}[{name!r}] has shape {x.shape}, expected [L, rows, slots, out] = {want}{hint}")


_PROJ = "jaxgrpo_projection"  # name of every dense projection's output, for `layer_checkpoint`'s policy


def layer_checkpoint(block: Any, remat: bool) -> Any:
    """A decoder layer's scan body wrapped for the backward pass.

    ``remat=False``: the outputs of the dense projections (q, k, v, o, gate, up, down) are saved; everything between
    them (RMSNorm, RoPE, the attention scores, softmax and value product, SwiGLU) is recomputed from them in the
    backward. A layer then keeps 2 activations of MLP width (gate and up) instead of the 6 that XLA keeps when every
    intermediate is saved, and no dense projection runs twice. Measured on the vs-TRL train step: XLA temp memory
    8.2 -> 3.4 GB and the step ~5% faster (BENCHMARKS.md). ``remat=True``: nothing is saved, the whole layer is
    recomputed (only the residual stream between layers is kept).
    """
    policy = (jax.checkpoint_policies.nothing_saveable if remat
              else jax.checkpoint_policies.save_only_these_names(_PROJ))  # fmt: skip
    return jax.checkpoint(block, policy=policy)


def _proj(x_BTI: jax.Array, w: jax.Array, n_in: int, io: dict | None = None, name: str = "") -> jax.Array:
    """Contract the last ``n_in`` axes of ``x`` with the first ``n_in`` axes of ``w`` (a dense projection).

    ``io`` (optional): ``io["given"][name]`` (if present), the known output ``[..., prod(out)]``, replaces the
    product (`_matmul_given`); ``io["record"]`` (if present) receives the output as ``io["record"][name]``."""
    in_shape, out_shape = w.shape[:n_in], w.shape[n_in:]
    x_flat = x_BTI.reshape(*x_BTI.shape[: x_BTI.ndim - n_in], math.prod(in_shape))
    w_flat = w.reshape(math.prod(in_shape), math.prod(out_shape))
    given = None if io is None else io.get("given", {}).get(name)
    y = _matmul(x_flat, w_flat) if given is None else _matmul_given(x_flat, w_flat, given.astype(x_flat.dtype))
    if io is not None and "record" in io:
        io["record"][name] = y
    y = checkpoint_name(y, _PROJ)
    return y.reshape(*y.shape[:-1], *out_shape)


def _qkv(config: ModelConfig, lp: Params, x_BTD: jax.Array, cos: jax.Array, sin: jax.Array, io: dict | None = None):
    """Normed input -> q ``[B,T,K,G,H]``, k and v ``[B,T,K,H]`` (RoPE applied to q and k). ``io``: see `_proj`
    (names "q", "k", "v")."""
    q_BTNH = _proj(x_BTD, lp["q"], 1, io, "q")
    k_BTKH = _proj(x_BTD, lp["k"], 1, io, "k")
    v_BTKH = _proj(x_BTD, lp["v"], 1, io, "v")
    if config.qkv_bias:
        q_BTNH, k_BTKH, v_BTKH = q_BTNH + lp["q_bias"], k_BTKH + lp["k_bias"], v_BTKH + lp["v_bias"]
    if config.qk_norm:
        q_BTNH = _rms_norm(q_BTNH, lp["q_norm"], config.rms_norm_eps)
        k_BTKH = _rms_norm(k_BTKH, lp["k_norm"], config.rms_norm_eps)
    q_BTNH = _apply_rope(q_BTNH, cos, sin)
    k_BTKH = _apply_rope(k_BTKH, cos, sin)
    B, T = x_BTD.shape[:2]
    q_BTKGH = q_BTNH.reshape(B, T, config.num_kv_heads, config.num_groups, config.head_dim)
    return q_BTKGH, k_BTKH, v_BTKH


def _attend(q_BTKGH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, mask_BTS: jax.Array) -> jax.Array:
    """Masked softmax attention -> ``[B, T, K, G, H]`` (scores and softmax in float32)."""
    scale = q_BTKGH.shape[-1] ** -0.5
    s_BKGTS = jnp.einsum("btkgh,bskh->bkgts", q_BTKGH, k_BSKH, preferred_element_type=jnp.float32) * scale
    m_B11TS = mask_BTS[:, None, None, :, :]
    s_BKGTS = jnp.where(m_B11TS, s_BKGTS, _NEG)
    p_BKGTS = jax.nn.softmax(s_BKGTS, axis=-1)
    p_BKGTS = jnp.where(jnp.any(m_B11TS, axis=-1, keepdims=True), p_BKGTS, 0.0)  # fully masked row -> 0, not NaN
    return jnp.einsum("bkgts,bskh->btkgh", p_BKGTS.astype(v_BSKH.dtype), v_BSKH)


def _kv_major(k_BSKH: jax.Array, v_BSKH: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Keys ``[B, S, K, H]`` -> ``[B, K, S, H]`` and values ``[B, S, K, H]`` -> ``[B, K, H, S]``: the layout
    `_attend_shared_prefix` reads (and the decode caches are stored in)."""
    return k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 3, 1)


def _attend_shared_prefix(
    q_NTKGH: jax.Array,
    kp_PKSH: jax.Array,
    vp_PKHS: jax.Array,
    prefix_mask_PS: jax.Array,
    kd_NKMH: jax.Array,
    vd_NKHM: jax.Array,
    mask_NTM: jax.Array,
) -> jax.Array:
    """Softmax attention of ``q [N, t, K, G, H]`` (``N = P * R`` prompt-major rows) over the keys of its prompt
    ``n // R`` (keys ``[P, K, Tp, H]``, values ``[P, K, H, Tp]``, shared by the prompt's R rows, masked by
    ``prefix_mask [P, Tp]``) and its own keys and values (``[N, K, M, H]``, ``[N, K, H, M]``, masked by
    ``mask_NTM [N, t, M]``), one softmax over both -> ``[N, t, K, G, H]``. Equals `_attend` over the concatenated
    keys ``[prefix_p ; own_n]`` without repeating the prefix R times: the prefix scores of a prompt's rows are one
    ``[R * t * G, H] x [H, Tp]`` product per (prompt, kv head). Keys and values come kv-head-major with the key axis
    of the values minor: every product then contracts the minor axis of both operands, the form XLA:CPU's matmul
    reads in place, so caches stored this way (the decode caches) are never transposed. Scores and softmax in
    float32; a query with no visible key gets 0 (as `_attend`)."""
    N, T, K, G, H = q_NTKGH.shape
    P, Tp = prefix_mask_PS.shape
    R = N // P
    M = kd_NKMH.shape[2]
    scale = H**-0.5
    # Every score tensor stays in one layout [P, K, R, T, G, keys]: the prefix scores are one product per (prompt,
    # kv head), the own-key scores one per (prompt, kv head, row), and no score tensor is transposed.
    q_PRTKGH = q_NTKGH.reshape(P, R, T, K, G, H)
    sp = jnp.einsum("prtkgh,pksh->pkrtgs", q_PRTKGH, kp_PKSH, preferred_element_type=jnp.float32) * scale
    kd_PRKMH = kd_NKMH.reshape(P, R, K, M, H)
    sd = jnp.einsum("prtkgh,prkmh->pkrtgm", q_PRTKGH, kd_PRKMH, preferred_element_type=jnp.float32) * scale
    mp = prefix_mask_PS.astype(bool)[:, None, None, None, None, :]  # [P, 1, 1, 1, 1, Tp]
    md = mask_NTM.astype(bool).reshape(P, R, T, M)[:, None, :, :, None, :]  # [P, 1, R, T, 1, M]
    sp, sd = jnp.where(mp, sp, _NEG), jnp.where(md, sd, _NEG)
    # One softmax over both key sets, computed part by part (no concatenated score tensor, no slices of it):
    # exp(s - m) / sum over both parts, with m the joint max (held constant, as jax.nn.softmax does).
    m = jax.lax.stop_gradient(jnp.maximum(jnp.max(sp, axis=-1, keepdims=True), jnp.max(sd, axis=-1, keepdims=True)))
    ep, ed = jnp.exp(sp - m), jnp.exp(sd - m)
    visible = jnp.any(mp, axis=-1, keepdims=True) | jnp.any(md, axis=-1, keepdims=True)
    inv = jnp.where(visible, 1.0 / (jnp.sum(ep, axis=-1, keepdims=True) + jnp.sum(ed, axis=-1, keepdims=True)), 0.0)
    out = jnp.einsum("pkrtgs,pkhs->prtkgh", (ep * inv).astype(vp_PKHS.dtype), vp_PKHS)
    out = out + jnp.einsum("pkrtgm,prkhm->prtkgh", (ed * inv).astype(vd_NKHM.dtype), vd_NKHM.reshape(P, R, K, H, M))
    return out.reshape(N, T, K, G, H)


def _finish_block(
    config: ModelConfig, lp: Params, x_BTD: jax.Array, a_BTKGH: jax.Array, io: dict | None = None
) -> jax.Array:
    """Residual after attention (output projection), then the SwiGLU MLP block. ``io``: see `_proj` (names "o",
    "gate", "up", "down")."""
    B, T = x_BTD.shape[:2]
    a_BTNH = a_BTKGH.reshape(B, T, config.num_heads, config.head_dim)
    x_BTD = x_BTD + _proj(a_BTNH, lp["o"], 2, io, "o")
    h_BTD = _rms_norm(x_BTD, lp["mlp_norm"], config.rms_norm_eps)
    g_BTF = _proj(h_BTD, lp["gate"], 1, io, "gate")
    u_BTF = _proj(h_BTD, lp["up"], 1, io, "up")
    return x_BTD + _proj(jax.nn.silu(g_BTF) * u_BTF, lp["down"], 1, io, "down")


def _take_rows(x_SX: jax.Array, idx_SY: jax.Array) -> jax.Array:
    """``out[s, y] = x[s, idx[s, y]]`` for ``x [S, X, ...]`` and ``idx [S, Y]`` (a gather within each row)."""
    S, X = x_SX.shape[:2]
    flat = x_SX.reshape(S, X, -1)
    return jnp.take_along_axis(flat, idx_SY[..., None], axis=1).reshape(S, idx_SY.shape[1], *x_SX.shape[2:])


def _embed(config: ModelConfig, params: Params, tokens_BT: jax.Array) -> jax.Array:
    return jnp.take(params["embed"], tokens_BT, axis=0).astype(_dtype(config))


def _check_tokens(tokens: jax.Array) -> None:
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, time] int, got shape {tokens.shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be an integer array, got dtype {tokens.dtype}")


# --------------------------------------------------------------------------------------------------- full sequences
def hidden_states(
    config: ModelConfig,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    *,
    remat: bool = False,
) -> jax.Array:
    """Final-normed hidden states ``[B, T, D]`` (compute dtype) for a (possibly padded) batch.

    attention_mask ``[B, T]``: 1/True = real token (left or right padding both work). positions default to
    ``cumsum(mask) - 1`` clipped at 0 (so each row's first real token is at position 0). ``remat=True``: the
    backward pass recomputes each layer (only the ``[B, T, D]`` residual stream per layer is kept), trading ~1/3
    more compute for activation memory in training; ``False`` keeps the projections' outputs (`layer_checkpoint`).
    """
    _check_tokens(tokens)
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
    cos, sin = _rope_tables(config, positions)
    causal_TS = jnp.tril(jnp.ones((T, T), bool))
    mask_BTS = causal_TS[None] & mask_BT[:, None, :]

    def block(x_BTD, lp):
        h_BTD = _rms_norm(x_BTD, lp["attn_norm"], config.rms_norm_eps)
        q, k, v = _qkv(config, lp, h_BTD, cos, sin)
        return _finish_block(config, lp, x_BTD, _attend(q, k, v, mask_BTS)), None

    x_BTD, _ = jax.lax.scan(layer_checkpoint(block, remat), _embed(config, params, tokens), params["layers"])
    return _rms_norm(x_BTD, params["final_norm"], config.rms_norm_eps)


def forward(
    config: ModelConfig,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    *,
    remat: bool = False,
) -> jax.Array:
    """Logits ``[B, T, V]`` float32 (see `hidden_states` for the arguments)."""
    h_BTD = hidden_states(config, params, tokens, positions, attention_mask, remat=remat)
    return jnp.einsum("btd,dv->btv", h_BTD, lm_head(config, params), preferred_element_type=jnp.float32)


# --------------------------------------------------------------------------------------------------- KV cache
def init_cache(config: ModelConfig, batch: int, max_len: int, dtype: Any = None) -> KVCache:
    """Zeroed cache with ``max_len`` slots: k, v ``[L, B, S, K, H]`` (dtype defaults to the model dtype)."""
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    dt = _dtype(config) if dtype is None else jnp.dtype(dtype)
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
    _check_tokens(tokens)
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
    cos, sin = _rope_tables(config, positions)
    slot_T = start + jnp.arange(t, dtype=jnp.int32)
    mask_BTS = (jnp.arange(S, dtype=jnp.int32)[None, :] <= slot_T[:, None])[None] & kv_mask.astype(bool)[:, None, :]
    zero = jnp.zeros((), jnp.int32)

    def block(carry, xs):
        x_BTD, k_LBSKH, v_LBSKH = carry
        lp, i = xs
        h_BTD = _rms_norm(x_BTD, lp["attn_norm"], config.rms_norm_eps)
        q, k_BTKH, v_BTKH = _qkv(config, lp, h_BTD, cos, sin)
        idx = (i, zero, start, zero, zero)
        k_LBSKH = jax.lax.dynamic_update_slice(k_LBSKH, k_BTKH[None].astype(k_LBSKH.dtype), idx)
        v_LBSKH = jax.lax.dynamic_update_slice(v_LBSKH, v_BTKH[None].astype(v_LBSKH.dtype), idx)
        k_BSKH = jax.lax.dynamic_index_in_dim(k_LBSKH, i, 0, keepdims=False).astype(q.dtype)
        v_BSKH = jax.lax.dynamic_index_in_dim(v_LBSKH, i, 0, keepdims=False).astype(q.dtype)
        x_BTD = _finish_block(config, lp, x_BTD, _attend(q, k_BSKH, v_BSKH, mask_BTS))
        return (x_BTD, k_LBSKH, v_LBSKH), None

    layer_ids = jnp.arange(config.num_layers, dtype=jnp.int32)
    carry = (_embed(config, params, tokens), cache.k, cache.v)
    (x_BTD, k, v), _ = jax.lax.scan(block, carry, (params["layers"], layer_ids))
    return _rms_norm(x_BTD, params["final_norm"], config.rms_norm_eps), KVCache(k=k, v=v)
