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

from jaxgrpo import coerce
from jaxgrpo import rewards as rewards_lib
from jaxgrpo.config_sections import Config, DataConfig
from jaxgrpo.errors import ConfigError
from jaxgrpo.synthetic import SYNTHETIC_SPLITS

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_DEFAULT_REWARD = {"synthetic": "arithmetic", "gsm8k": "gsm8k", "words": "gsm8k_lenient"}


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
    for name in cfg.data.rewards:  # the run's own, on its own source or on one the reward fits
        fits = data.source == cfg.data.source or data.source in rewards_lib.REWARD_SOURCES.get(name, ())
        if name in rewards_lib.CORRECTNESS_REWARDS and fits:
            return name
    if data.source not in _DEFAULT_REWARD:
        raise ConfigError(f"{where}.reward: data.source={data.source} has no answer check of its own and the run has "
                          f"no correctness reward ({', '.join(rewards_lib.CORRECTNESS_REWARDS)}) for it; name one, "
                          f"e.g. {where}.reward=math_verify")  # fmt: skip
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
        if data.source == "synthetic" and data.split not in SYNTHETIC_SPLITS:
            raise ConfigError(f"{where}: data.source=synthetic needs split {' or '.join(SYNTHETIC_SPLITS)}, got "
                              f"split={data.split!r}")
        if data.num_examples is not None and data.num_examples < 1:
            raise ConfigError(f"{where}.num_examples must be >= 1 or null, got {data.num_examples}")
        out.append(RetainSet(name, data, _reward_for(cfg, data, reward, where)))
    if cfg.train.retain_every < 0:
        raise ConfigError(f"train.retain_every must be >= 0 (0 = never), got {cfg.train.retain_every}")
    return out
