# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.rewards: answer extraction on tricky strings, exact normalisation, format, the RLCR calibration
reward against hand-computed values, and `score`'s error / invalidate handling."""

from fractions import Fraction

import chex
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxgrpo import rewards
from jaxgrpo.data import Example

F = Fraction


def ex(answer: str, prompt: str = "How many apples?", **meta) -> Example:
    return Example(prompt=prompt, answer=answer, meta=meta)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("#### 72", F(72)),
        ("#### 1,000.00", F(1000)),
        ("Each costs $5.\n#### $1,234", F(1234)),
        ("#### -5", F(-5)),
        ("#### +8", F(8)),
        ("#### 0.25", F(1, 4)),
        ("#### 3/4", F(3, 4)),
        ("#### 50%", F(50)),
        ("####72", F(72)),
        ("#### 72\nI hope this helps! 99 bottles.", F(72)),
        ("#### 7 apples and 3 pears", F(7)),
        ("first guess\n#### 3\nwait, no\n#### 4", F(4)),
        ("#### 4\n#### ", None),  # the last marker has no number: no answer, although an earlier one had
        ("#### four", None),
        ("The answer is 72.", None),  # strict mode wants the marker
        ("", None),
        ("#### \\frac{1}{8}", F(1, 8)),
    ],
)
def test_strict_extraction(text, expected):
    assert rewards.normalize_number(rewards.extract_answer(text, "strict")) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 72.", F(72)),
        ("It costs $1,000.50 in total", F(2001, 2)),
        ("pages 3-5 of the book", F(5)),  # a dash glued to a digit is not a minus sign
        ("-7 is the result", F(-7)),
        ("Final answer:\n- 42", F(42)),  # a markdown bullet is not a minus sign
        ("So we have 50 - 8", F(8)),  # nor is a spaced operator
        ("the change is −$5", F(-5)),
        ("so the total is 0.5 or 1/2", F(1, 2)),
        ("#### 12 but then 13", F(13)),
        ("we get \\boxed{\\frac{3}{4}} and then 12", F(3, 4)),  # \boxed wins over a later number
        ("\\boxed{1{,}000}", F(1000)),
        ("\\boxed{x = 2} ok", F(2)),
        ("no numbers here", None),
    ],
)
def test_lenient_extraction(text, expected):
    assert rewards.normalize_number(rewards.extract_answer(text, "lenient")) == expected


@pytest.mark.parametrize(
    "s, expected",
    [
        ("1,000", F(1000)),
        ("$1,000.00", F(1000)),
        ("1000.0", F(1000)),
        ("+3", F(3)),
        ("-0.5", F(-1, 2)),
        ("3/4", F(3, 4)),
        (" 42 ", F(42)),
        ("12%", F(12)),
        ("0.1", F(1, 10)),  # exact, not the binary float 0.1
        ("1/0", None),
        ("abc", None),
        ("nan", None),
        ("inf", None),
        ("", None),
        (None, None),
        ("1.2.3", None),
    ],
)
def test_normalize_number(s, expected):
    assert rewards.normalize_number(s) == expected


@given(st.fractions(max_denominator=10_000))
def test_format_number_round_trips(x):
    assert rewards.normalize_number(rewards.format_number(x)) == x


def test_format_number_examples():
    assert [rewards.format_number(F(n, d)) for n, d in [(1000, 1), (-1, 2), (1, 3), (5, 2), (-1, 8)]] == [
        "1000", "-0.5", "1/3", "2.5", "-0.125"]


def test_extract_answer_bad_mode():
    with pytest.raises(ValueError, match="strict"):
        rewards.extract_answer("1", "fuzzy")


