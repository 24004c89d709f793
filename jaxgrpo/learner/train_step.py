# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The GRPO train step: one jitted, pure function ``step_fn(state, batch) -> (state, metrics)``.

Inside one `jax.jit` (state donated), for one rollout of P prompts × G samples:

1. **Advantages and degeneracy, per group, inside `shard_map`.** ``A = advantages.compute(algo.estimator, rewards,
   valid, axis_name=BATCH_AXES, **algo.estimator_args)`` on the ``[P, G]`` rewards (sharded by groups; a batch-wide
   statistic such as ``scale="batch"`` is ``psum``'ed over the batch axes), and
   ``D = advantages.degenerate_for(algo.estimator, rewards, valid, atol, rtol)`` ``[P]``, and
   `degeneracy.diagnostics` (its batch-wide counts psum'ed too). Per-token loss mask:
   ``m = completion_mask ∧ valid``, and for ``degenerate_groups="mask"`` (and ``"resample"``) also ``∧ ¬D``.
   The global normalizers of every optimizer step (token counts ``Σ m`` and the counts of sequences with ≥ 1 loss
   token, for each micro-batch) are ``psum``'ed here too, once, up front.
2. **Log-probs** (`compute_logprobs`): `models.hidden_states` on the whole rows — or, with
   ``perf.prefix_sharing``, `jaxgrpo.models.prefix.prefix_shared_predictors`, which encodes each group's prompt
   once for its G completions (same values and gradients; the prompt of group p is read from row ``p*G``, which the
   prompt-major, left-padded `Batch` layout makes identical to the group's other rows; with ``packed_prompt_width``
   the prompts run packed end to end, so no decoder work is spent on their padding) — then only the hidden states
   that predict completion tokens (positions ``Tp-1 … T-2``) go through the LM head, in sequence chunks under `lax.map`
   with a hand-written backward, ``log_softmax(h·W / temperature)`` in float32: no float32 ``[B, T, V]`` tensor
   exists, and prompt positions cost no LM-head work.
3. **Loss** (`losses.policy_loss` inside `shard_map`, ``axis_name=BATCH_AXES``): the clipped surrogate with every
   algo option, the importance ratio ``ρ = exp(logp − old_logprobs)`` taken against the *sampler's* log-probs (kept
   for all μ iterations, so ``ρ ≠ 1`` from the second iteration on), plus ``kl_coef · KL(π‖π_ref)`` only when
   ``kl_coef > 0`` (then ``batch.ref_logprobs`` is required; with ``kl_coef = 0`` the trainer skips the reference
   forward and passes ``None``).
4. **Optimizer steps.** The rollout is split by whole groups into ``S = num_minibatches × grad_accum_steps`` parts
   (group ``p`` goes to part ``p mod S``; part ``s`` is micro-batch ``s mod grad_accum_steps`` of minibatch
   ``s // grad_accum_steps``). ``lax.scan`` runs ``μ × num_minibatches`` optimizer updates (μ =
   ``num_iterations``); each update accumulates its micro-batch gradients with an inner ``lax.scan``.

**Gradient accumulation keeps the unsplit loss exactly** (except ``entropy_top_frac`` with a ``seq-mean-*``
aggregation, which is refused: its sequence counts are taken before the selection). With aggregation denominator
``N`` (tokens for
``token-mean``; sequences with ≥ 1 loss token for the ``seq-mean-*`` modes, × ``max_tokens`` for
``seq-mean-token-sum-norm``, a constant that cancels), `policy_loss` on micro-batch k returns ``L_k = S_k / N_k``
(``S_k`` its numerator). The minibatch loss is ``L = Σ_k S_k / N = Σ_k (N_k / N) · L_k``, so each micro-batch loss
is weighted by ``w_k = N_k / N`` with the global ``N`` counted up front — not the mean of per-micro-batch averages.

**Degenerate groups** (all valid rewards equal, `degeneracy.degenerate_mask`; with ``pass_at_k`` also the groups its
estimator gives no signal, fewer than k wrong answers: `advantages.degenerate_for`):
``keep`` — they stay in the loss mask and so in every denominator, with the estimator's advantage (exactly 0 for
grpo / dr_grpo / rloo / max_rl / pass_at_k; sign and avspo give them a signal), as TRL, verl and Tunix do;
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
except norms and biases. The schedule's numbers (learning rate, warmup, ``total_steps``, ``min_lr_ratio``) reach the
compiled step as a runtime argument (`optim.schedule_hparams`), so they are not constants of the program.

