# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The trainer's multi-turn step (``data.environment`` and/or ``data.tools`` set): rollout, rewards, batch, update.

One RL step, with the same prompts, keys, checkpoint and resume as a single-turn step (`jaxgrpo.trainer`):

1. P prompts from the trainer's iterator; G trajectories each, run to the end with the key
   ``fold_in(fold_in(key(seed), step), 0)`` by the multi-turn engine (`jaxgrpo.rollout.turn_driver`, per-row caches:
   a row waiting on its tools leaves the decode batch and comes back with its cache; ``rollout.turn_engine=true``)
   or the simple loop (`jaxgrpo.rollout.multiturn.rollout`, one engine call per turn at the run's fixed shapes,
   `multiturn.fixed_generate`; the default),
   tools in worker threads with ``rollout.tool_timeout``;
2. rewards: ``sum_i w_i fn_i(answer, example)`` over the ``data.rewards`` functions, where ``answer`` is the text of
   the trajectory's last policy turn (its answer; "" when a limit stopped it), plus, with the reserved name
   ``environment`` in ``data.rewards``, ``w * env.get_reward()`` of the trajectory's environment instance;
3. the batch (`jaxgrpo.learner.batch.multiturn_batch`): each group's shared prompt, then the completion region (policy
   turns and the template/tool tokens between them); ``action_mask`` = the policy's tokens, so tool and environment
   tokens are attended but carry no loss, no KL and no count in the aggregation (`Batch.action_mask`);
4. the ordinary jitted train step.

A tool that hangs, raises or returns something unprintable is answered to the model as an error and counted
(``multiturn/tool_error_rate``, ``multiturn/tool_timeout_rate``); the step goes on. Environments start fresh for every
trajectory, so nothing of them needs checkpointing: a resumed run redraws exactly the prompts and keys of the
uninterrupted one.

Asynchronous rollouts (``rollout.max_staleness``, ``mesh.rollout``: `jaxgrpo.async_rollout`) run 1 and 2 (the
turns and their rewards) in the rollout thread (`rollout`, with the lagged weights), 3 and 4 in the learner
(`train_step`).

On a learner mesh (``mesh.data`` / ``fsdp`` / ``tensor``) the batch is split by groups over its batch axes as in a
single-turn step and the simple loop samples over the mesh; the multi-turn engine samples on one device
(``mesh.rollout=1``). On several processes (hosts) each host runs a contiguous block of the step's prompts, their
trajectories, tools and rewards, on rollout devices of its own (``mesh.rollout``, a multiple of the process count;
one per host for the multi-turn engine), with the trajectories' own keys (``row_offset``: the rows those of one
process), and the hosts swap the scored trajectories through the coordinator's key-value store
(`sample_across_processes`): no tool runs twice.

Dynamic sampling (``algo.degenerate_groups=resample``) runs in rounds of P prompts, each a whole multi-turn rollout,
until P informative groups are held or ``algo.resample_max_rounds`` rounds are spent (`rollout`); the skip schedule
(``rollout.schedule=skip``) picks each round's prompts (`jaxgrpo.scheduled.draw_round`) and records every round's
groups; with ``adaptive`` prompt i gets G_i trajectories, sampled as sub-groups of ``rollout.schedule_min_group`` and
regrouped into the ``[P, G]`` layout with invalid padding rows (`sample_sized`).

``train.eval_every`` evaluates the held-out split through the turns (`jaxgrpo.multiturn_eval.evaluate`,
`jaxgrpo.in_training.evaluate_held_out`; on several hosts each runs its block of the held-out prompts, their tools
and rewards, and the hosts swap the results), and ``algo.overlong_buffer`` punishes the tokens after the prompt
against the token budget (`trajectory_lengths`).

