# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Load HF (config.json + safetensors) and GGUF checkpoints into jaxgrpo params, and save params back as HF.

HF layout -> ours (torch ``nn.Linear`` stores ``W [out, in]`` and computes ``x W^T``; we store ``[in, *out]``):
``q_proj.weight [N*H, D] -> q [D, N, H]`` (transpose, reshape); ``o_proj.weight [D, N*H] -> o [N, H, D]``;
``gate/up_proj.weight [F, D] -> [D, F]``; ``down_proj.weight [D, F] -> [F, D]``; ``lm_head.weight [V, D] -> [D, V]``;
biases ``[N*H] -> [N, H]``; norms and the embedding as is. Layer ``i`` goes to index ``i`` of the stacked axis.

Tensors stream from disk one at a time (``safetensors.safe_open``; only one stacked parameter is held on the host
at a time) and, with target shardings, land directly on the mesh via ``jax.make_array_from_callback`` (each device
reads only its slice of the host array; the same call works on multi-host meshes).

GGUF files (llama.cpp) are read by `jaxgrpo.models.gguf_import`.
"""

from __future__ import annotations

import contextlib
import json
import math
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import Mesh

from jaxgrpo.models.config import ModelConfig, ModelConfigError, from_hf_config, to_hf_config
from jaxgrpo.models.params import param_shapes

Params = dict[str, Any]
PathLike = str | pathlib.Path

_NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}

# our layer param -> (HF name inside "model.layers.{i}.", GGUF name inside "blk.{i}.", kind)
# kind "in": matrix whose first axis (ours) is the HF input dim; "out": matrix whose last axis is the HF output dim;
# "vec": a vector possibly split into [heads, head_dim]; "same": identical layout (the embedding).
_LAYER_NAMES = {
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


# --------------------------------------------------------------------------------------------------- layout helpers
def _to_ours(w: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """HF/torch-layout tensor -> our layout (one layer, or a non-layer tensor)."""
    return w.T.reshape(shape) if kind in ("in", "out") else w.reshape(shape)


def _to_hf(x: np.ndarray, kind: str) -> np.ndarray:
    """Our layout (one layer) -> HF/torch layout."""
    if kind == "in":
        return np.ascontiguousarray(x.reshape(x.shape[0], -1).T)
    if kind == "out":
        return np.ascontiguousarray(x.reshape(-1, x.shape[-1]).T)
    if kind == "same":
        return np.ascontiguousarray(x)
    return np.ascontiguousarray(x.reshape(-1))


def _hf_shape(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
    if kind == "in":
        return (math.prod(shape[1:]), shape[0])
    if kind == "out":
        return (shape[-1], math.prod(shape[:-1]))
    if kind == "same":
        return tuple(shape)
    return (math.prod(shape),)


def _tensor_plan(config: ModelConfig) -> Iterator[tuple[tuple[str, ...], tuple[int, ...], list[tuple[str, str]], str]]:
    """(our path, our full shape, [(hf name, gguf name) per slice], kind) for every parameter."""
    shapes = param_shapes(config)
    yield ("embed",), shapes["embed"], [("model.embed_tokens.weight", "token_embd.weight")], "same"
    for key, shape in shapes["layers"].items():
        hf, gg, kind = _LAYER_NAMES[key]
        names = [(f"model.layers.{i}.{hf}", f"blk.{i}.{gg}") for i in range(config.num_layers)]
        yield ("layers", key), shape, names, kind
    yield ("final_norm",), shapes["final_norm"], [("model.norm.weight", "output_norm.weight")], "vec"
    if not config.tie_word_embeddings:
        yield ("lm_head",), shapes["lm_head"], [("lm_head.weight", "output.weight")], "in"


def _set(tree: Params, path: tuple[str, ...], value: Any) -> None:
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


def _get(tree: Params, path: tuple[str, ...]) -> Any:
    for p in path:
        tree = tree[p]
    return tree


def _place(host: np.ndarray, sharding: jax.sharding.Sharding | None) -> jax.Array:
    if sharding is None:
        return jnp.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def _resolve_shardings(config: ModelConfig, shardings: Any) -> Any:
    if shardings is None:
        return None
    if isinstance(shardings, Mesh):
        from jaxgrpo.sharding import param_shardings

        return param_shardings(config, shardings)
    return shardings


def _assemble(
    config: ModelConfig,
    read: Callable[[str, str, tuple[int, ...]], np.ndarray],
    shardings: Any,
) -> Params:
    """Build params by calling ``read(hf_name, gguf_name, expected_hf_shape) -> torch-layout array`` per tensor."""
    np_dtype = _NP_DTYPES[config.param_dtype]
    shardings = _resolve_shardings(config, shardings)
    params: Params = {}
    for path, shape, names, kind in _tensor_plan(config):
        stacked = len(names) > 1 or path[0] == "layers"
        slice_shape = shape[1:] if stacked else shape
        host = np.empty(shape, np_dtype)
        for i, (hf_name, gguf_name) in enumerate(names):
            w = read(hf_name, gguf_name, _hf_shape(slice_shape, kind))
            w = _to_ours(w, kind, slice_shape).astype(np_dtype)
            if stacked:
                host[i] = w
            else:
                host[...] = w
        _set(params, path, _place(host, None if shardings is None else _get(shardings, path)))
        del host
    return params


def _check_unexpected(config: ModelConfig, present: set[str], which: int, allowed: tuple[str, ...], where: str) -> None:
    """Fail before streaming anything if the checkpoint has tensors this config would silently ignore."""
    expected = {names[which] for _, _, plan, _ in _tensor_plan(config) for names in plan}
    extra = sorted(n for n in present - expected if not n.endswith(allowed))
    if extra:
        raise CheckpointError(
            f"{where} has {len(extra)} tensors that a {config.architecture} model with qkv_bias={config.qkv_bias}, "
            f"qk_norm={config.qk_norm}, {config.num_layers} layers does not use (unsupported variant?): {extra[:8]}"
        )


def _check_shape(name: str, found: tuple[int, ...], expected: tuple[int, ...], where: str) -> None:
    if tuple(found) != tuple(expected):
        raise CheckpointError(
            f"tensor {name!r} in {where} has shape {tuple(found)}, but the config expects {tuple(expected)} "
            f"(is config.json from the same model as the weights?)"
        )


# --------------------------------------------------------------------------------------------------- HF safetensors
def _safetensors_files(directory: pathlib.Path) -> list[pathlib.Path]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({directory / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise CheckpointError(
                f"{index} lists {len(files)} shard files but {len(missing)} are missing: {missing} "
                f"(partial download? fetch every shard listed in the index)"
            )
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in directory.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf", ".ckpt"))
        raise CheckpointError(
            f"no *.safetensors weights in {directory} (found {others or 'no weight files'}); supported: HF "
            f"safetensors (model.safetensors or a sharded model.safetensors.index.json) or a .gguf file path"
        )
    return files


def _load_hf(directory: pathlib.Path, dtype: str, param_dtype: str, shardings: Any) -> tuple[ModelConfig, Params]:
    from safetensors import safe_open

    cfg_path = directory / "config.json"
    if not cfg_path.exists():
        raise CheckpointError(
            f"no config.json in {directory}; expected an HF model directory (config.json + *.safetensors) "
            f"or a .gguf file"
        )
    config = from_hf_config(json.loads(cfg_path.read_text()), dtype=dtype).replace(param_dtype=param_dtype)
    files = _safetensors_files(directory)
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="numpy")) for f in files]
        where: dict[str, Any] = {}
        for h in handles:
            for k in h.keys():
                where[k] = h
        # Base-model checkpoints (LlamaModel) have no "model." prefix.
        prefix_fix = "model.embed_tokens.weight" not in where and "embed_tokens.weight" in where
        present = {("model." + k if prefix_fix else k) for k in where}
        _check_unexpected(config, present, 0, ("lm_head.weight", "rotary_emb.inv_freq"), directory.name)

        def read(hf_name: str, _gguf_name: str, expected: tuple[int, ...]) -> np.ndarray:
            name = hf_name.removeprefix("model.") if prefix_fix else hf_name
            h = where.get(name)
            if h is None:
                raise CheckpointError(
                    f"tensor {name!r} not found in {[f.name for f in files]} ({len(where)} tensors present) for "
                    f"a {config.architecture} model with {config.num_layers} layers, qkv_bias={config.qkv_bias}, "
                    f"qk_norm={config.qk_norm}, tie_word_embeddings={config.tie_word_embeddings}"
                )
            sl = h.get_slice(name)
            _check_shape(name, tuple(sl.get_shape()), expected, directory.name)
            return h.get_tensor(name)

        params = _assemble(config, read, shardings)
    return config, params


# --------------------------------------------------------------------------------------------------- save
def _to_host(x: Any) -> np.ndarray:
    """Full numpy copy of a (possibly multi-host sharded) array."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def save_pretrained(
    config: ModelConfig,
    params: Params,
    directory: PathLike,
    *,
    max_shard_bytes: int = 4 * 1024**3,
    dtype: str | None = None,
) -> pathlib.Path:
    """Write ``config.json`` + safetensors (sharded with an index above ``max_shard_bytes``) that transformers loads.

    Tensors are written in ``dtype`` (default: the model's compute dtype ``config.dtype``; ``"float32"`` keeps
    float32 masters exact).

    Parameters may be sharded device arrays (they are gathered one parameter at a time; on multi-host meshes every
    process must call this, and process 0 writes).
    """
    from safetensors.numpy import save_file

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shapes = param_shapes(config)
    got = jax.tree.map(lambda x: tuple(x.shape), params)
    if got != shapes:
        raise CheckpointError(f"params do not match the config: param shapes {got} != expected {shapes}")
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    out_dtype = config.dtype if dtype is None else (dtype if isinstance(dtype, str) else np.dtype(dtype).name)
    if out_dtype not in _NP_DTYPES:
        raise ModelConfigError(f"unsupported dtype {out_dtype!r}; supported: {tuple(_NP_DTYPES)}")
    np_dtype = _NP_DTYPES[out_dtype]
    for path, _shape, names, kind in _tensor_plan(config):
        host = _to_host(_get(params, path)).astype(np_dtype)
        for i, (hf_name, _) in enumerate(names):
            t = _to_hf(host[i] if path[0] == "layers" else host, kind)
            if size and size + t.nbytes > max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][hf_name] = t
            size += t.nbytes
    if jax.process_index() != 0:
        return directory  # every process gathered (a collective); process 0 writes
    for f in list(directory.glob("model*.safetensors")) + list(directory.glob("model.safetensors.index.json")):
        f.unlink()  # stale shards from an earlier save would be picked up by the glob fallback
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(directory / "model.safetensors"), metadata=meta)
    else:
        weight_map = {}
        for j, shard in enumerate(shards):
            name = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(directory / name), metadata=meta)
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(t.nbytes for s in shards for t in s.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (directory / "config.json").write_text(json.dumps(to_hf_config(config.replace(dtype=out_dtype)), indent=2))
    gen: dict[str, Any] = {}
    if config.bos_token_id is not None:
        gen["bos_token_id"] = config.bos_token_id
    if config.eos_token_ids:
        gen["eos_token_id"] = list(config.eos_token_ids) if len(config.eos_token_ids) > 1 else config.eos_token_ids[0]
    if gen:
        (directory / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return directory


# --------------------------------------------------------------------------------------------------- entry points
def load_pretrained(
    path: PathLike, dtype: str = "float32", shardings: Any = None, *, param_dtype: str = "float32"
) -> tuple[ModelConfig, Params]:
    """Load an HF directory (config.json + safetensors) or a ``.gguf`` file -> ``(config, params)``.

    ``dtype``: the compute dtype ("float32" or "bfloat16"); ``param_dtype``: the stored weights' dtype (float32
    masters by default; ``param_dtype=dtype`` for an inference-only copy). ``shardings``: None (default device), a
    `jax.sharding.Mesh` (parameters placed by `jaxgrpo.sharding.RULES`), or a pytree of shardings like the params.
    """
    path = pathlib.Path(path)
    dtype, param_dtype = (d if isinstance(d, str) else np.dtype(d).name for d in (dtype, param_dtype))
    for name, value in (("dtype", dtype), ("param_dtype", param_dtype)):
        if value not in _NP_DTYPES:
            raise ModelConfigError(f"unsupported {name} {value!r}; supported: {tuple(_NP_DTYPES)}")
    if not path.exists():
        raise CheckpointError(f"{path} does not exist (expected an HF model directory or a .gguf file)")
    if path.is_dir():
        return _load_hf(path, dtype, param_dtype, shardings)
    if path.suffix == ".gguf":
        from jaxgrpo.models.gguf_import import load_gguf  # imports this module's helpers: not at the top

        return load_gguf(path, dtype, param_dtype, shardings)
    raise CheckpointError(f"{path} is neither a directory (HF format) nor a .gguf file")


def load_tokenizer(path: PathLike) -> Any:
    """transformers tokenizer (with its chat template) for an HF directory or a ``.gguf`` file."""
    from transformers import AutoTokenizer

    path = pathlib.Path(path)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))
