# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Where each parameter lives in a checkpoint, and how it is assembled: the layout shared by the HF loader/saver
(`jaxgrpo.models.convert`), the GGUF reader (`gguf_import`) and the GGUF writer (`gguf_export`).

`tensor_plan` names every parameter of a config in both formats (HF ``model.layers.{i}.*``, GGUF ``blk.{i}.*``);
`to_ours` / `to_hf` convert one tensor between torch's ``[out, in]`` and our ``[in, *out]`` layouts; `assemble` builds
the params tree from any per-tensor reader, placing each stacked parameter on its sharding as soon as it is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import Mesh

from jaxgrpo.models.config import ModelConfig
from jaxgrpo.models.params import param_shapes

Params = dict[str, Any]

NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}

# our layer param -> (HF name inside "model.layers.{i}.", GGUF name inside "blk.{i}.", kind)
# kind "in": matrix whose first axis (ours) is the HF input dim; "out": matrix whose last axis is the HF output dim;
# "vec": a vector possibly split into [heads, head_dim]; "same": identical layout (the embedding).
LAYER_NAMES = {
    "attn_norm": ("input_layernorm.weight", "attn_norm.weight", "vec"),
    "q": ("self_attn.q_proj.weight", "attn_q.weight", "in"),
    "k": ("self_attn.k_proj.weight", "attn_k.weight", "in"),
    "v": ("self_attn.v_proj.weight", "attn_v.weight", "in"),
    "o": ("self_attn.o_proj.weight", "attn_output.weight", "out"),
    "q_bias": ("self_attn.q_proj.bias", "attn_q.bias", "vec"),
    "k_bias": ("self_attn.k_proj.bias", "attn_k.bias", "vec"),
    "v_bias": ("self_attn.v_proj.bias", "attn_v.bias", "vec"),
    "q_norm": ("self_attn.q_norm.weight", "attn_q_norm.weight", "vec"),
    "k_norm": ("self_attn.k_norm.weight", "attn_k_norm.weight", "vec"),
    "mlp_norm": ("post_attention_layernorm.weight", "ffn_norm.weight", "vec"),
    "gate": ("mlp.gate_proj.weight", "ffn_gate.weight", "in"),
    "up": ("mlp.up_proj.weight", "ffn_up.weight", "in"),
    "down": ("mlp.down_proj.weight", "ffn_down.weight", "out"),
}


class CheckpointError(ValueError):
    """A checkpoint that is missing, partial, or does not match its config (the message says what and where)."""


def to_ours(w: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """HF/torch-layout tensor -> our layout (one layer, or a non-layer tensor)."""
    return w.T.reshape(shape) if kind in ("in", "out") else w.reshape(shape)


def to_hf(x: np.ndarray, kind: str) -> np.ndarray:
    """Our layout (one layer) -> HF/torch layout."""
    if kind == "in":
        return np.ascontiguousarray(x.reshape(x.shape[0], -1).T)
    if kind == "out":
        return np.ascontiguousarray(x.reshape(-1, x.shape[-1]).T)
    if kind == "same":
        return np.ascontiguousarray(x)
    return np.ascontiguousarray(x.reshape(-1))


def hf_shape(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
    if kind == "in":
        return (math.prod(shape[1:]), shape[0])
    if kind == "out":
        return (shape[-1], math.prod(shape[:-1]))
    if kind == "same":
        return tuple(shape)
    return (math.prod(shape),)


def tensor_plan(config: ModelConfig) -> Iterator[tuple[tuple[str, ...], tuple[int, ...], list[tuple[str, str]], str]]:
    """(our path, our full shape, [(hf name, gguf name) per slice], kind) for every parameter."""
    shapes = param_shapes(config)
    yield ("embed",), shapes["embed"], [("model.embed_tokens.weight", "token_embd.weight")], "same"
    for key, shape in shapes["layers"].items():
        hf, gg, kind = LAYER_NAMES[key]
        names = [(f"model.layers.{i}.{hf}", f"blk.{i}.{gg}") for i in range(config.num_layers)]
        yield ("layers", key), shape, names, kind
    yield ("final_norm",), shapes["final_norm"], [("model.norm.weight", "output_norm.weight")], "vec"
    if not config.tie_word_embeddings:
        yield ("lm_head",), shapes["lm_head"], [("lm_head.weight", "output.weight")], "in"


def set_path(tree: Params, path: tuple[str, ...], value: Any) -> None:
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


def get_path(tree: Params, path: tuple[str, ...]) -> Any:
    for p in path:
        tree = tree[p]
    return tree


def place(host: np.ndarray, sharding: jax.sharding.Sharding | None) -> jax.Array:
    if sharding is None:
        return jnp.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def resolve_shardings(config: ModelConfig, shardings: Any) -> Any:
    if shardings is None:
        return None
    if isinstance(shardings, Mesh):
        from jaxgrpo.sharding import param_shardings

        return param_shardings(config, shardings)
    return shardings


def assemble(
    config: ModelConfig,
    read: Callable[[str, str, tuple[int, ...]], np.ndarray],
    shardings: Any,
) -> Params:
    """Build params by calling ``read(hf_name, gguf_name, expected_hf_shape) -> torch-layout array`` per tensor."""
    np_dtype = NP_DTYPES[config.param_dtype]
    shardings = resolve_shardings(config, shardings)
    params: Params = {}
    for path, shape, names, kind in tensor_plan(config):
        stacked = len(names) > 1 or path[0] == "layers"
        slice_shape = shape[1:] if stacked else shape
        host = np.empty(shape, np_dtype)
        for i, (hf_name, gguf_name) in enumerate(names):
            w = read(hf_name, gguf_name, hf_shape(slice_shape, kind))
            w = to_ours(w, kind, slice_shape).astype(np_dtype)
            if stacked:
                host[i] = w
            else:
                host[...] = w
        set_path(params, path, place(host, None if shardings is None else get_path(shardings, path)))
        del host
    return params


def check_unexpected(config: ModelConfig, present: set[str], which: int, allowed: tuple[str, ...], where: str) -> None:
    """Fail before streaming anything if the checkpoint has tensors this config would silently ignore."""
    expected = {names[which] for _, _, plan, _ in tensor_plan(config) for names in plan}
    extra = sorted(n for n in present - expected if not n.endswith(allowed))
    if extra:
        raise CheckpointError(
            f"{where} has {len(extra)} tensors that a {config.architecture} model with qkv_bias={config.qkv_bias}, "
            f"qk_norm={config.qk_norm}, {config.num_layers} layers does not use (unsupported variant?): {extra[:8]}"
        )


def check_shape(name: str, found: tuple[int, ...], expected: tuple[int, ...], where: str) -> None:
    if tuple(found) != tuple(expected):
        raise CheckpointError(
            f"tensor {name!r} in {where} has shape {tuple(found)}, but the config expects {tuple(expected)} "
            f"(is config.json from the same model as the weights?)"
        )
