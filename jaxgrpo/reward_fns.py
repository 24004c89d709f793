# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The built-in reward functions, each ``fn(completion: str, example: Example) -> float``: answer extraction,
exact and math-verify answer checks, format and calibration. `jaxgrpo.rewards` registers, resolves and runs them.

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

math-verify (HuggingFace's Math-Verify, the answer checker of TRL's, verl's and MaxText's math rewards):
``math_verify_correct`` parses the gold answer (wrapped in ``\\boxed{}``, so a bare number and LaTeX both parse) and
the completion with ``math_verify.parse`` (the last ``\\boxed{}`` first, else the last LaTeX or plain expression) and
compares them with ``math_verify.verify`` (symbolic and numeric equality: ``\\frac{1}{2}`` == 0.5, ``\\sqrt{2}``,
intervals, sets). Math-Verify bounds its own parsing and comparison with ``signal.alarm``, which works only in the
main thread (in any other thread its timeouts raise ValueError): called in the main thread the function passes
Math-Verify's timeouts (``MATH_VERIFY_TIMEOUT_S``); in a worker thread of the reward pool it turns them off, and the
pool's per-call timeout (``data.reward_timeout``) bounds the call instead.

Synthetic arithmetic (``synthetic.synthetic_arithmetic``): ``arithmetic_correct`` is 1 iff the completion, cut at the
first end-of-sequence marker still present in the text (``<eos>``, ``</s>``, ``<|endoftext|>``, ``<|im_end|>``,
``<|eot_id|>``) and stripped of surrounding whitespace, equals the gold answer string exactly (the trainer decodes
tokens up to and including EOS with ``skip_special_tokens=True``, so normally nothing needs cutting).
``arithmetic_lenient`` accepts any completion whose leading number equals the answer (what follows is ignored).
"""

from __future__ import annotations

import fractions
import functools
import logging
import re
import threading
from typing import Any, Literal

from jaxgrpo.example import Example

Mode = Literal["strict", "lenient"]
MATH_VERIFY_TIMEOUT_S = 5  # Math-Verify's own parse / verify timeouts (seconds), applied in the main thread only

# A number as it appears in text: optional sign (not when glued to a preceding word/digit, so "3-5" yields 5, not
# -5; only glued to what follows, so a markdown bullet "- 42" or "50 - 8" gives 42 and 8), optional $,
# thousands-grouped or plain digits, optional decimals, optional simple fraction, optional %.
_NUMBER = (
    r"(?:(?<![\w)])[-+−](?=\$?\.?\d))?\$?\s?"
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
    re.compile(r"\bconfidence\s*(?:level)?\s*[:=]\s*((?:\d+(?:\.\d+)?|\.\d+)\s*%?)", re.IGNORECASE),
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
    """1.0 iff the completion's leading number, read whole (``3.5``, ``3/4`` and ``3,000`` are not 3; what follows it
    is ignored), equals the answer as a number."""
    m = _LEADING_NUMBER_RE.match(_cut_at_eos(completion))
    return float(m is not None and normalize_number(m.group(1)) == _gold(example))



class _DropTimeoutDisabledNote(logging.Filter):
    """Hides Math-Verify's note that its timeouts are off: in worker threads the reward pool's timeout applies."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@functools.cache
def _math_verify() -> tuple[Any, Any]:
    """``(math_verify.parse, math_verify.verify)``, imported on first use (it imports SymPy, ~1 s)."""
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutDisabledNote())
    return math_verify.parse, math_verify.verify


@functools.lru_cache(maxsize=4096)
def _parsed_gold(answer: str, timeout: int | None) -> tuple[Any, ...]:
    parse, _ = _math_verify()
    gold = parse("\\boxed{" + answer + "}", parsing_timeout=timeout)
    if not gold:
        raise ValueError(f"math-verify cannot parse the example's gold answer {answer!r}")
    return tuple(gold)


def math_verify_correct(completion: str, example: Example) -> float:
    """1.0 if Math-Verify judges the completion's final answer equal to the gold answer (``\\frac{1}{2}`` == 0.5,
    ``\\boxed{}`` preferred, LaTeX or plain text), else 0.0. Its own timeouts apply only in the main thread (see the
    module docstring)."""
    parse, verify = _math_verify()
    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = list(_parsed_gold(example.answer, timeout))
    pred = parse(completion, parsing_timeout=timeout)
    if not pred:
        return 0.0
    return float(verify(gold, pred, timeout_seconds=timeout))
