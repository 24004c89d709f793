# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The GRPO train step: one jitted, pure function ``step_fn(state, batch) -> (state, metrics)``.

Inside one `jax.jit` (state donated), for one rollout of P prompts × G samples:

1. **Advantages and degeneracy, per group, inside `shard_map`.** ``A = advantages.compute(algo.estimator, rewards,
   valid, axis_name=BATCH_AXES, **algo.estimator_args)`` on the ``[P, G]`` rewards (sharded by groups; a batch-wide
   statistic such as ``scale="batch"`` is ``psum``'ed over the batch axes), and
   ``D = degeneracy.degenerate_mask(rewards, valid, atol, rtol)`` ``[P]``, and `degeneracy.diagnostics` (its
   batch-wide counts psum'ed too). Per-token loss mask:
   ``m = completion_mask ∧ valid``, and for ``degenerate_groups="mask"`` (and ``"resample"``) also ``∧ ¬D``.
   The global normalizers of every optimizer step (token counts ``Σ m`` and the counts of sequences with ≥ 1 loss
   token, for each micro-batch) are ``psum``'ed here too, once, up front.
2. **Log-probs** (`compute_logprobs`): `models.hidden_states` on the whole rows — or, with
   ``algo.prefix_sharing``, `jaxgrpo.models.prefix.prefix_shared_predictors`, which encodes each group's prompt
   once for its G completions (same values and gradients; the prompt of group p is read from row ``p*G``, which the
   prompt-major, left-padded `Batch` layout makes identical to the group's other rows; with ``packed_prompt_width``
   the prompts run packed end to end, so no decoder work is spent on their padding) — then only the hidden states
   that predict completion tokens (positions ``Tp-1 … T-2``) go through the LM head, in sequence chunks under `lax.map`
   with a hand-written backward, ``log_softmax(h·W / temperature)`` in float32: no float32 ``[B, T, V]`` tensor
   exists, and prompt positions cost no LM-head work. With ``batch.projections`` (the sampler's record, one update
   per rollout) the completion tokens' dense projections are taken as given in the forward, not recomputed.
3. **Loss** (`losses.policy_loss` inside `shard_map`, ``axis_name=BATCH_AXES``): the clipped surrogate with every
   algo option, the importance ratio ``ρ = exp(logp − old_logprobs)`` taken against the *sampler's* log-probs (kept
   for all μ iterations, so ``ρ ≠ 1`` from the second iteration on), plus ``kl_coef · KL(π‖π_ref)`` only when
   ``kl_coef > 0`` (then ``batch.ref_logprobs`` is required; with ``kl_coef = 0`` the trainer skips the reference
   forward and passes ``None``).
4. **Optimizer steps.** The rollout is split by whole groups into ``S = num_minibatches × grad_accum_steps`` parts
   (group ``p`` goes to part ``p mod S``; part ``s`` is micro-batch ``s mod grad_accum_steps`` of minibatch
   ``s // grad_accum_steps``). ``lax.scan`` runs ``μ × num_minibatches`` optimizer updates (μ =
   ``num_iterations``); each update accumulates its micro-batch gradients with an inner ``lax.scan``.

**Gradient accumulation keeps the unsplit loss exactly.** With aggregation denominator ``N`` (tokens for
``token-mean``; sequences with ≥ 1 loss token for the ``seq-mean-*`` modes, × ``max_tokens`` for
``seq-mean-token-sum-norm``, a constant that cancels), `policy_loss` on micro-batch k returns ``L_k = S_k / N_k``
(``S_k`` its numerator). The minibatch loss is ``L = Σ_k S_k / N = Σ_k (N_k / N) · L_k``, so each micro-batch loss
is weighted by ``w_k = N_k / N`` with the global ``N`` counted up front — not the mean of per-micro-batch averages.

**Degenerate groups** (all valid rewards equal, `degeneracy.degenerate_mask`):
``keep`` — they stay in the loss mask and so in every denominator, with the estimator's advantage (exactly 0 for
grpo / dr_grpo / rloo / max_rl; sign, pass_at_k and avspo may give them a signal), as TRL, verl and Tunix do;
``mask`` — their tokens leave the loss mask, hence every denominator, so informative groups are not diluted. For
token-mean with a zero-advantage estimator and ``kl_coef = 0``: ``loss_mask = loss_keep · N_all / N_informative``;
``resample`` — DAPO-style dynamic sampling: the trainer replaces degenerate groups before the step; the step treats
any that remain (resampling rounds exhausted) exactly as ``mask`` does, so they never dilute the batch.

