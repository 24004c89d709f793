# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Evaluation of a multi-turn config (``data.environment`` / ``data.tools``) through its turns: `evaluate`, which
``python -m jaxgrpo.eval`` and ``train.eval_every`` (`jaxgrpo.in_training`) run for such a run; the sampler and the
rewards are the multi-turn step's (`jaxgrpo.multiturn_step.MultiTurn`)."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxgrpo import async_rollout, models
from jaxgrpo.config_sections import Config
from jaxgrpo.example import Example
from jaxgrpo.models.attention import DENSE, Kernel
from jaxgrpo.multiturn_step import ENV_REWARD, MultiTurn, reward_functions
from jaxgrpo.rewards import Scorer
from jaxgrpo.rollout import history

PROMPTS_PER_BATCH = 32  # examples sampled together (`evaluate`'s default)


def sampler(cfg: Config, model_config: models.ModelConfig, tokenizer: Any, examples: Sequence[Example], reward: str,
            num_samples: int, attention: Kernel, prompts: int) -> tuple[Config, MultiTurn]:  # fmt: skip
    """The evaluation's config (``num_samples`` per example, scored by ``reward`` alone, no overlong shaping) and its
    `MultiTurn` (close it), whose simple loop runs every turn of every batch of up to ``prompts`` examples at one
    `multiturn.LoopShapes`: ``prompts * num_samples`` rows (at the run's ``P * G`` rows a batch's first turns would run
    wider, each at a program of its own), the prefix cache of the examples' longest prompt."""
    from jaxgrpo import build

    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, rewards={reward: 1.0}),
                              rollout=dataclasses.replace(cfg.rollout, group_size=num_samples),
                              algo=dataclasses.replace(cfg.algo, overlong_buffer=None))  # success: the reward alone
    mt = MultiTurn(cfg, tokenizer, model_config, build.eos_ids(model_config, tokenizer), examples, attention,
                   train=False, loop_rows=max(prompts, 1) * num_samples)  # fmt: skip
    return cfg, mt


def evaluate(cfg: Config, model_config: models.ModelConfig, params: Any, tokenizer: Any, examples: Sequence[Example],
             reward: str, *, num_samples: int, group_sizes: Sequence[int], key: jax.Array,
             prompts_per_batch: int = PROMPTS_PER_BATCH, success_threshold: float = 0.5,
             summarize: Callable[..., dict[str, Any]], ks: Sequence[int] | None = None,
             attention: Kernel = DENSE, mesh: Any = None,
             exchange: Callable[[bytes], list[bytes]] | None = None) -> dict[str, Any]:  # fmt: skip
    """`jaxgrpo.eval.evaluate` for a multi-turn config: ``num_samples`` trajectories per example through the turn
    loop, each scored by ``reward`` alone (a reward function of its final answer, or ``environment``: its
    environment's ``get_reward()``); success = reward >= ``success_threshold``. Returns ``summarize``'s
    (`jaxgrpo.eval.summarize`, passed in: eval imports this module) pass@k (at ``ks``, default 1, 2, 4, ...) and
    degeneracy, ``mean_reward``, the
    `history.metrics` of all trajectories and a few samples. ``attention``: the prefills' kernel. ``mesh``: the
    simple loop samples over it (a training run's learner mesh, ``params`` placed on it). Each trajectory draws with
    its row id in the whole evaluation (``row_offset``), so the result does not depend on how the examples are
    batched. ``exchange``: on several processes, this host evaluates its contiguous block of the examples
    (`async_rollout.host_share`: its turns, tools and rewards; ``params`` and ``mesh`` this host's) and
    ``exchange(payload)`` returns every host's payload in process order (`jaxgrpo.host.exchange`); every host then
    returns the whole evaluation's result, the one a single process gets."""
    block = range(len(examples)) if exchange is None else async_rollout.host_share(len(examples)).tolist()
    cfg, mt = sampler(cfg, model_config, tokenizer, examples, reward, num_samples, attention,
                      min(len(block), prompts_per_batch))  # fmt: skip
    scorer = Scorer(reward_functions(cfg)) if reward != ENV_REWARD else None
    params = models.compute_params(model_config, params)

    def run_block() -> dict[str, list]:
        rewards, hists, samples = [], [], []
        for start in range(0, len(block), prompts_per_batch):
            first = block[start]  # the batch's first example in the whole evaluation
            batch = [examples[i] for i in block[start : start + prompts_per_batch]]
            scored = mt.sample(model_config, params, batch, key, scorer, mesh=mesh, row_offset=first * num_samples)
            rewards.append(scored.rewards)
            hists += scored.rollout.histories
            for p, ex in enumerate(batch[: max(0, 4 - len(samples))]):
                samples.append({"prompt": ex.prompt, "answer": ex.answer, "reward": float(scored.rewards[p, 0]),
                                "conversation": scored.rollout.messages[p * num_samples]})  # fmt: skip
        return {"rewards": rewards, "histories": hists, "samples": samples}

    try:
        if exchange is None:
            parts = [run_block()]
        else:  # a host whose block failed still sends, so that every host raises at this exchange
            payload, failure = async_rollout.own_share(lambda: pickle.dumps(run_block()))
            raw = exchange(payload)
            async_rollout.settle(raw, failure)
            parts = [pickle.loads(b) for b in raw]
    finally:
        mt.close()
        if scorer is not None:
            scorer.close()
    rewards = [r for p in parts for r in p["rewards"]]
    hists = [h for p in parts for h in p["histories"]]
    samples = [x for p in parts for x in p["samples"]][:4]
    r = np.concatenate(rewards)
    result = summarize(r >= success_threshold, group_sizes, ks)
    result.update(mean_reward=float(r.mean()), multiturn=history.metrics(hists), samples=samples,
                  settings={"reward": reward, "success_threshold": float(success_threshold),
                            "num_samples": num_samples, "max_new_tokens": cfg.rollout.max_new_tokens,
                            "max_turns": cfg.rollout.max_turns, "temperature": cfg.rollout.temperature})  # fmt: skip
    return result
