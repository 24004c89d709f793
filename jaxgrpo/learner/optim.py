# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The optimizer: global-norm clipping then AdamW (Loshchilov & Hutter 2019) with a warmup + constant/cosine schedule.

The learning rate is a function of the rollout step, not of the optimizer update count: all ``μ × num_minibatches``
updates of one step use ``schedule(step)``; warmup is linear from ``lr / W`` at step 0 to ``lr`` at step ``W − 1``,
then constant or cosine down to ``min_lr_ratio · lr`` at ``total_steps`` (SGDR cosine, Loshchilov & Hutter 2017).
Weight decay applies to every weight except norms and biases.

The schedule's numbers (``lr``, ``W``, ``total_steps``, ``min_lr_ratio``) are *runtime* values: `schedule_hparams`
packs them into a float32 vector that the jitted train step takes as an argument, and `schedule_value` evaluates the
formula on it, so a change of the learning rate, the warmup or the run length reuses the compiled step. Only the
schedule's kind (constant or cosine) and AdamW's ``b1``, ``b2``, ``eps``, weight decay and clipping norm are part of
the program. The train step applies ``−lr · d`` itself to the direction ``d`` of `make_direction` (clipping, Adam's
bias-corrected moments, decoupled weight decay): the same arithmetic as ``optax.adamw`` with a schedule.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgrpo.config_sections import SCHEDULES, OptimConfig

Params = Any

# the order of the runtime schedule vector (`schedule_hparams`)
SCHEDULE_HPARAMS = ("learning_rate", "warmup_steps", "total_steps", "min_lr_ratio")


def schedule_hparams(optim: OptimConfig, total_steps: int) -> np.ndarray:
    """The schedule's runtime numbers, float32 ``[lr, W, total_steps, min_lr_ratio]`` (checked here)."""
    if optim.schedule not in SCHEDULES:
        raise ValueError(f"optim.schedule={optim.schedule!r} is not supported; choose one of {SCHEDULES}")
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if optim.warmup_steps < 0 or optim.learning_rate < 0:
        raise ValueError(f"optim.warmup_steps and optim.learning_rate must be >= 0, got {optim}")
    if optim.schedule == "cosine" and not 0.0 <= optim.min_lr_ratio <= 1.0:
        raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {optim.min_lr_ratio}")
    ratio = float(optim.min_lr_ratio) if optim.schedule == "cosine" else 1.0
    return np.asarray([optim.learning_rate, int(optim.warmup_steps), int(total_steps), ratio], np.float32)


def schedule_value(kind: str, hparams: jax.Array | np.ndarray, step: jax.Array | int) -> jax.Array:
    """Learning rate at rollout step ``step`` for the runtime vector ``hparams`` (`schedule_hparams`); jit-safe.

    Warmup ``t < W``: ``lr/W + (lr − lr/W) · min(t, R)/R`` with ``R = max(W − 1, 1)`` (optax's
    ``linear_schedule(lr/W, lr, R)``); then ``s = t − W``: constant ``lr``, or cosine
    ``lr · ((1 − α) · ½(1 + cos(π · min(s, D)/D)) + α)`` with ``D = max(total_steps − W, 1)`` and
    ``α = min_lr_ratio`` (optax's ``cosine_decay_schedule``).
    """
    hp = jnp.asarray(hparams, jnp.float32)
    lr, warmup, total, alpha = hp[0], hp[1], hp[2], hp[3]
    t = jnp.asarray(step).astype(jnp.float32)
    ramp_len = jnp.maximum(warmup - 1.0, 1.0)
    start = lr / jnp.maximum(warmup, 1.0)
    frac = 1.0 - jnp.clip(t, 0.0, ramp_len) / ramp_len
    ramp = (start - lr) * frac + lr
    if kind == "constant":
        main = lr
    else:
        decay = jnp.maximum(total - warmup, 1.0)
        s = jnp.minimum(t - warmup, decay)
        main = lr * ((1.0 - alpha) * 0.5 * (1.0 + jnp.cos(jnp.pi * s / decay)) + alpha)
    return jnp.where(t < warmup, ramp, main)