**Sharding.** ``mesh`` (`jaxgrpo.sharding.make_mesh`) has axes ``(data, fsdp, tensor)``; parameters are placed by
their logical axes (`jaxgrpo.sharding.param_shardings`, GSPMD inserts the collectives of the model); the batch is
sharded by whole groups over ``BATCH_AXES = ("data", "fsdp")`` — fsdp is ZeRO-3 data parallelism, so it carries
batch rows too. P must be a multiple of ``S × data × fsdp``. Multi-host: call ``jax.distributed.initialize()``
first, build the global mesh, and turn each process's rows into global arrays with `global_batch`.

**Schedules.** The learning rate is a function of the rollout step (``TrainState.step``), not of the optimizer
update count: all ``μ × num_minibatches`` updates of one step use ``schedule(step)``; warmup is linear from
``lr / W`` at step 0 to ``lr`` at step ``W − 1``, then constant or cosine down to ``min_lr_ratio · lr`` at
``total_steps`` (SGDR cosine, Loshchilov & Hutter 2017). AdamW (Loshchilov & Hutter 2019) decays every weight
except norms and biases.

**Metrics** (float32 scalars): every `degeneracy.diagnostics` key; ``loss``, ``pg_loss``, ``kl`` and the
`policy_loss` statistics (clip fractions, ratio statistics, ``approx_kl_old``) averaged over the step's optimizer
updates (``*/max`` and ``*/min`` are the extremes); ``entropy`` (mean over the valid completion tokens of the first
iteration, each minibatch measured at the params that train on it); ``mismatch/abs_diff_mean``,
``mismatch/abs_diff_max`` (of ``|logp_trainer − logp_sampler|``) and ``mismatch/ratio_mean`` (mean
``exp(logp_trainer − logp_sampler)``, log-ratio clamped to ±20 as in `losses`) over the valid tokens of the first
update, before any parameter change; ``grad_norm`` (before clipping, averaged over updates), ``lr``,
``tokens/prompt``, ``tokens/completion``, ``tokens/loss`` and ``sequences/loss`` (what the loss normalises by),
``degeneracy/masked_groups`` (groups dropped from the loss).

Parameters keep their dtype: with bfloat16 params, micro-batch gradients are accumulated in float32 and cast
back, and AdamW runs on bfloat16 params and moments (no float32 master copy).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgrpo import advantages as advantages_lib
from jaxgrpo import degeneracy, losses, models, padding
from jaxgrpo import sharding as sharding_lib
from jaxgrpo.config import AlgoConfig, OptimConfig, PerfConfig
from jaxgrpo.degeneracy import DEGENERATE_MODES
from jaxgrpo.logprobs import compute_logprobs
from jaxgrpo.losses import AGGREGATIONS
from jaxgrpo.optim import make_optimizer

BATCH_AXES = sharding_lib.BATCH_AXES

Params = Any


@flax.struct.dataclass
class TrainState:
    """Everything one train step reads and writes: params, optax state, rollout step counter, PRNG key."""

    params: Params
    opt_state: optax.OptState
    step: jax.Array  # int32 scalar: rollout steps done (drives the learning-rate schedule)
    rng: jax.Array  # advanced every step; for stochastic extensions of the step (none in the GRPO loss itself)


