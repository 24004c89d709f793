# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The pieces of the GRPO train step (`train_step` composes them; formulas in its docstring): advantages, degeneracy
masks and global normalizers of a rollout (inside `shard_map`), its split into minibatches and micro-batches by whole
groups, and the loss and gradient of one minibatch with exact gradient accumulation."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgrpo import advantages as advantages_lib
from jaxgrpo import degeneracy, losses, models, objectives
from jaxgrpo import sharding as sharding_lib
from jaxgrpo.config_sections import AlgoConfig, PerfConfig
from jaxgrpo.degeneracy import DEGENERATE_MODES
from jaxgrpo.learner.batch import Batch, check_batch
from jaxgrpo.learner.logprobs import compute_logprobs
from jaxgrpo.learner.perf import attention_kernel, platform_of, resolve_perf
from jaxgrpo.losses import AGGREGATIONS
from jaxgrpo.models import lora

BATCH_AXES = sharding_lib.BATCH_AXES
Params = Any


def _validate(algo: AlgoConfig, perf: PerfConfig, temperature: float, mesh: Mesh | None) -> None:
    if algo.degenerate_groups not in DEGENERATE_MODES:
        raise ValueError(f"algo.degenerate_groups={algo.degenerate_groups!r}; choose one of {DEGENERATE_MODES}")
    if algo.estimator not in advantages_lib.ESTIMATORS:
        raise ValueError(f"algo.estimator={algo.estimator!r}; choose one of {advantages_lib.ESTIMATORS}")
    if algo.aggregation not in AGGREGATIONS:
        raise ValueError(f"algo.aggregation={algo.aggregation!r}; choose one of {AGGREGATIONS}")
    for name in ("num_iterations", "num_minibatches", "grad_accum_steps"):
        if int(getattr(algo, name)) < 1:
            raise ValueError(f"algo.{name} must be >= 1, got {getattr(algo, name)}")
    if perf.logprob_chunk < 0:
        raise ValueError(f"perf.logprob_chunk must be >= 0 (0 = automatic), got {perf.logprob_chunk}")
    if algo.kl_coef < 0:
        raise ValueError(f"algo.kl_coef must be >= 0, got {algo.kl_coef}")
    if algo.entropy_top_frac is not None and int(algo.grad_accum_steps) > 1 and algo.aggregation != "token-mean":
        # the micro-batches are weighted by their sequences before the top-ρ selection: not the unsplit loss
        raise ValueError(f"algo.entropy_top_frac with algo.aggregation={algo.aggregation} needs "
                         "algo.grad_accum_steps=1 (or token-mean): the accumulated loss would not be the batch's")
    try:
        objectives.validate_objective(algo.objective, algo.entropy_top_frac, algo.clip_cov_ratio, algo.clip_cov_lb,
                                      algo.clip_cov_ub, algo.kl_cov_ratio, algo.kl_cov_coef, algo.cispo_clip_low,
                                      algo.cispo_clip_high)  # fmt: skip
    except ValueError as e:
        raise ValueError(f"algo.{e}") from None
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0 (the rollout temperature), got {temperature!r}")
    if mesh is not None and tuple(mesh.axis_names) != sharding_lib.MESH_AXES:
        raise ValueError(
            f"mesh axes {tuple(mesh.axis_names)} != {sharding_lib.MESH_AXES}; build it with jaxgrpo.sharding.make_mesh"
        )


