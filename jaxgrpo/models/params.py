# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The decoder's parameters: one abstract tree of shapes and logical axes, from which init, shardings and checkpoint
restore targets all derive (shape letters: see `jaxgrpo.models`).

    embed [V,D]; layers: attn_norm [L,D], q [L,D,N,H], k [L,D,K,H], v [L,D,K,H], o [L,N,H,D],
    (qwen2) q_bias [L,N,H], k_bias [L,K,H], v_bias [L,K,H]; (qwen3) q_norm [L,H], k_norm [L,H];
    mlp_norm [L,D], gate [L,D,F], up [L,D,F], down [L,F,D]; final_norm [D]; (untied) lm_head [D,V]

Layers are stacked on axis 0: the forward is one `jax.lax.scan` over them (`jaxgrpo.models.layers.run_layers`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxgrpo.models import lora
from jaxgrpo.models.config import ModelConfig

Params = dict[str, Any]
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")  # the dense projections of a layer, in order


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
    if config.lora is not None:
        layers["lora"] = lora.adapter_axes(config, layers)
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
    if c.lora is not None:
        layers["lora"] = lora.adapter_shapes(c, layers)
    shapes: Params = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
    if not c.tie_word_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def init_params(config: ModelConfig, key: jax.Array) -> Params:
    """Random parameters: weights ~ N(0, 0.02^2) (HF ``initializer_range``), norms 1, biases 0; with
    ``config.lora``, the base in the compute dtype and fresh adapters (`jaxgrpo.models.lora.add_adapters`)."""
    if config.lora is not None:
        base = init_params(config.replace(lora=None, param_dtype=config.dtype), key)
        return lora.add_adapters(config, base, jax.random.fold_in(key, 1))
    shapes = param_shapes(config)
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
        shapes, is_leaf=lambda x: isinstance(x, tuple))[0]]  # fmt: skip
    keys = jax.random.split(key, len(leaves))
    dtype = jnp.dtype(config.param_dtype)
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
    """The output projection ``[D, V]`` (the transposed embedding when tied) in the compute dtype."""
    w = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
    return w.astype(config.dtype)


def compute_params(config: ModelConfig, params: Params) -> Params:
    """The parameters in the compute dtype (``config.dtype``): what the sampler reads, cast once per rollout. A no-op
    when ``param_dtype == dtype``. Memory: 2 bytes per parameter for a bfloat16 copy of float32 masters.

    With LoRA adapters: in float32 compute they are merged into the base weights (``W + s A B``: the sampler then
    runs the plain forward, faster than two extra small matmuls per projection; benchmarks/lora.py); in a lower
    compute dtype they stay unmerged and float32 (rounding ``W + s A B`` to bfloat16 per weight would drop the small
    early updates, the sampler would not see them)."""
    dt = jnp.dtype(config.dtype)
    cast = lambda x: x if x.dtype == dt else x.astype(dt)  # noqa: E731
    if config.lora is not None and lora.has_adapters(params):
        if dt == jnp.float32:
            return jax.tree.map(cast, lora.merge(config, params))
        base, adapters = lora.split(params)
        return lora.join(jax.tree.map(cast, base), adapters)
    return jax.tree.map(cast, params)