**One program per static configuration.** `make_train_step` memoizes the jitted step (and ``init_fn``) on what the
program depends on: the model config, the algo, perf and mesh, the temperature, top-k and top-p, and the optimizer's
static fields (schedule kind, AdamW's ``b1``, ``b2``, ``eps``, weight decay, clipping norm). Two trainers that differ
only in the learning rate, warmup or number of steps share one jitted function, so jax compiles its step once.

**Metrics** (float32 scalars): every `degeneracy.diagnostics` key; ``loss``, ``pg_loss``, ``kl`` and the
`policy_loss` statistics (clip fractions, ratio statistics, ``approx_kl_old``) averaged over the step's optimizer
updates (``*/max`` and ``*/min`` are the extremes); ``entropy`` (mean over the valid completion tokens of the first
iteration, each minibatch measured at the params that train on it); ``mismatch/abs_diff_mean``,
``mismatch/abs_diff_max`` (of ``|logp_trainer − logp_sampler|``) and ``mismatch/ratio_mean`` (mean
``exp(logp_trainer − logp_sampler)``, log-ratio clamped to ±20 as in `losses`) over the valid tokens of the first
update, before any parameter change; ``grad_norm`` (before clipping, averaged over updates), ``lr``,
``tokens/prompt``, ``tokens/completion``, ``tokens/loss`` and ``sequences/loss`` (what the loss normalises by),
``degeneracy/masked_groups`` (groups dropped from the loss).

**Precision.** The state holds the master weights in ``model_config.param_dtype`` (float32 by default) and AdamW's
moments alike; the forward reads them cast to the compute dtype ``model_config.dtype`` inside the differentiated
function, so gradients arrive in the masters' dtype, and micro-batch gradients accumulate in float32
(docs/mixed_precision.md). **Sampler correction** (``algo.sampler_correction``, `losses.sampler_correction`): the PPO
ratio is taken against the trainer's log-probs at the sampling parameters, and each token's policy-gradient term is
weighted (or masked) by their ratio to the sampler's; those log-probs come from the first update's forward when it is
the only update and nothing is masked up front, else from one forward without gradient before the updates.

**LoRA** (``model_config.lora``, `jaxgrpo.models.lora`): the params hold the frozen base (compute dtype) and the
float32 adapters at ``layers.lora``; the gradient, the optimizer state and the update cover the adapters only
(`lora.trainable`), the base passes through the step unchanged.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgrpo import models
from jaxgrpo import sharding as sharding_lib
from jaxgrpo.config_sections import AlgoConfig, OptimConfig, PerfConfig
from jaxgrpo.learner import optim as optim_lib
from jaxgrpo.learner.batch import Batch, TrainState, check_batch, global_batch
from jaxgrpo.learner.logprobs import compute_logprobs
from jaxgrpo.learner.minibatch import StepParts, first_minibatch_gradient, join_groups, split_groups
from jaxgrpo.learner.perf import (
    attention_kernel,
    layer_loop,
    on_gpu,
    packed_prompt_width,
    platform_of,
    resolve_perf,
    shape_ladders,
)
from jaxgrpo.models import lora

# The train step's public surface, wherever each part lives.
__all__ = ["Batch", "TrainState", "abstract_state", "attention_kernel", "compute_logprobs", "global_batch",
           "make_train_step", "packed_prompt_width", "policy_gradient", "resolve_perf", "shape_ladders",
           "state_shardings", "StepFn"]  # fmt: skip

Params = Any


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
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[jax.Array, Params, dict[str, jax.Array]]:
    """Loss, gradient and policy-loss metrics of the first optimizer update of a train step (minibatch 0, with
    the configured gradient accumulation) — the exact function `make_train_step` differentiates. Jitted inside.
    For research code and tests; `make_train_step` is the entry point for training. ``packed_prompt_width``: as
    for ``step_fn`` (see `packed_prompt_width`); ``perf``, ``top_k``, ``top_p``: as for `make_train_step`."""
    step = StepParts(model_config, algo, mesh, temperature, perf, top_k=top_k, top_p=top_p)

    @jax.jit
    def run(params, batch):
        loss, grads, aux = first_minibatch_gradient(step, params, batch, packed_prompt_width)
        return loss, grads, aux["metrics"]

    return run(params, batch)


def state_shardings(model_config: models.ModelConfig, mesh: Mesh, tx: optax.GradientTransformation) -> TrainState:
    """Where every leaf of a `TrainState` lives on ``mesh``: params and their optimizer moments by the params' logical
    axes, everything else replicated."""
    params_sh = sharding_lib.param_shardings(model_config, mesh)
    abstract = jax.eval_shape(lambda: models.init_params(model_config, jax.random.key(0)))
    opt_abstract = jax.eval_shape(tx.init, lora.trainable(abstract))
    rep = NamedSharding(mesh, PartitionSpec())
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_abstract, lora.trainable(params_sh),
                                   transform_non_params=lambda _: rep)  # fmt: skip
    return TrainState(params=params_sh, opt_state=opt_sh, step=rep, rng=rep)


