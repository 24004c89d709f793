# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Evaluation of a policy: pass@k, per-prompt success rates, and the degeneracy rate against its i.i.d. prediction.

``python -m jaxgrpo.eval (--config FILE | --run-dir DIR) [--checkpoint STEP] [--split SPLIT] [--num-prompts N]
[--num-samples n] [--group-size G ...] [--out DIR] [section.key=value ...]`` draws n completions per prompt with
the training sampler (``jaxgrpo.sampling.generate``, the config's rollout settings), scores them, and writes
``eval.json``, ``success_histogram.png`` and ``degeneracy_vs_group_size.png``.

Statistics, for a prompt with c successes among n samples (success: reward >= ``success_threshold``):

- **unbiased pass@k** (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv:2107.03374,
  eq. 1): ``pass@k = 1 - C(n-c, k) / C(n, k)``, computed in the numerically stable product form
  ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` (= 1 when ``n - c < k``), averaged over prompts; pass@1 = mean c/n.
- **measured degeneracy at group size G**: the probability that G draws without replacement from the prompt's n
  samples are all successes or all failures, ``[C(c, G) + C(n-c, G)] / C(n, G)`` (hypergeometric), averaged over
  prompts. It is the unbiased estimate of ``mean_j(p_j^G + (1-p_j)^G)`` (``jaxgrpo.degeneracy.expected_rate``) for
  the prompts' true success probabilities p_j, because ``C(c, G) / C(n, G)`` is the unbiased estimator of p^G when
  c ~ Binomial(n, p).
- **i.i.d. prediction**: ``p̄^G + (1-p̄)^G`` at the mean success rate p̄, estimated from the S successes among all
  N samples as ``[C(S,G) + C(N-S,G)] / C(N,G)`` (`degenerate_probability` of the pooled samples, as
  ``jaxgrpo.degeneracy.pooled_iid_rate``: the rate if the N outcomes were dealt into groups at random; unbiased when
  all N are i.i.d., where plugging p̄ into the formula is biased up by about f''(p) p (1-p) / (2N)).
  The map f(p) = p^G + (1-p)^G is convex, so by Jensen the true rate mean_j f(p_j) is >= f at the prompts' mean
  success probability; the difference (``gap``) is how much more often GRPO groups of size G collapse because
  prompts differ in difficulty. Both rates are unbiased when every prompt is equally hard, so the gap then has
  expectation 0; otherwise it is positive, and it tends to the Jensen gap as the number of prompts grows.
  A prompt set with success rates {0, 1} collapses always (measured 1) while i.i.d. at p̄ = 0.5 predicts 2 * 0.5^G.
"""

from __future__ import annotations

import argparse
import dataclasses
import fractions
import io
import math
import os
import pathlib
import sys
from collections.abc import Callable, Sequence
from math import comb
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jaxgrpo import async_rollout, build, eval_schedule, models, sampling, sharding
from jaxgrpo import checkpoint as ckpt_lib
from jaxgrpo import config as config_lib
from jaxgrpo import data as data_lib
from jaxgrpo import rewards as rewards_lib
from jaxgrpo.build import Params, Tokenizer
from jaxgrpo.config import Config, DataConfig
from jaxgrpo.errors import CheckpointError, ConfigError, RewardError, cli_error
from jaxgrpo.eval_report import format_summary, write_report
from jaxgrpo.eval_stats import degenerate_probability, pass_at_k_unbiased
from jaxgrpo.example import Example
from jaxgrpo.files import output_dir_error
from jaxgrpo.models.attention import DENSE, Kernel

DEFAULT_NUM_SAMPLES = 16
PROMPTS_PER_BATCH = 32  # prompts per `sampling.generate` call of `evaluate`
CORRECTNESS_REWARDS = rewards_lib.CORRECTNESS_REWARDS


# -- statistics (host side, exact integer arithmetic where it matters) ----------------------------------------------


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n."""
    return [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []


def summarize(successes: np.ndarray, group_sizes: Sequence[int], ks: Sequence[int] | None = None) -> dict[str, Any]:
    """Statistics of a boolean success matrix ``[P prompts, n samples]`` (see the module docstring).

    Returns a JSON-ready dict: ``num_prompts``, ``num_samples``, ``pass@k`` {k: value}, ``success_counts`` (c per
    prompt), ``success_histogram`` {"rate": [c/n for c = 0..n], "prompts": [#prompts with c successes]},
    ``mean_success_rate`` (p̄), ``all_fail_prompts`` / ``all_pass_prompts`` (fractions with c = 0 / c = n), and
    ``degeneracy``: one entry per G with ``measured``, ``all_pass``, ``all_fail``, ``iid`` and ``gap`` (measured − iid).
    """
    s = np.asarray(successes)
    if s.ndim != 2 or s.shape[0] < 1 or s.shape[1] < 1:
        raise ValueError(f"successes must be a non-empty [prompts, samples] matrix, got shape {s.shape}")
    if s.dtype != np.bool_:
        raise ValueError(f"successes must be boolean (reward >= threshold), got dtype {s.dtype}")
    p_count, n = s.shape
    c = s.sum(axis=1).astype(np.int64)
    ks = default_ks(n) if ks is None else list(ks)
    p_bar = float(c.sum() / (p_count * n))
    result: dict[str, Any] = {
        "num_prompts": int(p_count),
        "num_samples": int(n),
        "pass@k": {str(k): float(np.mean(pass_at_k_unbiased(n, c, k))) for k in ks},
        "mean_success_rate": p_bar,
        "success_counts": c.tolist(),
        "success_histogram": {
            "rate": [j / n for j in range(n + 1)],
            "prompts": np.bincount(c, minlength=n + 1).tolist(),
        },
        "all_fail_prompts": float(np.mean(c == 0)),
        "all_pass_prompts": float(np.mean(c == n)),
        "degeneracy": [],
    }
    for g in group_sizes:
        measured = float(np.mean(degenerate_probability(n, c, g)))
        all_pass = float(np.mean([fractions.Fraction(comb(int(ci), int(g)), comb(n, int(g))) for ci in c]))
        all_fail = float(np.mean([fractions.Fraction(comb(n - int(ci), int(g)), comb(n, int(g))) for ci in c]))
        iid = degenerate_probability(p_count * n, int(c.sum()), int(g))  # every sample pooled: the i.i.d. rate
        result["degeneracy"].append(
            {
                "group_size": int(g),
                "measured": measured,
                "all_pass": all_pass,
                "all_fail": all_fail,
                "iid": iid,
                "gap": measured - iid,
            }
        )
    return result


# -- sampling driver ------------------------------------------------------------------------------------------------


def prefill_attention(cfg: Config, model_config: models.ModelConfig) -> Kernel:
    """The sampler's prefill attention kernel for ``cfg`` on this host's backend: its ``perf.attention`` resolved as a
    training run resolves it (`jaxgrpo.learner.perf.resolve_perf`)."""
    from jaxgrpo.learner.perf import attention_kernel, resolve_perf

    perf, _ = resolve_perf(cfg.algo, cfg.perf, num_shards=1, platform=jax.default_backend(),
                           compute_dtype=model_config.dtype)  # fmt: skip
    return attention_kernel(perf)


def evaluate(
    model_config: models.ModelConfig,
    params: Params,
    tokenizer: Tokenizer,
    examples: Sequence[Example],
    reward_fn: str | rewards_lib.RewardFn,
    *,
    num_samples: int,
    group_sizes: Sequence[int],
    key: jax.Array,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    data_config: DataConfig | None = None,
    success_threshold: float = 0.5,
    prompts_per_batch: int = PROMPTS_PER_BATCH,
    mesh: Mesh | None = None,
    keep_texts: int = 4,
    ks: Sequence[int] | None = None,
    packed_ladder: tuple[int, int] | None = None,
    attention: Kernel = DENSE,
    exchange: Callable[[bytes], list[bytes]] | None = None,
) -> dict[str, Any]:
    """Samples `num_samples` completions per example with `jaxgrpo.sampling.generate`, scores them with `reward_fn`
    (a `jaxgrpo.rewards.RewardFn` or registry name; success = reward >= `success_threshold`) and returns
    `summarize(...)` (pass@k at `ks`, default 1, 2, 4, ... <= n) plus ``mean_reward``, ``unscored_frac`` (samples the
    reward gave None, counted as failures, said once on stderr),
    completion-length statistics, the settings, and the first `keep_texts`
    completions of the first prompts (``samples``).

    Prompts are encoded with `jaxgrpo.data.encode_prompts(tokenizer, examples, data_config)` (default DataConfig),
    sampled `prompts_per_batch` at a time with key ``fold_in(key, batch_index)``; `eos_token_ids` None = the model's
    and the tokenizer's (`jaxgrpo.build.eos_ids`). ``packed_ladder``: ``(floor, cap)`` of the first prefill's packed
    width (`jaxgrpo.sampling.generate`); evaluations of several sets whose batches share a ladder (e.g. ``(w, w)``
    with ``w`` the widest batch's packed row, `jaxgrpo.padding.widest_row`) share one compiled prefill instead of
    one per set's prompt lengths. None: the bucket of each batch's own prompts. ``attention``: the prefill's
    attention kernel (a run's resolved ``perf.attention``). ``exchange``: on several processes (every one samples
    every row over the global ``mesh``), each host scores its contiguous block of each batch's prompts and
    ``exchange(payload)`` returns every host's payload in process order (`jaxgrpo.host.exchange`; `score_rows`),
    so the reward runs once per row, not once per host, and every host reports the same scores.
    """
    if not examples:
        raise ValueError("evaluate: no examples (check the split / --num-prompts)")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples={num_samples!r} must be an integer >= 1")
    for g in group_sizes:  # fail before sampling, not after
        degenerate_probability(num_samples, 0, g)
    if prompts_per_batch < 1:
        raise ValueError(f"prompts_per_batch={prompts_per_batch!r} must be >= 1")
    data_config = data_config if data_config is not None else DataConfig()
    prompts = data_lib.encode_prompts(tokenizer, examples, data_config)
    params = models.compute_params(model_config, params)  # the sampler reads compute-dtype weights: cast once
    if eos_token_ids is None:
        eos_token_ids = build.eos_ids(model_config, tokenizer)
    name, fn = rewards_lib.resolve(reward_fn)
    all_rewards, lengths, truncated, texts_kept, unscored = [], [], [], [], 0
    for b, batch in enumerate(prompt_batches(prompts, prompts_per_batch)):
        start = b * prompts_per_batch
        comp = sampling.generate(
            model_config,
            params,
            batch,
            num_samples=num_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            eos_token_ids=eos_token_ids,
            key=jax.random.fold_in(key, b),
            mesh=mesh,
            packed_ladder=packed_ladder,
            attention=attention,
        )
        tokens, mask = np.asarray(comp.tokens), np.asarray(comp.mask)
        texts = tokenizer.batch_decode([t[m].tolist() for t, m in zip(tokens, mask)], skip_special_tokens=True)
        rows = [ex for ex in examples[start : start + prompts_per_batch] for _ in range(num_samples)]
        r, valid = score_rows(texts, rows, fn, num_samples, exchange)
        unscored += int((~np.asarray(valid)).sum())  # the reward returned None: no success
        all_rewards.append(r.reshape(len(batch), num_samples))
        lengths.append(np.asarray(comp.lengths))
        truncated.append(np.asarray(comp.truncated))
        for p in range(len(batch)):
            if len(texts_kept) < keep_texts:
                texts_kept.append(
                    {
                        "prompt": examples[start + p].prompt,
                        "answer": examples[start + p].answer,
                        "completion": texts[p * num_samples],
                        "reward": float(r[p * num_samples]),
                    }
                )
    rewards_arr = np.concatenate(all_rewards)
    result = summarize(rewards_arr >= success_threshold, group_sizes, ks)
    per_prompt = np.concatenate(lengths).reshape(-1, num_samples).mean(axis=1)
    for d in result["degeneracy"]:  # what a group of G costs in sampled tokens against how often it is informative
        d["informative_per_1k_tokens"] = eval_schedule.informative_per_1k_tokens(
            result["success_counts"], num_samples, per_prompt, d["group_size"])
    if unscored:
        print(f"jaxgrpo eval: reward {name!r} gave no value (None) for {unscored} of {rewards_arr.size} samples; they "
              "count as failures (unscored_frac in the report)", file=sys.stderr)  # fmt: skip
    result.update(
        mean_reward=float(rewards_arr.mean()),
        unscored_frac=unscored / rewards_arr.size,
        completion_length_mean=float(np.concatenate(lengths).mean()),
        completion_length_per_prompt=per_prompt.tolist(),
        truncated_frac=float(np.concatenate(truncated).mean()),
        settings={
            "reward": name,
            "success_threshold": float(success_threshold),
            "num_samples": num_samples,
            "max_new_tokens": int(max_new_tokens),
            "temperature": float(temperature),
            "top_p": float(top_p),
            "top_k": int(top_k),
            "eos_token_ids": [int(e) for e in eos_token_ids],
        },
        samples=texts_kept,
    )
    return result


def score_rows(texts: list[str], rows: list[Example], fn: rewards_lib.RewardFn, num_samples: int,
               exchange: Callable[[bytes], list[bytes]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(rewards, valid)`` of a batch's rows (prompt-major, ``num_samples`` per prompt) under ``fn`` (a failure
    raises). ``exchange`` None: all here. Else this host scores its contiguous block of the prompts
    (`jaxgrpo.async_rollout.host_share`) and the hosts swap their scores through ``exchange``; a host whose block
    failed still sends, so that every host raises at the same batch (`jaxgrpo.async_rollout.settle`)."""
    if exchange is None:
        return rewards_lib.score(texts, rows, [(fn, 1.0)], on_error="error")
    block = async_rollout.host_share(len(rows) // num_samples)
    a, b = (int(block[0]) * num_samples, (int(block[-1]) + 1) * num_samples) if len(block) else (0, 0)

    def make() -> bytes:
        r, valid = (rewards_lib.score(texts[a:b], rows[a:b], [(fn, 1.0)], on_error="error") if a < b
                    else (np.zeros(0, np.float32), np.zeros(0, bool)))  # fmt: skip
        buf = io.BytesIO()
        np.savez(buf, rewards=np.asarray(r), valid=np.asarray(valid))
        return buf.getvalue()

    payload, failure = async_rollout.own_share(make)
    parts = exchange(payload)
    async_rollout.settle(parts, failure)
    got = [np.load(io.BytesIO(p)) for p in parts]
    return np.concatenate([g["rewards"] for g in got]), np.concatenate([g["valid"] for g in got])


def prompt_batches(prompts: Sequence[Sequence[int]], prompts_per_batch: int = PROMPTS_PER_BATCH) -> list[list[Any]]:
    """The encoded prompts in the batches `evaluate` samples them in (one `sampling.generate` call each; the
    background precompiler compiles the programs of these same batches: `jaxgrpo.precompile.eval_jobs`)."""
    return [list(prompts[i : i + prompts_per_batch]) for i in range(0, len(prompts), prompts_per_batch)]


# -- loading a policy -----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class EvalPolicy:
    """What `evaluate` needs about the policy: the model, its (mesh-sharded) params, tokenizer, mesh, and the
    checkpoint step the params came from (None = the initial/pretrained weights)."""

    model_config: models.ModelConfig
    params: Params
    tokenizer: Tokenizer
    mesh: Mesh
    step: int | None


def load_policy_for_eval(cfg: Config, run_dir: str | os.PathLike | None, step: int | None) -> EvalPolicy:
    """The policy to evaluate, as an `EvalPolicy`.

    The model and tokenizer are built exactly as training builds them (`jaxgrpo.build.build_policy`); with a
    `run_dir`, the params are then replaced by the checkpoint's (step `step`, None = latest) read from
    ``<run_dir>/checkpoints`` (only the params: the optimizer state is not loaded; a LoRA run's checkpoint holds
    its adapters, joined to the base the config names after checking the base's fingerprint). For
    ``model.name_or_path=tiny`` the weights come only from the checkpoint, so a `run_dir` is required; for a
    pretrained model without `run_dir` the pretrained weights are evaluated (step None).
    """
    if run_dir is None and cfg.model.name_or_path == "tiny":
        raise ConfigError(
            "model.name_or_path=tiny is trained from scratch: its weights exist only in a run's checkpoints; "
            "pass --run-dir DIR"
        )
    if run_dir is None and step is not None:
        raise ConfigError("--checkpoint needs --run-dir (the run whose checkpoint to load)")
    model_config, params, tokenizer = build.build_policy(cfg, build.policy_key(cfg))
    model_config, params = build.add_lora(cfg, model_config, params, jax.random.key(0))  # adapters: the checkpoint's
    size = cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor
    if size > jax.device_count():
        raise ConfigError(
            f"mesh data*fsdp*tensor = {size} devices but only {jax.device_count()} are available; lower mesh.*"
        )
    mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices=jax.devices()[:size])
    params = sharding.shard_params(params, model_config, mesh)
    if run_dir is not None:
        directory = ckpt_lib.run_checkpoint_dir(run_dir)
        if not directory.is_dir():
            raise CheckpointError(f"{directory} does not exist: is {run_dir} a jaxgrpo run directory?")
        fingerprint = models.lora.base_fingerprint(params)
        with ckpt_lib.CheckpointManager(directory, keep=10**6, save_interval=0) as mgr:

            def attempt(s: int) -> Any:
                build.check_lora_base(mgr.read_extra(s), fingerprint, cfg, directory)
                return mgr.restore_subtree(s, "params", models.lora.trainable(params))

            if step is None:  # the newest that restores; newer ones that do not are moved aside, as in training
                found = mgr.restore_newest(attempt)
                if found is None:
                    raise CheckpointError(f"no complete checkpoint under {directory}")
                step, trained = found
            else:
                try:
                    trained = attempt(step)
                except (ConfigError, CheckpointError):
                    raise
                except Exception as e:  # noqa: BLE001 -- a damaged step: orbax/tensorstore/json errors
                    raise CheckpointError(f"checkpoint step {step} under {directory} does not restore "
                                          f"({ckpt_lib.one_line(e)}); pick another with --checkpoint") from e
            params = models.lora.with_trainable(params, trained)
    return EvalPolicy(model_config, params, tokenizer, mesh, step)


# -- command line ---------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jaxgrpo.eval",
        description="pass@k, per-prompt success rates and measured vs i.i.d. degeneracy of a policy.",
        epilog="overrides: section.key=value applied on top of the config, e.g. rollout.temperature=0.7 "
        "data.source=gsm8k data.path=../shared/data/gsm8k",
    )
    p.add_argument("--config", default=None, help="YAML config (default: RUN_DIR/config.yaml)")
    p.add_argument("--run-dir", default=None, help="training run directory whose checkpoint to evaluate")
    p.add_argument("--checkpoint", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--split", default=None,
                   help="dataset split (default: the run's held-out split: pair-test after pair-train, else test)")
    p.add_argument("--num-prompts", type=int, default=None, help="number of prompts (default: train.eval_examples)")
    p.add_argument("--num-samples", type=int, default=DEFAULT_NUM_SAMPLES, help="samples per prompt n (default 16)")
    p.add_argument(
        "--group-size",
        type=int,
        nargs="+",
        default=None,
        help="group sizes G for the degeneracy table (default: 2, 4, ... <= n and rollout.group_size)",
    )
    p.add_argument(
        "--reward",
        default=None,
        help="correctness reward (registry name or module:function; default: from data.rewards)",
    )
    p.add_argument("--success-threshold", type=float, default=0.5, help="a sample succeeds when reward >= this")
    p.add_argument("--prompts-per-batch", type=int, default=32)
    p.add_argument("--out", default=None, help="output directory (default: RUN_DIR/eval/step<N>-<split>)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    return p


def correctness_reward(cfg: Config, explicit: str | None) -> str:
    """The reward that defines success: `explicit`; else the first configured correctness reward
    (`CORRECTNESS_REWARDS`); else a single configured user function ("module:function"); else the answer check of
    the data source (arithmetic for synthetic, gsm8k for GSM8K) — shaping rewards (format, calibration) do not define
    success."""
    if explicit is not None:
        return explicit
    names = list(cfg.data.rewards)
    for n in names:
        if n in CORRECTNESS_REWARDS:
            return n
    if len(names) == 1 and (":" in names[0] or names[0] == "environment"):  # environment: multi-turn get_reward()
        return names[0]
    by_source = {"synthetic": "arithmetic", "gsm8k": "gsm8k", "words": "gsm8k_lenient"}
    if cfg.data.source not in by_source:
        raise ConfigError(f"data.source={cfg.data.source!r}: no default correctness reward; pass --reward")
    return by_source[cfg.data.source]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_intermixed_args(sys.argv[1:] if argv is None else list(argv))
    try:
        bad = [o for o in args.overrides if "=" not in o]
        if bad:
            raise ConfigError(f"argument {bad[0]!r} is not an override (section.key=value)")
        if args.config is None and args.run_dir is None:
            raise ConfigError("give --config FILE or --run-dir DIR (or both)")
        bad_out = output_dir_error(args.out, "--out")
        if bad_out:
            raise ConfigError(bad_out)
        if args.run_dir is not None and not os.path.isdir(args.run_dir):
            raise ConfigError(f"--run-dir {args.run_dir} does not exist or is not a directory: name a training run's "
                              "directory (the one holding config.yaml and checkpoints/)")
        config_path = args.config
        if config_path is None:
            config_path = str(pathlib.Path(args.run_dir) / "config.yaml")
            if not os.path.exists(config_path):
                raise ConfigError(f"{config_path} not found: pass --config FILE")
        cfg = config_lib.load_config(config_path, args.overrides)
        num_prompts = args.num_prompts if args.num_prompts is not None else cfg.train.eval_examples
        if num_prompts < 1 or args.num_samples < 1:
            raise ConfigError("--num-prompts and --num-samples must be >= 1")
        run_cfg = cfg  # as trained (the schedule's history is keyed on its data)
        args.split = args.split or data_lib.held_out_split(cfg.data.split)
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, split=args.split, num_examples=num_prompts))
        n = args.num_samples
        groups = args.group_size or sorted({*(g for g in default_ks(n) if g >= 2), cfg.rollout.group_size} - {0})
        groups = [g for g in groups if g <= n] if args.group_size is None else groups
        for g in groups:  # before the (slow) model load
            degenerate_probability(n, 0, g)
        if run_cfg.rollout.schedule != "none" and not run_cfg.data.multiturn and n < run_cfg.rollout.group_size:
            raise ConfigError(f"--num-samples {n} < the run's rollout.group_size {run_cfg.rollout.group_size}: its "
                              f"rollout.schedule report needs a group of every prompt; pass --num-samples "
                              f"{run_cfg.rollout.group_size} or more")  # fmt: skip
        reward = correctness_reward(cfg, args.reward)
        if reward != "environment":
            rewards_lib.resolve(reward)
        examples = data_lib.load_dataset(cfg.data, cfg.seed)
        policy = load_policy_for_eval(cfg, args.run_dir, args.checkpoint)
        step = policy.step
        r = cfg.rollout
        from jaxgrpo import multiturn_eval  # imports this module

        multiturn = cfg.data.multiturn
        if multiturn:  # data.environment / data.tools: trajectories through the turn loop
            result = multiturn_eval.evaluate(
                cfg, policy.model_config, policy.params, policy.tokenizer, examples, reward, num_samples=n,
                group_sizes=groups, key=jax.random.key(cfg.seed + 1), prompts_per_batch=args.prompts_per_batch,
                success_threshold=args.success_threshold, summarize=summarize,
                attention=prefill_attention(cfg, policy.model_config))  # fmt: skip
        else:
            result = evaluate(
                policy.model_config,
                policy.params,
                policy.tokenizer,
                examples,
                reward,
                num_samples=n,
                group_sizes=groups,
                key=jax.random.key(cfg.seed + 1),
                max_new_tokens=r.max_new_tokens,
                temperature=r.temperature,
                top_p=r.top_p,
                top_k=r.top_k,
                data_config=cfg.data,
                success_threshold=args.success_threshold,
                prompts_per_batch=args.prompts_per_batch,
                mesh=policy.mesh,
                attention=prefill_attention(cfg, policy.model_config),
            )
        sched = None if multiturn else eval_schedule.load_history(run_cfg, args.run_dir, step)
        if sched is not None:  # rollout.schedule: what it buys on these prompts (jaxgrpo.eval_schedule)
            trained_on = data_lib.load_dataset(run_cfg.data, run_cfg.seed)
            result["schedule"] = eval_schedule.schedule_report(
                result, sched, eval_schedule.history_indices(examples, trained_on),
                result["completion_length_per_prompt"])
        result["settings"].update(split=args.split, checkpoint_step=step, config=config_path, run_dir=args.run_dir)
        if args.out is not None:
            out = pathlib.Path(args.out)
        elif args.run_dir is not None:
            out = pathlib.Path(args.run_dir) / "eval" / f"step{step}-{args.split}"
        else:
            out = pathlib.Path("eval") / f"{config_lib.config_name(config_path)}-{args.split}"
        paths = write_report(result, out)
    except (ConfigError, CheckpointError, RewardError, ValueError, FileNotFoundError) as e:
        return cli_error(str(e))
    print(format_summary(result))
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
