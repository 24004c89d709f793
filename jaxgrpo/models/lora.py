# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Low-rank adapters (LoRA; Hu et al. 2021, arXiv:2106.09685) on the frozen base of the decoder.

A targeted projection ``y = x W`` (``W [in, out]``, flattened as `layers.dense` reads it) becomes

    y = x W + s · (x A) B,        A [in, r] ~ U(-1/sqrt(in), 1/sqrt(in)),  B [r, out] = 0,  s = alpha / r

(PEFT's ``LoraConfig`` defaults: Kaiming-uniform ``A`` with ``a = sqrt(5)``, zero ``B``, ``scaling = lora_alpha / r``;
so an untrained adapter leaves the base's outputs exactly unchanged). The adapters live in the parameter tree at
``params["layers"]["lora"][name] = {"a": [L, *in_axes, r], "b": [L, r, *out_axes]}`` (the base weight's own input and
output axes, so they shard like it; `jaxgrpo.models.params`), are sliced per layer by the one scan and added by the one
projection function (`jaxgrpo.models.layers.dense`). They are always float32; the base is frozen in the compute dtype
(no gradient, no optimizer state).

* `split` / `join`: the tree as (base, adapters) — the train step differentiates and updates the adapters only;
  the base with its adapters removed is the KL reference policy (no second copy of the weights).
* `merge` / `merged`: ``W + s A B`` folded into the base weights (float32 sums, cast back to the base's dtype): the HF
  and GGUF exports, and the sampler's weights when the compute dtype is float32 (`models.compute_params`).
* `to_peft` / `save_peft`: a PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) that
  ``peft.PeftModel.from_pretrained`` loads onto the transformers base model.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.files import user_mode
from jaxgrpo.host import to_host
from jaxgrpo.models.config import ModelConfig

Params = dict[str, Any]

# (number of leading input axes of the base weight after L, PEFT module name inside "model.layers.{i}.")
_MODULES = {
    "q": (1, "self_attn.q_proj"),
    "k": (1, "self_attn.k_proj"),
    "v": (1, "self_attn.v_proj"),
    "o": (2, "self_attn.o_proj"),
    "gate": (1, "mlp.gate_proj"),
    "up": (1, "mlp.up_proj"),
    "down": (1, "mlp.down_proj"),
}


def n_in(name: str) -> int:
    """How many leading axes (after the layer axis) of projection `name`'s weight are its input."""
    return _MODULES[name][0]


def adapter_shapes(config: ModelConfig, base_shapes: Params) -> Params:
    """``{name: {"a": (L, *in, r), "b": (L, r, *out)}}`` for the targeted projections (from the base's shapes)."""
    r = config.lora.rank
    out: Params = {}
    for name in config.lora.targets:
        shape, k = base_shapes[name], n_in(name)
        out[name] = {"a": (shape[0], *shape[1 : 1 + k], r), "b": (shape[0], r, *shape[1 + k :])}
    return out


def adapter_axes(config: ModelConfig, base_axes: Params) -> Params:
    """Logical axes of the adapters: the base weight's input (``a``) and output (``b``) axes around ``lora_rank``."""
    out: Params = {}
    for name in config.lora.targets:
        axes, k = base_axes[name], n_in(name)
        out[name] = {"a": (axes[0], *axes[1 : 1 + k], "lora_rank"), "b": (axes[0], "lora_rank", *axes[1 + k :])}
    return out


def init_adapters(config: ModelConfig, base_shapes: Params, key: jax.Array) -> Params:
    """Fresh float32 adapters: ``A ~ U(-1/sqrt(in), 1/sqrt(in))`` (PEFT's Kaiming-uniform, ``a = sqrt(5)``),
    ``B = 0``."""
    shapes = adapter_shapes(config, base_shapes)
    keys = jax.random.split(key, len(shapes))
    out: Params = {}
    for k, (name, s) in zip(keys, shapes.items()):
        fan_in = math.prod(s["a"][1:-1])
        bound = 1.0 / math.sqrt(fan_in)
        a = jax.random.uniform(k, s["a"], jnp.float32, -bound, bound)
        out[name] = {"a": a, "b": jnp.zeros(s["b"], jnp.float32)}
    return out


def add_adapters(config: ModelConfig, base: Params, key: jax.Array) -> Params:
    """The base (cast to the compute dtype: it is frozen) with fresh adapters: the trainable policy of a LoRA run."""
    dt = jnp.dtype(config.dtype)
    base = jax.tree.map(lambda x: x if x.dtype == dt else x.astype(dt), base)
    shapes = jax.tree.map(lambda x: tuple(x.shape), base["layers"])
    return join(base, init_adapters(config, shapes, key))


ADAPTERS_PATH = ("layers", "lora")  # where `split`'s adapters sit in the whole params tree


def split(params: Params) -> tuple[Params, Params]:
    """``(base, adapters)``: the tree without ``layers.lora``, and ``layers.lora`` itself."""
    layers = dict(params["layers"])
    adapters = layers.pop("lora")
    return {**params, "layers": layers}, adapters


def join(base: Params, adapters: Params) -> Params:
    """The tree with ``adapters`` at ``layers.lora`` (inverse of `split`)."""
    return {**base, "layers": {**base["layers"], "lora": adapters}}


def has_adapters(params: Params) -> bool:
    return isinstance(params, dict) and isinstance(params.get("layers"), dict) and "lora" in params["layers"]


def delta(a: jax.Array, b: jax.Array, scale: float, k: int) -> jax.Array:
    """``s · A B`` in float32, shaped like the base weight (``a [.., *in, r]``, ``b [.., r, *out]``; ``k`` input axes
    after the leading ones; works stacked over layers or for one layer)."""
    lead = a.ndim - k - 1
    a2 = a.reshape(*a.shape[:lead], -1, a.shape[-1]).astype(jnp.float32)
    b2 = b.reshape(*b.shape[: lead + 1], -1).astype(jnp.float32)
    w = scale * jnp.einsum("...ir,...ro->...io", a2, b2)
    return w.reshape(*a.shape[:-1], *b.shape[lead + 1 :])


def merged(config: ModelConfig, params: Params, dtype: Any = None) -> tuple[ModelConfig, Params]:
    """``(config, params)`` of the plain model a LoRA tree stands for (adapters folded in by `merge`, ``lora=None``):
    what the HF and GGUF exports write. A tree without adapters is returned as it is."""
    if not has_adapters(params):
        return config, params
    return config.replace(lora=None), merge(config, params, dtype)


def merge(config: ModelConfig, params: Params, dtype: Any = None) -> Params:
    """The base with every adapter folded in (``W + s A B``, summed in float32, cast to ``dtype``, default the base's:
    a bfloat16 base rounds the sum per weight, which drops the smallest updates); the tree a config with ``lora=None``
    describes."""
    base, adapters = split(params)
    layers = dict(base["layers"])
    for name, ab in adapters.items():
        w = layers[name]
        layers[name] = (w.astype(jnp.float32) + delta(ab["a"], ab["b"], config.lora.scale, n_in(name))).astype(
            w.dtype if dtype is None else dtype)  # fmt: skip
    return {**base, "layers": layers}


def peft_config(config: ModelConfig, base_name_or_path: str, revision: str | None = None) -> dict[str, Any]:
    """The ``adapter_config.json`` of PEFT's LoRA for these adapters (no dropout, plain ``alpha / r`` scaling); the
    base's Hub ``revision`` where the run pinned one (PEFT loads the base at it)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name_or_path,
        "revision": revision,
        "r": config.lora.rank,
        "lora_alpha": config.lora.alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(_MODULES[t][1].rsplit(".", 1)[1] for t in config.lora.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "inference_mode": True,
    }


def to_peft(config: ModelConfig, adapters: Params) -> dict[str, np.ndarray]:
    """PEFT's tensors: ``base_model.model.model.layers.{i}.<module>.lora_A.weight [r, in]`` and ``lora_B.weight
    [out, r]`` (torch ``Linear`` layout: ``y = x A^T B^T``), float32."""
    out: dict[str, np.ndarray] = {}
    for name, ab in adapters.items():
        a = np.asarray(jax.device_get(ab["a"]), np.float32)
        b = np.asarray(jax.device_get(ab["b"]), np.float32)
        module = _MODULES[name][1]
        for i in range(config.num_layers):
            prefix = f"base_model.model.model.layers.{i}.{module}"
            out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a[i].reshape(-1, a.shape[-1]).T)
            out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b[i].reshape(b.shape[1], -1).T)
    return out


def save_peft(config: ModelConfig, adapters: Params, directory: str | pathlib.Path, base_name_or_path: str,
              revision: str | None = None) -> None:
    """Write a PEFT adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``) for these adapters.
    Gathers sharded adapters; on multi-host meshes every process must call this, and process 0 writes."""
    from safetensors.numpy import save_file

    tensors = to_peft(config, jax.tree.map(to_host, adapters))
    if jax.process_index() != 0:
        return
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    user_mode(directory / "adapter_model.safetensors")  # safetensors writes 0600
    config_json = peft_config(config, base_name_or_path, revision)
    (directory / "adapter_config.json").write_text(json.dumps(config_json, indent=2))


def base_fingerprint(params: Params) -> list[float] | None:
    """An identity of a LoRA tree's frozen base for checkpoints (None for a tree without adapters): per base leaf
    (tree order), the float32 sum of ``|x|`` and of ``x · i`` (``i`` the flat index modulo 1009, so permuted or shifted
    weights differ). Computed on device."""
    if not has_adapters(params):
        return None
    base = split(params)[0]

    @jax.jit
    def sums(tree):
        def leaf(x):
            xf = x.astype(jnp.float32).reshape(-1)
            w = (jnp.arange(xf.shape[0], dtype=jnp.int32) % 1009).astype(jnp.float32)
            return jnp.stack([jnp.sum(jnp.abs(xf)), jnp.sum(xf * w)])

        return jnp.stack([leaf(x) for x in jax.tree.leaves(tree)])

    return [float(v) for v in np.asarray(jax.device_get(sums(base))).reshape(-1)]


def trainable(params: Params) -> Params:
    """What the optimizer updates: the adapters of a LoRA tree, else the whole tree."""
    return split(params)[1] if has_adapters(params) else params


def with_trainable(params: Params, updated: Params) -> Params:
    """``params`` with its trainable part (`trainable`) replaced by ``updated``."""
    return join(split(params)[0], updated) if has_adapters(params) else updated
