# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Arithmetic asked in words for a pretrained chat model: a graded task family (``data.source=words``).

Each example is ``"What is a + b? Reply with just the number."`` (or ``a * b``) with the exact integer result as its
gold answer. It is meant for a small instruction-tuned model (SmolLM2-135M-Instruct) sampled with its chat template;
the reward is ``rewards.gsm8k_lenient``, which checks the **last** number of the completion (the model tends to
restate the question, "3 + 4 = 7", so the first number is usually an operand, not the answer).

Levels (``data.difficulty``), ordered by how often the base SmolLM2-135M-Instruct solves them (measured by
``benchmarks/degeneracy_real.py base``: ``benchmarks/results/degeneracy/real/base_success.json``):

  1. one-digit sums ``a + b``, a, b in 0..9 (100 problems);
  2. one-digit products ``a * b``, a, b in 2..9 (64 problems);
  3. a two-digit and a one-digit number ``a + b``, a in 10..99, b in 1..9 (810 problems);
  4. two-digit sums ``a + b``, a, b in 10..99 (8,100 problems);
  5. two-digit minus one-digit ``a - b``, a in 10..99, b in 1..9 (810 problems);
  6. two-digit times one-digit ``a * b``, a in 10..99, b in 1..9 (810 problems);
  7. two-digit differences ``a - b``, 10 <= b < a <= 99 (a positive result; 4,005 problems);
  8. two-digit products ``a * b``, a, b in 10..99 (8,100 problems).

Levels 5-8 were added for the study's second edition (``benchmarks/degeneracy_real2.py``), whose warmed-up model
needs levels between "solved" and "never": 5 and 6 for a matched level, 7 and 8 for a too-hard one (its warmed-up
model solved 11% of level 5, above the too-hard band).

Held-out split: every problem of a level belongs to exactly one split, chosen by a fixed hash of the problem
(CRC-32 of ``"level:a:b"``; ``test`` holds about a quarter, ``train`` the rest), so no test prompt is ever trained on.
``word_arithmetic(n, difficulty, seed, split)`` draws ``n`` problems of that split in a random order from
``default_rng([seed, difficulty, crc32(split)])``: distinct problems while ``n`` is at most the split's size, then
the split's problems again in a fresh permutation.

