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
import pathlib
from typing import Any

import jax
import numpy as np

from jaxgrpo.files import user_mode
from jaxgrpo.host import to_host
from jaxgrpo.models import lora
from jaxgrpo.models.config import ModelConfig, ModelConfigError, from_hf_config, to_hf_config
from jaxgrpo.models.gguf_import import load_gguf
from jaxgrpo.models.layout import (
    NP_DTYPES,
    CheckpointError,
    Params,
    assemble,
    check_shape,
    check_unexpected,
    get_path,
    tensor_plan,
    to_hf,
)
from jaxgrpo.models.params import param_shapes

PathLike = str | pathlib.Path


# --------------------------------------------------------------------------------------------------- HF safetensors
def _read_json(path: pathlib.Path) -> Any:
    """A checkpoint's JSON file; a damaged one is a one-line `CheckpointError` naming it."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); re-download or re-export the checkpoint") from None

def _safetensors_files(directory: pathlib.Path) -> list[pathlib.Path]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index)["weight_map"]
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
    config = from_hf_config(_read_json(cfg_path), dtype=dtype).replace(param_dtype=param_dtype)
    gen_path = directory / "generation_config.json"  # what transformers' generate stops on (Qwen2.5/3: two ids)
    gen_eos = _read_json(gen_path).get("eos_token_id") if gen_path.is_file() else None
    if gen_eos is not None:
        more = [int(e) for e in (gen_eos if isinstance(gen_eos, list) else [gen_eos])]
        config = config.replace(eos_token_ids=tuple(dict.fromkeys([*config.eos_token_ids, *more])))
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
        check_unexpected(config, present, 0, ("lm_head.weight", "rotary_emb.inv_freq"), directory.name)

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
            check_shape(name, tuple(sl.get_shape()), expected, directory.name)
            return h.get_tensor(name)

        params = assemble(config, read, shardings)
    return config, params


# --------------------------------------------------------------------------------------------------- save
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
    process must call this, and process 0 writes). A LoRA tree is written as its merged model (`lora.merged`).
    """
    from safetensors.numpy import save_file

    config, params = lora.merged(config, params)  # a LoRA tree: the plain model it stands for
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shapes = param_shapes(config)
    got = jax.tree.map(lambda x: tuple(x.shape), params)
    if got != shapes:
        raise CheckpointError(f"params do not match the config: param shapes {got} != expected {shapes}")
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    out_dtype = config.dtype if dtype is None else (dtype if isinstance(dtype, str) else np.dtype(dtype).name)
    if out_dtype not in NP_DTYPES:
        raise ModelConfigError(f"unsupported dtype {out_dtype!r}; supported: {tuple(NP_DTYPES)}")
    np_dtype = NP_DTYPES[out_dtype]
    for path, _shape, names, kind in tensor_plan(config):
        host = to_host(get_path(params, path)).astype(np_dtype)
        for i, (hf_name, _) in enumerate(names):
            t = to_hf(host[i] if path[0] == "layers" else host, kind)
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
        user_mode(directory / "model.safetensors")
    else:
        weight_map = {}
        for j, shard in enumerate(shards):
            name = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(directory / name), metadata=meta)
            user_mode(directory / name)
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
        if value not in NP_DTYPES:
            raise ModelConfigError(f"unsupported {name} {value!r}; supported: {tuple(NP_DTYPES)}")
    if not path.exists():
        raise CheckpointError(f"{path} does not exist (expected an HF model directory or a .gguf file)")
    if path.is_dir():
        return _load_hf(path, dtype, param_dtype, shardings)
    if path.suffix == ".gguf":
        return load_gguf(path, dtype, param_dtype, shardings)
    raise CheckpointError(f"{path} is neither a directory (HF format) nor a .gguf file")


def load_tokenizer(path: PathLike) -> Any:
    """transformers tokenizer (with its chat template) for an HF directory or a ``.gguf`` file."""
    from transformers import AutoTokenizer

    path = pathlib.Path(path)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))
