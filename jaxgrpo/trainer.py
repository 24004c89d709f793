# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The GRPO training loop: sampling → rewards → (dynamic sampling) → jitted train step → logs and checkpoints.

`python -m jaxgrpo.train` is a thin wrapper over `run(cfg, run_dir)`. Everything a resume needs (params, optimizer
state, step, rng and the prompt iterator's position) is checkpointed, and every random draw of step `s` derives from
`fold_in(key(seed), s)`, so the steps after a resume are exactly the steps the uninterrupted run would have taken
(with asynchronous rollouts, ``rollout.max_staleness = k > 0``, but for the first k steps after it, which sample with
the resumed weights: `jaxgrpo.async_rollout`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from jaxgrpo import (
    async_rollout,
    build,
    diversity,
    dynamic_sampling,
    export,
    in_training,
    metrics_log,
    models,
    multiturn_precompile,
    objectives,
    precompile,
    rewards,
    sampling,
    train_loop,
)
from jaxgrpo import checkpoint as ckpt_lib
from jaxgrpo import config as config_lib
from jaxgrpo import data as data_lib
from jaxgrpo import multiturn_step as mt_step
from jaxgrpo import retain as retain_lib
from jaxgrpo import run_dir as run_dir_lib
from jaxgrpo import sharding as sharding_lib
from jaxgrpo import step_batch as step_batch_lib
from jaxgrpo import warm_start as warm_start_lib
from jaxgrpo.groups import Rollout
from jaxgrpo.learner import optim as optim_lib
from jaxgrpo.learner import train_step as ts
from jaxgrpo.models import lora
from jaxgrpo.models.attention import Kernel
from jaxgrpo.rollout import driver as rollout_driver
from jaxgrpo.rollout import engine as rollout_engine
from jaxgrpo.rollout.params import SamplingParams
from jaxgrpo.scheduler import from_config as make_scheduler

PERF_FILE = "perf.yaml"  # in the run directory: the perf switches as applied, and why any requested one is off


class Trainer:
    """Holds what the loop needs between steps; `step()` performs one RL step and returns its metrics."""

    def __init__(self, cfg: config_lib.Config, run_dir: str | os.PathLike, *, allow_config_change: bool = False):
        """Checks everything that needs no model first (run directory, data, a resume's config, the run lock), then
        loads the model and restores the newest checkpoint that restores. A failed start leaves no empty run
        directory behind and releases the lock."""
        if cfg.mesh.distributed:  # before anything starts JAX's backend (jax.distributed.initialize refuses after)
            sharding_lib.initialize_distributed()
        async_rollout.start_run()  # this run's names of the exchanges between processes
        if not cfg.rollout.temperature > 0:
            raise config_lib.ConfigError(
                f"rollout.temperature={cfg.rollout.temperature}: training needs sampled rollouts (> 0); greedy "
                "decoding makes every group's G completions identical, hence every group degenerate")
        if cfg.data.multiturn:  # data.environment / data.tools: the multi-turn step (its own module)
            mt_step.check_config(cfg)
        self.cfg = cfg
        self.run_dir = run_dir_lib.check_path(run_dir)
        examples = data_lib.load_dataset(cfg.data, cfg.seed)
        check_prompt_count(cfg, len(examples))
        self.demonstrations = warm_start_lib.load_conversations(cfg.warm_start, examples)  # [] without a warm start
        self.eval_examples: list[data_lib.Example] | None = None
        if cfg.train.eval_every:  # the held-out split is read now, not at the first evaluation
            self.eval_examples = in_training.held_out_examples(self)
        self.retain_sets = retain_lib.resolve(cfg)
        self.config_changes = run_dir_lib.check_resume_config(cfg, self.run_dir, allow_config_change)
        self.key = jax.random.key(cfg.seed)
        created = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock = run_dir_lib.RunLock(self.run_dir)
        try:
            if jax.process_index() == 0:
                self.lock.acquire()
            self._start(examples)
        except BaseException:
            for part in ("ckpt", "scorer", "multiturn"):  # what `_start` got to before it failed
                if getattr(self, part, None) is not None:
                    getattr(self, part).close()
            self.lock.release()
            if created and jax.process_index() == 0:
                run_dir_lib.remove_if_empty(self.run_dir)
            raise

    def _start(self, examples: list[data_lib.Example]) -> None:
        """The model, tokenizer, train step and checkpoint manager; resumes from the newest restorable checkpoint."""
        cfg, m = self.cfg, self.cfg.mesh
        self.mesh, self.rollout_mesh, self.place_rollout = async_rollout.device_groups(cfg)
        if self.mesh is not None:
            sharding_lib.check_process_layout(self.mesh.devices, jax.process_count())
        self.model_config, params, self.tokenizer = build.build_policy(cfg, build.policy_key(cfg))
        self.model_config, params = build.add_lora(cfg, self.model_config, params, jax.random.fold_in(self.key, 3))
        self.lora = self.model_config.lora is not None
        self.eos_token_ids = build.eos_ids(self.model_config, self.tokenizer)
        if cfg.checkpoint.export_gguf:
            export.check_gguf_tokenizer(self)  # refused now, not after the last step
        # The perf switches that apply to this run (every device of the mesh counts as a batch shard here)
        self.perf, self.perf_notes = ts.resolve_perf(
            cfg.algo, cfg.perf, num_shards=m.data * m.fsdp * m.tensor, platform=jax.default_backend(),
            compute_dtype=self.model_config.dtype)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)

        self.set_prompts(examples)
        self.perf_notes += self.shapes.notes()
        self.retain_examples: dict[str, list[data_lib.Example]] = {}
        self.iterator = data_lib.PromptIterator(list(range(len(examples))), cfg.rollout.prompts_per_step, cfg.seed,
                                                cfg.data.shuffle)
        self.scheduler = make_scheduler(cfg)  # rollout.schedule: None = every prompt, G samples each
        self.reward_fns = mt_step.reward_functions(cfg)  # data.rewards less the environment's own reward
        # Worker threads score a rollout in parallel, each call cut off at data.reward_timeout; batched (TRL-style)
        # functions are called once per prompt group (`jaxgrpo.rewards`). None: only the environment scores.
        self.scorer = rewards.Scorer(self.reward_fns, on_error=cfg.algo.on_reward_error,
                                     workers=cfg.data.reward_workers, timeout=cfg.data.reward_timeout,
                                     batch_size=cfg.rollout.group_size) if self.reward_fns else None
        self.multiturn = (mt_step.MultiTurn(cfg, self.tokenizer, self.model_config, self.eos_token_ids, examples,
                                            self.prefill_attention, self.mesh)
                          if cfg.data.multiturn else None)  # fmt: skip

        if self.mesh is not None:
            params = sharding_lib.shard_params(params, self.model_config, self.mesh)
        if self.demonstrations:  # supervised fine-tuning on demonstrations first (warm_start.*), on the mesh if any
            schemas = self.multiturn.schemas if self.multiturn is not None else []
            params = warm_start_lib.warm_start(cfg, self.model_config, params, self.tokenizer, self.demonstrations,
                                               self.eos_token_ids, schemas, self.run_dir, self.perf, self.pad_id)
        temperature = cfg.rollout.temperature
        # the KL reference: the initial policy in the compute dtype, a copy (the step donates its state); with LoRA,
        # the frozen base read from the state each step (the adapters switched off: no second copy)
        self.ref_params = None
        if cfg.algo.kl_coef > 0:
            if not self.lora:
                self.ref_params = jax.tree.map(jnp.copy, models.compute_params(self.model_config, params))
            a = cfg.algo
            self.ref_logprobs = ts.reference_logprobs_fn(self.model_config, temperature, self.perf, cfg.rollout.top_k,
                                                         cfg.rollout.top_p, m.data * m.fsdp,
                                                         a.num_minibatches * a.grad_accum_steps)  # fmt: skip
        # the learner's log-probs are of the sampler's distribution (top-k / top-p truncated: jaxgrpo.learner.logprobs)
        # max_tokens fixed: the batch's completion width varies (`jaxgrpo.step_batch`; multi-turn: the token budget's)
        r = cfg.rollout
        width = self.multiturn.settings.budget if self.multiturn is not None else r.max_new_tokens
        algo = step_batch_lib.step_algo(cfg.algo, width)
        self.init_fn, self.step_fn = ts.make_train_step(
            self.model_config, algo, cfg.optim,
            perf=self.perf, mesh=self.mesh, temperature=temperature, top_k=cfg.rollout.top_k, top_p=cfg.rollout.top_p,
            total_steps=cfg.train.steps)
        self.state = self.init_fn(params, jax.random.fold_in(self.key, 2 * 10**9))
        self.ckpt = ckpt_lib.CheckpointManager(ckpt_lib.run_checkpoint_dir(self.run_dir), keep=cfg.checkpoint.keep,
                                               save_interval=cfg.checkpoint.every)
        self.sampled_tokens = 0  # completion tokens sampled so far, every resampling round included
        self.producer: async_rollout.Producer | None = None  # asynchronous rollouts: started at the first step
        self.sampler_params_override = None  # the producer's published weights (async_rollout)
        self.start_step = self.restore()
        if jax.process_index() == 0:  # one writer of the run's files (a shared filesystem: not one line per host)
            run_dir_lib.record_changes(self.run_dir, self.start_step, self.config_changes)
            (self.run_dir / "config.yaml").write_text(config_lib.to_yaml(self.cfg))
        # time/compiles counts the step path's compilations; after the first step a background thread compiles the
        # other shapes the run can take (`jaxgrpo.precompile`, perf.precompile; "auto" resolved for the platform)
        on = precompile.enabled(self.perf.precompile, jax.default_backend())
        self.perf = dataclasses.replace(self.perf, precompile="background" if on else "off")
        self.report_perf()
        self.precompiler: precompile.Precompiler | None = None
        self.first_shapes: tuple[ts.Batch, tuple[int, int, int]] | None = None
        self.precompile_pending = on
        self.compiles = precompile.CompileCounter()

    def close(self) -> None:
        """Stops the rollout thread, waits for pending saves, stops the reward workers and releases the run lock."""
        try:
            if getattr(self, "precompiler", None) is not None:
                self.precompiler.close()
            if getattr(self, "compiles", None) is not None:
                self.compiles.close()
            if getattr(self, "producer", None) is not None:
                self.producer.close()
            self.ckpt.close()
            for part in (self.scorer, self.multiturn):
                if part is not None:
                    part.close()
        finally:
            self.lock.release()

    def restore(self) -> int:
        """Restores the newest checkpoint that restores (newer ones that fail are moved aside,
        `CheckpointManager.restore_newest`); returns its step, 0 when there is none."""
        self.base_fingerprint = lora.base_fingerprint(self.state.params)

        def attempt(step: int) -> tuple[ts.TrainState, dict[str, Any]]:
            build.check_lora_base(self.ckpt.read_extra(step), self.base_fingerprint, self.cfg, self.run_dir)
            target = self.saved_state()
            try:
                return self.ckpt.restore(step, target)
            except ckpt_lib.CheckpointError as error:  # a checkpoint of the optimizer layout before 2026-11-25?
                try:
                    saved, extra = self.ckpt.restore(step, target.replace(
                        opt_state=optim_lib.legacy_layout(target.opt_state)))
                except ckpt_lib.CheckpointError:
                    raise error from None
            print(f"jaxgrpo: checkpoint step {step} holds the optimizer state of jaxgrpo before the runtime learning "
                  "rate (a schedule count in it); restored into the current layout", file=sys.stderr)
            return saved.replace(opt_state=optim_lib.from_legacy_layout(saved.opt_state)), extra

        found = self.ckpt.restore_newest(attempt)
        if found is None:
            return 0
        step, (saved, extra) = found
        self.state = saved.replace(params=lora.with_trainable(self.state.params, saved.params))
        self.iterator.restore(extra["iterator"])
        if self.scheduler is not None and "scheduler" in extra:  # the per-prompt history, saved with the position
            self.scheduler.restore(extra["scheduler"])
        self.sampled_tokens = int(extra.get("sampled_tokens", 0))
        return step

    def report_perf(self) -> None:
        """Says once, at startup, which requested perf switches do not apply to this run (stderr), and writes the
        applied switches and those notes to ``<run_dir>/perf.yaml``."""
        if jax.process_index() != 0:
            return
        for note in self.perf_notes:
            print(f"jaxgrpo: {note}", file=sys.stderr)
        info = {"applied": dataclasses.asdict(self.perf), "notes": list(self.perf_notes)}
        header = "# jaxgrpo perf switches as applied to this run (jaxgrpo.learner.train_step.resolve_perf)\n"
        (self.run_dir / PERF_FILE).write_text(header + yaml.safe_dump(info, sort_keys=False))

    def checkpoint_extra(self) -> dict[str, Any]:
        """What a resume needs besides the train state: the prompt iterator's position and the sampled-token count
        (with LoRA, the identity of the frozen base too)."""
        if self.producer is not None:  # the rollout thread draws ahead: the position as of the last trained step
            iterator, sched = self.consumed
        else:
            iterator, sched = self.iterator.state(), self.scheduler.state() if self.scheduler is not None else None
        extra = {"iterator": iterator, "sampled_tokens": self.sampled_tokens}
        if self.scheduler is not None:
            extra["scheduler"] = sched
        if self.lora:
            extra["lora_base"] = {"name_or_path": self.cfg.model.name_or_path, "fingerprint": self.base_fingerprint}
        return extra

    def set_prompts(self, examples: list[data_lib.Example]) -> None:
        """The prompts this trainer draws from (its iterator indexes them), encoded, and the shapes they fix: the train
        step's prompt width and the packed widths' ladders (`padding`: with the prompt width fixed, one program per
        run in practice). ConfigError when the longest prompt leaves no room for ``rollout.max_new_tokens``."""
        cfg = self.cfg
        self.encoded = data_lib.encode_prompts(self.tokenizer, examples, cfg.data)
        longest = max(len(x) for x in self.encoded)
        if longest + cfg.rollout.max_new_tokens > self.model_config.max_position_embeddings:
            raise config_lib.ConfigError(
                f"the longest prompt ({longest} tokens) + rollout.max_new_tokens ({cfg.rollout.max_new_tokens}) "
                f"exceeds the model's context ({self.model_config.max_position_embeddings}); lower "
                "data.max_prompt_tokens or rollout.max_new_tokens")
        r = cfg.rollout
        # the engine's first admission (its slots rounded up to the mesh's batch shards, as the driver rounds them)
        rm, p = self.rollout_mesh, r.prompts_per_step
        slots = p if r.engine == "static" else rollout_engine.split_slots(r.slots or p, rm)
        self.shapes = step_batch_lib.StepShapes.for_prompts(
            [len(x) for x in self.encoded], r.prompts_per_step, slots, cfg.algo, self.perf, self.mesh,
            r.max_new_tokens, self.pad_id)
        self.prompt_width, self.ladders = self.shapes.prompt_width, self.shapes.ladders
        self.examples = examples

    def saved_state(self) -> ts.TrainState:
        """What a checkpoint holds: the train state, with only the adapters of a LoRA run's params (the frozen base
        is reloaded from ``model.name_or_path`` and checked against `checkpoint_extra`'s fingerprint)."""
        return self.state.replace(params=lora.trainable(self.state.params))

    # -- one RL step -------------------------------------------------------------------------------------------
    def sample(self, indices: list[int], key: jax.Array) -> Rollout:
        """One round: a group for each prompt of ``indices`` (the rollout driver; on several processes with rollout
        devices of their own, each host drives its share: `async_rollout.sample_across_processes`)."""
        prompt_ids = [self.encoded[i] for i in indices]
        if not self.use_engine:  # (`async_rollout.process_groups`)
            return self.score(indices, async_rollout.sample_across_processes(self, prompt_ids, key))
        groups, stats = self.drive(prompt_ids, key)
        self.rollout_stats = stats.metrics()
        return self.score(indices, rollout_driver.completions(groups, range(len(indices))))

    @property
    def use_engine(self) -> bool:
        """Whether one rollout driver samples each round whole (continuous batching, streamed resampling, scheduling):
        on one device, on the learner's mesh (its slots split over the batch axes, `jaxgrpo.rollout.engine`; on
        several processes each reads the others' rows once per block, `driver.host_array`) and on rollout devices of
        its own in one process (``mesh.rollout``). Not on several processes with rollout devices of their own: there
        each host drives its share of a round's prompts (continuous batching within it) and the hosts swap the
        completions, so dynamic sampling and the schedule proceed in rounds."""
        return self.cfg.mesh.rollout == 0 or jax.process_count() == 1

    @property
    def prefill_attention(self) -> Kernel:
        """The rollout prefill's attention kernel: the run's resolved ``perf.attention``, as its train step's."""
        return ts.attention_kernel(self.perf)

    def sampler_params(self) -> Any:
        """The compute-dtype weights the rollout samples with: the version an asynchronous run's producer published
        for this step, else the current policy's."""
        if self.sampler_params_override is not None:
            return self.sampler_params_override
        return models.compute_params(self.model_config, self.state.params)

    def drive(self, prompt_ids: list[list[int]], key: jax.Array, num_samples: int | None = None, share: int = 1,
              **kw: Any) -> tuple[dict[int, rollout_driver.Group], rollout_driver.RunStats]:
        """The group driver (`jaxgrpo.rollout.driver`) over the current policy: groups of ``num_samples`` rows (default
        G) in as many slots as hold the run's ``slots`` x G rows (``share``: one of that many hosts sampling a round
        between them, each its ``1 / share`` of the slots). The run's packed-prefill ladder (sized for groups of G)
        applies to groups of G only: sub-groups admit more prompts at once than its cap was measured for."""
        r = self.cfg.rollout
        n = num_samples or r.group_size
        sp = SamplingParams(r.max_new_tokens, n, r.temperature, r.top_p, r.top_k, self.eos_token_ids)
        slots = None if r.engine == "static" else -(-(r.slots or r.prompts_per_step) * r.group_size // n // share)
        return rollout_driver.run(self.model_config, self.sampler_params(), prompt_ids, sp, key, slots=slots,
                                  block=r.decode_block, prompt_width=self.prompt_width, mesh=self.rollout_mesh,
                                  packed_ladder=self.ladders["engine"] if n == r.group_size else None,
                                  attention=self.prefill_attention, **kw)  # fmt: skip

    def score_rows(self, indices: list[int], sizes: Sequence[int], comp: sampling.Completions
                   ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Texts, rewards (DAPO's soft overlong punishment included) and validity of host-side completions, rows
        prompt-major: ``sizes[i]`` rows answer prompt ``indices[i]``."""
        mask = np.asarray(comp.mask)
        ids = [t[m].tolist() for t, m in zip(np.asarray(comp.tokens), mask)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        rows, sizes = [self.examples[i] for i, g in zip(indices, sizes) for _ in range(int(g))], [int(g) for g in sizes]
        if jax.process_count() > 1:  # each host scores its block of groups, and the hosts swap the scores
            rw, valid = async_rollout.score_across_processes(self, texts, rows, ids, sizes)
        else:
            rw, valid, _ = self.scorer(texts, rows, ids, group_sizes=sizes)  # a batched function: once per group
        if self.cfg.algo.overlong_buffer is not None:  # in tokens
            rw = rw + objectives.overlong_penalty(mask.sum(-1), self.cfg.rollout.max_new_tokens,
                                                  self.cfg.algo.overlong_buffer)
        return texts, np.asarray(rw), np.asarray(valid)

    def score(self, indices: list[int], comp: sampling.Completions) -> Rollout:
        """Rewards of host-side completions (prompt-major, G rows per prompt of ``indices``)."""
        g = self.cfg.rollout.group_size
        texts, rw, valid = self.score_rows(indices, [g] * len(indices), comp)
        shape = (len(indices), g)
        return Rollout([self.encoded[i] for i in indices], [self.examples[i] for i in indices], comp, texts,
                       rw.reshape(shape), valid.reshape(shape))

    def rollout(self, step: int) -> tuple[Rollout | mt_step.Scored, dict[str, float]]:
        """Samples the step's P groups (`jaxgrpo.dynamic_sampling.rollout`: with degenerate_groups=resample, DAPO's
        dynamic sampling; multi-turn: `jaxgrpo.multiturn_step.rollout`); the async rollout thread calls it too."""
        return (mt_step.rollout if self.multiturn is not None else dynamic_sampling.rollout)(self, step)

    def step(self, step: int) -> dict[str, float]:
        """One RL step; its metrics, with ``time/compiles`` and ``time/compile_s`` (XLA compilations on the step path
        in this step, their seconds) and, once the background precompiler runs, ``time/precompiled`` (programs it has
        compiled so far)."""
        before, seconds = self.compiles.step_path, self.compiles.step_path_s
        metrics = mt_step.train_step(self, step) if self.multiturn is not None else self.rl_step(step)
        metrics["time/compiles"] = float(self.compiles.step_path - before)
        metrics["time/compile_s"] = self.compiles.step_path_s - seconds
        if self.first_shapes is not None:  # after the first step: the other shapes, in the background
            pre = precompile if self.multiturn is None else multiturn_precompile
            self.precompiler = pre.start(self, *self.first_shapes)
            self.first_shapes = None
        if self.precompiler is not None:
            metrics["time/precompiled"] = float(self.precompiler.compiled)
        return metrics

    def take_rollout(self, step: int) -> tuple[Rollout | mt_step.Scored, dict[str, float]]:
        """Step ``step``'s rollout and its metrics: from the rollout thread, sampled ahead with lagged weights, when
        ``rollout.max_staleness`` or ``mesh.rollout`` is set (`jaxgrpo.async_rollout`, started on the first call);
        else sampled now (`rollout`)."""
        if self.cfg.rollout.max_staleness or self.cfg.mesh.rollout:
            if self.producer is None:
                self.producer = async_rollout.start(self, step)
            roll, extra, *self.consumed = self.producer.take(step)
            return roll, extra
        return self.rollout(step)

    def update(self, step: int, batch: ts.Batch, packed: int) -> dict[str, float]:
        """The train step on ``batch`` (with ``algo.kl_coef > 0`` the reference log-probs added first) at packed
        prompt width ``packed``; on the first step its shapes are kept for the background precompiler; the new
        weights go to the rollout thread, if any. Its metrics, as floats."""
        if self.cfg.algo.kl_coef > 0:
            ref = lora.split(self.state.params)[0] if self.lora else self.ref_params
            batch = batch.replace(ref_logprobs=self.ref_logprobs(ref, batch))
        self.state, metrics = self.step_fn(self.state, batch, packed_prompt_width=packed)
        if self.precompile_pending:  # the first step: the shapes the precompiler starts from
            self.precompile_pending = False
            self.first_shapes = (jax.tree.map(precompile.abstract, batch),
                                 (batch.rewards.shape[0], batch.completion_mask.shape[1], packed))
        if self.producer is not None:  # the next version, for the rollout thread
            self.producer.publish(step + 1, self.state.params)
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    def rl_step(self, step: int) -> dict[str, float]:
        """One single-turn RL step (`step`)."""
        t0 = time.perf_counter()
        roll, extra = self.take_rollout(step)
        t1 = time.perf_counter()
        # The prompt width is the run's (the data's longest prompt, rounded up); the completion width and the groups
        # are what this step sampled, on bounded ladders, and the packed prompt width climbs its ladder
        # (`jaxgrpo.step_batch`): a few programs per run.
        batch, packed, _, overrides = self.shapes.batch(roll, self.cfg.algo.overlong_filter)
        metrics = self.update(step, batch, packed)
        metrics.update(overrides)  # what reads the whole rollout, when groups were dropped from the batch
        t2 = time.perf_counter()
        if self.producer is not None:
            self.producer.mark("learner", step, t1, t2)
        comp = roll.completions
        lengths = np.asarray(comp.mask).sum(-1)
        real = lengths > 0  # a sampled row has at least one token; an adaptive schedule's padding rows have none
        metrics.update(extra)
        metrics["completion/len_mean"] = float(lengths[real].mean())
        metrics["completion/truncated_frac"] = float(np.asarray(comp.truncated).mean())
        metrics.update(objectives.overlong_metrics(lengths, np.asarray(comp.truncated), roll.valid,
                                                   self.cfg.rollout.max_new_tokens, self.cfg.algo.overlong_filter,
                                                   self.cfg.algo.overlong_buffer))
        metrics.update(diversity.diversity_metrics(comp.tokens, comp.mask, comp.entropy, self.cfg.rollout.group_size,
                                                   real))  # fmt: skip
        if self.producer is None:  # (the rollout thread puts its own in `extra`)
            metrics.update(self.scorer.take_stats())  # reward/timeouts, reward/invalid_frac, time/reward_s
        metrics["time/sample_s"] = t1 - t0
        metrics["time/train_s"] = t2 - t1
        metrics["throughput/tokens_per_s"] = float(lengths.sum()) / max(t2 - t0, 1e-9)
        if self.cfg.train.eval_every and (step + 1) % self.cfg.train.eval_every == 0:
            metrics.update(self.evaluate(step + 1))
        if self.retain_sets and self.cfg.train.retain_every and (step + 1) % self.cfg.train.retain_every == 0:
            metrics.update(self.retain(step + 1))
        g = self.cfg.rollout.group_size
        self.last_samples = ([f"{roll.examples[0].prompt} -> {t}" for t in roll.texts[:g]],
                             roll.rewards[0].tolist())
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        """The in-training evaluation of the policy (`jaxgrpo.in_training.evaluate_held_out`)."""
        return in_training.evaluate_held_out(self, step)

    def retain(self, step: int) -> dict[str, float]:
        """``retain/<name>/accuracy`` on each `train.retain` set (`jaxgrpo.in_training.retain_accuracy`)."""
        return in_training.retain_accuracy(self, step)


def check_prompt_count(cfg: config_lib.Config, num_examples: int) -> None:
    """ConfigError when the data set holds fewer prompts than one step takes (`rollout.prompts_per_step`): a step
    would repeat prompts; names the largest valid value to set. Notes (stderr): with dynamic sampling, when the
    rounds of one step can exhaust the data set (later rounds then draw prompts again); with a rollout schedule, when
    the run's steps draw at most one pass over the data set (the schedule reads prompts' earlier groups); with AVSPO,
    when ``algo.degenerate_groups`` takes out the only groups it changes."""
    p, a = cfg.rollout.prompts_per_step, cfg.algo
    if num_examples < p:
        parts = a.num_minibatches * a.grad_accum_steps * cfg.mesh.data * cfg.mesh.fsdp
        fit = num_examples // parts * parts
        fix = f"set rollout.prompts_per_step={fit}" if fit else f"use a data set of at least {parts} prompts"
        raise config_lib.ConfigError(
            f"the data set has {num_examples} prompts but rollout.prompts_per_step={p}: every step would repeat "
            f"prompts; {fix} (a multiple of {parts}, see algo.grad_accum_steps) or add data (data.num_examples)")
    if jax.process_index() != 0:
        return
    if a.degenerate_groups == "resample" and num_examples < p * a.resample_max_rounds:
        print(f"jaxgrpo: the data set has {num_examples} prompts, fewer than rollout.prompts_per_step × "
              f"algo.resample_max_rounds = {p * a.resample_max_rounds}: a step's later resampling rounds may draw "
              "prompts it already drew", file=sys.stderr)
    if a.estimator == "avspo" and a.degenerate_groups != "keep":  # AVSPO (He et al., 2026) acts on those groups only
        print(f"jaxgrpo: algo.estimator=avspo differs from grpo only on the degenerate groups, which "
              f"algo.degenerate_groups={a.degenerate_groups} takes out of the loss: this run trains as grpo would "
              "(degenerate_groups=keep lets AVSPO's virtual samples act)", file=sys.stderr)
    if cfg.rollout.schedule != "none" and cfg.train.steps * p <= num_examples:
        print(f"jaxgrpo: rollout.schedule={cfg.rollout.schedule} acts on a prompt's earlier groups, but "
              f"train.steps × rollout.prompts_per_step = {cfg.train.steps * p} draws at most one pass over the "
              f"{num_examples} prompts (more only through resampling rounds): few or none come back to be scheduled; "
              "fewer prompts (data.num_examples) or more steps make them recur", file=sys.stderr)


def run(cfg: config_lib.Config, run_dir: str | os.PathLike, *, allow_config_change: bool = False
        ) -> list[dict[str, float]]:
    """Trains to `cfg.train.steps` (or until `cfg.train.max_sampled_tokens` completion tokens were sampled, counting
    every resampling round), resuming from `run_dir` if it holds a checkpoint; returns this call's metrics.

    SIGTERM/SIGINT: the step in flight finishes, is checkpointed, and `checkpoint.Preempted` is raised (its
    ``exit_code`` is 143/130). A fatal `RewardError` first checkpoints the last completed step (the prompt iterator
    put back to its start), so the resumed run retries the failed step. `allow_config_change`: see `Trainer`."""
    trainer = Trainer(cfg, run_dir, allow_config_change=allow_config_change)
    stop = ckpt_lib.install_signal_handlers()
    try:
        logger = metrics_log.MetricsLogger(trainer.run_dir, tensorboard=cfg.log.tensorboard,
                                           progress_total=cfg.train.steps if cfg.log.progress else None,
                                           resume_step=trainer.start_step, wandb=cfg.log.wandb,
                                           wandb_project=cfg.log.wandb_project, wandb_entity=cfg.log.wandb_entity,
                                           wandb_config=config_lib.to_dict(cfg))
    except BaseException:
        stop.uninstall()
        trainer.close()
        raise
    try:
        return train_loop.loop(trainer, logger, stop)
    finally:
        stop.uninstall()
        logger.close()
        trainer.close()
