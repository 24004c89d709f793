# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`CalculatorEnv`: the packaged example environment (``configs/smollm2_tools.yaml``), a TRL ``environment_factory``-
style class (`jaxgrpo.rollout.env`) for arithmetic tasks (``data.source=words``, GSM8K).

One instance per trajectory. ``reset(answer)`` keeps the gold answer; the one tool, ``calculator(expression)``, is
the built-in `jaxgrpo.rollout.tools.calculator` (numbers and ``+ - * / // % **``, parsed with `ast`); its errors
are the model's tool replies. ``get_reward()`` is 1.0 when some calculator result of the trajectory equals the gold
answer (the policy computed the right quantity), else 0.0: the ``environment`` term of ``data.rewards``, a shaping
bonus beside the answer's own check (``gsm8k_lenient``: the last number of the final answer).

`demonstrations` writes worked examples of the tool's use for ``warm_start.demonstrations`` (`jaxgrpo.warm_start`):
for a ``data.source=words`` prompt ("What is 23 + 58? Reply with just the number."), a call of the calculator on the
question's expression, its reply, and the answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from jaxgrpo.example import Example
from jaxgrpo.rewards import normalize_number
from jaxgrpo.rollout import tools


class CalculatorEnv:
    """An arithmetic task with a calculator tool; rewards a calculation whose result is the gold answer."""

    def reset(self, answer: str = "", **kwargs: object) -> None:
        self.gold = normalize_number(str(answer))
        self.results: list[str] = []

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return its value.

        Args:
            expression: The expression, with numbers, + - * / // % ** and parentheses, e.g. (12 + 7) * 3.
        """
        value = tools.calculator(expression)
        self.results.append(value)
        return value

    def get_reward(self) -> float:
        return float(self.gold is not None and any(normalize_number(r) == self.gold for r in self.results))


_QUESTION = re.compile(r"What is ([0-9+\-*/ ()]+)\?")


def demonstrations(examples: Sequence[Example]) -> list[list[dict[str, Any]] | None]:
    """One conversation per example (TRL's conversational format): the user's prompt, an assistant turn calling
    ``calculator`` on the question's expression, the tool's reply, and the answer (the reply's number, as the system
    prompt of ``configs/smollm2_tools.yaml`` asks). None for a prompt without a "What is <expression>?" question."""
    out: list[list[dict[str, Any]] | None] = []
    for ex in examples:
        m = _QUESTION.search(ex.prompt)
        if m is None:
            out.append(None)
            continue
        expression = m.group(1).strip()
        value = tools.calculator(expression)
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        out.append([{"role": "user", "content": ex.prompt}, {"role": "assistant", "tool_calls": [call]},
                    {"role": "tool", "name": "calculator", "content": value}, {"role": "assistant", "content": value}])
    return out