def abstract_state(
    model_config: models.ModelConfig, algo: AlgoConfig, optim: OptimConfig, mesh: Mesh, total_steps: int
) -> TrainState:
    """The `TrainState` ``make_train_step``'s ``init_fn`` would build, as ``jax.ShapeDtypeStruct`` leaves with their
    shardings on ``mesh`` (nothing allocated): the input to ahead-of-time compilation (`jaxgrpo.aot`)."""
    optim_lib.schedule_hparams(optim, total_steps)  # the same checks as make_train_step
    tx = optim_lib.make_direction(optim)
    shardings = state_shardings(model_config, mesh, tx)
    params = jax.eval_shape(lambda: models.init_params(model_config, jax.random.key(0)))
    state = TrainState(params=params, opt_state=jax.eval_shape(tx.init, lora.trainable(params)),
                       step=jax.ShapeDtypeStruct((), jnp.int32), rng=jax.eval_shape(lambda: jax.random.key(0)))
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)


def _replicated(x: np.ndarray, mesh: Mesh) -> jax.Array:
    """A host value (identical on every process) as a mesh-replicated global array (works multi-process)."""
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, PartitionSpec()), lambda idx: x[idx])


def _freeze(x: Any) -> Hashable:
    """A hashable, exact key for a config value: dataclasses by their fields, dicts by sorted items, lists as tuples."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__qualname__, *((f.name, _freeze(getattr(x, f.name))) for f in dataclasses.fields(x)))
    if isinstance(x, dict):
        return ("dict", *sorted((repr(k), _freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, *(_freeze(v) for v in x))
    hash(x)
    return x


def _static_optim(optim: OptimConfig) -> Hashable:
    """The optimizer fields the compiled step depends on: all but the schedule's runtime numbers."""
    return tuple((f.name, _freeze(getattr(optim, f.name))) for f in dataclasses.fields(optim)
                 if f.name not in optim_lib.SCHEDULE_HPARAMS)  # fmt: skip


_PROGRAMS: OrderedDict[Hashable, Any] = OrderedDict()  # the train step's and the KL reference pass's programs
# XLA:GPU's dot merger turns two dots that share an operand into one dot on concatenated operands. In the train step
# the shared operand is a layer's weight, read by both streams of prefix sharing (the prompts once, the completions):
# XLA then copies both streams' activations into one [prompt + completion tokens, *] buffer per projection, pass and
# micro-batch to save a GEMM launch. At the Qwen2.5-0.5B config that is ~300 GiB of copies per step (the MLP's
# bf16[35776, 4864] three times per layer and micro-batch), for -170 GiB net with it off (BENCHMARKS §12). Off for the
# train step on GPUs; other backends have no such pass or option.
GPU_TRAIN_COMPILER_OPTIONS = {"xla_gpu_dot_merger_threshold_mb": 0}


def train_compiler_options(platform: str) -> dict[str, Any] | None:
    """XLA options the train step compiles with on ``platform`` (a device's ``.platform``)."""
    return dict(GPU_TRAIN_COMPILER_OPTIONS) if on_gpu(platform) else None


