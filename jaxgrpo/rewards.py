# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Reward functions on (completion text, example): answer extraction, verification, format and calibration.

A reward function is a plain Python callable ``fn(completion: str, example: Example) -> float`` (``RewardFn``).
Configs name them through the registry ``REWARDS`` (``data.rewards: {name: weight}``); a name of the form
``"package.module:function"`` imports a user function. ``score`` applies a weighted sum of them to a batch of
completions and turns a failure (an exception, or a value that is not a finite real number) into a ``RewardError``
naming the function and the example — or, with ``on_error="invalidate"``, into an invalid sample (``valid=False``,
reward 0) that the train step masks out. A NaN never reaches the update silently.

Answers (GSM8K convention, Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems"):

* ``extract_answer(text, "strict")``: the number after the **last** ``####`` marker (text after that number on the
  same line, and later lines, are ignored). If the last marker is not followed by a number there is no answer,
  even when an earlier marker had one: the last marker is the model's final word.
* ``extract_answer(text, "lenient")``: the content of the last ``\\boxed{...}`` if there is one, else the last number
  anywhere in the text.
* ``normalize_number(s)`` maps a numeric string to an exact ``fractions.Fraction``: thousands commas, ``$``, a
  leading ``+``, a trailing ``%`` (read as the number itself: "50%" == 50, since GSM8K golds state percentages as bare
  numbers), LaTeX ``\\frac{a}{b}`` and ``{,}`` are accepted; ``1,000.00`` == ``1000``; ``3/4`` and ``0.75`` are equal
  because both are exact; anything else (``nan``, ``inf``, words, ``1/0``) is ``None``.

