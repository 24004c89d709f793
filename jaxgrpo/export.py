# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""A finished run's exports: ``<run_dir>/final`` (HF weights and tokenizer; with LoRA a PEFT adapter directory too)
and ``<run_dir>/final.gguf``, from a `jaxgrpo.trainer.Trainer`'s state."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax

from jaxgrpo import build, models
from jaxgrpo.host import to_host
from jaxgrpo.models import lora


def final(tr: Any) -> None:
    """``<run_dir>/final``: HF weights (adapters merged) and tokenizer; with LoRA also ``<run_dir>/final_adapter``,
    a PEFT adapter directory whose base is `build.peft_base` or, for a base transformers cannot load by name,
    ``<run_dir>/final_base`` (exported here). On several processes every one gathers the (possibly sharded)
    weights and process 0 alone writes."""
    writer = jax.process_index() == 0
    if tr.lora:  # the adapter names a base AutoPeftModel loads: a Hub id, a directory, or final_base/
        base = build.peft_base(tr.cfg)
        adapters = jax.tree.map(to_host, lora.trainable(tr.state.params))
        if base is None:  # tiny, GGUF: the base exists only as this run loaded it
            base_dir = tr.run_dir / "final_base"
            frozen = jax.tree.map(to_host, lora.split(tr.state.params)[0])
            if writer:
                models.save_pretrained(tr.model_config.replace(lora=None), frozen, base_dir)
                build.save_tokenizer(tr.tokenizer, base_dir)
            base = str(base_dir.absolute())
        if writer:
            lora.save_peft(tr.model_config, adapters, tr.run_dir / "final_adapter", base_name_or_path=base,
                           revision=tr.cfg.model.revision)  # fmt: skip
    mcfg, params = lora.merged(tr.model_config, tr.state.params)
    params = jax.tree.map(to_host, params)
    if writer:
        models.save_pretrained(mcfg, params, tr.run_dir / "final")
        build.save_tokenizer(tr.tokenizer, tr.run_dir / "final")


def gguf(tr: Any) -> pathlib.Path:
    """``<run_dir>/final.gguf`` for llama.cpp / ollama (adapters merged), in ``checkpoint.export_gguf_dtype``; its
    tokenizer metadata is copied from the GGUF the tokenizer came from (``model.tokenizer``, else the model's
    file), else built from the run's tokenizer (`models.save_gguf`). Process 0 writes (every process gathers)."""
    # adapters merged in float32 and rounded once, to the file's dtype (a bfloat16 base would round the sum first)
    mcfg, params = lora.merged(tr.model_config, tr.state.params, tr.cfg.checkpoint.export_gguf_dtype)
    params = jax.tree.map(to_host, params)
    path = tr.run_dir / "final.gguf"
    if jax.process_index() != 0:
        return path
    return models.save_gguf(mcfg, params, path, gguf_vocab(tr), dtype=tr.cfg.checkpoint.export_gguf_dtype)


def gguf_vocab(tr: Any) -> Any:
    """Where ``final.gguf``'s tokenizer metadata comes from: the GGUF the tokenizer came from (``model.tokenizer``,
    else the model's file; its fields are copied verbatim), else the run's HF tokenizer."""
    m = tr.cfg.model
    hub = build.is_hub_id(m.name_or_path) and not os.path.exists(m.name_or_path)  # its tokenizer is loaded already
    source = m.tokenizer or (None if m.name_or_path == "tiny" or hub else build.resolve_model_path(m.name_or_path))
    return source if str(source).endswith(".gguf") else tr.tokenizer


def check_gguf_tokenizer(tr: Any) -> None:
    """Before the first step of a ``checkpoint.export_gguf`` run: a ConfigError when ``final.gguf`` could not hold the
    run's tokenizer (`models.gguf_export.hf_tokenizer_fields` refuses it: byte fallback, SentencePiece, an unknown
    pre-tokenizer), rather than after the last step."""
    from jaxgrpo.config import ConfigError
    from jaxgrpo.models.gguf_export import hf_tokenizer_fields

    vocab = gguf_vocab(tr)
    if isinstance(vocab, (str, os.PathLike)):
        return
    try:
        hf_tokenizer_fields(vocab, tr.model_config)
    except models.CheckpointError as e:
        raise ConfigError(f"checkpoint.export_gguf=true: {e}; or set checkpoint.export_gguf=false") from None
