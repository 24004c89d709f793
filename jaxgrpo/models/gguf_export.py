# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Write a policy as a GGUF file that llama.cpp and ollama run, and that `load_pretrained` reads back.

GGUF layout (llama.cpp's format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), written with the `gguf`
package's ``GGUFWriter``:

- Tensors: the names of `jaxgrpo.models.convert` (``token_embd``, ``blk.{i}.attn_q`` ..., ``output_norm``,
  ``output`` unless the head is tied to the embedding), each in torch layout ``[out, in]`` (GGML dims
  ``(in, out)``). Matrices are written in ``dtype`` (F32, F16 or BF16); vectors (norms, biases, ``rope_freqs``)
  always in F32, as llama.cpp's own converter does.
- Llama q/k rows: llama.cpp's ``llama`` graph applies RoPE to interleaved pairs ``(2i, 2i+1)`` while HF (and
  jaxgrpo) rotate halves ``(i, i + H/2)``; llama.cpp's ``convert_hf_to_gguf.py`` therefore reorders the rows of q and
  k inside each head, ``W.reshape(n, 2, H/2, D).swapaxes(1, 2)`` (n = heads for q, kv heads for k), and so does this
  writer; `gguf_import._unpermute` undoes it on load. Qwen2/Qwen3 use NEOX (rotate-half) RoPE in llama.cpp: not
  permuted.
