# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Llama / Qwen2 / Qwen3 decoders as pytrees + pure functions, with HF safetensors and GGUF conversion.

Public surface: `ModelConfig`, `init_params`, `param_axes`, `forward`, `hidden_states`, `lm_head`, `init_cache`,
`forward_with_cache`, `KVCache`, `count_params`, `projection_widths`, (decode.py) `prefill_packed`,
`forward_with_prefix_cache`, `init_decode_cache`, `init_projection_record`, and (convert.py) `load_pretrained`,
`save_pretrained`, `load_tokenizer`, and (presets.py) `PRESETS`.
"""

from jaxgrpo.models.config import ModelConfig, ModelConfigError, RopeScaling, from_hf_config, to_hf_config
from jaxgrpo.models.convert import CheckpointError, load_pretrained, load_tokenizer, save_pretrained
from jaxgrpo.models.decode import (
    forward_with_prefix_cache,
    init_decode_cache,
    init_projection_record,
    prefill_packed,
)
from jaxgrpo.models.presets import PRESETS, get_preset
from jaxgrpo.models.transformer import (
    KVCache,
    count_params,
    forward,
    forward_with_cache,
    hidden_states,
    init_cache,
    init_params,
    lm_head,
    param_axes,
    param_shapes,
    projection_widths,
)

__all__ = [
    "CheckpointError",
    "load_pretrained",
    "load_tokenizer",
    "save_pretrained",
    "KVCache",
    "PRESETS",
    "get_preset",
    "ModelConfig",
    "ModelConfigError",
    "RopeScaling",
    "count_params",
    "forward",
    "forward_with_cache",
    "forward_with_prefix_cache",
    "from_hf_config",
    "hidden_states",
    "init_cache",
    "init_decode_cache",
    "init_projection_record",
    "projection_widths",
    "init_params",
    "lm_head",
    "param_axes",
    "param_shapes",
    "prefill_packed",
    "to_hf_config",
]