class StepParts:
    """The pieces of the train step for one (model, algo, mesh, temperature); all methods trace under jit."""

    def __init__(
        self,
        model_config: models.ModelConfig,
        algo: AlgoConfig,
        mesh: Mesh | None,
        temperature: float,
        perf: PerfConfig | None = None,
        *,
        top_k: int = 0,
        top_p: float = 1.0,
    ):
        perf = PerfConfig() if perf is None else perf
        _validate(algo, perf, temperature, mesh)
        self.config, self.algo, self.mesh, self.temperature = model_config, algo, mesh, float(temperature)
        self.top_k, self.top_p = top_k, top_p  # the sampler's truncation: log-probs of that distribution
        self.axis_name = BATCH_AXES if mesh is not None else None
        self.num_shards = 1 if mesh is None else int(mesh.shape["data"] * mesh.shape["fsdp"])
        self.perf, _ = resolve_perf(algo, perf, num_shards=self.num_shards, platform=platform_of(mesh),
                                   compute_dtype=model_config.dtype)
        self.nm, self.ga = int(algo.num_minibatches), int(algo.grad_accum_steps)
        self.splits = self.nm * self.ga
        self.drop_degenerate = algo.degenerate_groups in ("mask", "resample")
        # Sampler-mismatch correction: against the trainer's log-probs at the sampling parameters, taken from the
        # first update's own forward (stop-gradient) when that is the only update and nothing is masked up front,
        # else from a separate forward before the updates (`correct_sampler`).
        self.correction = losses.resolve_sampler_correction(algo.sampler_correction, model_config.dtype)
        self.cap = float(algo.sampler_correction_cap)
        self.old_forward = self.correction != "none" and (
            int(algo.num_iterations) * self.nm > 1 or self.correction.endswith("mask")
        )
        self.seq_normalized = algo.aggregation != "token-mean"
        # The estimator shares the degeneracy tolerances unless the config sets them explicitly.
        self.est_args = dict(algo.estimator_args)
        accepted = inspect.signature(getattr(advantages_lib, algo.estimator)).parameters
        for name, value in (("atol", algo.degenerate_atol), ("rtol", algo.degenerate_rtol)):
            if name in accepted and name not in self.est_args:
                self.est_args[name] = value

    # -- helpers
    def _shard_map(self, fn: Callable, in_specs: Any, out_specs: Any) -> Callable:
        if self.mesh is None:
            return fn
        return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs)

    def _constrain_rows(self, x: jax.Array, axis: int = 0) -> jax.Array:
        if self.mesh is None:
            return x
        spec = [None] * x.ndim
        spec[axis] = BATCH_AXES
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, PartitionSpec(*spec)))

    # -- 1. advantages, degeneracy, loss mask, global normalizers (inside shard_map)
    def prepare(self, batch: Batch) -> dict[str, jax.Array]:
        algo, S = self.algo, self.splits
        Pn, G = batch.rewards.shape

        def local(rewards, valid, completion_mask, action_mask, *truncated):
            p_local = rewards.shape[0]
            adv_PG = advantages_lib.compute(algo.estimator, rewards, valid, axis_name=self.axis_name, **self.est_args)
            diag = degeneracy.diagnostics(
                rewards, valid, adv_PG, atol=algo.degenerate_atol, rtol=algo.degenerate_rtol, axis_name=self.axis_name
            )
            degenerate_P = advantages_lib.degenerate_for(  # with pass_at_k, its no-signal groups too
                algo.estimator, rewards, valid, atol=algo.degenerate_atol, rtol=algo.degenerate_rtol,
                **algo.estimator_args)  # fmt: skip
            token_mask = completion_mask & action_mask & valid.reshape(-1)[:, None]  # tool tokens are context
            keep_B = jnp.ones((p_local * G,), bool)
            if self.drop_degenerate:
                keep_B = jnp.repeat(~degenerate_P, G)
            if truncated:  # DAPO overlong filtering: truncated completions leave the loss and its denominators
                keep_B = keep_B & ~truncated[0]
            loss_mask = token_mask & keep_B[:, None]
            # Global normalizers of every split (micro-batch): loss tokens and sequences with >= 1 loss token.
            split_B = jnp.repeat(jnp.arange(p_local) % S, G)
            tok_S = jax.ops.segment_sum(loss_mask.sum(-1).astype(jnp.float32), split_B, num_segments=S)
            seq_S = jax.ops.segment_sum(loss_mask.any(-1).astype(jnp.float32), split_B, num_segments=S)
            dropped = (degenerate_P & self.drop_degenerate).sum().astype(jnp.float32)
            if self.axis_name is not None:
                tok_S, seq_S, dropped = jax.lax.psum((tok_S, seq_S, dropped), self.axis_name)
            return adv_PG.astype(jnp.float32), token_mask, loss_mask, tok_S, seq_S, dropped, diag

        rows = PartitionSpec(BATCH_AXES)
        args = [batch.rewards.astype(jnp.float32), batch.valid.astype(bool), batch.completion_mask.astype(bool)]
        args += [args[2] if batch.action_mask is None else batch.action_mask.astype(bool)]
        args += [batch.truncated.astype(bool)] if algo.overlong_filter else []
        fn = self._shard_map(local, in_specs=(rows,) * len(args), out_specs=(rows, rows, rows, *[PartitionSpec()] * 4))
        adv, token_mask, loss_mask, tok_S, seq_S, dropped, diag = fn(*args)
        return dict(
            advantages=adv, token_mask=token_mask, loss_mask=loss_mask, tok=tok_S, seq=seq_S, dropped=dropped, diag=diag
        )

    # -- split a rollout into [nm, ga, rows...] by groups: group p -> split p % S (`split_groups`)
    def split(self, x: jax.Array, rows_per_group: int) -> jax.Array:
        y = split_groups(x, rows_per_group, self.splits)
        return self._constrain_rows(y.reshape(self.nm, self.ga, *y.shape[1:]), axis=2)

    def logprobs(
        self,
        params: Params,
        mb: dict[str, jax.Array],
        group_size: int,
        packed_width: int,
        remat: str,
    ) -> tuple[jax.Array, jax.Array]:
        """`compute_logprobs` of a micro-batch's rows with the step's perf switches."""
        rows = Batch(tokens=mb["tokens"], prompt_mask=mb["prompt_mask"], completion_mask=mb["completion_mask"],
                     rewards=jnp.zeros((0, 0)), valid=jnp.zeros((0, 0), bool), old_logprobs=mb["old_logprobs"])
        perf = self.perf
        kernel = attention_kernel(perf)
        return compute_logprobs(self.config, params, rows, self.temperature, perf.logprob_chunk, remat=remat,
                                matmul_backward=perf.matmul_backward, attention_kernel=kernel,
                                constrain_rows=self._constrain_rows if self.mesh is not None else None,
                                group_size=group_size if perf.prefix_sharing else 0,
                                packed_width=packed_width,  # used only with prefix sharing (group_size > 1)
                                pack_rows=self.num_shards, top_k=self.top_k,
                                top_p=self.top_p, lm_head=perf.lm_head, layer_loop=perf.layer_loop)  # fmt: skip

    # -- 3. one micro-batch: loss (weighted by its share of the global normalizer) and statistics
    def micro_loss(
        self,
        params: Params,
        mb: dict[str, jax.Array],
        group_size: int,
        packed_width: int = 0,
        key: jax.Array | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        algo = self.algo
        logp, entropy = self.logprobs(params, mb, group_size, packed_width, self.perf.remat)
        logp = self._constrain_rows(logp)
        max_tokens = algo.max_tokens if algo.max_tokens is not None else logp.shape[1]
        use_kl = algo.kl_coef > 0
        # the trainer's log-probs at the sampling parameters (exact in the first update, which alone is reported)
        train_old = mb["train_old"] if self.old_forward else jax.lax.stop_gradient(logp)
        sampler_old = mb["old_logprobs"]
        if self.correction != "none":  # the PPO ratio against the trainer's old policy, reweighted to the sampler's
            is_w, keep = losses.sampler_correction(train_old, sampler_old, mb["token_mask"], self.correction, self.cap)
            ratio_old = train_old
        else:
            is_w, keep, ratio_old = jnp.ones(logp.shape, jnp.float32), jnp.ones(logp.shape, bool), sampler_old

        use_ent, use_key = algo.entropy_top_frac is not None, algo.objective == "clip_cov"

        def local(logp, old, adv, mask, is_w, *extra):
            extra = list(extra)  # the optional trailing arguments, in order
            ref = extra.pop(0) if use_kl else None
            ent = extra.pop(0) if use_ent else None
            k = extra.pop(0) if use_key else None
            return losses.policy_loss(
                logp,
                old,
                adv,
                mask,
                clip_low=algo.clip_low,
                clip_high=algo.clip_high,
                dual_clip=algo.dual_clip,
                ratio_level=algo.ratio_level,
                aggregation=algo.aggregation,
                max_tokens=max_tokens,
                ref_logp=ref,
                kl_coef=algo.kl_coef,
                kl_estimator=algo.kl_estimator,
                axis_name=self.axis_name,
                is_weights=is_w,
                **self.objective_kw(ent, k),
            )

        args = [logp, ratio_old, mb["advantages"], mb["loss_mask"], is_w] + ([mb["ref_logprobs"]] if use_kl else [])
        args += [self._constrain_rows(entropy)] if use_ent else []  # the learner's own entropies (constants)
        rows = PartitionSpec(BATCH_AXES)
        scalar = PartitionSpec()
        specs = [rows] * len(args)
        if use_key:  # Clip-Cov's random subset: one replicated key per micro-batch
            args, specs = args + [jax.random.key(0) if key is None else key], specs + [scalar]
        loss, pm = self._shard_map(local, in_specs=tuple(specs), out_specs=(scalar, scalar))(*args)
        num, den = (mb["seq"], mb["seq_total"]) if self.seq_normalized else (mb["tok"], mb["tok_total"])
        w = num / jnp.maximum(den, 1.0)  # this micro-batch's share of the minibatch normalizer
        tok_share = mb["tok"] / jnp.maximum(mb["tok_total"], 1.0)
        # First-pass statistics as sums over the valid completion tokens (GSPMD reduces them globally).
        tm = mb["token_mask"]
        diff = jnp.where(tm, logp - mb["old_logprobs"], 0.0)
        corrected = tm & (~keep | (is_w >= self.cap))  # masked, or weight truncated at the cap
        stats = {
            "sampler_kl_sum": jnp.sum(jnp.where(tm, sampler_old - train_old, 0.0)),
            "corrected_sum": jnp.sum(corrected).astype(jnp.float32),
            "entropy_sum": jnp.sum(jnp.where(tm, entropy, 0.0)),
            "abs_diff_sum": jnp.sum(jnp.abs(diff)),
            "abs_diff_max": jnp.max(jnp.abs(diff)),
            "exp_diff_sum": jnp.sum(jnp.where(tm, jnp.exp(jnp.clip(diff, -20.0, 20.0)), 0.0)),
            "valid_tokens": jnp.sum(tm).astype(jnp.float32),
        }
        stats = jax.lax.stop_gradient(stats)
        pm = {k: jnp.asarray(v, jnp.float32) for k, v in pm.items()}
        return loss * w, dict(policy=pm, w=w, tok=mb["tok"], tok_share=tok_share, stats=stats)

    def objective_kw(self, entropy: jax.Array | None, key: jax.Array | None) -> dict[str, Any]:
        """`losses.policy_loss`'s objective keywords from the algo config."""
        a = self.algo
        return dict(objective=a.objective, entropy=entropy, entropy_top_frac=a.entropy_top_frac,
                    cispo_clip_low=a.cispo_clip_low, cispo_clip_high=a.cispo_clip_high, clip_cov_ratio=a.clip_cov_ratio,
                    clip_cov_lb=a.clip_cov_lb, clip_cov_ub=a.clip_cov_ub, kl_cov_ratio=a.kl_cov_ratio,
                    kl_cov_coef=a.kl_cov_coef, key=key)  # fmt: skip

    @staticmethod
    def _combine(pms: dict[str, jax.Array], w: jax.Array, tok: jax.Array, tok_share: jax.Array) -> dict:
        """Combine per-micro-batch policy_loss metrics ``[ga]`` into the values of the whole minibatch.

        pg_loss / kl: weighted by the normaliser share ``w`` (exact); token means: by the token share (exact);
        ratio extremes: over micro-batches holding loss tokens; counts are re-derived by the caller, not kept.
        """
        out = {}
        has = tok > 0
        for k, v in pms.items():
            if k in ("tokens", "sequences"):
                continue
            if k.endswith("max"):
                out[k] = jnp.where(has.any(), jnp.max(jnp.where(has, v, -jnp.inf)), 0.0)
            elif k.endswith("min"):
                out[k] = jnp.where(has.any(), jnp.min(jnp.where(has, v, jnp.inf)), 0.0)
            elif k in ("pg_loss", "kl"):
                out[k] = jnp.sum(w * v)
            else:
                out[k] = jnp.sum(tok_share * v)
        return out

    # -- gradient of one minibatch (grad accumulation over its micro-batches)
    def minibatch_grad(
        self,
        params: Params,
        mbs: dict[str, jax.Array],
        group_size: int,
        packed_width: int = 0,
        key: jax.Array | None = None,
    ) -> tuple[jax.Array, Params, dict]:
        """``key``: the randomness of this update's loss (Clip-Cov), split over its micro-batches; None = key(0)."""
        # the gradient of the trainable part only (a LoRA run's adapters; the frozen base is a constant here)
        train = lora.trainable(params)
        grad_fn = jax.value_and_grad(
            lambda t, mb, k: self.micro_loss(lora.with_trainable(params, t), mb, group_size, packed_width, k),
            has_aux=True,
        )
        if self.algo.objective != "clip_cov":
            key = None
        elif key is None:
            key = jax.random.key(0)
        if self.ga == 1:
            first = jax.tree.map(lambda x: x[0], mbs)
            (loss, aux), grads = grad_fn(train, first, key)
            aux = jax.tree.map(lambda x: x[None], aux)
        else:

            def body(acc, mb_k):
                (loss, aux), g = grad_fn(train, *mb_k)
                acc = jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc, g)
                return acc, (loss, aux)

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), train)
            keys = None if key is None else jax.random.split(key, self.ga)
            grads, (loss, aux) = jax.lax.scan(body, zeros, (mbs, keys))
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, train)
            loss = jnp.sum(loss)
        metrics = self._combine(aux["policy"], aux["w"], aux["tok"], aux["tok_share"])
        stats = {k: (jnp.max(v) if k.endswith("max") else jnp.sum(v)) for k, v in aux["stats"].items()}
        return jnp.sum(loss), grads, dict(metrics=metrics, stats=stats)

    def split_batch(self, batch: Batch, prep: dict[str, jax.Array]) -> dict[str, jax.Array]:
        G = batch.rewards.shape[1]
        rows = {
            "tokens": batch.tokens,
            "prompt_mask": batch.prompt_mask.astype(bool),
            "completion_mask": batch.completion_mask.astype(bool),
            "old_logprobs": batch.old_logprobs.astype(jnp.float32),
            "advantages": prep["advantages"].reshape(-1),
            "token_mask": prep["token_mask"],
            "loss_mask": prep["loss_mask"],
        }
        if self.algo.kl_coef > 0:
            rows["ref_logprobs"] = batch.ref_logprobs.astype(jnp.float32)
        out = {k: self.split(self._constrain_rows(v), G) for k, v in rows.items()}
        return dict(out, **_normalizers(prep["tok"].reshape(self.nm, self.ga), prep["seq"].reshape(self.nm, self.ga)))

    def correct_sampler(
        self,
        params: Params,
        split: dict[str, jax.Array],
        group_size: int,
        packed_width: int = 0,
    ) -> dict[str, jax.Array]:
        """With `old_forward`: the trainer's log-probs at the sampling parameters (a forward without gradient, one
        micro-batch at a time), as ``split["train_old"]``; for the masking modes the dropped tokens leave
        ``loss_mask`` and the global normalizers are recounted (as for masked degenerate groups)."""
        if not self.old_forward:
            return split
        params = jax.lax.stop_gradient(params)
        forward = lambda mb: self.logprobs(params, mb, group_size, packed_width, "none")[0]  # noqa: E731

        keys = ("tokens", "prompt_mask", "completion_mask", "old_logprobs")
        flat = {k: split[k].reshape(self.splits, *split[k].shape[2:]) for k in keys}
        train_old = jax.lax.map(forward, flat).reshape(split["old_logprobs"].shape)
        out = dict(split, train_old=self._constrain_rows(train_old, axis=2))
        if self.correction.endswith("mask"):
            _, keep = losses.sampler_correction(train_old, split["old_logprobs"], split["token_mask"],
                                                self.correction, self.cap)  # fmt: skip
            loss_mask = split["loss_mask"] & keep
            tok = jnp.sum(loss_mask, axis=(2, 3)).astype(jnp.float32)
            seq = jnp.sum(jnp.any(loss_mask, axis=3), axis=2).astype(jnp.float32)
            out.update(loss_mask=loss_mask, **_normalizers(tok, seq))
        return out