def test_gsm8k_correct():
    gold = ex("1000")
    assert rewards.gsm8k_correct("so 10 * 100\n#### 1,000.00", gold) == 1.0
    assert rewards.gsm8k_correct("#### 999", gold) == 0.0
    assert rewards.gsm8k_correct("it is 1000", gold, "strict") == 0.0
    assert rewards.gsm8k_correct("it is 1000", gold, "lenient") == 1.0
    assert rewards.REWARDS["gsm8k"]("#### 1000", gold) == 1.0
    assert rewards.REWARDS["gsm8k_lenient"]("1000 it is", gold) == 1.0
    with pytest.raises(ValueError, match="gold answer"):
        rewards.gsm8k_correct("#### 1", ex("many"))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("6 * 7 = 42\n#### 42", 1.0),
        ("#### 42\n", 1.0),
        ("#### 42\n<confidence>0.9</confidence>", 1.0),
        ("#### 1,000.50\nConfidence: 80%", 1.0),
        ("#### 42 apples", 0.0),
        ("#### 4\n#### 42", 0.0),
        ("the answer is 42", 0.0),
        ("#### 42\nbut maybe 41", 0.0),
        ("#### x", 0.0),
    ],
)
def test_format_reward(text, expected):
    assert rewards.format_reward(text, ex("42")) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<confidence>0.8</confidence>", 0.8),
        ("Confidence: 80%", 0.8),
        ("confidence = 0.25", 0.25),
        ("<confidence> 1 </confidence>", 1.0),
        ("Confidence: 0.3 ... final Confidence: 0.6", 0.6),
        ("<confidence>1.5</confidence>", None),
        ("<confidence>high</confidence>", None),
        ("no confidence given", None),
    ],
)
def test_extract_confidence(text, expected):
    q = rewards.extract_confidence(text)
    assert (q is None) if expected is None else q == pytest.approx(expected)


@pytest.mark.parametrize(
    "text, expected",
    [
        # R = c - (q - c)^2, by hand
        ("#### 12\n<confidence>0.8</confidence>", 1 - 0.2**2),  # correct, q=0.8: 0.96
        ("#### 13\n<confidence>0.8</confidence>", 0 - 0.8**2),  # wrong, q=0.8: -0.64
        ("#### 12\nConfidence: 30%", 1 - 0.7**2),  # 0.51
        ("#### 12\nConfidence: 0.9.", 1 - 0.1**2),  # a sentence's period is not part of the number
        ("#### 13\nConfidence: 0%", 0.0),  # wrong and said so: the best a wrong answer can get
        ("#### 12\n<confidence>1</confidence>", 1.0),
        ("#### 12", 0.0),  # missing confidence: the full Brier penalty 1
        ("#### 13", -1.0),
        ("#### 12\n<confidence>2</confidence>", 0.0),  # out of range counts as missing
    ],
)
def test_calibration_reward_by_hand(text, expected):
    assert rewards.calibration_reward(text, ex("12")) == pytest.approx(expected, abs=1e-12)


def test_calibration_lenient_ignores_the_confidence_number():
    text = "The answer is 12. <confidence>0.8</confidence>"
    assert rewards.gsm8k_lenient(text, ex("12")) == 0.0  # plain lenient extraction reads the 0.8
    assert rewards.calibration_reward(text, ex("12"), "lenient") == pytest.approx(1 - 0.2**2)
    assert rewards.REWARDS["calibration_lenient"]("12\nConfidence: 10%", ex("12")) == pytest.approx(1 - 0.9**2)


@given(st.floats(0, 1), st.booleans())
def test_calibration_missing_is_never_better_than_stating(q, correct):
    example = ex("12")
    answer = "12" if correct else "13"
    stated = rewards.calibration_reward(f"#### {answer}\n<confidence>{q!r}</confidence>", example)
    missing = rewards.calibration_reward(f"#### {answer}", example)
    assert missing <= stated


