# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The background compilation jobs of a multi-turn run (`jaxgrpo.multiturn_step`; the single-turn ones are
`jaxgrpo.precompile`'s, whose `Precompiler` runs these): every program its step path can reach after the first step.

Measured before these jobs (a tiny random model, SmolLM2's tokenizer, the arithmetic environment with tool calls
forced, 4 prompts x 2, 3 turns, 6 steps, ``perf.precompile=off``): the simple loop compiled on steps 2 and 3 (3 and
14 programs: `sampling.generate`'s engine ``init``, ``prefill`` and ``decode_block`` at each new number of live rows
and context bucket, and a ``jnp.asarray`` transfer per completion array and row count); the multi-turn engine
compiled nothing after step 1 (its shapes are the run's: P groups, the longest prompt's prefix cache, the token
budget's row caches). The learner's batch was one shape there, but its prompt width and packed width followed each
step's prompts.

What the step path can reach, by design a bounded set (`MultiTurn`):

* the learner: the train step (and with ``algo.kl_coef > 0`` the reference log-probs) at ``P`` groups, the run's
  prompt width (`MultiTurn.train_shapes`: the longest prompt rendered with the tools, to a multiple of 32), the
  token budget's completion width, and the packed prompt widths of the run's ``"train"`` ladder a step can reach
  (`precompile.packed_rungs` over the rendered prompt lengths);
* the simple loop (the default sampler): every turn runs the engine at the run's `multiturn.LoopShapes` -- ``P * G``
  slots (a power of two) and a prefix cache of the longest prompt + the token budget -- whatever the number of live
  rows and the contexts' lengths, so its programs are the engine's ``init``, one ``decode_block`` per window, the
  window changes (up by a block) and one ``prefill`` per rung of its packed-width ladder (`LoopShapes.packed_rungs`).
  The cost: a turn with few live rows decodes the padding slots' rows (masked) and every decode step reads the widest
  prefix cache. On an accelerator a decode step is bound by reading the weights, so rows and cache columns added to
  a small model's batch cost little; the packed prefill spends one token per padding slot;
* the multi-turn engine (``rollout.turn_engine=true``): ``prefill_prefix``, ``decode_block`` and ``resume`` at the
  run's `turn_engine.TurnSpec` (``resume`` is first called by the first tool reply, which step 1 may not have had);
* the held-out evaluation (``train.eval_every``, through the turns): its statistics' eager scalar programs and, on the
  simple loop, the engine's programs at the evaluation's own `LoopShapes` (`multiturn_eval.sampler`: a batch of up
  to 32 held-out prompts x G rows, the held-out prompts' width; before these jobs, the first evaluating step of a
  tiny run with P = G = 2 and 4 held-out prompts compiled 6 programs); on the multi-turn engine, its programs at the
  `TurnSpec` of each of the evaluation's batch sizes.

Not covered (compiled by the step that needs them, as without these jobs): a prompt longer than the run's estimate
(`MultiTurn.check_context` renders the 64 longest prompts by characters and 512 drawn at random), an environment
whose first observations differ within a group (a wider completion region), a learner or rollout mesh, and
asynchronous rollouts (their weights are placed on the rollout device).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import models, padding
from jaxgrpo import precompile as pc
from jaxgrpo.learner.batch import Batch

Job = tuple[str, Callable[[], Any]]


def train_jobs(tr: Any, template: Batch, first: tuple[int, int, int]) -> list[Job]:
    """The train step at each packed prompt width of the run's ladder but the first step's (``first``: its
    ``(groups, completion width, packed width)``). The batch's shapes are the first step's (the packed width is no
    argument of the reference log-probs nor of the transfers), so those programs are compiled already."""
    mt = tr.multiturn
    groups, width, packed = first
    shapes = mt.train_shapes
    rungs = pc.packed_rungs(shapes, mt.prompt_lengths, groups)
    state = jax.tree.map(pc.abstract, tr.state)
    hparams = pc.abstract(tr.step_fn._placed)
    batch = pc.batch_struct(template, groups, width)
    return [(f"multi-turn train step packed {p}", lambda p=p: tr.step_fn.jitted.lower(
        state, batch, hparams, packed_prompt_width=p).compile()) for p in rungs if p != packed]  # fmt: skip


def _on_the_loop(tr: Any) -> bool:
    """Whether the run's turns run on the simple loop's one-device programs (`multiturn.fixed_generate`), which the
    jobs below lower for uncommitted weights."""
    mt, r = tr.multiturn, tr.cfg.rollout
    return not (mt.generate is not None or r.turn_engine or r.max_staleness or tr.rollout_mesh is not None
                or pc.committed(tr))  # fmt: skip


def _loop_programs(tr: Any, shapes: Any, label: str) -> list[Job]:
    """The simple loop's engine programs at ``shapes`` (a `multiturn.LoopShapes`)."""
    from jaxgrpo.rollout import driver, engine
    from jaxgrpo.rollout.params import SamplingParams

    r = tr.cfg.rollout
    sp = SamplingParams(r.max_new_tokens, 1, r.temperature, r.top_p, r.top_k, tr.eos_token_ids)
    spec = engine.make_spec(tr.model_config, sp, shapes.slots, shapes.prompt_width, driver.DEFAULT_BLOCK,
                            attention=tr.multiturn.attention)  # fmt: skip
    return pc.engine_programs(tr, spec, shapes.slots, shapes.packed_rungs(), False, init=True, label=label)


def loop_jobs(tr: Any) -> list[Job]:
    """The simple loop's engine programs at the run's `multiturn.LoopShapes` (one device, uncommitted weights)."""
    return _loop_programs(tr, tr.multiturn.loop_shapes, "turn loop: ") if _on_the_loop(tr) else []


def eval_jobs(tr: Any) -> list[Job]:
    """The held-out evaluation's programs (``train.eval_every``, `jaxgrpo.multiturn_eval.evaluate` through the turns):
    the eager scalar programs of its statistics; on the simple loop its engine programs at the evaluation's own
    `LoopShapes` (`multiturn_eval.sampler`: its batch of prompts, the held-out prompts' width); on the multi-turn
    engine its programs at each batch size of the evaluation (up to 32 prompts, and the last batch's)."""
    from jaxgrpo import eval as eval_lib
    from jaxgrpo import in_training, multiturn_eval

    if not tr.cfg.train.eval_every:
        return []
    G = tr.cfg.rollout.group_size
    jobs: list[Job] = [("evaluation statistics", lambda: eval_lib.summarize(np.zeros((1, G), bool), [G]))]
    loop, on_engine = _on_the_loop(tr) and tr.mesh is None, _on_the_engine(tr)  # (a learner mesh: sampled over it)
    if not (loop or on_engine):
        return jobs
    examples, per = in_training.held_out_examples(tr), multiturn_eval.PROMPTS_PER_BATCH
    _, mt = multiturn_eval.sampler(tr.cfg, tr.model_config, tr.tokenizer, examples,
                                   eval_lib.correctness_reward(tr.cfg, None), G, tr.prefill_attention,
                                   min(len(examples), per))  # fmt: skip
    mt.close()
    if loop:
        return jobs + _loop_programs(tr, mt.loop_shapes, "evaluation turn loop: ")
    sizes = dict.fromkeys(min(per, len(examples) - start) for start in range(0, len(examples), per))  # its batches
    return jobs + [j for n in sizes for j in _engine_programs(tr, n, mt.prompt_width, f"evaluation turn engine {n}")]


def _on_the_engine(tr: Any) -> bool:
    """Whether the run's turns run on the multi-turn engine's one-device programs."""
    mt, r = tr.multiturn, tr.cfg.rollout
    return mt.generate is None and r.turn_engine and not r.max_staleness and not pc.committed(tr)


def turn_engine_jobs(tr: Any) -> list[Job]:
    """The multi-turn engine's programs at the run's `TurnSpec` (as `turn_driver` builds it when each group shares
    its prompt: one first token per row)."""
    if not _on_the_engine(tr):
        return []
    return _engine_programs(tr, tr.cfg.rollout.prompts_per_step, tr.multiturn.prompt_width, "turn engine")


def _engine_programs(tr: Any, groups: int, prompt_width: int, label: str) -> list[Job]:
    """The multi-turn engine's ``prefill_prefix``, ``decode_block``, ``resume`` and first state (`init_state`'s
    eager programs) at the `TurnSpec` of ``groups`` groups of G rows whose prompts are at most ``prompt_width``
    tokens."""
    from jaxgrpo.rollout import engine
    from jaxgrpo.rollout import turn_engine as TE

    mt, r = tr.multiturn, tr.cfg.rollout
    mcfg, s = tr.model_config, mt.settings
    greedy = s.temperature <= 0
    top_k, use_top_p = engine.truncation(mcfg, greedy, s.top_k, s.top_p)
    W = engine.cache_slots(1 + s.budget + 1)
    spec = TE.TurnSpec(groups, r.group_size, W, padding.prompt_bucket(max(prompt_width, 1)),
                       r.decode_block, greedy, top_k, use_top_p, tuple(int(e) for e in tr.eos_token_ids),
                       mt.attention)  # fmt: skip
    S, B, Tp = spec.groups, spec.rows, spec.prompt_width
    params = jax.eval_shape(lambda p: models.compute_params(mcfg, p), tr.state.params)
    weights = jax.eval_shape(lambda p: engine.prepare_weights(mcfg, p), params)
    arr = lambda dt, *shape: jax.ShapeDtypeStruct(shape, dt)  # noqa: E731
    caches = jax.eval_shape(lambda p, a, b, c: TE.prefill_prefix(mcfg, spec, p, a, b, c), params,
                            arr(jnp.int32, S, Tp), arr(jnp.bool_, S, Tp), arr(jnp.bool_, S, Tp))  # fmt: skip
    zeros = lambda dt: np.zeros(B, dt)  # noqa: E731
    state = jax.eval_shape(lambda k: TE.init_state(spec, k, np.zeros((B, W), np.int32), zeros(np.int32),
                                                   zeros(np.int32), zeros(np.int32), zeros(bool)),
                           jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype))  # fmt: skip
    f32 = jax.ShapeDtypeStruct((), jnp.float32)
    return [
        (f"{label} prefix prefill", lambda: TE.prefill_prefix.lower(
            mcfg, spec, params, arr(jnp.int32, S, Tp), arr(jnp.bool_, S, Tp), arr(jnp.bool_, S, Tp)).compile()),
        (f"{label} decode block", lambda: TE.decode_block.lower(mcfg, spec, weights, caches, state, f32,
                                                                   f32).compile()),
        (f"{label} resume", lambda: TE.resume.lower(state, arr(jnp.bool_, B), arr(jnp.int32, B, W),
                                                       arr(jnp.int32, B), arr(jnp.int32, B)).compile()),
        # `init_state` runs eagerly (its row keys and copies: small programs per row count), so it is run, on zeros
        (f"{label} first state", lambda: jax.block_until_ready(TE.init_state(
            spec, jax.random.key(0), np.zeros((B, W), np.int32), zeros(np.int32), zeros(np.int32), zeros(np.int32),
            zeros(bool)))),
    ]  # fmt: skip


def start(tr: Any, template: Batch, first: tuple[int, int, int]) -> pc.Precompiler | None:
    """The background precompiler of a multi-turn `Trainer` after its first step (as `precompile.start`)."""
    return pc.run(jobs(tr, template, first))


def jobs(tr: Any, template: Batch, first: tuple[int, int, int]) -> list[Job]:
    """Every job of a multi-turn `Trainer` after its first step: the sampler's and the learner's, interleaved; then
    the held-out evaluation's."""
    rollout = loop_jobs(tr) + turn_engine_jobs(tr)
    train = train_jobs(tr, template, first)
    return [j for pair in itertools.zip_longest(rollout, train) for j in pair if j is not None] + eval_jobs(tr)