- Metadata: ``{arch}.context_length``, ``embedding_length``, ``block_count``, ``feed_forward_length``,
  ``attention.head_count``, ``attention.head_count_kv``, ``attention.key_length`` / ``value_length``,
  ``rope.dimension_count``, ``rope.freq_base``, ``attention.layer_norm_rms_epsilon``, ``vocab_size``. Linear RoPE
  scaling is ``rope.scaling.type = linear`` + ``rope.scaling.factor``; llama3 RoPE scaling (Llama 3.1) is llama.cpp's
  ``rope_freqs`` tensor of per-frequency divisors ``inv_freq / scaled_inv_freq``, computed here from
  `layers.rope_inv_freq` (the forward's own frequencies).
- Tokenizer (``tokenizer.ggml.*``, ``tokenizer.chat_template``): copied field for field from a source GGUF
  (`copy_tokenizer_fields`), or built from an HF fast tokenizer (`hf_tokenizer_fields`). llama.cpp's ``gpt2``
  vocabulary type is byte-level BPE: ``tokens`` (id order, in the tokenizer's byte-to-unicode alphabet),
  ``token_type`` (NORMAL 1, CONTROL 3 for special added tokens, USER_DEFINED 4 for other added tokens, UNUSED 5 for
  ids the tokenizer leaves empty, which get the placeholder ``[PAD{id}]`` as in llama.cpp's converter), ``merges``
  (``"a b"``, by rank), ``pre`` (the name llama.cpp gives the text-splitting rule, read off the tokenizer's
  pre-tokenizer), ``bos/eos/unknown/padding_token_id``, ``add_bos_token``/``add_eos_token``; the model's other
  end-of-sequence ids (Llama 3.1's three) as ``eot_token_id`` and ``eom_token_id``, which llama.cpp also ends a
  generation on (GGUF has no field for a fourth: more are left out, with a warning). BPE vocabularies carry
  no ``scores`` (llama.cpp's converter writes none for them); a source GGUF's scores are copied with the rest.

The file is written to ``<path>.tmp`` and renamed, so a crash never leaves a truncated ``.gguf`` behind.
"""

from __future__ import annotations

import json
import os
import pathlib
import typing
import warnings
from typing import Any, Literal

import jax
import ml_dtypes
import numpy as np

from jaxgrpo.host import to_host
from jaxgrpo.models import lora
from jaxgrpo.models.config import ModelConfig, ModelConfigError
from jaxgrpo.models.layout import CheckpointError, get_path, tensor_plan, to_hf
from jaxgrpo.models.params import param_shapes

PathLike = str | os.PathLike
GgufDtype = Literal["float32", "float16", "bfloat16"]  # the matrices' type in the file
GGUF_DTYPES: tuple[str, ...] = typing.get_args(GgufDtype)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half rows of a q/k projection ``[n_head * H, D]`` -> llama.cpp's interleaved RoPE pairs."""
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_freq_divisors(config: ModelConfig) -> np.ndarray:
    """llama.cpp's ``rope_freqs`` tensor ``[H/2]`` for llama3 RoPE scaling: unscaled / scaled inverse frequencies."""
    from jaxgrpo.models.layers import rope_inv_freq

    base = rope_inv_freq(config.replace(rope_scaling=None)).astype(np.float64)
    return (base / rope_inv_freq(config).astype(np.float64)).astype(np.float32)


# --------------------------------------------------------------------------------------------------- tokenizer
KeyValue = tuple[str, Any, Any, Any]  # (key, value, GGUFValueType, array element type or None)

# Pre-tokenizer split regexes of the model families' own tokenizer.json files, and llama.cpp's name for each.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")


def _pre_tokenizer_signature(spec: dict[str, Any] | None) -> tuple[Any, ...]:
    """The parts of a tokenizer.json ``pre_tokenizer`` that decide how text splits, as a comparable tuple."""
    if spec is None:
        return ()
    kind = spec["type"]
    if kind == "Sequence":
        return tuple(x for s in spec["pretokenizers"] for x in _pre_tokenizer_signature(s))
    if kind == "ByteLevel":
        return (("ByteLevel", bool(spec.get("add_prefix_space", False)), bool(spec.get("use_regex", True))),)
    if kind == "Digits":
        return (("Digits", bool(spec.get("individual_digits", False))),)
    if kind == "Split":
        pattern = spec.get("pattern", {})
        return (("Split", pattern.get("Regex", pattern.get("String"))),)
    return ((kind,),)


PRE_TOKENIZERS: dict[tuple[Any, ...], str] = {
    (("ByteLevel", False, True),): "gpt-2",
    (("Digits", True), ("ByteLevel", False, True)): "smollm",
    (("Split", _LLAMA3_SPLIT), ("ByteLevel", False, False)): "llama-bpe",
    (("Split", _QWEN2_SPLIT), ("ByteLevel", False, False)): "qwen2",
}


def _encodes_with(tokenizer: Any, token_id: int | None, where: int) -> bool:
    if token_id is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return len(ids) > 1 and ids[where] == token_id


def hf_tokenizer_fields(tokenizer: Any, config: ModelConfig) -> list[KeyValue]:
    """``tokenizer.*`` GGUF metadata for an HF fast tokenizer with a byte-level BPE model (see the module docstring).

    Raises `CheckpointError` for tokenizers llama.cpp's ``gpt2`` vocabulary cannot express (not BPE, byte fallback,
    an unknown pre-tokenizer) and for a tokenizer with more ids than the model's vocabulary.
    """
    from gguf import GGUFValueType as T
    from gguf import TokenType

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise CheckpointError(f"GGUF export needs a fast (tokenizers) tokenizer, got {type(tokenizer).__name__}; "
                              "load it with AutoTokenizer.from_pretrained(..., use_fast=True)")
    spec = json.loads(backend.to_str())
    model = spec["model"]
    if model["type"] != "BPE" or model.get("byte_fallback"):
        kind = model["type"] + (" with byte fallback" if model.get("byte_fallback") else "")
        raise CheckpointError(f"GGUF export supports byte-level BPE tokenizers (Llama 3, Qwen2/3, SmolLM2); this one "
                              f"is {kind}: pass a source .gguf as the tokenizer, or None for a weights-only file")
    signature = _pre_tokenizer_signature(spec.get("pre_tokenizer"))
    pre = PRE_TOKENIZERS.get(signature)
    if pre is None:
        raise CheckpointError(f"GGUF export: pre-tokenizer {signature} has no llama.cpp name (known: "
                              f"{sorted(PRE_TOKENIZERS.values())}); pass a source .gguf as the tokenizer, or None")
    tokens: list[str | None] = [None] * config.vocab_size
    types = [int(TokenType.UNUSED)] * config.vocab_size
    entries = [(i, t, int(TokenType.NORMAL)) for t, i in model["vocab"].items()]
    entries += [(a["id"], a["content"], int(TokenType.CONTROL if a["special"] else TokenType.USER_DEFINED))
                for a in spec.get("added_tokens", [])]  # fmt: skip
    for i, text, kind in entries:
        if i >= config.vocab_size:
            raise CheckpointError(f"the tokenizer has token id {i} ({text!r}) but the model's vocabulary has "
                                  f"{config.vocab_size} ids: the tokenizer does not belong to this model")
        tokens[i], types[i] = text, kind
    tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    fields: list[KeyValue] = [
        ("tokenizer.ggml.model", "gpt2", T.STRING, None),
        ("tokenizer.ggml.pre", pre, T.STRING, None),
        ("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING),
        ("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32),
    ]
    if merges:
        fields.append(("tokenizer.ggml.merges", merges, T.ARRAY, T.STRING))
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else next(iter(config.eos_token_ids), None)
    # a tokenizer without a BOS (transformers' Qwen2Tokenizer) takes config.json's, as llama.cpp's converter does:
    # without the field llama.cpp assumes id 11 for a gpt2 vocabulary
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else config.bos_token_id
    others = sorted(set(config.eos_token_ids) - {eos})  # end of turn / of message in llama.cpp's terms
    if len(others) > 2:
        warnings.warn(f"GGUF holds three end-of-sequence ids (eos, eot, eom); the model's {others[2:]} are not "
                      "written, so a runtime reading the file does not stop on them", stacklevel=2)
    eot, eom = (others + [None, None])[:2]
    for key, value in (("bos", bos), ("eos", eos), ("eot", eot), ("eom", eom), ("unknown", tokenizer.unk_token_id),
                       ("padding", tokenizer.pad_token_id)):  # fmt: skip
        if value is not None:
            fields.append((f"tokenizer.ggml.{key}_token_id", int(value), T.UINT32, None))
    fields.append(("tokenizer.ggml.add_bos_token", _encodes_with(tokenizer, tokenizer.bos_token_id, 0), T.BOOL, None))
    fields.append(("tokenizer.ggml.add_eos_token", _encodes_with(tokenizer, eos, -1), T.BOOL, None))
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates: the default one is llama.cpp's tokenizer.chat_template
        template = template.get("default")
    if template:
        fields.append(("tokenizer.chat_template", template, T.STRING, None))
    return fields


def copy_tokenizer_fields(source: PathLike, vocab_size: int) -> list[KeyValue]:
    """Every ``tokenizer.*`` field of the GGUF file ``source``, with its value and GGUF types, to write unchanged."""
    from gguf import GGUFReader, GGUFValueType

    source = pathlib.Path(source)
    if source.suffix != ".gguf" or not source.is_file():
        raise CheckpointError(f"tokenizer source {source} is not a .gguf file; pass an HF tokenizer, a .gguf path "
                              "or None")
    reader = GGUFReader(str(source))
    fields = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[1] if vtype == GGUFValueType.ARRAY else None
        if vtype == GGUFValueType.ARRAY and len(field.types) > 2:
            raise CheckpointError(f"{source.name}: tokenizer field {key!r} is a nested array, which is not copied")
        fields.append((key, field.contents(), vtype, sub_type))
    tokens = next((v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens"), None)
    if tokens is not None and len(tokens) != vocab_size:  # llama.cpp sizes the embedding by the token list
        raise CheckpointError(f"{source.name} has {len(tokens)} tokens but the model's vocabulary has {vocab_size} "
                              "ids: that GGUF's tokenizer does not belong to this model")
    return fields


# --------------------------------------------------------------------------------------------------- writer
def _add_metadata(writer: Any, config: ModelConfig, name: str, file_type: int) -> None:
    import gguf

    writer.add_name(name)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_theta))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    rs = config.rope_scaling
    if rs is not None and rs.rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rs.factor))
    elif rs is not None and rs.rope_type == "llama3":
        writer.add_rope_scaling_orig_ctx_len(rs.original_max_position_embeddings)


def _add_tensor(writer: Any, name: str, w: np.ndarray, dtype: str) -> None:
    from gguf import GGMLQuantizationType

    if w.ndim == 1 or dtype == "float32":
        writer.add_tensor(name, np.ascontiguousarray(w, np.float32))
    elif dtype == "float16":
        writer.add_tensor(name, np.ascontiguousarray(w, np.float16))
    else:  # bfloat16, rounded to nearest even (ml_dtypes, as the HF export), passed to GGUF as raw bytes
        raw = np.ascontiguousarray(w.astype(ml_dtypes.bfloat16)).view(np.uint8)
        writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType.BF16)


def save_gguf(
    config: ModelConfig,
    params: dict[str, Any],
    path: PathLike,
    tokenizer: Any,
    *,
    dtype: GgufDtype | None = None,
    name: str | None = None,
) -> pathlib.Path:
    """Write ``params`` as a GGUF file at ``path`` (llama.cpp / ollama; `load_pretrained` reads it back).

    Args:
      config, params: the model (params may be sharded device arrays: they are gathered one parameter at a time;
        on multi-host meshes every process calls this and process 0 writes).
      path: the ``.gguf`` file to write (its directory is created).
      tokenizer: where the ``tokenizer.*`` metadata comes from: a ``.gguf`` path (the fields are copied from that
        file, e.g. the GGUF the model was loaded from), an HF fast tokenizer (byte-level BPE: Llama 3, Qwen2/3,
        SmolLM2), or None for a weights-only file (`load_pretrained` reads it; llama.cpp needs a tokenizer).
      dtype: the matrices' type: "float32", "float16" or "bfloat16" (default: the compute dtype ``config.dtype``).
      name: ``general.name`` (default: the file name without ``.gguf``).

    A LoRA tree is written as its merged model (`lora.merged`, summed in float32 and rounded once to ``dtype``).
    """
    import gguf

    path = pathlib.Path(path)
    out_dtype = config.dtype if dtype is None else (dtype if isinstance(dtype, str) else np.dtype(dtype).name)
    config, params = lora.merged(config, params, dtype)  # a LoRA tree: its merged model, rounded once
    if out_dtype not in GGUF_DTYPES:
        raise ModelConfigError(f"unsupported GGUF dtype {out_dtype!r}; supported: {GGUF_DTYPES}")
    if path.suffix != ".gguf":
        raise CheckpointError(f"{path}: a GGUF file name must end in .gguf (llama.cpp and load_pretrained expect it)")
    got = jax.tree.map(lambda x: tuple(x.shape), params)
    if got != param_shapes(config):
        raise CheckpointError(f"params do not match the config: param shapes {got} != expected {param_shapes(config)}")
    if tokenizer is None:
        vocab_fields = []
    elif isinstance(tokenizer, str | os.PathLike):
        vocab_fields = copy_tokenizer_fields(tokenizer, config.vocab_size)
    else:
        vocab_fields = hf_tokenizer_fields(tokenizer, config)

    file_type = {"float32": gguf.LlamaFileType.ALL_F32, "float16": gguf.LlamaFileType.MOSTLY_F16,
                 "bfloat16": gguf.LlamaFileType.MOSTLY_BF16}[out_dtype]  # fmt: skip
    writer = gguf.GGUFWriter(None, config.architecture)
    _add_metadata(writer, config, name if name is not None else path.name.removesuffix(".gguf"), int(file_type))
    for key, value, vtype, sub_type in vocab_fields:
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    if config.rope_scaling is not None and config.rope_scaling.rope_type == "llama3":
        writer.add_tensor("rope_freqs.weight", rope_freq_divisors(config))
    permute = config.architecture == "llama"
    for p, _shape, names, kind in tensor_plan(config):
        host = to_host(get_path(params, p)).astype(np.float32)
        for i, (_hf_name, gguf_name) in enumerate(names):
            w = to_hf(host[i] if p[0] == "layers" else host, kind)
            if permute and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
                w = llama_cpp_permute(w, config.num_heads if "attn_q" in gguf_name else config.num_kv_heads)
            _add_tensor(writer, gguf_name, w, out_dtype)
    if jax.process_index() != 0:
        return path  # every process gathered (a collective); process 0 writes
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    writer.open_output_file(tmp)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path