@pytest.mark.parametrize(
    "text, exact, lenient",
    [
        ("7", 1.0, 1.0),
        (" 7\n", 1.0, 1.0),
        ("7<eos>8", 1.0, 1.0),
        ("77", 0.0, 0.0),
        ("7+1", 0.0, 1.0),
        ("", 0.0, 0.0),
        ("seven", 0.0, 0.0),
        ("7.5", 0.0, 0.0),  # the leading number read whole, not its first digits
        ("7/2", 0.0, 0.0),
        ("7,000", 0.0, 0.0),
        ("7.", 0.0, 1.0),
    ],
)
def test_arithmetic_rewards(text, exact, lenient):
    assert rewards.arithmetic_correct(text, ex("7")) == exact
    assert rewards.arithmetic_lenient(text, ex("7")) == lenient


def test_arithmetic_negative():
    assert rewards.arithmetic_correct("-35", ex("-35")) == 1.0
    assert rewards.arithmetic_lenient("-35 ok", ex("-35")) == 1.0
    assert rewards.arithmetic_lenient("35", ex("-35")) == 0.0


def test_score_weighted_sum():
    examples = [ex("12"), ex("12"), ex("5")]
    texts = ["#### 12", "#### 12 apples", "#### 4"]
    r, valid = rewards.score(texts, examples, [("gsm8k", 1.0), ("format", 0.5)])
    chex.assert_shape([r, valid], (3,))
    chex.assert_type(r, np.float32)
    assert valid.dtype == np.bool_ and valid.all()
    np.testing.assert_allclose(r, [1.5, 1.0, 0.5])


def test_score_accepts_callables_import_paths_and_numpy_scalars():
    examples = [ex("1"), ex("2")]

    def length(completion: str, example: Example) -> np.float64:
        return np.float64(len(completion))

    r, valid = rewards.score(["a", "bcd"], examples, [(length, 2.0), ("jaxgrpo.rewards:arithmetic_correct", 1.0)])
    np.testing.assert_allclose(r, [2.0, 6.0])
    assert valid.all()
    combined = rewards.combine([(length, 2.0), ("arithmetic", 1.0)])
    assert combined("1", ex("1")) == 3.0


def _boom(completion, example):
    if completion == "bad":
        raise ZeroDivisionError("division by zero")
    return 1.0


def _nan_on_bad(completion, example):
    return float("nan") if completion == "bad" else 1.0


def _text_on_bad(completion, example):
    return "1.0" if completion == "bad" else 1.0


@pytest.mark.parametrize("fn, what", [(_boom, "raised ZeroDivisionError: division by zero"),
                                      (_nan_on_bad, "non-finite"), (_text_on_bad, "not a real number")])
def test_score_error_names_function_and_example(fn, what):
    examples = [ex("1", prompt="What is one?", index=7), ex("1", prompt="Q" * 100, index=8)]
    with pytest.raises(rewards.RewardError) as info:
        rewards.score(["fine", "bad"], examples, [("arithmetic", 1.0), (fn, 1.0)])
    msg = str(info.value)
    assert fn.__name__ in msg and what in msg
    assert "sample 1" in msg and "dataset example 8" in msg and "QQQ" in msg and "..." in msg
    assert "algo.on_reward_error=invalidate" in msg


def test_score_invalidate():
    examples = [ex("1"), ex("1"), ex("1")]
    r, valid = rewards.score(["1", "bad", "1"], examples, [("arithmetic", 2.0), (_nan_on_bad, 1.0)],
                             on_error="invalidate")
    np.testing.assert_array_equal(valid, [True, False, True])
    np.testing.assert_array_equal(r, np.array([3.0, 0.0, 3.0], np.float32))
    assert np.isfinite(r).all()


@pytest.mark.parametrize(
    "fns, match",
    [
        ([("gsm9k", 1.0)], "did you mean 'gsm8k'"),
        ([("nosuchmodule_xyz:f", 1.0)], "cannot import"),
        ([("gsm8k", float("nan"))], "finite"),
        ([], "at least one"),
    ],
)
def test_score_bad_reward_config(fns, match):
    with pytest.raises(ValueError, match=match):
        rewards.score(["#### 1"], [ex("1")], fns)