@flax.struct.dataclass
class Batch:
    """One rollout, prompt-major: rows ``p*G .. p*G+G-1`` are the G samples of prompt p (B = P*G).

    tokens ``[B, Tp+Tc]`` int32: the prompt left-padded to Tp, then the completion right-padded to Tc.
    prompt_mask ``[B, Tp]`` / completion_mask ``[B, Tc]`` bool: real tokens (completion: up to and including EOS).
    rewards ``[P, G]`` float32; valid ``[P, G]`` bool (False = sample dropped, e.g. a failed reward).
    old_logprobs ``[B, Tc]`` float32: the sampler's per-token log-probs (temperature-scaled), 0 where masked.
    ref_logprobs ``[B, Tc]`` float32 or None: reference-policy log-probs, required iff ``kl_coef > 0``.
    projections: None, or the sampler's recorded dense-projection outputs of the completion tokens
    (`sampling.Completions.projections`: name -> ``[L, B, Tc-1, out]``), valid only for the parameters that sampled
    this rollout. With prefix sharing and one optimizer update per rollout (``num_iterations = num_minibatches =
    grad_accum_steps = 1``, no mesh) the step's forward then takes those products as given instead of recomputing
    them (`transformer._matmul_given`: same values up to float rounding, same backward); ~1/5 of the step's FLOPs.
    """

    tokens: jax.Array
    prompt_mask: jax.Array
    completion_mask: jax.Array
    rewards: jax.Array
    valid: jax.Array
    old_logprobs: jax.Array
    ref_logprobs: jax.Array | None = None
    projections: dict[str, jax.Array] | None = None


# ----------------------------------------------------------------------------------------------- validation
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
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0 (the rollout temperature), got {temperature!r}")
    if mesh is not None and tuple(mesh.axis_names) != sharding_lib.MESH_AXES:
        raise ValueError(
            f"mesh axes {tuple(mesh.axis_names)} != {sharding_lib.MESH_AXES}; build it with jaxgrpo.sharding.make_mesh"
        )


def resolve_perf(algo: AlgoConfig, perf: PerfConfig, *, num_shards: int, platform: str) -> tuple[PerfConfig, list[str]]:
    """The performance switches that apply to this run, and one note per requested switch that does not.

    The one place that decides them: ``perf.reuse_projections`` (the sampler's recorded projections stand for the
    step's forward only with prefix sharing, one optimizer update per rollout -- at the parameters that sampled it --
    and one batch shard; the trainer also drops it with ``remat="full"``, which trades that memory away, and with
    dynamic sampling, whose merged rounds carry no record); ``perf.prompt_packing`` (needs prefix sharing);
    ``perf.matmul_backward="auto"`` (explicit on ``platform == "cpu"``, XLA's own elsewhere)."""
    notes, changes = [], {}
    updates = algo.num_iterations * algo.num_minibatches * algo.grad_accum_steps
    if perf.reuse_projections:
        why = [text for cond, text in (
            (not perf.prefix_sharing, "perf.prefix_sharing=false"),
            (updates != 1, f"{updates} optimizer updates per rollout (num_iterations x num_minibatches x "
                           "grad_accum_steps; the record holds for the sampling parameters only)"),
            (num_shards != 1, f"{num_shards} batch shards (the sampler records unsharded)"),
            (perf.remat == "full", 'perf.remat="full" (it trades this memory away)'),
            (algo.degenerate_groups == "resample", "algo.degenerate_groups=resample (merged rounds carry no record)"),
        ) if cond]  # fmt: skip
        if why:
            changes["reuse_projections"] = False
            notes.append(f"perf.reuse_projections=true does not apply: {'; '.join(why)}; recomputing the projections")
    if perf.prompt_packing and not perf.prefix_sharing:
        changes["prompt_packing"] = False
        notes.append("perf.prompt_packing=true does not apply: it packs the shared prompts of perf.prefix_sharing")
    if perf.matmul_backward == "auto":
        changes["matmul_backward"] = "explicit" if platform == "cpu" else "xla"
    return dataclasses.replace(perf, **changes), notes


