# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`SamplingParams`: how the engine draws tokens (temperature, top-k, top-p, EOS ids) and how many (G rows per prompt,
M tokens per row), validated once with a one-line error naming the bad value. The distribution itself is
`jaxgrpo.token_sampling`'s (see `jaxgrpo.rollout.record` for which one the log-probs are of)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

# How a rollout decodes (`rollout.engine`): static = all groups as one batch until its longest row ends
# (`jaxgrpo.rollout.driver.run` with ``slots=None``); continuous = a fixed number of group slots, each refilled as soon
# as its group has finished.
EngineMode = Literal["static", "continuous"]


def _is_int(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, np.integer))


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """num_samples: G rows per prompt.  max_new_tokens: M.  temperature: > 0 samples, 0 is greedy.  top_p: nucleus
    mass in (0, 1] (1 = off).  top_k: keep the k most likely tokens (0 = off).  eos_token_ids: ids that end a row."""

    max_new_tokens: int
    num_samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        eos = self.eos_token_ids
        eos = (eos,) if _is_int(eos) else tuple(eos)
        if not all(_is_int(e) for e in eos):
            raise ValueError(f"eos_token_ids must be integer token ids (got {eos!r})")
        object.__setattr__(self, "eos_token_ids", tuple(int(e) for e in eos))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        if not _is_int(self.num_samples) or self.num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1 (got {self.num_samples!r})")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1 (got {self.max_new_tokens!r})")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, 0 meaning greedy (got {self.temperature!r})")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], 1 meaning no nucleus truncation (got {self.top_p!r})")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, 0 meaning no top-k truncation (got {self.top_k!r})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check(self, vocab_size: int, max_positions: int, prompts: Sequence[Sequence[int]]) -> None:
        """ValueError naming the first prompt or EOS id that does not fit the model."""
        if any(not 0 <= e < vocab_size for e in self.eos_token_ids):
            raise ValueError(f"eos_token_ids must be token ids in [0, {vocab_size}) (got {self.eos_token_ids!r})")
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
            raise ValueError("prompts must be a non-empty list of token-id lists (got an empty or non-list value)")
        for i, p in enumerate(prompts):
            if isinstance(p, (str, bytes)) or not hasattr(p, "__len__"):
                raise ValueError(f"prompt {i} must be a list of token ids, got {type(p).__name__}; tokenize it first")
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token (e.g. BOS)")
            arr = np.asarray(p)
            if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
                raise ValueError(f"prompt {i} must be a flat list of integer token ids (got dtype {arr.dtype})")
            if arr.min() < 0 or arr.max() >= vocab_size:
                raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size}) (min {arr.min()}, max "
                                 f"{arr.max()})")  # fmt: skip
            if len(p) + self.max_new_tokens > max_positions:
                raise ValueError(f"prompt {i} has {len(p)} tokens; with max_new_tokens={self.max_new_tokens} that is "
                                 f"{len(p) + self.max_new_tokens} positions, beyond the model's "
                                 f"max_position_embeddings={max_positions}; shorten the prompt or lower "
                                 "max_new_tokens")  # fmt: skip
