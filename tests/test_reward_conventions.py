# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Batched reward functions in TRL's convention beside jaxgrpo's per-sample ones: the detection rule, the keyword
arguments they receive, None as "no reward", failures, and TRL's own reward functions run through `Scorer`.

The TRL-style functions below are written after the examples of TRL's GRPOTrainer documentation (length, format,
ground-truth column, multi-task with None); their expected rewards are worked out by hand.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from jaxgrpo import rewards
from jaxgrpo.example import Example


def ex(answer: str, prompt: str = "What is 1 + 1?", **meta) -> Example:
    return Example(prompt=prompt, answer=answer, meta=meta)


# -- TRL-style functions (GRPOTrainer docs' examples, re-written) ----------------------------------------------------


def length_reward(completions, **kwargs):
    """Closer to 20 characters is better."""
    return [-abs(20 - len(c)) for c in completions]


def think_answer_format(completions, **kwargs):
    pattern = re.compile(r"^<think>.*?</think><answer>.*?</answer>$", re.DOTALL)
    return [1.0 if pattern.match(c) else 0.0 for c in completions]


def boxed_matches_ground_truth(completions, ground_truth, **kwargs):
    found = [re.search(r"\\boxed\{(.*?)\}", c) for c in completions]
    return [1.0 if m is not None and m.group(1) == gt else 0.0 for m, gt in zip(found, ground_truth)]


def math_only(prompts, completions, task, **kwargs):
    """Scores math samples, None (no opinion) for the others."""
    return [None if t != "math" else float(c.strip() == "2") for c, t in zip(completions, task)]


def code_only(prompts, completions, task, **kwargs):
    return [None if t != "code" else float("print" in c) for c, t in zip(completions, task)]


def test_trl_documented_functions_closed_form():
    texts = ["<think>easy</think><answer>2</answer>", "x" * 25, "so \\boxed{4}", "\\boxed{2}"]
    examples = [ex("2", ground_truth="2"), ex("2", ground_truth="2"), ex("4", ground_truth="4"),
                ex("3", ground_truth="3")]
    r, valid = rewards.score(texts, examples, [(length_reward, 1.0)])
    np.testing.assert_array_equal(r, [-17.0, -5.0, -8.0, -11.0])
    r, _ = rewards.score(texts, examples, [(think_answer_format, 1.0)])
    np.testing.assert_array_equal(r, [1.0, 0.0, 0.0, 0.0])
    r, valid = rewards.score(texts, examples, [(boxed_matches_ground_truth, 2.0), (think_answer_format, 0.5)],
                             batch_size=2)
    np.testing.assert_array_equal(r, [0.5, 0.0, 2.0, 0.0])
    assert valid.all()


def test_multi_task_none_means_no_opinion_and_no_score_means_invalid():
    texts = ["2", "print(1)", "3", "hello"]
    examples = [ex("2", task="math"), ex("", task="code"), ex("2", task="math"), ex("", task="chat")]
    r, valid = rewards.score(texts, examples, [(math_only, 1.0), (code_only, 3.0)])
    np.testing.assert_array_equal(valid, [True, True, True, False])  # nobody scores the chat sample
    np.testing.assert_array_equal(r, [1.0, 3.0, 0.0, 0.0])
    # one function: None drops the sample (TRL: "no reward"), also under on_error="error"
    r, valid = rewards.score(texts, examples, [(math_only, 1.0)])
    np.testing.assert_array_equal(valid, [True, False, True, False])


def test_per_sample_none_is_no_reward_too():
    def only_short(completion, example):
        return None if len(completion) > 3 else 1.0

    r, valid = rewards.score(["ab", "abcdef"], [ex("1"), ex("1")], [(only_short, 1.0)])
    np.testing.assert_array_equal(valid, [True, False])
    r, valid = rewards.score(["ab", "abcdef"], [ex("1"), ex("1")], [(only_short, 1.0), ("arithmetic", 0.5)])
    np.testing.assert_array_equal(valid, [True, True])
    np.testing.assert_array_equal(r, [1.0, 0.0])


class _Judge:
    def __call__(self, completions, **kwargs):
        return [float(len(c)) for c in completions]


def _per_sample(completion, example, **kw):
    return 1.0


def _positional_batch(texts, rows):
    return [1.0] * len(texts)