def _platform(mesh: Mesh | None) -> str:
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def _check_batch(batch: Batch, algo: AlgoConfig, perf: PerfConfig, num_shards: int) -> tuple[int, int]:
    """Static shape checks at trace time; returns (P, G)."""
    if batch.rewards.ndim != 2:
        raise ValueError(f"rewards must be [P, G], got shape {batch.rewards.shape}")
    Pn, G = batch.rewards.shape
    B, Tp = batch.prompt_mask.shape
    Tc = batch.completion_mask.shape[1]
    if B != Pn * G:
        raise ValueError(f"batch has {B} rows but rewards are [P={Pn}, G={G}]: rows must be P*G, prompt-major")
    expected = {"tokens": (B, Tp + Tc), "completion_mask": (B, Tc), "valid": (Pn, G), "old_logprobs": (B, Tc)}
    for name, shape in expected.items():
        if getattr(batch, name).shape != shape:
            raise ValueError(f"batch.{name} has shape {getattr(batch, name).shape}, expected {shape}")
    if batch.projections is not None:
        _, notes = resolve_perf(algo, dataclasses.replace(perf, reuse_projections=True), num_shards=num_shards,
                                platform="any")  # fmt: skip
        if any(n.startswith("perf.reuse_projections") for n in notes):
            raise ValueError(f"batch.projections given but {notes[0]}; pass projections=None")
        for name, x in batch.projections.items():
            if x.ndim != 4 or x.shape[1:3] != (B, Tc - 1):
                raise ValueError(f"batch.projections[{name!r}] has shape {x.shape}, expected [L, {B}, {Tc - 1}, out]")
    if algo.kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("algo.kl_coef > 0 needs batch.ref_logprobs (compute_logprobs with the reference params)")
        if batch.ref_logprobs.shape != (B, Tc):
            raise ValueError(f"batch.ref_logprobs has shape {batch.ref_logprobs.shape}, expected {(B, Tc)}")
    elif batch.ref_logprobs is not None:
        raise ValueError("batch.ref_logprobs given but algo.kl_coef == 0: skip the reference forward and pass None")
    splits = algo.num_minibatches * algo.grad_accum_steps
    if Pn % (splits * num_shards):
        raise ValueError(
            f"P={Pn} prompts cannot be split into num_minibatches*grad_accum_steps={splits} parts of whole groups "
            f"on {num_shards} batch shards (data*fsdp); make P a multiple of {splits * num_shards}"
        )
    return Pn, G


