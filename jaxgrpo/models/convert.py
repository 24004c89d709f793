# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Load HF (config.json + safetensors) and GGUF checkpoints into jaxgrpo params, and save params back as HF.

HF layout -> ours (torch ``nn.Linear`` stores ``W [out, in]`` and computes ``x W^T``; we store ``[in, *out]``):
``q_proj.weight [N*H, D] -> q [D, N, H]`` (transpose, reshape); ``o_proj.weight [D, N*H] -> o [N, H, D]``;
``gate/up_proj.weight [F, D] -> [D, F]``; ``down_proj.weight [D, F] -> [F, D]``; ``lm_head.weight [V, D] -> [D, V]``;
biases ``[N*H] -> [N, H]``; norms and the embedding as is. Layer ``i`` goes to index ``i`` of the stacked axis.

Tensors stream from disk one at a time (``safetensors.safe_open``; only one stacked parameter is held on the host
at a time) and, with target shardings, land directly on the mesh via ``jax.make_array_from_callback`` (each device
reads only its slice of the host array; the same call works on multi-host meshes).

GGUF (llama.cpp): tensors ``token_embd``, ``blk.{i}.attn_{q,k,v,output}``, ``blk.{i}.ffn_{gate,up,down}``,
``blk.{i}.attn_norm``, ``blk.{i}.ffn_norm``, (qwen2) ``attn_{q,k,v}.bias``, (qwen3) ``attn_{q,k}_norm``,
``output_norm``, ``output`` (absent when tied). A GGML tensor with dims ``(ne0, ne1)`` is the row-major numpy array
``[ne1, ne0]``, i.e. the torch layout ``[out, in]``. Quantized blocks are dequantized with
``gguf.quants.dequantize``. For the ``llama`` architecture llama.cpp's converter (``convert_hf_to_gguf.py``,
``LlamaModel.permute``) reorders the rows of q and k inside each head from HF's rotate-half layout to interleaved
pairs: ``W.reshape(n, 2, H/2, D).swapaxes(1, 2)``; we undo it with ``W.reshape(n, H/2, 2, D).swapaxes(1, 2)``
(n = heads for q, kv heads for k). Qwen2/Qwen3 GGUFs use NEOX (rotate-half) RoPE and are not permuted.
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

from jaxgrpo.models.config import ModelConfig, ModelConfigError, RopeScaling, from_hf_config, to_hf_config
from jaxgrpo.models.params import param_shapes

Params = dict[str, Any]
PathLike = str | pathlib.Path

GGUF_QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
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
        return _load_gguf(path, dtype, param_dtype, shardings)
    raise CheckpointError(f"{path} is neither a directory (HF format) nor a .gguf file")


def load_tokenizer(path: PathLike) -> Any:
    """transformers tokenizer (with its chat template) for an HF directory or a ``.gguf`` file."""
    from transformers import AutoTokenizer

    path = pathlib.Path(path)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))


# --------------------------------------------------------------------------------------------------- GGUF
def _gguf_field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    return field.contents()


