# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The words task (``data.source=words``): every level's problems by brute force, disjoint train/test splits,
determinism, answers by Python arithmetic, the data.load_dataset hook, the config's errors, and the last-number
reward on the answer shapes SmolLM2 produces."""

from __future__ import annotations

import pytest

from jaxgrpo import config as config_lib
from jaxgrpo import data as data_lib
from jaxgrpo import rewards
from jaxgrpo import word_arithmetic as wa

OPERANDS = {1: (range(10), range(10), "+"), 2: (range(2, 10), range(2, 10), "*"),
            3: (range(10, 100), range(1, 10), "+"), 4: (range(10, 100), range(10, 100), "+"),
            5: (range(10, 100), range(1, 10), "-"), 6: (range(10, 100), range(1, 10), "*"),
            7: (range(10, 100), range(10, 100), "-"), 8: (range(10, 100), range(10, 100), "*")}  # fmt: skip
ANSWER = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def every_problem(level):
    """The level's problems from its definition (level 7 keeps b < a: a two-digit difference is positive)."""
    ra, rb, _ = OPERANDS[level]
    return {(a, b) for a in ra for b in rb if level != 7 or b < a}


@pytest.mark.parametrize("level", sorted(wa.WORDS_LEVELS))
def test_splits_partition_the_level(level):
    every = every_problem(level)
    train, test = set(wa.problems(level, "train")), set(wa.problems(level, "test"))
    assert train | test == every and not train & test
    assert 0.15 < len(test) / len(every) < 0.35  # about a quarter held out


@pytest.mark.parametrize("level", sorted(wa.WORDS_LEVELS))
def test_pair_splits_hold_out_unordered_pairs(level):
    every = every_problem(level)
    train, test = set(wa.problems(level, "pair-train")), set(wa.problems(level, "pair-test"))
    assert train | test == every and not train & test
    unordered = lambda split: {frozenset(p) for p in split}  # noqa: E731
    assert not unordered(train) & unordered(test)  # no {a, b} on both sides: b + a is never a trained twin of a + b
    if level >= 3:
        assert len(test) >= 200 and 0.25 < len(test) / len(every) < 0.42  # about a third held out
    if level == 1:  # the commuted twins exist here: every test pair's twin is a test problem too
        assert all((b, a) in test for a, b in test)


@pytest.mark.parametrize("level,split", [(lv, sp) for lv in sorted(wa.WORDS_LEVELS) for sp in ("test", "pair-test")])
def test_examples_are_correct_distinct_and_deterministic(level, split):
    n = len(wa.problems(level, split))
    ex = wa.word_arithmetic(n, level, 3, split)
    assert ex == wa.word_arithmetic(n, level, 3, split)
    assert ex != wa.word_arithmetic(n, level, 4, split)  # another seed, another order
    assert len({e.prompt for e in ex}) == n  # no repeats until the split is used up
    _, _, op = OPERANDS[level]
    pool = set(wa.problems(level, split))
    for e in ex:
        a, b = e.meta["a"], e.meta["b"]
        assert e.prompt == f"What is {a} {op} {b}? Reply with just the number."
        assert int(e.answer) == ANSWER[op](a, b) and int(e.answer) >= 0
        assert (a, b) in pool
    more = wa.word_arithmetic(n + 3, level, 3, split)  # past the split's size: a second permutation
    assert more[:n] == ex and {e.prompt for e in more[n:]} <= {e.prompt for e in ex}


def test_load_dataset_hook_and_config_errors():
    cfg = config_lib.load_config(None, ["data.source=words", "data.difficulty=2", "data.split=test",
                                        "data.rewards={gsm8k_lenient: 1.0}"])  # fmt: skip
    ex = data_lib.load_dataset(cfg.data, 0)
    assert len(ex) == len(wa.problems(2, "test")) and ex == wa.word_arithmetic(len(ex), 2, 0, "test")
    cfg = config_lib.load_config(None, ["data.source=words", "data.num_examples=5", "data.rewards={gsm8k_lenient: 1}"])
    assert len(data_lib.load_dataset(cfg.data, 0)) == 5
    with pytest.raises(config_lib.ConfigError, match=r"data.difficulty must be a data.source=words level in \[1, 2"):
        config_lib.load_config(None, ["data.source=words", "data.difficulty=0", "data.rewards={gsm8k_lenient: 1}"])
    cfg = config_lib.load_config(None, ["data.source=words", "data.difficulty=5", "data.split=pair-test",
                                        "data.rewards={gsm8k_lenient: 1.0}"])  # fmt: skip
    assert data_lib.load_dataset(cfg.data, 0) == wa.word_arithmetic(len(wa.problems(5, "pair-test")), 5, 0, "pair-test")
    with pytest.raises(config_lib.ConfigError, match="data.split must be one of train, test, pair-train, pair-test"):
        config_lib.load_config(None, ["data.source=words", "data.split=validation", "data.rewards={gsm8k_lenient: 1}"])
    with pytest.raises(config_lib.ConfigError, match=r"rewards for words: gsm8k_lenient"):
        config_lib.load_config(None, ["data.source=words", "data.rewards={arithmetic: 1.0}"])


@pytest.mark.parametrize("split,held", [("pair-train", "pair-test"), ("train", "test"), ("test", "test")])
def test_a_run_is_evaluated_on_the_split_held_out_from_its_training_split(split, held):
    """The trainer's ``train.eval_every`` set and `jaxgrpo.eval`'s default split: after ``pair-train`` the held-out
    unordered pairs, so no evaluated problem's commuted twin was trained on."""
    cfg = config_lib.load_config(None, ["data.source=words", "data.difficulty=4", f"data.split={split}",
                                        "data.rewards={gsm8k_lenient: 1}"])  # fmt: skip
    assert data_lib.held_out_split(split) == held
    held_cfg = data_lib.held_out_config(cfg.data, 64)
    assert (held_cfg.split, held_cfg.num_examples, held_cfg.difficulty) == (held, 64, 4)
    ex = data_lib.load_dataset(held_cfg, 0)
    assert len(ex) == 64
    if split == "pair-train":
        trained = {frozenset(p) for p in wa.problems(4, "pair-train")}
        asked = {frozenset(map(int, e.prompt.split("?")[0].split()[2::2])) for e in ex}  # "What is a + b?"
        assert len({e.prompt for e in ex}) == 64 and len(asked) > 32 and not asked & trained  # twins both held out


@pytest.mark.parametrize("completion,reward", [
    ("7", 1.0), ("4 + 3 is 7", 1.0), ("3 + 4 = 7.", 1.0), ("The answer is 7.\n\n", 1.0), ("3 + 4", 0.0),
    ("7, or maybe 8", 0.0), ("", 0.0), ("seven", 0.0),
])  # fmt: skip
def test_last_number_reward(completion, reward):
    level_one = wa.word_arithmetic(100, 1, 0, "train") + wa.word_arithmetic(100, 1, 0, "test")
    ex = next(e for e in level_one if e.prompt.startswith("What is 3 + 4?"))
    assert rewards.REWARDS["gsm8k_lenient"](completion, ex) == reward
