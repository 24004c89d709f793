# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Read GGUF checkpoints (llama.cpp) into jaxgrpo params: `gguf_config` (the model config from the file's metadata)
and `load_gguf` (what `jaxgrpo.models.convert.load_pretrained` calls for a ``.gguf`` path).

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

import math
import pathlib
from typing import Any

import numpy as np

from jaxgrpo.files import gguf_reader
from jaxgrpo.models.config import ModelConfig, ModelConfigError, RopeScaling
from jaxgrpo.models.layout import CheckpointError, Params, assemble, check_shape, check_unexpected

GGUF_QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


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
    ends = [_gguf_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]  # llama.cpp's EOG ids
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
        eos_token_ids=tuple(dict.fromkeys(int(e) for e in ends if e is not None)),
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


def load_gguf(path: pathlib.Path, dtype: str, param_dtype: str, shardings: Any) -> tuple[ModelConfig, Params]:
    try:
        reader = gguf_reader(path)
    except Exception as e:  # the gguf package raises ValueError/struct errors for truncated or foreign files
        raise CheckpointError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from e
    config = gguf_config(reader, dtype).replace(param_dtype=param_dtype)
    index = _gguf_tensor_index(reader)
    check_unexpected(config, set(index), 1, ("rope_freqs.weight",), path.name)

    def read(_hf_name: str, gguf_name: str, expected: tuple[int, ...]) -> np.ndarray:
        if gguf_name not in index:
            raise CheckpointError(
                f"tensor {gguf_name!r} not found in {path.name} ({len(index)} tensors) for a {config.architecture} "
                f"model with {config.num_layers} layers"
            )
        t = reader.tensors[index[gguf_name]]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        check_shape(gguf_name, shape, expected, path.name)
        w = _gguf_array(reader, index[gguf_name])
        if config.architecture == "llama" and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            n = config.num_heads if gguf_name.endswith("attn_q.weight") else config.num_kv_heads
            w = _unpermute(w, n)
        return w

    return config, assemble(config, read, shardings)