def gguf_config(reader: Any, dtype: str = "float32") -> ModelConfig:
    """ModelConfig from GGUF metadata (``general.architecture`` and ``{arch}.*`` keys)."""
    arch = _gguf_field(reader, "general.architecture")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ModelConfigError(f"unsupported GGUF architecture {arch!r}; supported: ('llama', 'qwen2', 'qwen3')")

    def req(key: str) -> Any:
        value = _gguf_field(reader, f"{arch}.{key}")
        if value is None:
            raise CheckpointError(f"GGUF metadata is missing {arch}.{key}")
        return value

    num_heads = int(req("attention.head_count"))
    hidden = int(req("embedding_length"))
    kv = _gguf_field(reader, f"{arch}.attention.head_count_kv")
    head_dim = _gguf_field(reader, f"{arch}.attention.key_length")
    head_dim = head_dim or _gguf_field(reader, f"{arch}.rope.dimension_count")
    names = {t.name: t for t in reader.tensors}
    if "token_embd.weight" in names:
        vocab = int(names["token_embd.weight"].shape[-1])  # GGML dims (D, V): the weights decide
    else:
        tokens = _gguf_field(reader, "tokenizer.ggml.tokens")
        vocab = _gguf_field(reader, f"{arch}.vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None:
        raise CheckpointError("GGUF has no token_embd.weight tensor, vocab size or token list")
    eos = _gguf_field(reader, "tokenizer.ggml.eos_token_id")
    bos = _gguf_field(reader, "tokenizer.ggml.bos_token_id")
    rope_scaling = None
    if "rope_freqs.weight" in names:
        dim = int(head_dim or hidden // num_heads)
        rope_scaling = _llama3_from_rope_freqs(reader, arch, dim, _f32_to_float(req("rope.freq_base")))
    scaling_type = _gguf_field(reader, f"{arch}.rope.scaling.type")
    if scaling_type not in (None, "none"):
        if scaling_type != "linear":
            raise ModelConfigError(f"unsupported GGUF rope scaling type {scaling_type!r}; supported: none, linear")
        rope_scaling = RopeScaling("linear", float(req("rope.scaling.factor")))
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(req("feed_forward_length")),
        num_layers=int(req("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(kv) if kv is not None else num_heads,
        head_dim=int(head_dim) if head_dim else None,
        rope_theta=_f32_to_float(_gguf_field(reader, f"{arch}.rope.freq_base") or 10000.0),
        rope_scaling=rope_scaling,
        rms_norm_eps=_f32_to_float(req("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(_gguf_field(reader, f"{arch}.context_length") or 2048),
        tie_word_embeddings="output.weight" not in names,
        qkv_bias=arch == "qwen2",
        qk_norm=arch == "qwen3",
        dtype=dtype,
        architecture=arch,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def _f32_to_float(x: Any) -> float:
    """GGUF stores float32; take the shortest decimal that rounds to it (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(x)))


def _llama3_from_rope_freqs(reader: Any, arch: str, head_dim: int, theta: float) -> RopeScaling:
    """Recover llama3 RoPE scaling from llama.cpp's ``rope_freqs`` tensor.

    llama.cpp stores per-frequency divisors ``r_i = inv_freq_i / scaled_inv_freq_i``: 1 (high frequencies), ``factor``
    (low frequencies) and in between ``1 / r = (1 - s) / factor + s`` with ``s = (L / wavelen - low) / (high - low)``.
    ``s`` is linear in ``1 / wavelen``, so two medium-band points give ``L / (high - low)`` and ``low / (high - low)``;
    with ``L`` = the GGUF's original context length (default 8192, Llama 3.1/3.2) that fixes ``low`` and ``high``.
    """
    from jaxgrpo.models.layers import rope_inv_freq

    r = _gguf_array(reader, _gguf_tensor_index(reader)["rope_freqs.weight"]).reshape(-1).astype(np.float64)
    factor = float(np.round(r.max(), 4))
    orig = int(_gguf_field(reader, f"{arch}.rope.scaling.original_context_length") or 8192)
    probe = ModelConfig(vocab_size=1, hidden_size=head_dim, intermediate_size=1, num_layers=1, num_heads=1,
                        num_kv_heads=1, rope_theta=theta)  # fmt: skip
    base = rope_inv_freq(probe).astype(np.float64)
    low, high = 1.0, 4.0  # Meta's values, used when the tensor has fewer than two medium-band points
    medium = (r > 1 + 1e-4) & (r < factor - 1e-4)
    if medium.sum() >= 2 and factor > 1:
        s = (1 / r[medium] - 1 / factor) / (1 - 1 / factor)
        # s = slope / wavelen + intercept with slope = L / (high - low), intercept = -low / (high - low)
        slope, intercept = np.polyfit(base[medium] / (2 * math.pi), s, 1)
        width = orig / slope
        low = float(np.round(-intercept * width, 4))
        high = float(np.round(low + width, 4))
    cand = RopeScaling("llama3", factor, low, high, orig) if factor > 1 and high > low else None
    if cand is not None and np.allclose(base / rope_inv_freq(probe.replace(rope_scaling=cand)), r, rtol=1e-3):
        return cand
    raise ModelConfigError(
        f"GGUF rope_freqs tensor (divisors {np.round(r, 3).tolist()}) is not a llama3 RoPE scaling; supported: "
        f"llama3 scaling (Llama 3.1/3.2) or no rope_freqs tensor"
    )


def _gguf_tensor_index(reader: Any) -> dict[str, int]:
    return {t.name: i for i, t in enumerate(reader.tensors)}


def _gguf_array(reader: Any, index: int) -> np.ndarray:
    """Dequantized float32 array in row-major torch layout ``[ne_last, ..., ne0]``."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    t = reader.tensors[index]
    qtype = GGMLQuantizationType(t.tensor_type)
    if qtype.name not in GGUF_QUANT_TYPES:
        raise CheckpointError(
            f"GGUF tensor {t.name!r} has quantization type {qtype.name}, which is not supported; "
            f"supported: {GGUF_QUANT_TYPES} (re-quantize the model, e.g. to Q8_0)"
        )
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if qtype.name in ("F32", "F16"):
        arr = np.asarray(t.data, dtype=np.float32)
    else:
        arr = dequantize(np.asarray(t.data), qtype).astype(np.float32)
    return arr.reshape(shape)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> HF rotate-half halves)."""
    out_dim = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, out_dim // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _load_gguf(path: pathlib.Path, dtype: str, param_dtype: str, shardings: Any) -> tuple[ModelConfig, Params]:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # the gguf package raises ValueError/struct errors for truncated or foreign files
        raise CheckpointError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from e
    config = gguf_config(reader, dtype).replace(param_dtype=param_dtype)
    index = _gguf_tensor_index(reader)
    _check_unexpected(config, set(index), 1, ("rope_freqs.weight",), path.name)

    def read(_hf_name: str, gguf_name: str, expected: tuple[int, ...]) -> np.ndarray:
        if gguf_name not in index:
            raise CheckpointError(
                f"tensor {gguf_name!r} not found in {path.name} ({len(index)} tensors) for a {config.architecture} "
                f"model with {config.num_layers} layers"
            )
        t = reader.tensors[index[gguf_name]]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        _check_shape(gguf_name, shape, expected, path.name)
        w = _gguf_array(reader, index[gguf_name])
        if config.architecture == "llama" and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            n = config.num_heads if gguf_name.endswith("attn_q.weight") else config.num_kv_heads
            w = _unpermute(w, n)
        return w

    return config, _assemble(config, read, shardings)