@rewards.batched
def _marked_batch(texts, rows):
    return [1.0] * len(texts)


@pytest.mark.parametrize(
    "fn, expected",
    [
        (rewards.gsm8k_strict, False),
        (_per_sample, False),  # positional parameters first: per sample, **kw or not
        (lambda completion, example: 1.0, False),
        (length_reward, True),  # a parameter named completions
        (math_only, True),
        (lambda prompts, **kw: [], True),  # a parameter named prompts
        (lambda **kw: [], True),  # keyword arguments only
        (_Judge(), True),  # a callable object
        (functools.partial(boxed_matches_ground_truth, ground_truth=["1"]), True),
        (_positional_batch, False),  # neither rule applies ...
        (_marked_batch, True),  # ... unless marked with @rewards.batched
        (len, False),
    ],
)
def test_detection_rule(fn, expected):
    assert rewards.is_batched(fn) is expected


def test_batched_function_gets_trl_keyword_arguments():
    seen = []

    def spy(prompts, completions, **kwargs):
        seen.append({"prompts": prompts, "completions": completions, **kwargs})
        return [0.0] * len(completions)

    def narrow(completions, answer):  # no **kwargs: only what it names
        seen.append({"completions": completions, "answer": answer})
        return [1.0] * len(completions)

    examples = [ex("2", prompt="P0", index=0, solution="1+1=2"), ex("2", prompt="P0", index=0, solution="1+1=2"),
                ex("5", prompt="P1", index=4)]
    rewards.score(["a", "b", "c"], examples, [(spy, 1.0), (narrow, 1.0)], completion_ids=[[1], [2, 3], []],
                  batch_size=2)
    first, second, narrow_first, _ = seen
    assert first == {"prompts": ["P0", "P0"], "completions": ["a", "b"], "completion_ids": [[1], [2, 3]],
                     "answer": ["2", "2"], "index": [0, 0], "solution": ["1+1=2", "1+1=2"]}
    assert second == {"prompts": ["P1"], "completions": ["c"], "completion_ids": [[]], "answer": ["5"],
                      "index": [4]}
    assert narrow_first == {"completions": ["a", "b"], "answer": ["2", "2"]}
    # a column one example lacks is None there
    seen.clear()
    rewards.score(["a", "b"], [ex("1", index=0, solution="s"), ex("1", index=1)], [(spy, 1.0)])
    assert seen[0]["solution"] == ["s", None]