def split_groups(x: jax.Array, rows_per_group: int, splits: int) -> jax.Array:
    """Prompt-major rows ``[groups * rows_per_group, ...]`` split by whole groups, ``[splits, rows / splits, ...]``:
    group p goes to split ``p % splits`` (with the groups sharded contiguously over the batch axes and each shard's
    count a multiple of ``splits``, every split takes its rows from every shard: no row changes device)."""
    groups = x.shape[0] // rows_per_group
    y = x.reshape(groups // splits, splits, rows_per_group, *x.shape[1:])
    return jnp.moveaxis(y, 1, 0).reshape(splits, (groups // splits) * rows_per_group, *x.shape[1:])


def join_groups(y: jax.Array, rows_per_group: int) -> jax.Array:
    """The inverse of `split_groups`: ``[splits, rows / splits, ...]`` back to the prompt-major rows."""
    splits, n = y.shape[:2]
    z = y.reshape(splits, n // rows_per_group, rows_per_group, *y.shape[2:])
    return jnp.moveaxis(z, 0, 1).reshape(splits * n, *y.shape[2:])


def _normalizers(tok: jax.Array, seq: jax.Array) -> dict[str, jax.Array]:
    """Loss tokens and sequences of each micro-batch ``[nm, ga]``, and their totals over each minibatch."""
    return dict(tok=tok, seq=seq, tok_total=jnp.broadcast_to(tok.sum(1, keepdims=True), tok.shape),
                seq_total=jnp.broadcast_to(seq.sum(1, keepdims=True), seq.shape))  # fmt: skip


def first_minibatch_gradient(
    step: StepParts, params: Params, batch: Batch, packed_width: int = 0
) -> tuple[jax.Array, Params, dict]:
    Pn, G = check_batch(batch, step.algo, step.num_shards)
    prep = step.prepare(batch)
    split = step.correct_sampler(params, step.split_batch(batch, prep), G, packed_width)
    mbs = jax.tree.map(lambda x: x[0], split)
    return step.minibatch_grad(params, mbs, G, packed_width)
