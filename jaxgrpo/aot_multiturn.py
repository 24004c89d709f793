# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`python -m jaxgrpo.compile` for a multi-turn config (``data.environment`` / ``data.tools``): the shapes its run
takes, as `jaxgrpo.multiturn_step.MultiTurn` sizes them from the data (the tokenizer is read and the environment
instantiated once; no weights), and the multi-turn engine's programs (``rollout.turn_engine``).

* The train step: the longest prompt rendered with the tools' description, the token budget's completion width
  (policy, template and tool tokens), the action mask.
* The rollout, the simple loop (the default): its engine for one turn at the run's `multiturn.LoopShapes` (every
  trajectory a row of its own, contexts up to the prompt and the budget, ``rollout.max_new_tokens`` new tokens).
* The rollout, the multi-turn engine: its prefix prefill and decode block (`jaxgrpo.rollout.turn_engine`) on one
  device, for P groups of G rows that share their prompt (each row's cache holds the budget and its first token).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxgrpo import models, padding, sharding
from jaxgrpo.config_sections import Config
from jaxgrpo.learner.perf import attention_kernel, resolve_perf


@dataclasses.dataclass(frozen=True)
class Shapes:
    """A multi-turn run's compile shapes: ``train``, a config whose single-turn train step has the run's shapes;
    ``loop``, one whose rollout engine is the simple loop's; ``turn_spec``, the multi-turn engine's `TurnSpec` (None
    for the simple loop); ``note``, one line saying what is compiled."""

    train: Config
    loop: Config
    turn_spec: Any
    note: str

    def cache_bytes(self, mcfg: models.ModelConfig) -> float:
        """The multi-turn engine's KV caches in bytes (its prefix caches and its rows' linear caches), from
        ``turn_spec`` (the simple loop's are `aot.rollout_cache_bytes` of ``loop``)."""
        s = self.turn_spec
        return float(mcfg.kv_bytes_per_token * (s.groups * s.prompt_width + s.rows * s.width))


def shapes(cfg: Config, mcfg: models.ModelConfig, platform: str) -> Shapes | None:
    """The compile shapes of a multi-turn config on ``platform``'s devices (None for a single-turn one); the prefill
    attention kernel as the run resolves ``perf.attention`` there."""
    from jaxgrpo import build, multiturn_step
    from jaxgrpo import data as data_lib
    from jaxgrpo.rollout import engine
    from jaxgrpo.rollout import turn_engine as TE

    if not cfg.data.multiturn:
        return None
    tokenizer = build.policy_tokenizer(cfg)
    eos = build.eos_ids(mcfg, tokenizer)
    perf, _ = resolve_perf(cfg.algo, cfg.perf, num_shards=1, platform=platform, compute_dtype=mcfg.dtype)
    mt = multiturn_step.MultiTurn(cfg, tokenizer, mcfg, eos, data_lib.load_dataset(cfg.data, cfg.seed),
                                  attention_kernel(perf))  # fmt: skip
    mt.close()
    r, d, put = cfg.rollout, cfg.data, dataclasses.replace
    prompt, completion, loop = mt.train_shapes.prompt_width, padding.prompt_bucket(mt.settings.budget), mt.loop_shapes
    train = put(cfg, rollout=put(r, max_new_tokens=completion), data=put(d, max_prompt_tokens=prompt))
    loop_cfg = put(cfg, rollout=put(r, prompts_per_step=loop.slots, group_size=1, slots=0),
                   data=put(d, max_prompt_tokens=loop.prompt_width))  # fmt: skip
    note = (f"multi-turn: the train step at the prompt rendered with the tools ({prompt} tokens) and the token "
            f"budget's completion width ({completion}); ")
    if not r.turn_engine:
        note += (f"the rollout as the simple loop runs a turn ({loop.slots} rows, contexts up to {loop.prompt_width} "
                 f"tokens, {r.max_new_tokens} new)")
        return Shapes(train, loop_cfg, None, note)
    greedy = r.temperature <= 0
    top_k, use_top_p = engine.truncation(mcfg, greedy, r.top_k, r.top_p)
    width = engine.cache_slots(1 + mt.settings.budget + 1)  # (`turn_driver._layout`: first token + budget + 1)
    spec = TE.TurnSpec(r.prompts_per_step, r.group_size, width, padding.prompt_bucket(mt.prompt_width),
                       r.decode_block, greedy, top_k, use_top_p, tuple(eos), mt.attention)  # fmt: skip
    note += (f"the rollout as the multi-turn engine runs it ({spec.rows} rows of {width} cache slots, prefixes of "
             f"{spec.prompt_width}), on one device")
    return Shapes(train, loop_cfg, spec, note)


def compile_turn_engine(mcfg: models.ModelConfig, spec: Any, device: Any) -> dict[str, dict[str, float]]:
    """The multi-turn engine's prefix prefill and decode block compiled for ``device`` on abstract compute-dtype
    weights: `aot.program_figures` of each (``prefill``, ``decode``) and ``weights`` (per-chip bytes of the decode
    weights, as `aot.compile_rollout` reports them)."""
    from jaxgrpo import aot
    from jaxgrpo.rollout import engine
    from jaxgrpo.rollout import turn_engine as TE

    mesh = sharding.make_mesh(1, 1, 1, devices=[device])
    place = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(  # noqa: E731
        mesh, PartitionSpec())), tree)  # fmt: skip
    params = place(jax.eval_shape(lambda: models.compute_params(mcfg, models.init_params(mcfg, jax.random.key(0)))))
    weights = place(jax.eval_shape(lambda p: engine.prepare_weights(mcfg, p), params))
    S, Tp, B, W = spec.groups, spec.prompt_width, spec.rows, spec.width
    prefix = place((jax.ShapeDtypeStruct((S, Tp), jnp.int32), jax.ShapeDtypeStruct((S, Tp), jnp.bool_),
                    jax.ShapeDtypeStruct((S, Tp), jnp.bool_)))  # fmt: skip
    caches = place(jax.eval_shape(functools.partial(TE.prefill_prefix, mcfg, spec), params, *prefix))
    zeros = np.zeros(B, np.int32)
    state = place(jax.eval_shape(lambda: TE.init_state(spec, jax.random.key(0), np.zeros((B, W), np.int32), zeros,
                                                       zeros, zeros, np.zeros(B, bool))))  # fmt: skip
    f32 = place(jax.ShapeDtypeStruct((), jnp.float32))
    options = aot.compiler_options([device])
    programs = {"prefill": TE.prefill_prefix.lower(mcfg, spec, params, *prefix),
                "decode": TE.decode_block.lower(mcfg, spec, weights, caches, state, f32, f32)}
    out = {name: aot.program_figures(p.compile(options)) for name, p in programs.items()}
    mine = aot.per_chip_bytes(weights)
    return dict(weights=dict(total=mine, share=1.0, row_shards=1.0), **out)
