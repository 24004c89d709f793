# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The synthetic arithmetic task: verifiable problems whose difficulty knob moves a small model between the
all-fail, mixed and all-pass regimes of GRPO groups (`DIFFICULTY_LEVELS`).

``synthetic_arithmetic(n, difficulty, seed, split)`` is deterministic in (seed, difficulty, split); the gold answer
is the exact integer result as text, judged by ``rewards.arithmetic_correct``. ``data.load_dataset`` serves it for
``data.source=synthetic``; the config validates ``data.difficulty`` against `MAX_DIFFICULTY`.
"""

from __future__ import annotations

import zlib

import numpy as np

from jaxgrpo.errors import DataError
from jaxgrpo.example import Example

SYNTHETIC_DEFAULT_SIZE = 10_000  # examples generated when data.num_examples is None (the task is unbounded)
MAX_DIFFICULTY = 12
# the splits a config may name: any other name would draw a stream of its own, so a typo would pass for a split
SYNTHETIC_SPLITS = ("train", "test")
DIFFICULTY_LEVELS = {
    0: "copy one digit: '7=' -> '7'",
    1: "sum of two digits without carry (sum <= 9): '3+4=' -> '7'",
    2: "sum of two digits, any (0..18): '8+5=' -> '13'",
    3: "sum of two two-digit numbers: '23+58=' -> '81'",
    4: "sum or difference of two two-digit numbers (may be negative): '23-58=' -> '-35'",
    5: "d >= 5: d-2 two-digit numbers joined by + or -: '12+34-56=' -> '-10' (d=5)",
}

_NO_CARRY_PAIRS = [(a, b) for a in range(10) for b in range(10) if a + b <= 9]


def synthetic_arithmetic(n: int, difficulty: int, seed: int, split: str = "train") -> list[Example]:
    """`n` arithmetic problems ``"a+b="`` → ``"c"`` of the given difficulty (`DIFFICULTY_LEVELS`), deterministic.

    The stream depends on (seed, difficulty, split), so train and test draws differ, but they draw from the same
    problems: ``test`` is not held out. Levels 0-2 have only 10, 55 and 100 distinct problems, and for 10,000 training
    draws (seed 0) 64 of 64 test problems occur in training at level 1, 48 at level 3, 24 at level 4, none at 5.
    The ``words`` source (`jaxgrpo.word_arithmetic`) splits by problem for a held-out set.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DataError(f"synthetic_arithmetic: n must be a positive int, got {n!r}")
    if isinstance(difficulty, bool) or not isinstance(difficulty, int) or not 0 <= difficulty <= MAX_DIFFICULTY:
        raise DataError(f"data.difficulty must be an int in [0, {MAX_DIFFICULTY}], got {difficulty!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DataError(f"synthetic_arithmetic: seed must be a non-negative int, got {seed!r}")
    rng = np.random.default_rng([seed, difficulty, zlib.crc32(split.encode())])
    out = []
    for i in range(n):
        if difficulty == 0:
            a = int(rng.integers(10))
            prompt, value = f"{a}=", a
        elif difficulty == 1:
            a, b = _NO_CARRY_PAIRS[int(rng.integers(len(_NO_CARRY_PAIRS)))]
            prompt, value = f"{a}+{b}=", a + b
        elif difficulty == 2:
            a, b = (int(x) for x in rng.integers(10, size=2))
            prompt, value = f"{a}+{b}=", a + b
        elif difficulty == 3:
            a, b = (int(x) for x in rng.integers(10, 100, size=2))
            prompt, value = f"{a}+{b}=", a + b
        else:
            k = 2 if difficulty == 4 else difficulty - 2
            nums = [int(x) for x in rng.integers(10, 100, size=k)]
            ops = ["+" if s else "-" for s in rng.integers(2, size=k - 1)]
            prompt = str(nums[0]) + "".join(f"{op}{x}" for op, x in zip(ops, nums[1:])) + "="
            value = nums[0] + sum(x if op == "+" else -x for op, x in zip(ops, nums[1:]))
        out.append(Example(prompt, str(value), {"source": "synthetic", "difficulty": difficulty, "index": i}))
    return out



def describe_difficulty(difficulty: int) -> str:
    """Human-readable description of a synthetic difficulty level."""
    return DIFFICULTY_LEVELS[min(difficulty, 5)]