_PROGRAMS_KEPT = 32  # least recently used programs beyond this are dropped (with their compiled executables)


def _memoized(key: Hashable, build: Callable[[], Any]) -> Any:
    """``_PROGRAMS[key]``, built by ``build()`` on a miss; least recently used entries beyond `_PROGRAMS_KEPT` go."""
    if key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
    else:
        _PROGRAMS[key] = build()
        while len(_PROGRAMS) > _PROGRAMS_KEPT:
            _PROGRAMS.popitem(last=False)
    return _PROGRAMS[key]


class StepFn:
    """``step_fn(state, batch, packed_prompt_width=0) -> (state, metrics)``: the memoized jitted step bound to one
    run's schedule numbers (a runtime argument, placed on the mesh at the first call). ``lower`` lowers it for
    ahead-of-time compilation (no device needed); ``jitted`` is the shared `jax.jit` function."""

    def __init__(self, jitted: Callable, hparams: np.ndarray, mesh: Mesh | None):
        self.jitted, self.hparams, self.mesh = jitted, hparams, mesh
        self._placed: jax.Array | None = None

    def __call__(self, state: TrainState, batch: Batch, packed_prompt_width: int = 0) -> tuple[TrainState, dict]:
        if self._placed is None:
            self._placed = _replicated(self.hparams, self.mesh) if self.mesh else jnp.asarray(self.hparams)
        return self.jitted(state, batch, self._placed, packed_prompt_width=packed_prompt_width)

    def lower(self, state: TrainState, batch: Batch, packed_prompt_width: int = 0) -> Any:
        sh = NamedSharding(self.mesh, PartitionSpec()) if self.mesh is not None else None
        hp = jax.ShapeDtypeStruct(self.hparams.shape, self.hparams.dtype, sharding=sh)
        return self.jitted.lower(state, batch, hp, packed_prompt_width=packed_prompt_width)

    def _cache_size(self) -> int:
        return self.jitted._cache_size()


def make_train_step(
    model_config: models.ModelConfig,
    algo: AlgoConfig,
    optim: OptimConfig,
    *,
    perf: PerfConfig | None = None,
    mesh: Mesh | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    total_steps: int,
) -> tuple[Callable[[Params, jax.Array], TrainState], StepFn]:
    """Build ``(init_fn(params, key) -> TrainState, step_fn(state, batch) -> (state, metrics))``.

    ``step_fn`` is a `jax.jit` function (state donated: do not reuse the input state). ``temperature`` is the
    rollout temperature (the sampler's logits were divided by it); ``top_k`` (0 = off), ``top_p`` (1 = off) the
    rollout's truncation: the step's log-probs are then of the truncated, renormalised distribution the sampler drew
    from (`jaxgrpo.learner.logprobs`), so the importance ratio is 1 at the sampling parameters. ``total_steps``: rollout
    steps of the run, for the schedule. ``perf``: how the step is computed (`config.PerfConfig`, default its
    defaults), as `resolve_perf` applies it to this algo and mesh.
    ``step_fn(state, batch, packed_prompt_width=W)`` (static; compiles once per distinct ``W``): with prefix sharing,
    run the prompts packed end to end (no work on prompt padding, same result); ``W`` from `packed_prompt_width`.
    With ``mesh``, ``init_fn`` places params/optimizer state by their logical axes and the batch must come from
    `global_batch` (or be placed with `jaxgrpo.sharding.batch_sharding`). ``init_fn`` takes ownership of the
    params it is given: the first step donates them (pass a copy to keep using the originals).
    The jitted program is memoized on its static arguments (module docstring): calls that differ only in the
    learning rate, warmup, ``min_lr_ratio`` or ``total_steps`` share it.
    """
    hparams = optim_lib.schedule_hparams(optim, total_steps)
    truncation = (int(top_k), float(top_p))
    key = ("step", _freeze(model_config), _freeze(algo), _static_optim(optim), _freeze(perf), mesh,
           float(temperature), truncation)  # fmt: skip
    init_fn, jitted = _memoized(key, lambda: _build_program(model_config, algo, optim, perf, mesh, temperature,
                                                            truncation))  # fmt: skip
    return init_fn, StepFn(jitted, hparams, mesh)