def make_schedule(optim: OptimConfig, total_steps: int) -> optax.Schedule:
    """Learning rate as a function of the rollout step (see the module docstring for the formula)."""
    hparams = schedule_hparams(optim, total_steps)
    return lambda step: schedule_value(optim.schedule, hparams, step)


def _decay_mask(params: Params) -> Params:
    """AdamW weight decay on matrices only: norms and biases (path contains "norm" or "bias") are not decayed."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: not any(w in jax.tree_util.keystr(path) for w in ("norm", "bias")), params
    )


def make_direction(optim: OptimConfig) -> optax.GradientTransformation:
    """optax chain without the learning rate: global-norm clipping (if ``max_grad_norm > 0``), Adam's bias-corrected
    moments, decoupled weight decay on the `_decay_mask` weights. ``optax.adamw(lr)`` is this chain followed by
    ``× (−lr)`` (`apply_learning_rate`)."""
    if optim.max_grad_norm < 0:
        raise ValueError(f"optim.max_grad_norm must be >= 0 (0 disables clipping), got {optim.max_grad_norm}")
    parts = [optax.clip_by_global_norm(optim.max_grad_norm)] if optim.max_grad_norm > 0 else []
    parts += [optax.scale_by_adam(b1=optim.b1, b2=optim.b2, eps=optim.eps),
              optax.add_decayed_weights(optim.weight_decay, mask=_decay_mask)]  # fmt: skip
    return optax.chain(*parts)


def apply_learning_rate(direction: Params, lr: jax.Array) -> Params:
    """The parameter update ``−lr · d`` of a `make_direction` output (as optax's ``scale_by_learning_rate``)."""
    return jax.tree.map(lambda d: jnp.asarray(-lr, d.dtype) * d, direction)


def make_optimizer(
    optim: OptimConfig, total_steps: int, *, updates_per_step: int = 1
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The whole optimizer as one optax transformation, for code outside the train step: `make_direction` then
    ``× (−schedule(c // updates_per_step))`` at the optimizer's update count ``c``. Returns ``(optimizer, schedule)``.
    ``updates_per_step`` (= μ × num_minibatches) optimizer updates happen per rollout step. The train step itself
    uses `make_direction` and passes the schedule's numbers at run time (module docstring).
    """
    if updates_per_step < 1:
        raise ValueError(f"updates_per_step must be >= 1, got {updates_per_step}")
    schedule = make_schedule(optim, total_steps)
    scale = optax.scale_by_schedule(lambda count: -schedule(count // updates_per_step))
    return optax.chain(make_direction(optim), scale), schedule


# -- checkpoints written before the runtime learning rate (layout of optax.chain(clip, optax.adamw(schedule))) --------
def legacy_layout(opt_state: optax.OptState) -> optax.OptState:
    """The restore target, in the layout of checkpoints written before the schedule became a runtime argument, of a
    `make_direction` state ``(clip?, adam, decay)``: ``(clip?, (adam, decay, ScaleByScheduleState(count)))``, the
    state of ``optax.chain(clip?, optax.adamw(schedule))`` (leaves are arrays or shape structs; the count an int32)."""
    count = jax.ShapeDtypeStruct((), jnp.int32)
    return (*opt_state[:-2], (opt_state[-2], opt_state[-1], optax.ScaleByScheduleState(count=count)))


def from_legacy_layout(old: optax.OptState) -> optax.OptState:
    """A state restored in `legacy_layout` as a `make_direction` state: the same Adam moments and count; the schedule's
    update count is dropped (the learning rate now follows ``TrainState.step``, the same rollout step)."""
    adam, decay, _ = old[-1]
    return (*old[:-1], adam, decay)