Calibration reward of RLCR (Damani et al. 2025, "Beyond Binary Rewards: Training LMs to Reason About Their
Uncertainty", arXiv:2507.16806): the completion states a confidence ``q`` in [0, 1] and

    R = c - (q - c)^2,   c = 1[answer correct]   (correctness plus the negative Brier score)

(c is judged on the completion with its confidence statements removed), which, being built on a bounded proper
scoring rule, is maximised in expectation by the most likely answer stated with its true probability of being
correct. Confidence is read from ``<confidence>0.8</confidence>`` or
``Confidence: 80%`` / ``confidence = 0.8`` (the last such statement wins); a value with ``%`` is divided by 100.
**Missing, unparseable or out-of-range confidence** is scored with the largest possible Brier penalty, 1, so
``R = c - 1``: omitting the confidence is never better than stating any ``q`` in [0, 1] (with ``q = 0`` as the
penalty instead, omission would tie with an honest "0" on wrong answers and the model could learn to stay silent).
This is our choice; the paper's reward is defined on well-formed outputs and pairs it with a format reward.

Synthetic arithmetic (``synthetic.synthetic_arithmetic``): ``arithmetic_correct`` is 1 iff the completion, cut at the
first end-of-sequence marker still present in the text (``<eos>``, ``</s>``, ``<|endoftext|>``, ``<|im_end|>``,
``<|eot_id|>``) and stripped of surrounding whitespace, equals the gold answer string exactly (the trainer decodes
tokens up to and including EOS with ``skip_special_tokens=True``, so normally nothing needs cutting).
``arithmetic_lenient`` accepts any completion whose leading number equals the answer (what follows is ignored).
"""

from __future__ import annotations

import difflib
import fractions
import importlib
import math
import numbers
import re
import typing
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from jaxgrpo.errors import RewardError
from jaxgrpo.example import Example

RewardFn = Callable[[str, Example], float]
Mode = Literal["strict", "lenient"]
# What `score` does with a failing reward function (the config's algo.on_reward_error).
OnRewardError = Literal["error", "invalidate"]
ON_REWARD_ERROR: tuple[str, ...] = typing.get_args(OnRewardError)

# A number as it appears in text: optional sign (not when glued to a preceding word/digit, so "3-5" yields 5, not
# -5), optional $, thousands-grouped or plain digits, optional decimals, optional simple fraction, optional %.
_NUMBER = (
    r"(?:(?<![\w)])[-+−])?\$?\s?"
    r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s?/\s?\d+(?:\.\d+)?)?"
    r"%?"
)
_NUMBER_RE = re.compile(_NUMBER)
_STRICT_RE = re.compile(r"####[ \t]*([^\n]*)")
_LEADING_NUMBER_RE = re.compile(r"\s*(?:\\\$|\$)?\s*(" + _NUMBER + ")")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_EOS_MARKERS = ("<eos>", "</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>")


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = text.find("{", start)
        if i != -1 and text[start + len("\\boxed") : i].strip() == "":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
                j += 1
        start = text.rfind("\\boxed", 0, start)
    return None


def _clean_latex(s: str) -> str:
    s = _FRAC_RE.sub(r"\1/\2", s)
    return s.replace("{,}", ",").replace("\\!", "").replace("\\,", "").replace("\\$", "$").replace("\\%", "%")


def extract_answer(text: str, mode: Mode = "strict") -> str | None:
    """The final-answer number of `text` as written (e.g. ``"$1,000.00"``), or None when there is none.

    strict: the number right after the last ``####``; lenient: the last ``\\boxed{...}`` if any, else the last number.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects a str, got {type(text).__name__}")
    if mode == "strict":
        markers = _STRICT_RE.findall(text)
        if not markers:
            return None
        m = _LEADING_NUMBER_RE.match(_clean_latex(markers[-1]))
        return m.group(1).strip() if m else None
    if mode == "lenient":
        boxed = _last_boxed(text)
        region = _clean_latex(boxed if boxed is not None else text)
        found = _NUMBER_RE.findall(region)
        return found[-1].strip() if found else None
    raise ValueError(f"extract_answer: unknown mode {mode!r}; valid modes: 'strict', 'lenient'")


def normalize_number(s: str | None) -> fractions.Fraction | None:
    """Exact value of a numeric string (``"1,000.00"`` → 1000, ``"3/4"`` → 3/4, ``"-$5"`` → -5), else None."""
    if s is None:
        return None
    t = _clean_latex(str(s)).strip().replace("−", "-")
    t = t.replace(",", "").replace("$", "").replace(" ", "")
    if t.endswith("%"):
        t = t[:-1]
    if t.startswith("+"):
        t = t[1:]
    if not t or not re.fullmatch(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:/-?(?:\d+(?:\.\d*)?|\.\d+))?", t):
        return None
    try:
        if "/" in t:
            num, den = t.split("/")
            den_v = fractions.Fraction(den)
            return None if den_v == 0 else fractions.Fraction(num) / den_v
        return fractions.Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def format_number(x: fractions.Fraction) -> str:
    """Canonical text of an exact number: ``"1000"``, ``"-5"``, ``"0.75"`` (finite decimals), else ``"p/q"``."""
    if x.denominator == 1:
        return str(x.numerator)
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d != 1:
        return f"{x.numerator}/{x.denominator}"
    digits = 0
    while (x * 10**digits).denominator != 1:
        digits += 1
    sign = "-" if x < 0 else ""
    scaled = abs(x.numerator) * 10**digits // x.denominator
    whole, frac = divmod(scaled, 10**digits)
    return f"{sign}{whole}.{frac:0{digits}d}"


def _gold(example: Example) -> fractions.Fraction:
    gold = normalize_number(example.answer)
    if gold is None:
        raise ValueError(f"the example's gold answer {example.answer!r} is not a number")
    return gold


def gsm8k_correct(completion: str, example: Example, mode: Mode = "strict") -> float:
    """1.0 if the extracted final answer equals the example's gold answer exactly (as numbers), else 0.0."""
    pred = normalize_number(extract_answer(completion, mode))
    return float(pred is not None and pred == _gold(example))


def gsm8k_strict(completion: str, example: Example) -> float:
    """`gsm8k_correct` in strict mode (the number after the last ``####``)."""
    return gsm8k_correct(completion, example, "strict")


def gsm8k_lenient(completion: str, example: Example) -> float:
    """`gsm8k_correct` in lenient mode (last ``\\boxed{}`` or last number)."""
    return gsm8k_correct(completion, example, "lenient")


_CONFIDENCE_RES = (
    re.compile(r"<confidence>\s*([^<]*?)\s*</confidence>", re.IGNORECASE),
    re.compile(r"\bconfidence\s*(?:level)?\s*[:=]\s*([0-9.]+\s*%?)", re.IGNORECASE),
)


def _is_confidence_line(line: str) -> bool:
    return any(r.search(line) for r in _CONFIDENCE_RES)


def format_reward(completion: str, example: Example) -> float:
    """1.0 if the completion ends with a well-formed final answer line ``#### <number>``, else 0.0.

    Well-formed: the last line containing ``####`` is exactly ``#### <number>`` (surrounding whitespace allowed),
    ``####`` occurs once in the completion, and anything after that line is blank or a confidence statement.
    """
    del example
    if completion.count("####") != 1:
        return 0.0
    lines = completion.split("\n")
    idx = next(i for i, line in enumerate(lines) if "####" in line)
    line_ok = re.fullmatch(r"\s*####\s*(" + _NUMBER + r")\s*", lines[idx])
    if not line_ok or normalize_number(line_ok.group(1)) is None:
        return 0.0
    rest_ok = all(not line.strip() or _is_confidence_line(line) for line in lines[idx + 1 :])
    return float(rest_ok)


def extract_confidence(text: str) -> float | None:
    """The last stated confidence in [0, 1] (``<confidence>0.8</confidence>``, ``Confidence: 80%``), else None."""
    found: list[tuple[int, str]] = []
    for r in _CONFIDENCE_RES:
        found.extend((m.start(), m.group(1)) for m in r.finditer(text))
    if not found:
        return None
    raw = max(found)[1].strip()
    pct = raw.endswith("%")
    value = normalize_number(raw[:-1] if pct else raw)
    if value is None:
        return None
    q = float(value) / (100.0 if pct else 1.0)
    return q if 0.0 <= q <= 1.0 else None


def strip_confidence(text: str) -> str:
    """`text` without its confidence statements (so lenient answer extraction does not read 0.8 as the answer)."""
    for r in _CONFIDENCE_RES:
        text = r.sub(" ", text)
    return text


def calibration_reward(completion: str, example: Example, mode: Mode = "strict") -> float:
    """RLCR: ``c - (q - c)^2`` with c = `gsm8k_correct` on the completion minus its confidence statements and q its
    stated confidence; missing q → ``c - 1``."""
    c = gsm8k_correct(strip_confidence(completion), example, mode)
    q = extract_confidence(completion)
    brier = 1.0 if q is None else (q - c) ** 2
    return c - brier


def calibration_lenient(completion: str, example: Example) -> float:
    """`calibration_reward` with lenient answer extraction."""
    return calibration_reward(completion, example, "lenient")


def _cut_at_eos(completion: str) -> str:
    cut = len(completion)
    for marker in _EOS_MARKERS:
        i = completion.find(marker)
        if i != -1:
            cut = min(cut, i)
    return completion[:cut].strip()


def arithmetic_correct(completion: str, example: Example) -> float:
    """1.0 iff the completion up to the first EOS marker, whitespace-stripped, equals the answer string exactly."""
    return float(_cut_at_eos(completion) == example.answer)


def arithmetic_lenient(completion: str, example: Example) -> float:
    """1.0 iff the completion's leading number (what follows it is ignored) equals the answer as a number."""
    m = re.match(r"\s*(-?\d+)", _cut_at_eos(completion))
    return float(m is not None and normalize_number(m.group(1)) == _gold(example))


REWARDS: dict[str, RewardFn] = {
    "gsm8k": gsm8k_strict,
    "gsm8k_lenient": gsm8k_lenient,
    "format": format_reward,
    "calibration": calibration_reward,
    "calibration_lenient": calibration_lenient,
    "arithmetic": arithmetic_correct,
    "arithmetic_lenient": arithmetic_lenient,
}


# Which data.source each registered reward is meant for (a strict GSM8K reward on the synthetic task, whose completions
# carry no "####", is always 0; the exact-match arithmetic reward on GSM8K reasoning is always 0).
REWARD_SOURCES: dict[str, tuple[str, ...]] = {
    "gsm8k": ("gsm8k",),
    "gsm8k_lenient": ("gsm8k", "synthetic", "words"),  # words: the last number of the completion
    "format": ("gsm8k",),
    "calibration": ("gsm8k",),
    "calibration_lenient": ("gsm8k",),
    "arithmetic": ("synthetic",),
    "arithmetic_lenient": ("synthetic",),
}


def resolve(name_or_fn: str | RewardFn) -> tuple[str, RewardFn]:
    """(display name, function) for a registry name, a ``"module:function"`` import path, or a callable."""
    if callable(name_or_fn):
        return getattr(name_or_fn, "__name__", repr(name_or_fn)), name_or_fn
    if not isinstance(name_or_fn, str):
        raise TypeError(f"a reward function is a name or a callable, got {type(name_or_fn).__name__}")
    if name_or_fn in REWARDS:
        return name_or_fn, REWARDS[name_or_fn]
    if ":" in name_or_fn:
        module_name, _, attr = name_or_fn.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot import reward function {name_or_fn!r}: {e}") from e
        if not callable(fn):
            raise ValueError(f"reward function {name_or_fn!r} is not callable")
        return name_or_fn, fn
    close = difflib.get_close_matches(name_or_fn, list(REWARDS), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(
        f"unknown reward function {name_or_fn!r}; {hint}valid names: {', '.join(REWARDS)} "
        "(or 'package.module:function' for your own)"
    )


def _check_weights(fns: Sequence[tuple[str | RewardFn, float]]) -> list[tuple[str, RewardFn, float]]:
    if not fns:
        raise ValueError("no reward functions given: configure at least one, e.g. data.rewards={arithmetic: 1.0}")
    out = []
    for item in fns:
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise TypeError(f"reward functions are (name_or_fn, weight) pairs, got {item!r}")
        name, fn = resolve(item[0])
        w = item[1]
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise ValueError(f"the weight of reward function {name!r} must be a finite number, got {w!r}")
        out.append((name, fn, float(w)))
    return out


def combine(fns: Sequence[tuple[str | RewardFn, float]]) -> RewardFn:
    """One RewardFn computing ``sum_i w_i * fn_i(completion, example)`` (no error handling: see `score`)."""
    resolved = _check_weights(fns)

    def combined(completion: str, example: Example) -> float:
        return sum(w * float(fn(completion, example)) for _, fn, w in resolved)

    combined.__name__ = "+".join(f"{w:g}*{name}" for name, _, w in resolved)
    return combined


def _describe(i: int, example: Example) -> str:
    prompt = example.prompt if len(example.prompt) <= 60 else example.prompt[:57] + "..."
    where = f"sample {i}"
    if isinstance(example.meta, dict) and "index" in example.meta:
        where += f" (dataset example {example.meta['index']})"
    return f"{where}, prompt {prompt!r}"


def score(
    texts: Sequence[str],
    examples: Sequence[Example],
    fns: Sequence[tuple[str | RewardFn, float]],
    on_error: OnRewardError = "error",
) -> tuple[np.ndarray, np.ndarray]:
    """Weighted rewards of N completions: ``(rewards float32 [N], valid bool [N])``.

    `examples[i]` is the example completion `texts[i]` answers (repeat each example G times for groups).
    A function that raises or returns a non-finite / non-real value → `RewardError` naming it and the sample
    (on_error="error"), or that sample gets valid=False and reward 0 (on_error="invalidate").
    """
    if on_error not in ON_REWARD_ERROR:
        raise ValueError(f"on_error must be one of {', '.join(ON_REWARD_ERROR)}, got {on_error!r}")
    if len(texts) != len(examples):
        raise ValueError(f"score: {len(texts)} completions but {len(examples)} examples; pass one example per row")
    resolved = _check_weights(fns)
    rewards = np.zeros(len(texts), np.float32)
    valid = np.ones(len(texts), np.bool_)
    for i, (text, example) in enumerate(zip(texts, examples)):
        total = 0.0
        for name, fn, w in resolved:
            problem = None
            try:
                value = fn(text, example)
            except Exception as e:  # any failure of user code is reported the same way
                problem, cause = f"raised {type(e).__name__}: {e}", e
            else:
                cause = None
                if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.shape == ()):
                    value = value.item()  # numpy scalars (including np.bool_) → Python numbers
                if not isinstance(value, numbers.Real):
                    problem = f"returned {value!r} ({type(value).__name__}), not a real number"
                elif not math.isfinite(float(value)):
                    problem = f"returned the non-finite value {float(value)!r}"
            if problem is not None:
                if on_error == "invalidate":
                    valid[i] = False
                    total = 0.0
                    break
                raise RewardError(
                    f"reward function {name!r} {problem} on {_describe(i, example)}; fix the function, or set "
                    "algo.on_reward_error=invalidate to drop such samples from the update"
                ) from cause
            total += w * float(value)
        rewards[i] = total
    return rewards, valid
