# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The semantic checks of a loaded `Config` (types are checked while loading, `jaxgrpo.coerce`): ranges, choices and
the values that must agree across sections. `validate` raises a one-line `ConfigError` that names the key, what was
given and what would be valid; `jaxgrpo.config.load_config` calls it on every config it returns."""

from __future__ import annotations

import importlib.util
import re
import typing
from typing import Any

from jaxgrpo import advantages, coerce, retain, scheduler
from jaxgrpo import rewards as rewards_lib
from jaxgrpo.config_sections import CHOICES, SECTIONS, Config
from jaxgrpo.errors import ConfigError
from jaxgrpo.hf_dataset import ROLES as DATA_COLUMN_ROLES
from jaxgrpo.synthetic import MAX_DIFFICULTY, SYNTHETIC_SPLITS
from jaxgrpo.word_arithmetic import WORDS_LEVELS, WORDS_SPLITS

BUILTIN_TOKENIZERS = ("builtin:arithmetic",)
FILE_SOURCES = ("gsm8k", "hf")  # the data sources that read data.path (jaxgrpo.data.load_dataset)


def _require(ok: bool, key: str, value: Any, requirement: str) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {requirement}, got {value!r}")


def _at_least(cfg: Config, minimum: int, *keys: str) -> None:
    """Each dotted key (``section.key``, or a top-level key) must be >= `minimum`."""
    for dotted in keys:
        section, _, key = dotted.rpartition(".")
        value = getattr(getattr(cfg, section) if section else cfg, key)
        _require(value >= minimum, dotted, value, f">= {minimum}")


def _validate_objective(cfg: Config) -> None:
    """algo.objective's hyper-parameters, algo.entropy_top_frac and DAPO's overlong shaping (jaxgrpo.objectives)."""
    a = cfg.algo
    _require(a.entropy_top_frac is None or 0 < a.entropy_top_frac <= 1, "algo.entropy_top_frac", a.entropy_top_frac,
             "in (0, 1] (0.2 in the paper) or null (off)")
    # per micro-batch, the selection keeps ⌈ρ n⌉ tokens but no fixed share of the sequences, while the micro-batches
    # are weighted by their sequences before it: a seq-mean-* loss would not be the whole batch's (docs/objectives.md)
    _require(a.entropy_top_frac is None or a.grad_accum_steps == 1 or a.aggregation == "token-mean",
             "algo.entropy_top_frac", a.entropy_top_frac, f"null with algo.aggregation={a.aggregation} and "
             f"algo.grad_accum_steps={a.grad_accum_steps} > 1 (use token-mean, or grad_accum_steps=1)")
    _require(0 < a.clip_cov_ratio <= 1, "algo.clip_cov_ratio", a.clip_cov_ratio, "in (0, 1] (2e-4 in the paper)")
    _require(a.clip_cov_lb < a.clip_cov_ub, "algo.clip_cov_lb", a.clip_cov_lb, f"< algo.clip_cov_ub={a.clip_cov_ub}")
    _require(0 < a.kl_cov_ratio <= 1, "algo.kl_cov_ratio", a.kl_cov_ratio, "in (0, 1] (2e-3 in the paper)")
    _require(a.kl_cov_coef >= 0, "algo.kl_cov_coef", a.kl_cov_coef, ">= 0 (1 in the paper)")
    _require(a.cispo_clip_low is None or 0 <= a.cispo_clip_low < 1, "algo.cispo_clip_low", a.cispo_clip_low,
             "in [0, 1) or null (no lower bound)")
    _require(a.cispo_clip_high is None or a.cispo_clip_high >= 0, "algo.cispo_clip_high", a.cispo_clip_high,
             ">= 0 or null (= algo.clip_high)")
    _require(a.dual_clip is None or a.objective in ("ppo", "clip_cov"), "algo.dual_clip", a.dual_clip,
             f"null with algo.objective={a.objective} (dual-clip caps the clipped PPO loss only)")
    r = cfg.rollout
    m, limit = r.max_new_tokens, f"rollout.max_new_tokens={r.max_new_tokens}"
    if cfg.data.multiturn:  # multi-turn: the token budget after the prompt
        m = r.max_total_tokens if r.max_total_tokens is not None else r.max_turns * r.max_new_tokens
        limit = f"the token budget (rollout.max_total_tokens, else max_turns × max_new_tokens) = {m}"
    _require(a.overlong_buffer is None or 1 <= a.overlong_buffer <= m, "algo.overlong_buffer", a.overlong_buffer,
             f"in [1, {limit}] (tokens of the soft punishment interval) or null (off)")


def _divisible_fix(prompts: int, parts: int, accum: int) -> str:
    """The values that make `prompts` a multiple of `parts`: the next multiple, or the largest grad_accum_steps."""
    fix = f"set rollout.prompts_per_step={-(-prompts // parts) * parts}"
    rest = parts // accum
    fits = [g for g in range(accum - 1, 0, -1) if prompts % (rest * g) == 0]
    return fix + (f" or algo.grad_accum_steps={fits[0]}" if fits else "")


def _check_choices(cfg: Config) -> None:
    """Enum-like fields against their choices; algo.estimator_args against the estimator's arguments."""
    for (section, key), choices in CHOICES.items():
        value = getattr(getattr(cfg, section), key)
        if value is None and coerce.optional_inner(typing.get_type_hints(SECTIONS[section])[key])[1]:
            continue  # a `Literal[...] | None` field set to null
        coerce.check_choice(f"{section}.{key}", value, choices)
    accepted = advantages.estimator_args(cfg.algo.estimator)
    for k in cfg.algo.estimator_args:
        if k not in accepted:
            raise ConfigError(f"algo.estimator_args.{k} is not an argument of the {cfg.algo.estimator!r} estimator; "
                              f"{coerce.suggest(k, accepted)}valid arguments: {', '.join(accepted) or '(none)'}")