def _wrong_length(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def _nan_for_b(completions, **kwargs):
    return [float("nan") if c == "b" else 1.0 for c in completions]


def _raises(completions, **kwargs):
    raise KeyError("ground_truth")


@pytest.mark.parametrize(
    "fn, sample, what",
    [
        (_wrong_length, 0, "returned 3 rewards for a batch of 4 completions"),
        (_nan_for_b, 1, "returned the non-finite value nan"),
        (_raises, 0, "raised KeyError: 'ground_truth'"),
    ],
)
def test_batched_failures_name_function_and_sample(fn, sample, what):
    examples = [ex("1", prompt=f"prompt {i}") for i in range(4)]
    with pytest.raises(rewards.RewardError) as info:
        rewards.score(["a", "b", "c", "d"], examples, [(fn, 1.0)])
    msg = str(info.value)
    assert f"reward {fn.__name__!r} {what}" in msg and f"sample {sample}, prompt 'prompt {sample}'" in msg
    assert "algo.on_reward_error=invalidate" in msg and "\n" not in msg


def test_batched_invalidate_drops_only_what_failed():
    examples = [ex("1") for _ in range(4)]
    texts = ["a", "b", "c", "d"]
    _, valid = rewards.score(texts, examples, [(_nan_for_b, 1.0)], on_error="invalidate", batch_size=2)
    np.testing.assert_array_equal(valid, [True, False, True, True])
    _, valid = rewards.score(texts, examples, [(_wrong_length, 1.0)], on_error="invalidate", batch_size=2)
    assert not valid.any()  # a wrong-length answer cannot be attributed: its whole batch is dropped
    # ... even where another function scores those rows: the sum would silently lack the failed function
    for failing in (_wrong_length, _raises):
        rw, valid = rewards.score(texts, examples, [(failing, 1.0), (_per_sample_half, 1.0)], on_error="invalidate",
                                  batch_size=2)  # fmt: skip
        assert not valid.any() and not rw.any(), failing.__name__


def _per_sample_half(completion, example):
    return 0.5


def test_a_batched_function_is_called_once_per_group_whatever_the_group_sizes():
    """An adaptive schedule's groups of 4, 8 and 4 rows with G = 8: three calls, each on one prompt's rows (cut every
    G rows, rows 0-7 would mix prompts A and B)."""
    calls = []

    def record(prompts, completions, **kwargs):
        calls.append(list(prompts))
        return [1.0] * len(completions)

    examples = [ex("1", prompt=p) for p, g in (("A", 4), ("B", 8), ("C", 4)) for _ in range(g)]
    scorer = rewards.Scorer([(record, 1.0)], workers=0, batch_size=8)
    rw, valid, _ = scorer(["x"] * 16, examples, group_sizes=[4, 8, 4])
    assert calls == [["A"] * 4, ["B"] * 8, ["C"] * 4] and valid.all() and (rw == 1.0).all()
    calls.clear()
    scorer(["x"] * 16, examples)  # without group sizes: every batch_size rows
    assert calls == [["A"] * 4 + ["B"] * 4, ["B"] * 4 + ["C"] * 4]
    with pytest.raises(ValueError, match=r"group sizes \[4, 8\] do not add up to the 16 completions"):
        scorer(["x"] * 16, examples, group_sizes=[4, 8])
    scorer.close()


def test_combine_mixes_conventions():
    combined = rewards.combine([(length_reward, 1.0), ("arithmetic", 10.0), (math_only, 100.0)])
    assert combined("2", ex("2", task="math")) == -19.0 + 10.0 + 100.0
    assert combined("2", ex("3", task="chat")) == -19.0


# -- TRL's own reward functions (conversational) -------------------------------------------------------------------


def test_trl_accuracy_reward_through_the_conversational_adapter():
    from trl import rewards as trl_rewards
    accuracy = rewards.conversational(trl_rewards.accuracy_reward)
    assert rewards.is_batched(accuracy)
    texts = ["The answer is \\boxed{\\frac{1}{3}}", "The answer is \\boxed{\\frac{1}{2}}", "\\boxed{2}", "\\boxed{2}"]
    examples = [ex("1/3", solution="$\\frac{1}{3}$"), ex("1/3", solution="$\\frac{1}{3}$"),
                ex("2", solution="$2$"), ex("x", solution="no math here")]
    for workers, timeout in ((0, None), (2, 30.0)):  # TRL's function turns its signal timeouts off off-main-thread
        r, valid = rewards.score(texts, examples, [(accuracy, 1.0)], workers=workers, timeout=timeout)
        np.testing.assert_array_equal(r, [1.0, 0.0, 1.0, 0.0])
        np.testing.assert_array_equal(valid, [True, True, True, False])  # unparseable gold: TRL says None
    think = rewards.conversational(trl_rewards.think_format_reward)
    r, _ = rewards.score(["<think>\nhm\n</think>\n2", "2"], [ex("2"), ex("2")], [(think, 1.0)])
    np.testing.assert_array_equal(r, [1.0, 0.0])


def test_columns_reach_batched_functions_row_by_row():
    """`Scorer(..., columns=)`: one entry per completion, sliced with the call's rows (a multi-turn run passes TRL's
    ``environments``); a reserved name or a wrong length is refused."""

    def by_env(completions, environments, **kwargs):
        return [float(e) for e in environments]

    scorer = rewards.Scorer([(by_env, 1.0), (length_reward, 0.0)], batch_size=2)
    try:
        r, valid, _ = scorer(["a", "b", "c"], [ex("1")] * 3, columns={"environments": [3, 5, 7]})
        np.testing.assert_array_equal(r, [3.0, 5.0, 7.0])
        with pytest.raises(ValueError, match="column 'prompts' must be a new name with one entry per completion"):
            scorer(["a"], [ex("1")], columns={"prompts": ["x"]})
        with pytest.raises(ValueError, match=r"column 'environments' must be .* \(2\)"):
            scorer(["a", "b"], [ex("1")] * 2, columns={"environments": [1]})
    finally:
        scorer.close()