def reference_logprobs_fn(model_config: models.ModelConfig, temperature: float, perf: PerfConfig, top_k: int,
                          top_p: float, num_shards: int = 1, chunks: int = 1) -> Callable:
    """``fn(params, batch) -> [B, Tc]``: the batch's completion log-probs under ``params`` (the KL reference pass,
    `compute_logprobs` at the rollout's temperature and truncation), with the run's perf switches as the train
    step's forward takes them (``perf`` as `resolve_perf` gives it: the attention kernel, prefix sharing -- each
    group's prompt encoded once, the batch being prompt-major --, the LM-head chunk and kernel; no remat, there is no
    backward; the prompts left-padded, not packed, so the pass has one program per batch shape), jitted and memoized
    like `make_train_step`'s step, so trainers with the same model and settings share its compiled programs.
    ``chunks`` (the train step's micro-batches a step, ``num_minibatches x grad_accum_steps``): the rows run in that
    many parts under `jax.lax.map`, split by whole groups as the train step splits its micro-batches
    (`minibatch.split_groups`: every part takes its groups from each of ``num_shards`` batch shards), so the pass
    holds one micro-batch's activations, not the whole batch's; when the groups do not divide so, the batch runs
    whole."""
    key = ("reference", _freeze(model_config), float(temperature), int(top_k), float(top_p), perf.attention,
           int(perf.attention_chunk), bool(perf.prefix_sharing), int(perf.logprob_chunk), perf.lm_head, int(num_shards),
           int(chunks), perf.layer_loop)  # fmt: skip
    kernel = attention_kernel(perf)

    def rows_logprobs(params: Any, rows: dict[str, jax.Array], group_size: int) -> jax.Array:
        batch = Batch(**rows, rewards=jnp.zeros((0, 0)), valid=jnp.zeros((0, 0), bool),
                      old_logprobs=jnp.zeros((0, 0)))  # the log-probs read the rows alone  # fmt: skip
        return compute_logprobs(model_config, params, batch, temperature, perf.logprob_chunk, remat="none",
                                attention_kernel=kernel, group_size=group_size if perf.prefix_sharing else 0,
                                pack_rows=num_shards, top_k=top_k, top_p=top_p, lm_head=perf.lm_head,
                                layer_loop=layer_loop(perf))[0]  # fmt: skip

    def fn(params: Any, batch: Batch) -> jax.Array:
        P, G = batch.rewards.shape
        rows = {k: getattr(batch, k) for k in ("tokens", "prompt_mask", "completion_mask")}
        if chunks <= 1 or P % (num_shards * chunks):
            return rows_logprobs(params, rows, G)
        parts = {k: split_groups(x, G, chunks) for k, x in rows.items()}  # the train step's micro-batch rule
        return join_groups(jax.lax.map(lambda mb: rows_logprobs(params, mb, G), parts), G)

    return _memoized(key, lambda: jax.jit(fn))


def release_programs() -> None:
    """Forget every memoized program (`make_train_step`, `reference_logprobs_fn`), so its compiled executables can be
    freed once no trainer holds them; the next call compiles again. For a long-lived process that builds many
    configurations (a test session, a sweep in one process): XLA:CPU holds memory maps for each live executable."""
    _PROGRAMS.clear()


