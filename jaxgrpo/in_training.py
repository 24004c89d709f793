# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""What the trainer evaluates while it trains: the held-out ``train.eval_every`` evaluation and the ``train.retain``
sets (`jaxgrpo.retain`), each through `jaxgrpo.eval.evaluate` with the rollout's sampler settings."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxgrpo import data as data_lib
from jaxgrpo import eval as eval_lib


def evaluate_held_out(tr: Any, step: int) -> dict[str, float]:
    """The trainer's ``train.eval_every`` evaluation (``tr`` a `jaxgrpo.trainer.Trainer`): pass@1 / pass@G and
    measured vs i.i.d. degeneracy at G on `train.eval_examples` held-out prompts (the dataset's "test" split), sampled
    like the rollouts; written to <run_dir>/eval/step<N>/ too."""
    if tr.eval_examples is None:
        data_cfg = dataclasses.replace(tr.cfg.data, split="test", num_examples=tr.cfg.train.eval_examples)
        tr.eval_examples = data_lib.load_dataset(data_cfg, tr.cfg.seed)
    r = tr.cfg.rollout
    result = eval_lib.evaluate(
        tr.model_config, tr.state.params, tr.tokenizer, tr.eval_examples,
        eval_lib.correctness_reward(tr.cfg, None), num_samples=r.group_size, group_sizes=[r.group_size],
        key=jax.random.fold_in(jax.random.fold_in(tr.key, step), 1), max_new_tokens=r.max_new_tokens,
        temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, eos_token_ids=tr.eos_token_ids,
        data_config=tr.cfg.data, mesh=tr.mesh)
    eval_lib.write_report(result, tr.run_dir / "eval" / f"step{step}")
    (deg,) = result["degeneracy"]
    out = {f"eval/pass@{k}": v for k, v in result["pass@k"].items()}
    out.update({"eval/mean_reward": result["mean_reward"], "eval/degeneracy_measured": deg["measured"],
                "eval/degeneracy_iid": deg["iid"]})
    return out


def retain_accuracy(tr: Any, step: int) -> dict[str, float]:
    """The trainer's ``train.retain`` figures (``tr`` a `jaxgrpo.trainer.Trainer`): ``retain/<name>/accuracy`` (mean
    success rate) of the policy on each `train.retain` set, G samples per prompt sampled like the rollouts."""
    r, out = tr.cfg.rollout, {}
    for i, rs in enumerate(tr.retain_sets):
        if rs.name not in tr.retain_examples:
            tr.retain_examples[rs.name] = data_lib.load_dataset(rs.data, tr.cfg.seed)
        result = eval_lib.evaluate(
            tr.model_config, tr.state.params, tr.tokenizer, tr.retain_examples[rs.name], rs.reward,
            num_samples=r.group_size, group_sizes=[], key=jax.random.fold_in(jax.random.fold_in(tr.key, step),
                                                                               2 + i),
            max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
            eos_token_ids=tr.eos_token_ids, data_config=rs.data, mesh=tr.mesh)  # fmt: skip
        out[f"retain/{rs.name}/accuracy"] = result["mean_success_rate"]
    return out