def _check_model(cfg: Config) -> None:
    """model.*: the checkpoint, the tokenizer and the tiny model's shape."""
    m = cfg.model
    _require(bool(m.name_or_path), "model.name_or_path", m.name_or_path, "'tiny', 'smollm2', a Hub id or a model path")
    if m.tokenizer is not None and m.tokenizer.startswith("builtin:"):
        coerce.check_choice("model.tokenizer", m.tokenizer, BUILTIN_TOKENIZERS)
    _at_least(cfg, 1, *(f"model.{k}" for k in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                                                "num_kv_heads", "max_position_embeddings")))
    if m.name_or_path == "tiny":
        _require(m.hidden_size % m.num_heads == 0, "model.hidden_size", m.hidden_size,
                 f"a multiple of model.num_heads={m.num_heads} (head_dim = hidden_size / num_heads)")
        _require(m.num_heads % m.num_kv_heads == 0, "model.num_heads", m.num_heads,
                 f"a multiple of model.num_kv_heads={m.num_kv_heads} (grouped-query attention)")


def _check_data(cfg: Config) -> None:
    """data.* (the source, its level and split, columns, rewards, the reward workers) and lora.*."""
    d = cfg.data
    if d.source == "words":
        _require(d.difficulty in WORDS_LEVELS, "data.difficulty", d.difficulty,
                 f"a data.source=words level in {sorted(WORDS_LEVELS)}")
        _require(d.split in WORDS_SPLITS, "data.split", d.split,
                 f"one of {', '.join(WORDS_SPLITS)} for data.source=words")
    else:
        _require(0 <= d.difficulty <= MAX_DIFFICULTY, "data.difficulty", d.difficulty, f"in [0, {MAX_DIFFICULTY}]")
    _require(d.source != "synthetic" or d.split in SYNTHETIC_SPLITS, "data.split", d.split,
             f"{' or '.join(SYNTHETIC_SPLITS)} for data.source=synthetic")
    _require(d.num_examples is None or d.num_examples >= 1, "data.num_examples", d.num_examples, ">= 1 or null")
    _require(d.path is None or d.source in FILE_SOURCES, "data.path", d.path,
             f"null for data.source={d.source}, which reads no files (data.path is for data.source="
             f"{' or '.join(FILE_SOURCES)})")  # fmt: skip
    _at_least(cfg, 1, "data.max_prompt_tokens", "rollout.prompts_per_step", "rollout.max_new_tokens")
    lo = cfg.lora
    _require(lo.rank >= 0, "lora.rank", lo.rank, ">= 0 (0 = off)")
    _require(lo.alpha is None or lo.alpha > 0, "lora.alpha", lo.alpha, "> 0 or null (= 2 × rank)")
    _require(bool(lo.targets) and len(set(lo.targets)) == len(lo.targets), "lora.targets", lo.targets,
             "a non-empty list of distinct projections, e.g. [q, k, v, o, gate, up, down]")  # fmt: skip
    _require(d.split != "", "data.split", d.split, "a non-empty split name (train, test)")
    _require(bool(d.hf_id), "data.hf_id", d.hf_id, "a non-empty dataset id")
    _require(set(d.columns) <= set(DATA_COLUMN_ROLES) and all(d.columns.values()), "data.columns", d.columns,
             "a mapping of prompt/answer to column names, e.g. {prompt: question, answer: answer}")
    _require(bool(d.rewards), "data.rewards", d.rewards, "a non-empty mapping of reward name to weight, "
             "e.g. {arithmetic: 1.0}")
    _require(d.reward_workers >= 0, "data.reward_workers", d.reward_workers, ">= 0 (0 = score in the training thread)")
    _require(d.reward_timeout is None or d.reward_timeout > 0, "data.reward_timeout", d.reward_timeout,
             "> 0 seconds or null (no timeout)")
    if d.reward_timeout is not None and d.reward_workers == 0:
        raise ConfigError(f"data.reward_timeout={d.reward_timeout} needs data.reward_workers >= 1 (a call in the "
                          "training thread cannot be cut off); set data.reward_workers=4 or data.reward_timeout=null")