def _build_program(
    model_config: models.ModelConfig,
    algo: AlgoConfig,
    optim: OptimConfig,
    perf: PerfConfig | None,
    mesh: Mesh | None,
    temperature: float,
    truncation: tuple[int, float] = (0, 1.0),
) -> tuple[Callable[[Params, jax.Array], TrainState], Callable]:
    """``(init_fn, jitted step(state, batch, schedule_hparams, packed_prompt_width=0))`` for `make_train_step`;
    ``truncation``: the rollout's ``(top_k, top_p)``."""
    step = StepParts(model_config, algo, mesh, temperature, perf, top_k=truncation[0], top_p=truncation[1])
    updates = int(algo.num_iterations) * step.nm
    tx = optim_lib.make_direction(optim)
    state_sh = state_shardings(model_config, mesh, tx) if mesh is not None else None

    def init_fn(params: Params, key: jax.Array) -> TrainState:
        if mesh is not None:
            params = sharding_lib.shard_params(params, model_config, mesh)
            opt_state = jax.jit(tx.init, out_shardings=state_sh.opt_state)(lora.trainable(params))
            count = _replicated(np.zeros((), np.int32), mesh)
            if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
                impl = jax.random.key_impl(key)
                data = _replicated(np.asarray(jax.random.key_data(key)), mesh)
                key = jax.jit(lambda d: jax.random.wrap_key_data(d, impl=impl), out_shardings=state_sh.rng)(data)
            else:
                key = _replicated(np.asarray(key), mesh)
        else:
            opt_state = jax.jit(tx.init)(lora.trainable(params))
            count = jnp.zeros((), jnp.int32)
        return TrainState(params=params, opt_state=opt_state, step=count, rng=key)

    def train_step(
        state: TrainState, batch: Batch, hparams: jax.Array, packed_prompt_width: int = 0
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        check_batch(batch, algo, step.num_shards)
        prep = step.prepare(batch)
        split = step.split_batch(batch, prep)
        G = batch.rewards.shape[1]
        split = step.correct_sampler(state.params, split, G, packed_prompt_width)
        lr = optim_lib.schedule_value(optim.schedule, hparams, state.step)  # one rate for all updates of the step

        def update(carry, u):
            params, opt_state = carry
            mbs = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, u % step.nm, keepdims=False), split)
            key = jax.random.fold_in(state.rng, u) if algo.objective == "clip_cov" else None  # Clip-Cov's subset
            loss, grads, aux = step.minibatch_grad(params, mbs, batch.rewards.shape[1], packed_prompt_width, key)
            grad_norm = optax.tree_utils.tree_norm(grads)
            train = lora.trainable(params)  # a LoRA run updates its adapters only; the base passes through
            direction, opt_state = tx.update(grads, opt_state, train)
            train = optax.apply_updates(train, optim_lib.apply_learning_rate(direction, lr))
            params = lora.with_trainable(params, train)
            return (params, opt_state), dict(loss=loss, grad_norm=grad_norm, **aux)

        (params, opt_state), hist = jax.lax.scan(
            update, (state.params, state.opt_state), jnp.arange(updates, dtype=jnp.int32)
        )
        metrics = _step_metrics(hist, prep, split, batch, lr, step.nm)
        new_state = TrainState(
            params=params, opt_state=opt_state, step=state.step + 1, rng=jax.random.split(state.rng)[0]
        )
        return new_state, metrics

    options = train_compiler_options(platform_of(mesh))
    if mesh is None:
        step_fn = jax.jit(
            train_step, donate_argnums=0, static_argnames="packed_prompt_width", compiler_options=options
        )
    else:
        rep = NamedSharding(mesh, PartitionSpec())
        step_fn = jax.jit(
            train_step,
            donate_argnums=0,
            out_shardings=(state_sh, rep),
            static_argnames="packed_prompt_width",
            compiler_options=options,
        )
    return init_fn, step_fn


def _step_metrics(hist: dict, prep: dict, split: dict, batch: Batch, lr: jax.Array, nm: int) -> dict[str, jax.Array]:
    """The step's metrics from the scanned updates' history ``hist`` (``num_iterations × nm`` updates): the loss and
    gradient norm averaged over them, the policy's entropy over the first pass (the sampled policy's), the
    sampler-mismatch statistics of the first update, token counts and the groups masked as degenerate."""
    updates = hist["loss"].shape[0]
    first_pass = (jnp.arange(updates) < nm).astype(jnp.float32)
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
            "lr": lr,
            "entropy": jnp.sum(s["entropy_sum"] * first_pass) / n_first,
            "mismatch/abs_diff_mean": s["abs_diff_sum"][0] / n0,
            "mismatch/abs_diff_max": s["abs_diff_max"][0],
            "mismatch/ratio_mean": s["exp_diff_sum"][0] / n0,
            "sampler/kl": s["sampler_kl_sum"][0] / n0,
            "sampler/corrected_frac": s["corrected_sum"][0] / n0,
            "tokens/prompt": batch.prompt_mask.astype(jnp.float32).sum(),
            "tokens/completion": completion_tokens,
            "tokens/loss": jnp.sum(split["tok"]),
            "sequences/loss": jnp.sum(split["seq"]),
            "degeneracy/masked_groups": prep["dropped"],
        }
    )
    return {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