# ----------------------------------------------------------------------------------------------- the step
class _Step:
    """The pieces of the train step for one (model, algo, mesh, temperature); all methods trace under jit."""

    def __init__(
        self,
        model_config: models.ModelConfig,
        algo: AlgoConfig,
        mesh: Mesh | None,
        temperature: float,
        perf: PerfConfig | None = None,
    ):
        perf = PerfConfig() if perf is None else perf
        _validate(algo, perf, temperature, mesh)
        self.config, self.algo, self.mesh, self.temperature = model_config, algo, mesh, float(temperature)
        self.axis_name = BATCH_AXES if mesh is not None else None
        self.num_shards = 1 if mesh is None else int(mesh.shape["data"] * mesh.shape["fsdp"])
        self.perf, _ = resolve_perf(algo, perf, num_shards=self.num_shards, platform=_platform(mesh))
        self.nm, self.ga = int(algo.num_minibatches), int(algo.grad_accum_steps)
        self.splits = self.nm * self.ga
        self.drop_degenerate = algo.degenerate_groups in ("mask", "resample")
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

        def local(rewards, valid, completion_mask):
            p_local = rewards.shape[0]
            adv_PG = advantages_lib.compute(algo.estimator, rewards, valid, axis_name=self.axis_name, **self.est_args)
            diag = degeneracy.diagnostics(
                rewards, valid, adv_PG, atol=algo.degenerate_atol, rtol=algo.degenerate_rtol, axis_name=self.axis_name
            )
            degenerate_P = degeneracy.degenerate_mask(
                rewards, valid, atol=algo.degenerate_atol, rtol=algo.degenerate_rtol
            )
            token_mask = completion_mask & valid.reshape(-1)[:, None]
            keep_B = jnp.ones((p_local * G,), bool)
            if self.drop_degenerate:
                keep_B = jnp.repeat(~degenerate_P, G)
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
        fn = self._shard_map(local, in_specs=(rows, rows, rows), out_specs=(rows, rows, rows, *[PartitionSpec()] * 4))
        adv, token_mask, loss_mask, tok_S, seq_S, dropped, diag = fn(
            batch.rewards.astype(jnp.float32), batch.valid.astype(bool), batch.completion_mask.astype(bool)
        )
        return dict(
            advantages=adv, token_mask=token_mask, loss_mask=loss_mask, tok=tok_S, seq=seq_S, dropped=dropped, diag=diag
        )

    # -- split a rollout into [nm, ga, rows...] by groups: group p -> split p % S
    def split(self, x: jax.Array, rows_per_group: int) -> jax.Array:
        S = self.splits
        groups = x.shape[0] // rows_per_group
        y = x.reshape(groups // S, S, rows_per_group, *x.shape[1:])
        y = jnp.moveaxis(y, 1, 0).reshape(self.nm, self.ga, (groups // S) * rows_per_group, *x.shape[1:])
        return self._constrain_rows(y, axis=2)

    # -- 3. one micro-batch: loss (weighted by its share of the global normalizer) and statistics
    def micro_loss(
        self,
        params: Params,
        mb: dict[str, jax.Array],
        group_size: int,
        packed_width: int = 0,
        projections: dict[str, jax.Array] | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        algo = self.algo
        batch = Batch(
            tokens=mb["tokens"],
            prompt_mask=mb["prompt_mask"],
            completion_mask=mb["completion_mask"],
            rewards=jnp.zeros((0, 0)),  # unused by compute_logprobs
            valid=jnp.zeros((0, 0), bool),
            old_logprobs=mb["old_logprobs"],
        )
        logp, entropy = compute_logprobs(
            self.config,
            params,
            batch,
            self.temperature,
            self.perf.logprob_chunk,
            remat=self.perf.remat,
            matmul_backward=self.perf.matmul_backward,
            group_size=group_size if self.perf.prefix_sharing else 0,
            packed_width=packed_width,  # used only with prefix sharing (group_size > 1)
            pack_rows=self.num_shards,
            projections=projections,
        )
        logp = self._constrain_rows(logp)
        max_tokens = algo.max_tokens if algo.max_tokens is not None else logp.shape[1]
        use_kl = algo.kl_coef > 0

        def local(logp, old, adv, mask, *ref):
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
                ref_logp=ref[0] if use_kl else None,
                kl_coef=algo.kl_coef,
                kl_estimator=algo.kl_estimator,
                axis_name=self.axis_name,
            )

        args = [logp, mb["old_logprobs"], mb["advantages"], mb["loss_mask"]] + ([mb["ref_logprobs"]] if use_kl else [])
        rows = PartitionSpec(BATCH_AXES)
        scalar = PartitionSpec()
        loss, pm = self._shard_map(local, in_specs=tuple(rows for _ in args), out_specs=(scalar, scalar))(*args)
        num, den = (mb["seq"], mb["seq_total"]) if self.seq_normalized else (mb["tok"], mb["tok_total"])
        w = num / jnp.maximum(den, 1.0)  # this micro-batch's share of the minibatch normalizer
        tok_share = mb["tok"] / jnp.maximum(mb["tok_total"], 1.0)
        # First-pass statistics as sums over the valid completion tokens (GSPMD reduces them globally).
        tm = mb["token_mask"]
        diff = jnp.where(tm, logp - mb["old_logprobs"], 0.0)
        stats = {
            "entropy_sum": jnp.sum(jnp.where(tm, entropy, 0.0)),
            "abs_diff_sum": jnp.sum(jnp.abs(diff)),
            "abs_diff_max": jnp.max(jnp.abs(diff)),
            "exp_diff_sum": jnp.sum(jnp.where(tm, jnp.exp(jnp.clip(diff, -20.0, 20.0)), 0.0)),
            "valid_tokens": jnp.sum(tm).astype(jnp.float32),
        }
        stats = jax.lax.stop_gradient(stats)
        pm = {k: jnp.asarray(v, jnp.float32) for k, v in pm.items()}
        return loss * w, dict(policy=pm, w=w, tok=mb["tok"], tok_share=tok_share, stats=stats)

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
        projections: dict[str, jax.Array] | None = None,
    ) -> tuple[jax.Array, Params, dict]:
        grad_fn = jax.value_and_grad(
            lambda p, mb: self.micro_loss(p, mb, group_size, packed_width, projections), has_aux=True
        )
        if self.ga == 1:
            first = jax.tree.map(lambda x: x[0], mbs)
            (loss, aux), grads = grad_fn(params, first)
            aux = jax.tree.map(lambda x: x[None], aux)
        else:

            def body(acc, mb):
                (loss, aux), g = grad_fn(params, mb)
                acc = jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc, g)
                return acc, (loss, aux)

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
            grads, (loss, aux) = jax.lax.scan(body, zeros, mbs)
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
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
        tok = prep["tok"].reshape(self.nm, self.ga)
        seq = prep["seq"].reshape(self.nm, self.ga)
        out["tok"], out["seq"] = tok, seq
        out["tok_total"] = jnp.broadcast_to(tok.sum(1, keepdims=True), tok.shape)
        out["seq_total"] = jnp.broadcast_to(seq.sum(1, keepdims=True), seq.shape)
        return out


def _minibatch_gradient(
    step: _Step, params: Params, batch: Batch, packed_width: int = 0
) -> tuple[jax.Array, Params, dict]:
    Pn, G = _check_batch(batch, step.algo, step.perf, step.num_shards)
    prep = step.prepare(batch)
    mbs = jax.tree.map(lambda x: x[0], step.split_batch(batch, prep))
    return step.minibatch_grad(params, mbs, G, packed_width, batch.projections)


def packed_prompt_width(
    prompt_lengths: Any, prompt_width: int, algo: AlgoConfig, perf: PerfConfig, mesh: Mesh | None = None
) -> int:
    """The ``packed_prompt_width`` to give ``step_fn`` (and `policy_gradient`) for a rollout whose P prompts have
    these lengths in a batch of prompt width ``prompt_width``: with ``perf.prompt_packing`` (and prefix sharing) the
    train step runs each
    micro-batch's prompts packed end to end, one row per batch shard, instead of left-padded, so no decoder work is
    spent on prompt padding (`jaxgrpo.models.prefix`). The width holds the longest possible row (the
    ``P / (num_minibatches * grad_accum_steps * shards)`` longest prompts), rounded up to
    `jaxgrpo.padding.PACK_BUCKET`; 0 (padded rows) when packing is off or would not save."""
    if not (perf.prefix_sharing and perf.prompt_packing):
        return 0
    shards = 1 if mesh is None else int(mesh.shape["data"] * mesh.shape["fsdp"])
    parts = int(algo.num_minibatches) * int(algo.grad_accum_steps) * shards
    lengths = np.asarray(prompt_lengths)
    if len(lengths) % parts:
        raise ValueError(f"{len(lengths)} prompts cannot be split into {parts} parts (minibatches x accum x shards)")
    # each micro-batch has `shards` rows of P / parts prompts: size a row from the P / parts longest prompts
    return padding.packed_width(lengths, parts, prompt_width=prompt_width)


def policy_gradient(
    model_config: models.ModelConfig,
    algo: AlgoConfig,
    params: Params,
    batch: Batch,
    *,
    perf: PerfConfig | None = None,
    temperature: float = 1.0,
    mesh: Mesh | None = None,
    packed_prompt_width: int = 0,
) -> tuple[jax.Array, Params, dict[str, jax.Array]]:
    """Loss, gradient and policy-loss metrics of the first optimizer update of a train step (minibatch 0, with
    the configured gradient accumulation) — the exact function `make_train_step` differentiates. Jitted inside.
    For research code and tests; `make_train_step` is the entry point for training. ``packed_prompt_width``: as
    for ``step_fn`` (see `packed_prompt_width`); ``perf``: as for `make_train_step`."""
    step = _Step(model_config, algo, mesh, temperature, perf)

    @jax.jit
    def run(params, batch):
        loss, grads, aux = _minibatch_gradient(step, params, batch, packed_prompt_width)
        return loss, grads, aux["metrics"]

    return run(params, batch)


def _state_shardings(model_config: models.ModelConfig, mesh: Mesh, tx: optax.GradientTransformation) -> TrainState:
    params_sh = sharding_lib.param_shardings(model_config, mesh)
    abstract = jax.eval_shape(lambda: models.init_params(model_config, jax.random.key(0)))
    opt_abstract = jax.eval_shape(tx.init, abstract)
    rep = NamedSharding(mesh, PartitionSpec())
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_abstract, params_sh, transform_non_params=lambda _: rep)
    return TrainState(params=params_sh, opt_state=opt_sh, step=rep, rng=rep)


