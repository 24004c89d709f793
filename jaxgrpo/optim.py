# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The optimizer: global-norm clipping then AdamW (Loshchilov & Hutter 2019) with a warmup + constant/cosine schedule.

The learning rate is a function of the rollout step, not of the optimizer update count: all ``μ × num_minibatches``
updates of one step use ``schedule(step)``; warmup is linear from ``lr / W`` at step 0 to ``lr`` at step ``W − 1``,
then constant or cosine down to ``min_lr_ratio · lr`` at ``total_steps`` (SGDR cosine, Loshchilov & Hutter 2017).
Weight decay applies to every weight except norms and biases.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from jaxgrpo.config import SCHEDULES, OptimConfig

Params = Any


def make_schedule(optim: OptimConfig, total_steps: int) -> optax.Schedule:
    """Learning rate as a function of the rollout step (see the module docstring for the formula)."""
    if optim.schedule not in SCHEDULES:
        raise ValueError(f"optim.schedule={optim.schedule!r} is not supported; choose one of {SCHEDULES}")
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if optim.warmup_steps < 0 or optim.learning_rate < 0:
        raise ValueError(f"optim.warmup_steps and optim.learning_rate must be >= 0, got {optim}")
    lr, warmup = float(optim.learning_rate), int(optim.warmup_steps)
    if optim.schedule == "constant":
        main = optax.constant_schedule(lr)
    else:
        if not 0.0 <= optim.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {optim.min_lr_ratio}")
        main = optax.cosine_decay_schedule(lr, decay_steps=max(total_steps - warmup, 1), alpha=optim.min_lr_ratio)
    if warmup == 0:
        return main
    ramp = optax.linear_schedule(lr / warmup, lr, transition_steps=max(warmup - 1, 1))
    return optax.join_schedules([ramp, main], [warmup])


def _decay_mask(params: Params) -> Params:
    """AdamW weight decay on matrices only: norms and biases (path contains "norm" or "bias") are not decayed."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: not any(w in jax.tree_util.keystr(path) for w in ("norm", "bias")), params
    )


def make_optimizer(
    optim: OptimConfig, total_steps: int, *, updates_per_step: int = 1
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """optax chain: global-norm clipping (if ``max_grad_norm > 0``) then AdamW with the warmup + constant/cosine
    schedule. Returns ``(optimizer, schedule)``; ``schedule(step)`` is the rollout-step learning rate to log.

    ``updates_per_step`` (= μ × num_minibatches) optimizer updates happen per rollout step; the optimizer maps its
    own update count ``c`` to ``schedule(c // updates_per_step)``.
    """
    if updates_per_step < 1:
        raise ValueError(f"updates_per_step must be >= 1, got {updates_per_step}")
    if optim.max_grad_norm < 0:
        raise ValueError(f"optim.max_grad_norm must be >= 0 (0 disables clipping), got {optim.max_grad_norm}")
    schedule = make_schedule(optim, total_steps)
    per_update = lambda count: schedule(count // updates_per_step)
    adamw = optax.adamw(
        per_update, b1=optim.b1, b2=optim.b2, eps=optim.eps, weight_decay=optim.weight_decay, mask=_decay_mask
    )
    parts = ([optax.clip_by_global_norm(optim.max_grad_norm)] if optim.max_grad_norm > 0 else []) + [adamw]
    return optax.chain(*parts), schedule