def _check_rewards(cfg: Config) -> None:
    """data.environment and data.tools written as import paths; each of data.rewards known and meant for the data
    source."""
    d = cfg.data
    _require(d.environment is None or d.environment.count(":") == 1, "data.environment", d.environment,
             "'package.module:Class' or null")
    _require(all(isinstance(t, str) and t.count(":") == 1 for t in d.tools), "data.tools", d.tools,
             "a list of 'package.module:function'")
    for name in d.rewards:
        if name == "environment":  # the multi-turn environment's get_reward() (jaxgrpo.multiturn_step)
            _require(d.environment is not None, "data.rewards", d.rewards,
                     "a mapping without 'environment' unless data.environment is set (its get_reward() is that reward)")
            continue
        try:
            rewards_lib.resolve(name)
        except ValueError as e:
            raise ConfigError(f"data.rewards: {e}") from None
        sources = rewards_lib.REWARD_SOURCES.get(name)
        if sources is not None and d.source not in sources and d.source != "hf":  # hf: any dataset, any reward
            fitting = [k for k, v in rewards_lib.REWARD_SOURCES.items() if d.source in v]
            example = "arithmetic" if d.source == "synthetic" else fitting[0]
            raise ConfigError(
                f"data.rewards has {name!r}, which is meant for data.source={' or '.join(sources)}, not "
                f"data.source={d.source}; rewards for {d.source}: {', '.join(fitting)} "
                f"(e.g. data.rewards={{{example}: 1.0}})"
            )


def _check_rollout(cfg: Config) -> None:
    """rollout.*: turns and token budgets, group size, sampling and the engine's slots and blocks."""
    r = cfg.rollout
    _require(r.max_turns >= 1, "rollout.max_turns", r.max_turns, ">= 1 (policy turns per trajectory)")
    _require(r.max_total_tokens is None or r.max_total_tokens >= r.max_new_tokens, "rollout.max_total_tokens",
             r.max_total_tokens, f">= rollout.max_new_tokens={r.max_new_tokens} or null")  # fmt: skip
    _require(r.tool_timeout is None or r.tool_timeout > 0, "rollout.tool_timeout", r.tool_timeout,
             "> 0 seconds or null (no timeout)")
    _require(r.group_size >= 2, "rollout.group_size", r.group_size,
             ">= 2 (group-relative advantages need at least two samples per prompt)")
    _require(r.temperature >= 0, "rollout.temperature", r.temperature, ">= 0 (0 = greedy)")
    _require(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "in (0, 1]")
    _require(r.top_k >= 0, "rollout.top_k", r.top_k, ">= 0 (0 = off)")
    if cfg.perf.lm_head == "fused" and (r.top_k or r.top_p < 1):
        raise ConfigError(f"perf.lm_head=fused has no top-k/top-p truncation (rollout.top_k={r.top_k}, rollout.top_p="
                          f"{r.top_p}); set perf.lm_head=auto or xla, or sample without truncation")
    _require(r.slots >= 0, "rollout.slots", r.slots, ">= 0 (0 = prompts_per_step)")
    _require(r.decode_block >= 1, "rollout.decode_block", r.decode_block, ">= 1")
    scheduler.validate(cfg)  # rollout.schedule_*