Pair splits (``pair-train`` / ``pair-test``, the second edition's): the held-out unit is the *unordered* pair
{a, b}, so a test problem's commuted twin (``b + a``) is never trained on: a problem is in ``pair-test`` iff
``crc32("pair:level:min(a,b):max(a,b)") % 3 == 0`` (about a third: 286, 2,732, 249, 262, 1,327 and 2,714 test
problems at levels 3-8, 28 and 21 at levels 1 and 2). The ``train``/``test`` splits stay as they were, so the first
edition's runs reproduce.
"""

from __future__ import annotations

import zlib

import numpy as np

from jaxgrpo.errors import DataError
from jaxgrpo.example import Example

WORDS_LEVELS: dict[int, str] = {
    1: "one-digit sums: 'What is 3 + 4?' -> '7'",
    2: "one-digit products: 'What is 6 * 7?' -> '42'",
    3: "two-digit plus one-digit: 'What is 47 + 8?' -> '55'",
    4: "two-digit sums: 'What is 23 + 58?' -> '81'",
    5: "two-digit minus one-digit: 'What is 47 - 8?' -> '39'",
    6: "two-digit times one-digit: 'What is 23 * 4?' -> '92'",
    7: "two-digit differences: 'What is 58 - 23?' -> '35'",
    8: "two-digit products: 'What is 23 * 58?' -> '1334'",
}
WORDS_MIN_DIFFICULTY, WORDS_MAX_DIFFICULTY = min(WORDS_LEVELS), max(WORDS_LEVELS)
WORDS_SPLITS = ("train", "test", "pair-train", "pair-test")
INSTRUCTION = "Reply with just the number."
TEST_FRACTION_NUM, TEST_FRACTION_DEN = 1, 4  # a problem is held out iff crc32 % 4 == 0
PAIR_TEST_DEN = 3  # pair splits: an unordered pair is held out iff crc32 % 3 == 0

_OPERANDS: dict[int, tuple[str, range, range]] = {
    1: ("+", range(0, 10), range(0, 10)),
    2: ("*", range(2, 10), range(2, 10)),
    3: ("+", range(10, 100), range(1, 10)),
    4: ("+", range(10, 100), range(10, 100)),
    5: ("-", range(10, 100), range(1, 10)),
    6: ("*", range(10, 100), range(1, 10)),
    7: ("-", range(10, 100), range(10, 100)),  # only b < a (_keep): the result is positive
    8: ("*", range(10, 100), range(10, 100)),
}


def _keep(level: int, a: int, b: int) -> bool:
    return level != 7 or b < a


def _is_test(level: int, a: int, b: int) -> bool:
    return zlib.crc32(f"{level}:{a}:{b}".encode()) % TEST_FRACTION_DEN < TEST_FRACTION_NUM


def _is_pair_test(level: int, a: int, b: int) -> bool:
    return zlib.crc32(f"pair:{level}:{min(a, b)}:{max(a, b)}".encode()) % PAIR_TEST_DEN == 0


def problems(difficulty: int, split: str) -> list[tuple[int, int]]:
    """All operand pairs ``(a, b)`` of a level that belong to `split` (`WORDS_SPLITS`), in a fixed order."""
    _check(difficulty, split)
    _, ra, rb = _OPERANDS[difficulty]
    held_out = split.endswith("test")
    in_test = _is_pair_test if split.startswith("pair-") else _is_test
    return [(a, b) for a in ra for b in rb if _keep(difficulty, a, b) and in_test(difficulty, a, b) == held_out]


def question(difficulty: int, a: int, b: int) -> str:
    """The prompt text of one problem."""
    op = _OPERANDS[difficulty][0]
    return f"What is {a} {op} {b}? {INSTRUCTION}"


def _check(difficulty: int, split: str) -> None:
    if isinstance(difficulty, bool) or not isinstance(difficulty, int) or difficulty not in WORDS_LEVELS:
        raise DataError(f"data.difficulty={difficulty!r} is not a level of data.source=words; valid levels: "
                        + "; ".join(f"{k} = {v}" for k, v in WORDS_LEVELS.items()))  # fmt: skip
    if split not in WORDS_SPLITS:
        raise DataError(f"data.split={split!r} is not a split of data.source=words; valid splits: "
                        + ", ".join(WORDS_SPLITS))


def word_arithmetic(n: int, difficulty: int, seed: int, split: str = "train") -> list[Example]:
    """`n` problems of level `difficulty` from `split`, deterministic in (seed, difficulty, split) (module docstring).

    The gold answer is the exact result as text; ``meta`` holds the operands, the operator and the level.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DataError(f"word_arithmetic: n must be a positive int, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DataError(f"word_arithmetic: seed must be a non-negative int, got {seed!r}")
    pool = problems(difficulty, split)
    rng = np.random.default_rng([seed, difficulty, zlib.crc32(split.encode())])
    order: list[int] = []
    while len(order) < n:
        order.extend(int(i) for i in rng.permutation(len(pool)))
    op = _OPERANDS[difficulty][0]
    out = []
    for index, j in enumerate(order[:n]):
        a, b = pool[j]
        value = a + b if op == "+" else a - b if op == "-" else a * b
        meta = {"source": "words", "difficulty": difficulty, "index": index, "a": a, "b": b, "op": op}
        out.append(Example(question(difficulty, a, b), str(value), meta))
    return out


def default_size(difficulty: int, split: str) -> int:
    """The number of distinct problems of a level's split (the dataset size when data.num_examples is null)."""
    return len(problems(difficulty, split))