Not supported with multi-turn (one-line errors at startup, `check_config`): several processes without rollout
devices of their own (every host would run every trajectory's tools), the multi-turn engine on several devices of
one process (a learner mesh without ``mesh.rollout=1``, or ``mesh.rollout`` > 1) and ``data.template=plain``; and,
as for single-turn runs, ``rollout.schedule=adaptive`` on several hosts (`jaxgrpo.config_checks`)."""

from __future__ import annotations

import dataclasses
import functools
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import async_rollout, diversity, models, objectives, padding, sampling, scheduled
from jaxgrpo import step_batch as step_batch_lib
from jaxgrpo.config_sections import Config
from jaxgrpo.errors import ConfigError, RewardError
from jaxgrpo.example import Example
from jaxgrpo.groups import degenerate_groups, process_share, resample_metrics
from jaxgrpo.learner import train_step as ts
from jaxgrpo.learner.batch import Batch, global_batch, multiturn_batch
from jaxgrpo.models.attention import DENSE, Kernel
from jaxgrpo.rewards import Scorer
from jaxgrpo.rollout import history, turn_driver
from jaxgrpo.rollout import multiturn as MT
from jaxgrpo.rollout.env import Toolbox
from jaxgrpo.rollout.history import ChatFormat
from jaxgrpo.rollout.tools import ToolRunner

ENV_REWARD = "environment"  # the data.rewards name of the environment's own get_reward()


def reward_functions(cfg: Config) -> list[tuple[str, float]]:
    """``data.rewards`` less the environment's own reward: what a `jaxgrpo.rewards.Scorer` runs."""
    return [(name, w) for name, w in cfg.data.rewards.items() if name != ENV_REWARD]


def check_config(cfg: Config) -> None:
    """One-line `ConfigError` for a setting the multi-turn step does not support (see the module docstring)."""
    m = cfg.mesh
    if m.distributed and not m.rollout:
        raise ConfigError("multi-turn rollouts (data.environment / data.tools) on several hosts need rollout devices "
                          "on every host (each host runs its share of the trajectories and their tools): set "
                          "mesh.rollout to a multiple of the process count")  # fmt: skip
    if m.data * m.fsdp * m.tensor > 1 and not m.rollout and cfg.rollout.turn_engine:
        raise ConfigError("rollout.turn_engine=true samples on one device, but the learner's mesh would be its "
                          "devices; set rollout.turn_engine=false (the simple loop samples over the mesh) or "
                          "mesh.rollout=1 (the engine on a device of its own)")  # fmt: skip
    if cfg.data.template != "chat":
        raise ConfigError("multi-turn rollouts need the chat template (tools and tool replies are chat messages); "
                          "set data.template=chat")  # fmt: skip
    toolbox(cfg)


def toolbox(cfg: Config) -> Toolbox:
    """The run's environment class and tool functions, imported and checked (schemas; ``get_reward`` when
    ``data.rewards`` names the environment)."""
    d = cfg.data
    box = Toolbox.from_config(d.environment, d.tools)
    if ENV_REWARD in d.rewards and not callable(getattr(box.environment, "get_reward", None)):
        raise ConfigError(f"data.rewards has {ENV_REWARD!r} but data.environment={d.environment!r} has no "
                          "get_reward(self) method; add one or remove the reward")  # fmt: skip
    return box


@dataclasses.dataclass
class Scored:
    """A multi-turn rollout with its rewards ``[P, G]`` and validity ``[P, G]``; ``real`` ``[P, G]``: the rows that
    are trajectories (False: the padding of a group smaller than G, ``rollout.schedule=adaptive``; None: every row)."""

    rollout: MT.MultiTurnRollout
    examples: list[Example]  # [P]
    rewards: np.ndarray
    valid: np.ndarray
    real: np.ndarray | None = None

    def real_rows(self) -> np.ndarray:
        """bool ``[P * G]``: which rows are trajectories."""
        return np.ones(self.rewards.size, bool) if self.real is None else np.asarray(self.real, bool).reshape(-1)

    def trajectories(self) -> list[Any]:
        """The histories of the rows that are trajectories (not a small group's padding), in row order."""
        return [h for h, real in zip(self.rollout.histories, self.real_rows()) if real]


class MultiTurn:
    """What a multi-turn run holds between steps: the toolbox, the tool runner and the turn settings.

    The sampler: with ``rollout.turn_engine=true`` the multi-turn engine (`jaxgrpo.rollout.turn_driver`: per-row
    caches, a row waiting on its tools leaves the decode batch); else (the default) the simple loop
    (`jaxgrpo.rollout.multiturn.rollout`: one call per turn for the trajectories still running, on one device
    `multiturn.fixed_generate` at ``loop_shapes``, the run's fixed shapes, so that the run compiles a bounded set of
    programs: `jaxgrpo.multiturn_precompile`; with ``mesh.rollout`` `sampling.generate` on that mesh).
    ``generate``: a `sampling.generate` stand-in for the simple loop (a test's scripted policy; it implies the loop).
    ``rollout_stats``: the engine's metrics of the last `sample` (`turn_driver.TurnStats`; none for the loop).
    ``attention``: both samplers' prefill attention kernel (a run's resolved ``perf.attention``). ``train``: False
    for an evaluation, which samples only (no train-step shapes, ``train_shapes`` None). ``loop_rows``: the rows of
    ``loop_shapes`` (default the step's ``P * G``; an evaluation's, its batch of prompts times its samples)."""

    generate: Callable[..., sampling.Completions] | None = None

    def __init__(self, cfg: Config, tokenizer: Any, model_config: models.ModelConfig,
                 eos_token_ids: Sequence[int], examples: Sequence[Example], attention: Kernel = DENSE,
                 mesh: Any = None, train: bool = True, loop_rows: int | None = None):  # fmt: skip
        d, r = cfg.data, cfg.rollout
        self.cfg, self.tokenizer, self.eos_token_ids = cfg, tokenizer, tuple(eos_token_ids)
        self.mesh = mesh  # the learner's: the batch is split over its batch axes (None: one device)
        self.attention = attention  # the prefills' kernel (the run's resolved perf.attention)
        self.toolbox = toolbox(cfg)
        self.env_weight = d.rewards.get(ENV_REWARD)
        self.settings = MT.TurnSettings(max_turns=r.max_turns, max_new_tokens=r.max_new_tokens,
                                        max_total_tokens=r.max_total_tokens, temperature=r.temperature,
                                        top_p=r.top_p, top_k=r.top_k)  # fmt: skip
        self.check_context(model_config, examples)
        P, limit = r.prompts_per_step, model_config.max_position_embeddings
        self.loop_shapes = MT.LoopShapes.for_run(loop_rows or P * r.group_size, self.prompt_width, self.settings,
                                                 limit)  # fmt: skip
        # the train step's shapes (P prompts packed over the mesh's batch shards); an evaluation samples only
        self.train_shapes = step_batch_lib.StepShapes.for_prompts(
            self.prompt_lengths, P, P, cfg.algo, cfg.perf, mesh, self.settings.budget) if train else None  # fmt: skip
        self.runner = ToolRunner(workers=max(1, d.reward_workers), timeout=r.tool_timeout)
        self.rollout_stats: dict[str, float] = {}

    def check_context(self, model_config: models.ModelConfig, examples: Sequence[Example]) -> None:
        """`ConfigError` when the longest prompt, rendered with the tools' description, leaves no room for a turn, or
        when the chat template cannot append a tool reply to a token history (`ChatFormat.reply_tokens`); also
        instantiates and resets the environment once: a broken class fails here, before any step."""
        (episode,) = self.toolbox.episodes(examples[:1])
        self.schemas = episode.schemas  # the tools' JSON schemas (the same for every episode)
        chat = ChatFormat(self.tokenizer, episode.schemas, self.cfg.data.system_prompt)
        if episode.schemas:  # the template's rules around a tool reply, checked before the first step's turns
            name = episode.schemas[0]["function"]["name"]
            chat.reply_tokens(chat.prompt_messages(examples[0].prompt, episode.observation),
                              [{"role": "tool", "name": name, "content": "0"}], None)  # fmt: skip
        # the rendered lengths of the 64 longest prompts (in characters) and of 512 drawn at random (seeded): the
        # run's widths (the longest) and its packed-width ladder (their distribution), at a bounded cost
        by_chars = np.argsort([-len(e.prompt) for e in examples], kind="stable")[:64]
        drawn = np.random.default_rng(0).permutation(len(examples))[:512]
        self.prompt_lengths = [len(chat.prompt_tokens(chat.prompt_messages(examples[i].prompt, episode.observation)))
                               for i in sorted(set(by_chars.tolist()) | set(drawn.tolist()))]  # fmt: skip
        n = max(self.prompt_lengths)
        self.prompt_width = n  # the engine's prefix-cache width for the run (turn_driver.rollout)
        room = model_config.max_position_embeddings - n
        if room < self.settings.max_new_tokens:
            raise ConfigError(
                f"the longest prompt with the tools' description is {n} tokens; with rollout.max_new_tokens="
                f"{self.settings.max_new_tokens} that passes the model's context "
                f"({model_config.max_position_embeddings}); shorten data.system_prompt or lower "
                "rollout.max_new_tokens")  # fmt: skip

    def sample(self, model_config: models.ModelConfig, params: Any, examples: Sequence[Example], key: jax.Array,
               scorer: Scorer | None, mesh: Any = None, row_offset: int = 0, group_size: int | None = None,
               score_groups: Sequence[int] | None = None) -> Scored:  # fmt: skip
        """G trajectories per example (``group_size``; default ``rollout.group_size``), scored (rewards as in the
        module docstring; a batched reward function is called once per ``score_groups`` consecutive rows, default
        once per example's G: an adaptive schedule's sub-groups of one prompt are scored together). ``mesh``: the
        simple loop's
        sampler runs over its batch axes (`sampling.generate` on the mesh; an asynchronous run's ``mesh.rollout``
        devices), ``params`` placed on it. ``row_offset``: the first trajectory's row in the step's whole rollout
        (a host's share of one split over hosts draws what the whole would)."""
        r = self.cfg.rollout
        g = group_size or r.group_size
        kw = dict(group_size=g, settings=self.settings, eos_token_ids=self.eos_token_ids, key=key,
                  system_prompt=self.cfg.data.system_prompt, row_offset=row_offset)  # fmt: skip
        if self.generate is None and r.turn_engine:
            out, stats = turn_driver.rollout(model_config, params, self.tokenizer, self.toolbox, self.runner,
                                             examples, block=r.decode_block, prompt_width=self.prompt_width,
                                             attention=self.attention, **kw)  # fmt: skip
            self.rollout_stats = stats.metrics()
        else:
            generate = self.generate or (
                MT.fixed_generate(self.loop_shapes, attention=self.attention) if mesh is None
                else functools.partial(sampling.generate, mesh=mesh, attention=self.attention))  # fmt: skip
            out = MT.rollout(model_config, params, self.tokenizer, self.toolbox, self.runner, examples,
                             generate=generate, **kw)  # fmt: skip
            self.rollout_stats = {}
        rows = [e for e in examples for _ in range(g)]
        n = len(rows)
        rewards, valid = np.zeros(n, np.float32), np.ones(n, bool)
        if scorer is not None:
            ids = [[t for t, a in zip(h.tokens, h.action) if a] for h in out.histories]
            envs = {"environments": [ep.env for ep in out.episodes]} if self.toolbox.environment is not None else {}
            rewards, valid, _ = scorer(out.answers, rows, ids, columns=envs,  # TRL's environments= for its rewards
                                       group_sizes=score_groups or [g] * len(examples))
        if self.env_weight is not None:
            env = np.array([self._env_reward(ep, i, rows[i]) for i, ep in enumerate(out.episodes)])
            valid = valid & np.isfinite(env)
            rewards = np.where(valid, rewards + self.env_weight * np.nan_to_num(env), 0.0).astype(np.float32)
        if self.cfg.algo.overlong_buffer is not None:  # DAPO's soft punishment of the tokens the token budget counts
            pen = objectives.overlong_penalty(trajectory_lengths(out.histories), self.settings.budget,
                                              self.cfg.algo.overlong_buffer)  # fmt: skip
            rewards = np.where(valid, rewards + pen, 0.0).astype(np.float32)
        return Scored(out, list(examples), rewards.reshape(-1, g), valid.reshape(-1, g))

    def _env_reward(self, episode: Any, i: int, example: Example) -> float:
        """``get_reward()`` of one trajectory's environment; NaN (invalid) for a failure under
        ``algo.on_reward_error=invalidate``, else a `RewardError`."""
        try:
            value = float(episode.reward())
            if not np.isfinite(value):
                raise ValueError(f"returned {value}")
            return value
        except Exception as e:  # noqa: BLE001 -- any failure of user code is reported the same way
            if self.cfg.algo.on_reward_error == "invalidate":
                return float("nan")
            raise RewardError(f"{type(episode.env).__name__}.get_reward() failed on trajectory {i} (prompt "
                              f"{example.prompt[:60]!r}): {type(e).__name__}: {e}",
                              "fix the environment, or set algo.on_reward_error=invalidate") from e  # fmt: skip

    def batch(self, scored: Scored, pad_id: int) -> tuple[Batch, list[int]]:
        """The train step's `Batch` and the group prompts' lengths. Widths: the prompts' the run's (the longest
        prompt's, `train_shapes`; wider only for a step with a longer one); the completion region's the bucket of the
        token budget (``max_total_tokens``), so the step compiles once, whatever the prompts drawn and the
        trajectories' lengths (wider only when first observations that differ within a group add context)."""
        out = scored.rollout
        lengths = [len(p) for p in out.prompt_ids]
        width = max(padding.train_prompt_width(lengths), self.train_shapes.prompt_width)
        longest = max(len(h.tokens) for h in out.histories)
        completion = padding.prompt_bucket(max(longest, self.settings.budget))
        batch = multiturn_batch(out, scored.rewards, scored.valid, width, completion, pad_id)
        if self.cfg.algo.overlong_filter:  # a trajectory stopped by a limit, not by an answer, leaves the loss
            batch = batch.replace(truncated=jnp.asarray([h.truncated for h in out.histories], bool))
        if self.mesh is not None:  # split by groups over the learner's batch axes (this process's groups)
            batch = global_batch(process_share(batch, len(lengths)), self.mesh)
        return batch, lengths

    def packed_width(self, lengths: Sequence[int], width: int, perf: Any) -> int:
        """The train step's packed prompt width (`perf.packed_prompt_width`) on the run's ``"train"`` ladder
        (`train_shapes`: a few rungs per run, `precompile.packed_rungs`); off the ladder (PACK_BUCKET steps) only for
        a step whose prompts are longer than the run's estimate."""
        ladder = self.train_shapes.ladders["train"]
        try:
            return ts.packed_prompt_width(lengths, width, self.cfg.algo, perf, self.mesh, ladder=ladder)
        except ValueError:  # a row wider than the ladder's cap
            return ts.packed_prompt_width(lengths, width, self.cfg.algo, perf, self.mesh)

    def close(self) -> None:
        self.runner.close()


def trajectory_lengths(histories: Sequence[Any]) -> np.ndarray:
    """Each trajectory's tokens after its own prompt (policy, template and tool tokens): what ``max_total_tokens``,
    the token budget, counts, and so what DAPO's overlong shaping measures on a multi-turn run (a row whose first
    observation made its prompt longer than the group's shared one carries that rest as context, not counted)."""
    return np.array([len(h.tokens) - h.prompt_rest for h in histories])


def step_metrics(scored: Scored, group_size: int) -> dict[str, float]:
    """The rollout's metrics: `history.metrics` (turns, tool calls, error and timeout rates, action-token share,
    truncation) and the single-turn keys where they have a meaning (completion = the policy's tokens), over the
    trajectories; ``diversity/*`` per group over its real rows (an adaptive schedule's padding left out, as in a
    single-turn run)."""
    hs = scored.trajectories()
    policy = np.array([sum(h.action) for h in hs], np.float64)
    out = history.metrics(hs)
    out["tokens/sampled"] = float(policy.sum())
    out["completion/len_mean"] = float(policy.mean())
    out["completion/truncated_frac"] = float(np.mean([h.truncated for h in hs]))
    rows = history.to_rows(scored.rollout.histories)
    out.update(diversity.diversity_metrics(rows["completion"], rows["completion_mask"], None, group_size,
                                           scored.real_rows()))  # fmt: skip
    return out


def rollout(trainer: Any, step: int) -> tuple[Scored, dict[str, float]]:
    """Step ``step``'s rollout: P prompts from the trainer's iterator, G trajectories each with the key
    ``fold_in(fold_in(key(seed), step), 0)`` and the weights `trainer.sampler_params` gives (in an asynchronous run,
    the version the rollout thread was handed: `jaxgrpo.async_rollout`), scored; and its metrics (`step_metrics`, the
    engine's ``rollout/*``). With ``algo.degenerate_groups=resample``, rounds of P more prompts (round r with
    ``fold_in(key, r)``) until P informative groups are held or ``algo.resample_max_rounds`` rounds are spent; the P
    groups trained are the informative ones in the order drawn, a shortfall filled with degenerate ones (which the
    step masks), and ``tokens/sampled`` counts the policy tokens of every round (``resample/*`` as single-turn
    runs'). With ``rollout.schedule=adaptive`` prompt i has G_i trajectories (`sample_sized`). The rollout thread of
    an asynchronous run calls this through `Trainer.rollout`."""
    key = jax.random.fold_in(jax.random.fold_in(trainer.key, step), 0)
    a, g, sch = trainer.cfg.algo, trainer.cfg.rollout.group_size, trainer.scheduler
    want = trainer.cfg.rollout.prompts_per_step
    # DAPO's dynamic sampling in rounds of P prompts (Yu et al. 2025, arXiv:2503.14476; `jaxgrpo.dynamic_sampling`):
    # round r draws with fold_in(key, r); a shortfall after the last round is filled with degenerate groups (masked)
    max_rounds = a.resample_max_rounds if a.degenerate_groups == "resample" else 1
    pool, rounds, drawn, informative, degenerate, skipped, sizes = [], [], [], [], [], [0], []
    while True:
        r = len(pool)  # the skip schedule's draws (`scheduled.draw_round`), else the iterator's next P
        indices = scheduled.draw_round(trainer, step, r, skipped) if sch is not None else trainer.iterator.next_batch()
        round_key = key if r == 0 else jax.random.fold_in(key, r)
        if sch is not None and sch.settings.adaptive:
            sized = sch.group_sizes(indices)
            scored, stats = sample_sized(trainer, indices, sized, round_key)
            sizes += [int(n) for n in sized]
        else:
            scored, stats = sample_round(trainer, indices, round_key)
            sizes += [g] * len(indices)
        deg = degenerate_groups(a, scored.rewards, scored.valid)
        pool.append(scored)
        rounds.append(stats)
        drawn.append((indices, deg))
        informative += [(r, p) for p in np.flatnonzero(~deg)]
        degenerate += [(r, p) for p in np.flatnonzero(deg)]
        if len(informative) >= want or len(pool) >= max_rounds:
            break
    kept = pool[0] if len(pool) == 1 else merge(pool, (informative + degenerate)[:want], g)
    tokens = float(sum(sum(h.action) for s in pool for h in s.rollout.histories))
    out = {**step_metrics(kept, g), "tokens/sampled": tokens}
    out.update({k: float(np.mean([s[k] for s in rounds])) for k in rounds[0]})  # the engine's figures per round
    if a.degenerate_groups == "resample":
        out.update(resample_metrics(len(pool), want * len(pool), want, len(informative), len(degenerate), tokens))
    if sch is not None:  # every round scored: now the history (a step that fails leaves it as it was)
        rounds_scored = [(indices, s.rewards, s.valid, deg) for (indices, deg), s in zip(drawn, pool)]
        counts = scheduled.record_step(sch, rounds_scored)
        out.update(scheduled.schedule_metrics(sch, skipped[0], len(informative), tokens, sizes, counts))
    return kept, out


def sample_round(trainer: Any, indices: Sequence[int], key: jax.Array) -> tuple[Scored, dict[str, float]]:
    """The prompts ``indices`` of the trainer's examples, G trajectories each, scored; and the sampler's metrics."""
    mt: MultiTurn = trainer.multiturn
    examples = [trainer.examples[i] for i in indices]
    if jax.process_count() > 1:
        return sample_across_processes(trainer, examples, key)
    scored = mt.sample(trainer.model_config, trainer.sampler_params(), examples, key, trainer.scorer,
                       mesh=trainer.rollout_mesh)  # the learner's mesh, or mesh.rollout's devices when > 1
    return scored, mt.rollout_stats


def sample_sized(trainer: Any, indices: Sequence[int], sizes: Sequence[int], key: jax.Array
                 ) -> tuple[Scored, dict[str, float]]:  # fmt: skip
    """``sizes[i]`` trajectories for prompt ``indices[i]`` (``rollout.schedule=adaptive``), scored, in the ``[P, G]``
    layout: sampled as sub-groups of u = ``rollout.schedule_min_group`` (the sizes are multiples of it), so that the
    sampler runs at most ``P * G`` rows as without the schedule (`jaxgrpo.scheduled.sample_sized`, single-turn); then
    regrouped per prompt (`multiturn.regroup`), the padding rows invalid with reward 0 (``Scored.real``)."""
    mt: MultiTurn = trainer.multiturn
    g, unit = trainer.cfg.rollout.group_size, trainer.scheduler.settings.min_group
    expanded = [trainer.examples[i] for i, n in zip(indices, sizes) for _ in range(int(n) // unit)]
    sc = mt.sample(trainer.model_config, trainer.sampler_params(), expanded, key, trainer.scorer,
                   mesh=trainer.rollout_mesh, group_size=unit, score_groups=[int(n) for n in sizes])  # fmt: skip
    out, real = MT.regroup(sc.rollout, [int(n) for n in sizes], g)
    rewards, valid = np.zeros(real.shape, np.float32), np.zeros(real.shape, bool)
    rewards[real], valid[real] = sc.rewards.reshape(-1), sc.valid.reshape(-1)  # both prompt-major
    return Scored(out, [trainer.examples[i] for i in indices], rewards, valid, real), mt.rollout_stats


def merge(pool: list[Scored], picks: list[tuple[int, int]], group_size: int) -> Scored:
    """Whole groups ``(round, prompt)`` of several rounds, in that order, as one `Scored` (the trajectories'
    episodes kept where every round has them)."""
    rows = [(r, p * group_size + j) for r, p in picks for j in range(group_size)]
    each = lambda field: [getattr(pool[r].rollout, field)[i] for r, i in rows]  # noqa: E731
    episodes = each("episodes") if all(s.rollout.episodes for s in pool) else []
    out = MT.MultiTurnRollout([pool[r].rollout.prompt_ids[p] for r, p in picks], each("histories"), episodes,
                              each("messages"), each("answers"))  # fmt: skip
    real = (None if all(s.real is None for s in pool)
            else np.stack([pool[r].real_rows().reshape(-1, group_size)[p] for r, p in picks]))  # fmt: skip
    return Scored(out, [pool[r].examples[p] for r, p in picks], np.stack([pool[r].rewards[p] for r, p in picks]),
                  np.stack([pool[r].valid[p] for r, p in picks]), real)


def sample_across_processes(trainer: Any, examples: list[Example], key: jax.Array
                            ) -> tuple[Scored, dict[str, float]]:  # fmt: skip
    """One step's rollout on several processes: this host runs its block of ``examples`` (`async_rollout.host_share`)
    on its rollout devices, their tools in its tool workers and their rewards in its reward workers, its rows drawing
    with their ids in the whole rollout (``row_offset``); the hosts swap the scored trajectories (`async_rollout.swap`)
    and every host returns the whole step's `Scored`, the same on every host. The environments stay where their tools
    ran (``episodes`` is empty). Metrics: the engine's are the mean over the hosts; ``reward/timeouts`` and
    ``time/reward_s`` the sum and the longest of the hosts', ``reward/invalid_frac`` over all rows."""
    mt: MultiTurn = trainer.multiturn
    g = trainer.cfg.rollout.group_size
    mine = async_rollout.host_share(len(examples))

    def sample() -> bytes:
        if not len(mine):
            return b""
        sc = mt.sample(trainer.model_config, trainer.sampler_params(), [examples[i] for i in mine], key,
                       trainer.scorer, mesh=trainer.rollout_mesh, row_offset=int(mine[0]) * g)  # fmt: skip
        o = sc.rollout
        return pickle.dumps(dict(prompt_ids=o.prompt_ids, histories=o.histories, messages=o.messages,
                                 answers=o.answers, rewards=sc.rewards, valid=sc.valid, engine=mt.rollout_stats,
                                 reward=trainer.scorer.take_stats() if trainer.scorer is not None else {}))  # fmt: skip

    parts = [pickle.loads(b) for b in async_rollout.swap(trainer, sample) if b]  # (the job's own processes)
    cat = lambda f: [x for p in parts for x in p[f]]  # noqa: E731
    out = MT.MultiTurnRollout(cat("prompt_ids"), cat("histories"), [], cat("messages"), cat("answers"))
    rewards, valid = (np.concatenate([p[f] for p in parts]) for f in ("rewards", "valid"))
    stats = {k: float(np.mean([p["engine"][k] for p in parts])) for k in parts[0]["engine"]}
    if parts[0]["reward"]:
        rw, rows = [p["reward"] for p in parts], [p["rewards"].size for p in parts]
        stats.update({"reward/timeouts": sum(r["reward/timeouts"] for r in rw),
                      "time/reward_s": max(r["time/reward_s"] for r in rw),
                      "reward/invalid_frac": float(np.average([r["reward/invalid_frac"] for r in rw], weights=rows))})
    return Scored(out, list(examples), rewards, valid), stats


def train_step(trainer: Any, step: int) -> dict[str, float]:
    """One multi-turn RL step of a `jaxgrpo.trainer.Trainer` (its state, iterator, scorer, keys); its metrics. With
    ``rollout.max_staleness`` or ``mesh.rollout`` set, the rollout comes from the rollout thread
    (`jaxgrpo.async_rollout`), sampled ahead with the lagged weights, and the updated weights go back to it."""
    t0 = time.perf_counter()
    mt: MultiTurn = trainer.multiturn
    cfg = trainer.cfg
    scored, extra = trainer.take_rollout(step)  # sampled now, or ahead by the rollout thread
    if trainer.producer is None and trainer.scorer is not None:  # (the rollout thread puts its own in `extra`)
        extra.update(trainer.scorer.take_stats())
    t1 = time.perf_counter()
    batch, lengths = mt.batch(scored, trainer.pad_id)
    metrics = trainer.update(step, batch, mt.packed_width(lengths, batch.prompt_mask.shape[1], trainer.perf))
    t2 = time.perf_counter()
    if trainer.producer is not None:
        trainer.producer.mark("learner", step, t1, t2)
    metrics.update(extra)
    real, a, hs = scored.real_rows(), cfg.algo, scored.trajectories()
    metrics.update(objectives.overlong_metrics(trajectory_lengths(hs), np.array([h.truncated for h in hs]),
                                               np.asarray(scored.valid).reshape(-1)[real], mt.settings.budget,
                                               a.overlong_filter, a.overlong_buffer))  # fmt: skip
    metrics["time/sample_s"], metrics["time/train_s"] = t1 - t0, t2 - t1
    metrics["throughput/tokens_per_s"] = metrics["tokens/sampled"] / max(t2 - t0, 1e-9)
    if cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0:
        metrics.update(trainer.evaluate(step + 1))
    if trainer.retain_sets and cfg.train.retain_every and (step + 1) % cfg.train.retain_every == 0:
        metrics.update(trainer.retain(step + 1))
    g = cfg.rollout.group_size
    first = [j for j in range(g) if real[j]]  # the first group's trajectories
    texts = [trainer.tokenizer.decode(scored.rollout.histories[j].tokens, skip_special_tokens=False) for j in first]
    trainer.last_samples = ([f"{scored.examples[0].prompt} -> {t}" for t in texts],
                            [float(scored.rewards[0][j]) for j in first])
    return metrics