def _check_algo_optim(cfg: Config) -> None:
    """algo.* (clipping, the objective, token limits) and optim.*."""
    a, o = cfg.algo, cfg.optim
    _at_least(cfg, 0, "algo.degenerate_atol", "algo.degenerate_rtol", "algo.kl_coef", "optim.warmup_steps",
              "optim.weight_decay", "seed")
    _at_least(cfg, 1, "algo.num_iterations", "algo.num_minibatches", "algo.grad_accum_steps",
              "algo.resample_max_rounds", "train.steps", "train.eval_examples", "mesh.data", "mesh.fsdp", "mesh.tensor",
              "checkpoint.keep", "log.every")
    _require(0 < a.clip_low < 1, "algo.clip_low", a.clip_low, "in (0, 1) (the ratio is clipped below at 1 - clip_low)")
    _require(a.clip_high is None or a.clip_high > 0, "algo.clip_high", a.clip_high, "> 0 or null (= clip_low)")
    _require(a.dual_clip is None or a.dual_clip > 1, "algo.dual_clip", a.dual_clip, "> 1 or null (off)")
    _require(a.max_tokens is None or a.max_tokens >= 1, "algo.max_tokens", a.max_tokens, ">= 1 or null")
    _require(cfg.perf.attention_chunk >= 1, "perf.attention_chunk", cfg.perf.attention_chunk, ">= 1")
    _require(a.sampler_correction_cap > 1, "algo.sampler_correction_cap", a.sampler_correction_cap, "> 1 (e.g. 2.0)")
    _require(cfg.perf.logprob_chunk >= 0, "perf.logprob_chunk", cfg.perf.logprob_chunk, ">= 0 (0 = automatic)")
    _validate_objective(cfg)
    _require(o.learning_rate > 0, "optim.learning_rate", o.learning_rate, "> 0")
    _require(0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio", o.min_lr_ratio, "in [0, 1]")
    _require(0 <= o.b1 < 1, "optim.b1", o.b1, "in [0, 1)")
    _require(0 <= o.b2 < 1, "optim.b2", o.b2, "in [0, 1)")
    _require(o.eps > 0, "optim.eps", o.eps, "> 0")
    _require(o.max_grad_norm >= 0, "optim.max_grad_norm", o.max_grad_norm, ">= 0 (0 = no clipping)")


def _check_warm_start(cfg: Config) -> None:
    """warm_start.*: demonstrations, their schedule, and what they need of data and lora."""
    w, d, lo, a = cfg.warm_start, cfg.data, cfg.lora, cfg.algo
    w = cfg.warm_start
    if w.demonstrations is not None:
        _require(w.demonstrations.endswith(".jsonl") or w.demonstrations.count(":") == 1, "warm_start.demonstrations",
                 w.demonstrations, "a .jsonl file of {\"messages\": [...]} lines, 'package.module:function' or null")
        _at_least(cfg, 1, "warm_start.examples", "warm_start.steps", "warm_start.batch_size")
        _require(w.learning_rate > 0, "warm_start.learning_rate", w.learning_rate, "> 0")
        _require(d.template == "chat", "data.template", d.template, "chat when warm_start.demonstrations is set (the "
                 "demonstrations are conversations in the chat template)")
        if lo.rank and a.kl_coef > 0:
            raise ConfigError("warm_start.demonstrations with lora.rank > 0 and algo.kl_coef > 0: a LoRA run's KL "
                              "reference is the frozen base, not the warm-started policy; set algo.kl_coef=0 or "
                              "warm-start without LoRA (lora.rank=0)")


def _check_train_mesh(cfg: Config) -> None:
    """train.*, and the mesh against the batch: whole groups on every shard, the rollout's devices."""
    a, r, d = cfg.algo, cfg.rollout, cfg.data
    t = cfg.train
    _require(t.eval_every >= 0, "train.eval_every", t.eval_every, ">= 0 (0 = never)")
    retain.resolve(cfg)  # train.retain entries and train.retain_every
    _require(t.max_sampled_tokens is None or t.max_sampled_tokens >= 1, "train.max_sampled_tokens",
             t.max_sampled_tokens, ">= 1 or null (no token budget)")
    # The train step splits the P groups into num_minibatches × grad_accum_steps parts of whole groups on each of
    # the data × fsdp batch shards (jaxgrpo.learner.train_step), so P must be a multiple of their product.
    parts = a.num_minibatches * a.grad_accum_steps * cfg.mesh.data * cfg.mesh.fsdp
    if r.prompts_per_step % parts:
        raise ConfigError(
            f"rollout.prompts_per_step={r.prompts_per_step} must be a multiple of algo.num_minibatches × "
            f"algo.grad_accum_steps × mesh.data × mesh.fsdp = {a.num_minibatches} × {a.grad_accum_steps} × "
            f"{cfg.mesh.data} × {cfg.mesh.fsdp} = {parts} (the train step splits the rollout into parts of whole "
            f"groups on every batch shard): {_divisible_fix(r.prompts_per_step, parts, a.grad_accum_steps)}"
        )
    _at_least(cfg, 0, "rollout.max_staleness", "mesh.rollout")
    _at_least(cfg, 1, "mesh.rollout_fsdp")
    if cfg.mesh.rollout_fsdp > 1 and (not cfg.mesh.rollout or cfg.mesh.rollout % cfg.mesh.rollout_fsdp):
        raise ConfigError(f"mesh.rollout_fsdp={cfg.mesh.rollout_fsdp} splits the weights over the rollout's own "
                          f"devices, so mesh.rollout ({cfg.mesh.rollout}) must be a multiple of it; set mesh.rollout "
                          "to such a multiple, or mesh.rollout_fsdp=1 (on the learner's devices, mesh.fsdp splits)")
    if cfg.mesh.rollout > 1 and not cfg.mesh.distributed and r.turn_engine and d.multiturn:
        raise ConfigError(f"mesh.rollout={cfg.mesh.rollout} with rollout.turn_engine=true: the multi-turn engine "
                          "samples on one device; set mesh.rollout=1 or rollout.turn_engine=false (the simple loop)")
    if (r.max_staleness or cfg.mesh.rollout) and cfg.mesh.distributed and (why := async_hosts_refusal(cfg)):
        raise ConfigError(why)
    if r.max_staleness and not cfg.mesh.rollout and cfg.mesh.distributed:  # (`async_rollout.process_groups`)
        raise ConfigError("asynchronous rollouts on several hosts need rollout devices on every host: set mesh.rollout "
                          "to a multiple of the process count, or rollout.max_staleness=0")


def _check_outputs(cfg: Config) -> None:
    """mesh.topology, checkpoints, logging and GGUF export."""
    topo = cfg.mesh.topology
    _require(topo is None or re.fullmatch(r"v\d+[a-z]*:\d+(x\d+)+", topo) is not None, "mesh.topology", topo,
             "a TPU slice name such as v5p:2x4x4 or v5e:4x8, or null")
    _require(cfg.checkpoint.every >= 0, "checkpoint.every", cfg.checkpoint.every, ">= 0 (0 = only on exit)")
    _require(cfg.log.sample_every >= 0, "log.sample_every", cfg.log.sample_every, ">= 0 (0 = never)")
    if cfg.log.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError("log.wandb=true needs the wandb package: pip install wandb (in the jaxgrpo clone: "
                          "pip install -e '.[wandb]'), or set log.wandb=false")
    if cfg.checkpoint.export_gguf and (cfg.model.tokenizer == "builtin:arithmetic" or (
            cfg.model.name_or_path == "tiny" and cfg.model.tokenizer is None)):
        raise ConfigError("checkpoint.export_gguf=true needs a byte-level BPE tokenizer (llama.cpp has no vocabulary "
                          "type for the builtin character tokenizer): set model.tokenizer to an HF tokenizer directory "
                          "(null = a pretrained model's own) or checkpoint.export_gguf=false")


def validate(cfg: Config) -> None:
    """Raises ConfigError for an out-of-range or inconsistent value (types are checked while loading)."""
    for check in (_check_choices, _check_model, _check_data, _check_rewards, _check_rollout, _check_algo_optim,
                  _check_warm_start, _check_train_mesh, _check_outputs):  # fmt: skip
        check(cfg)


def async_hosts_refusal(cfg: Config) -> str | None:
    """Why an asynchronous run cannot run on several processes (hosts), or None: the adaptive schedule samples the
    whole step on each host (`async_rollout.process_groups` shares rounds of G-sample groups only)."""
    if "adaptive" not in cfg.rollout.schedule:
        return None
    return (f"rollout.schedule={cfg.rollout.schedule} with asynchronous rollouts runs on one host so far: set "
            "rollout.max_staleness=0 mesh.rollout=0 on several hosts, or rollout.schedule=skip")
