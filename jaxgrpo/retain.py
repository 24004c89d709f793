# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Capability retention: named held-out prompt sets evaluated during training (``train.retain``, ``retain_every``).

Each entry of ``train.retain`` is ``name: {data keys..., reward: optional}``: the run's own ``data`` section with the
given keys replaced (e.g. ``{source: words, difficulty: 1, split: test, num_examples: 64}``), so the prompts are
rendered with the run's template and system prompt unless the entry changes them. Success is judged by ``reward``
when given, else by the run's correctness reward when it fits the set's source (`jaxgrpo.rewards.REWARD_SOURCES`),
else by the source's own answer check (`jaxgrpo.eval.correctness_reward`). Every ``retain_every`` steps the trainer
runs `jaxgrpo.eval.evaluate` on each set with the rollout's sampler settings and G samples per prompt and logs
``retain/<name>/accuracy``, the mean success rate (pass@1 = mean c/n over prompts).

`resolve(cfg)` turns the entries into `RetainSet`s and is what `jaxgrpo.config.validate` calls, so a bad entry (an
unknown data key, a value of the wrong type, a reward that does not fit the source) fails at load time.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax

from jaxgrpo import coerce
from jaxgrpo import rewards as rewards_lib
from jaxgrpo.config_sections import Config, DataConfig
from jaxgrpo.errors import ConfigError

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_DEFAULT_REWARD = {"synthetic": "arithmetic", "gsm8k": "gsm8k", "words": "gsm8k_lenient"}
_CORRECTNESS = ("gsm8k", "gsm8k_lenient", "arithmetic", "arithmetic_lenient")


@dataclasses.dataclass(frozen=True)
class RetainSet:
    """One retention set: its name, the data section that loads its prompts, and the reward that defines success."""

    name: str
    data: DataConfig
    reward: str


def _reward_for(cfg: Config, data: DataConfig, explicit: Any, where: str) -> str:
    if explicit is not None:
        if not isinstance(explicit, str):
            raise ConfigError(f"{where}.reward must be a reward name, got {explicit!r}")
        try:
            rewards_lib.resolve(explicit)
        except ValueError as e:
            raise ConfigError(f"{where}.reward: {e}") from None
        return explicit
    for name in cfg.data.rewards:
        if name in _CORRECTNESS and data.source in rewards_lib.REWARD_SOURCES.get(name, ()):
            return name
    return _DEFAULT_REWARD[data.source]


def resolve(cfg: Config) -> list[RetainSet]:
    """The run's retention sets in config order; ConfigError naming ``train.retain.<name>.<key>`` for a bad entry."""
    out = []
    for name, spec in cfg.train.retain.items():
        where = f"train.retain.{name}"
        if not _NAME_RE.fullmatch(name):
            raise ConfigError(f"{where}: a retention set's name becomes the metric retain/<name>/accuracy; use "
                              "letters, digits, '_', '-' or '.' (e.g. easy, gsm8k)")  # fmt: skip
        spec = dict(spec)
        reward = spec.pop("reward", None)
        data = coerce.dataclass_from_mapping(where, DataConfig, {**dataclasses.asdict(cfg.data), **spec})
        if data.source == "words":
            from jaxgrpo.word_arithmetic import WORDS_LEVELS, WORDS_SPLITS

            if data.difficulty not in WORDS_LEVELS or data.split not in WORDS_SPLITS:
                raise ConfigError(f"{where}: data.source=words needs difficulty in {sorted(WORDS_LEVELS)} and split "
                                  f"in {list(WORDS_SPLITS)}, got difficulty={data.difficulty}, split={data.split!r}")
        if data.num_examples is not None and data.num_examples < 1:
            raise ConfigError(f"{where}.num_examples must be >= 1 or null, got {data.num_examples}")
        out.append(RetainSet(name, data, _reward_for(cfg, data, reward, where)))
    if cfg.train.retain_every < 0:
        raise ConfigError(f"train.retain_every must be >= 0 (0 = never), got {cfg.train.retain_every}")
    return out


# -- during training ----------------------------------------------------------------------------------------------


def evaluate_held_out(tr: Any, step: int) -> dict[str, float]:
    """The trainer's ``train.eval_every`` evaluation (``tr`` a `jaxgrpo.trainer.Trainer`): pass@1 / pass@G and
    measured vs i.i.d. degeneracy at G on `train.eval_examples` held-out prompts (the dataset's "test" split), sampled
    like the rollouts; written to <run_dir>/eval/step<N>/ too."""
    from jaxgrpo import data as data_lib
    from jaxgrpo import eval as eval_lib  # (eval imports config, which imports this module)

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
    from jaxgrpo import data as data_lib
    from jaxgrpo import eval as eval_lib

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
