# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Llama / Qwen2 / Qwen3 decoders as pytrees + pure functions, with HF safetensors and GGUF conversion.

Layout::

    config.py       ModelConfig (architecture switches: qkv bias, qk-norm, rope scaling, tied head), HF config I/O
    params.py       the parameter tree: shapes, logical axes, init (one abstract tree feeds all three)
    layers.py       the decoder layer, the one dense projection, the ONE scan over the stacked layers
    attention.py    the pluggable part: attention kernels and the attention functions of each forward
    transformer.py  full sequences (`forward`, `hidden_states`) and a KV-cached chunk (`forward_with_cache`)
    decode.py       the rollout engine's `prefill` (prompts packed end to end) and one-token `decode_step`
    prefix.py       the prefix-shared train forward (each group's prompt encoded once for its G completions)
    lora.py         low-rank adapters: init, merge, split/join with the frozen base, PEFT export
    convert.py      HF safetensors load and save, tokenizers (GGUF loads via gguf_import.py);  presets.py  shapes
    layout.py       each parameter's name and layout in HF and GGUF checkpoints; assembly onto shardings
    gguf_import.py  GGUF load: config from the metadata, dequantized weights (llama.cpp's q/k row order undone)
    gguf_export.py  GGUF save (llama.cpp / ollama): weights, metadata, tokenizer

Shape letters (one meaning each, package-wide; arrays are named ``x_BTD`` with them)::

    P prompts            G samples per prompt     B rows (B = P*G in a rollout, or any batch)
    T query length       S key length / cache slots  Tp prompt width  Tc completion width  M decode slots
    D hidden             F MLP width              V vocab             L layers
    N query heads        K key/value heads        R query heads per kv head (N = K*R, GQA)   H head dim
    J packed prompt rows W packed row width       Q prompts per packed row

Public surface: `ModelConfig`, `init_params`, `param_axes`, `param_shapes`, `count_params`, `lm_head`, `forward`,
`hidden_states`, `init_cache`, `forward_with_cache`, `KVCache`, `prefill`, `load_pretrained`, `save_pretrained`,
`load_tokenizer`, `PRESETS`, `save_gguf`, `LoraSpec`, `lora`.
"""

from jaxgrpo.models import lora
from jaxgrpo.models.attention import KVCache
from jaxgrpo.models.config import LoraSpec, ModelConfig, ModelConfigError, RopeScaling, from_hf_config, to_hf_config
from jaxgrpo.models.convert import CheckpointError, load_pretrained, load_tokenizer, save_pretrained
from jaxgrpo.models.decode import prefill
from jaxgrpo.models.gguf_export import save_gguf
from jaxgrpo.models.params import (
    PROJECTIONS,
    compute_params,
    count_params,
    init_params,
    lm_head,
    param_axes,
    param_shapes,
)
from jaxgrpo.models.presets import PRESETS, get_preset
from jaxgrpo.models.transformer import forward, forward_with_cache, hidden_states, init_cache

__all__ = [
    "CheckpointError",
    "load_pretrained",
    "load_tokenizer",
    "save_pretrained",
    "save_gguf",
    "KVCache",
    "PRESETS",
    "PROJECTIONS",
    "get_preset",
    "ModelConfig",
    "LoraSpec",
    "lora",
    "ModelConfigError",
    "RopeScaling",
    "compute_params",
    "count_params",
    "forward",
    "forward_with_cache",
    "from_hf_config",
    "hidden_states",
    "init_cache",
    "init_params",
    "lm_head",
    "param_axes",
    "param_shapes",
    "prefill",
    "to_hf_config",
]