def _replicated(x: np.ndarray, mesh: Mesh) -> jax.Array:
    """A host value (identical on every process) as a mesh-replicated global array (works multi-process)."""
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, PartitionSpec()), lambda idx: x[idx])


def make_train_step(
    model_config: models.ModelConfig,
    algo: AlgoConfig,
    optim: OptimConfig,
    *,
    perf: PerfConfig | None = None,
    mesh: Mesh | None = None,
    temperature: float = 1.0,
    total_steps: int,
) -> tuple[Callable[[Params, jax.Array], TrainState], Callable[[TrainState, Batch], tuple[TrainState, dict]]]:
    """Build ``(init_fn(params, key) -> TrainState, step_fn(state, batch) -> (state, metrics))``.

    ``step_fn`` is a `jax.jit` function (state donated: do not reuse the input state). ``temperature`` is the
    rollout temperature (the sampler's logits were divided by it). ``total_steps``: rollout steps of the run, for
    the schedule. ``perf``: how the step is computed (`config.PerfConfig`, default its defaults), as
    `resolve_perf` applies it to this algo and mesh.
    ``step_fn(state, batch, packed_prompt_width=W)`` (static; compiles once per distinct ``W``): with prefix sharing,
    run the prompts packed end to end (no work on prompt padding, same result); ``W`` from `packed_prompt_width`.
    With ``mesh``, ``init_fn`` places params/optimizer state by their logical axes and the batch must come from
    `global_batch` (or be placed with `jaxgrpo.sharding.batch_sharding`). ``init_fn`` takes ownership of the
    params it is given: the first step donates them (pass a copy to keep using the originals).
    """
    step = _Step(model_config, algo, mesh, temperature, perf)
    updates = int(algo.num_iterations) * step.nm
    tx, schedule = make_optimizer(optim, total_steps, updates_per_step=updates)
    state_sh = _state_shardings(model_config, mesh, tx) if mesh is not None else None

    def init_fn(params: Params, key: jax.Array) -> TrainState:
        if mesh is not None:
            params = sharding_lib.shard_params(params, model_config, mesh)
            opt_state = jax.jit(tx.init, out_shardings=state_sh.opt_state)(params)
            count = _replicated(np.zeros((), np.int32), mesh)
            if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
                impl = jax.random.key_impl(key)
                data = _replicated(np.asarray(jax.random.key_data(key)), mesh)
                key = jax.jit(lambda d: jax.random.wrap_key_data(d, impl=impl), out_shardings=state_sh.rng)(data)
            else:
                key = _replicated(np.asarray(key), mesh)
        else:
            opt_state = jax.jit(tx.init)(params)
            count = jnp.zeros((), jnp.int32)
        return TrainState(params=params, opt_state=opt_state, step=count, rng=key)

    def train_step(
        state: TrainState, batch: Batch, packed_prompt_width: int = 0
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        _check_batch(batch, algo, step.perf, step.num_shards)
        prep = step.prepare(batch)
        split = step.split_batch(batch, prep)

        def update(carry, u):
            params, opt_state = carry
            mbs = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, u % step.nm, keepdims=False), split)
            # batch.projections (checked: one update per rollout) hold for these params: the ones that sampled
            loss, grads, aux = step.minibatch_grad(
                params, mbs, batch.rewards.shape[1], packed_prompt_width, batch.projections
            )
            grad_norm = optax.global_norm(grads)
            upd, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, upd)
            return (params, opt_state), dict(loss=loss, grad_norm=grad_norm, **aux)

        (params, opt_state), hist = jax.lax.scan(
            update, (state.params, state.opt_state), jnp.arange(updates, dtype=jnp.int32)
        )
        first_pass = (jnp.arange(updates) < step.nm).astype(jnp.float32)
        s = hist["stats"]
        n_first = jnp.maximum(jnp.sum(s["valid_tokens"] * first_pass), 1.0)
        n0 = jnp.maximum(s["valid_tokens"][0], 1.0)
        metrics: dict[str, jax.Array] = dict(prep["diag"])
        for k, v in hist["metrics"].items():
            metrics[k] = jnp.max(v) if k.endswith("max") else jnp.min(v) if k.endswith("min") else jnp.mean(v)
        completion_tokens = batch.completion_mask.astype(jnp.float32).sum()
        metrics.update(
            {
                "loss": jnp.mean(hist["loss"]),
                "grad_norm": jnp.mean(hist["grad_norm"]),
                "lr": schedule(state.step),
                "entropy": jnp.sum(s["entropy_sum"] * first_pass) / n_first,
                "mismatch/abs_diff_mean": s["abs_diff_sum"][0] / n0,
                "mismatch/abs_diff_max": s["abs_diff_max"][0],
                "mismatch/ratio_mean": s["exp_diff_sum"][0] / n0,
                "tokens/prompt": batch.prompt_mask.astype(jnp.float32).sum(),
                "tokens/completion": completion_tokens,
                "tokens/loss": jnp.sum(prep["tok"]),
                "sequences/loss": jnp.sum(prep["seq"]),
                "degeneracy/masked_groups": prep["dropped"],
            }
        )
        metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
        new_state = TrainState(
            params=params, opt_state=opt_state, step=state.step + 1, rng=jax.random.split(state.rng)[0]
        )
        return new_state, metrics

    if mesh is None:
        step_fn = jax.jit(train_step, donate_argnums=0, static_argnames="packed_prompt_width")
    else:
        rep = NamedSharding(mesh, PartitionSpec())
        step_fn = jax.jit(
            train_step, donate_argnums=0, out_shardings=(state_sh, rep), static_argnames="packed_prompt_width"
        )
    return init_fn, step_fn


def global_batch(batch: Batch, mesh: Mesh) -> Batch:
    """Turn this process's rows of a rollout into global arrays sharded by groups over ``("data", "fsdp")``.

    Single process: the batch is simply placed on the mesh. Multi-process (after ``jax.distributed.initialize()``):
    each process passes its own whole groups (``P_local`` prompts × G rows, the same ``P_local`` everywhere); the
    global batch has ``P = P_local × process_count`` groups, ordered by the mesh's devices. Group order does not
    change the step's result.
    """

    def place(x: Any) -> jax.Array:
        x = np.asarray(x)
        sharding = NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (x.ndim - 1))))
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree.map(place, batch)