def test_score_length_mismatch_and_bad_mode():
    with pytest.raises(ValueError, match="2 completions but 1 examples"):
        rewards.score(["a", "b"], [ex("1")], [("gsm8k", 1.0)])
    with pytest.raises(ValueError, match="on_error"):
        rewards.score(["a"], [ex("1")], [("gsm8k", 1.0)], on_error="ignore")


@given(st.text(alphabet=st.sampled_from(list("0123456789#$,./%-+ \n\\{}boxedfrac<>confidence:")), max_size=60))
def test_reward_functions_never_raise_on_arbitrary_text(text):
    example = ex("12")
    for mode in ("strict", "lenient"):
        got = rewards.extract_answer(text, mode)
        assert got is None or (isinstance(got, str) and got)
    for name, fn in rewards.REWARDS.items():
        if name == "math_verify":  # SymPy: too slow for this many examples (its own test below)
            continue
        value = fn(text, example)
        assert isinstance(value, float) and np.isfinite(value), name
        assert -1.0 <= value <= 1.0, name


@given(st.integers(-10**7, 10**7), st.sampled_from(["", "$"]), st.booleans())
def test_strict_extraction_of_written_integers(n, dollar, commas):
    written = f"{abs(n):,}" if commas else str(abs(n))
    sign = "-" if n < 0 else ""
    text = f"Step 1: 3 + 4 = 7.\n#### {sign}{dollar}{written}\nDone in 2 steps."
    assert rewards.normalize_number(rewards.extract_answer(text, "strict")) == n


# -- math_verify -----------------------------------------------------------------------------------------------------

MATH_VERIFY_CASES = [
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("so it is 0.5", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
    ("#### 1,000", "1000", 1.0),  # GSM8K's marker and thousands commas
    ("Total: $18.00", "18", 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),  # symbolic equality
    ("x = \\boxed{\\frac{\\pi}{2}}", "\\pi/2", 1.0),
    ("\\boxed{\\{1,2\\}}", "\\{2,1\\}", 1.0),  # sets: order does not matter
    ("\\boxed{5} but then 7", "5", 1.0),  # \\boxed{} is preferred to a later number
    ("\\boxed{3}", "-3", 0.0),
    ("\\boxed{0.333}", "\\frac{1}{3}", 0.0),  # not equal at math-verify's 6-digit rounding
    ("no answer here", "3", 0.0),
]


@pytest.mark.parametrize("text, gold, expected", MATH_VERIFY_CASES)
def test_math_verify_closed_form(text, gold, expected):
    assert rewards.math_verify_correct(text, ex(gold)) == expected


def test_math_verify_on_gsm8k_solutions_and_in_worker_threads(gsm8k_dir):
    import json

    rows = [json.loads(line) for line in (gsm8k_dir / "test.jsonl").read_text().splitlines()[:8]]
    texts = [r["answer"] for r in rows] + [t for t, _, _ in MATH_VERIFY_CASES]
    examples = [ex(r["answer"].split("####")[-1].strip()) for r in rows] + [ex(g) for _, g, _ in MATH_VERIFY_CASES]
    expected = [1.0] * len(rows) + [e for _, _, e in MATH_VERIFY_CASES]
    # main thread (Math-Verify's own signal timeouts) and worker threads (those off, the pool's timeout instead)
    for workers, timeout in ((0, None), (3, 60.0)):
        r, valid = rewards.score(texts, examples, [("math_verify", 1.0)], workers=workers, timeout=timeout)
        np.testing.assert_array_equal(r, expected)
        assert valid.all()


def test_math_verify_bad_gold_is_a_reward_error():
    with pytest.raises(rewards.RewardError, match="cannot parse the example's gold answer"):
        rewards.score(["\\boxed{1}"], [ex("}{")], [("math_verify", 1.0)])


@settings(max_examples=25, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789#$,./%-+ \n\\{}boxedfrac^_()=x")), max_size=40))
def test_math_verify_never_raises_on_arbitrary_text(text):
    assert rewards.math_verify_correct(text, ex("12")) in (0.0, 1.0)
