# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`CalculatorEnv`: the packaged example environment (``configs/smollm2_tools.yaml``), a TRL ``environment_factory``-
style class (`jaxgrpo.rollout.env`) for arithmetic tasks (``data.source=words``, GSM8K).

One instance per trajectory. ``reset(answer)`` keeps the gold answer; the one tool, ``calculator(expression)``, is
the built-in `jaxgrpo.rollout.tools.calculator` (numbers and ``+ - * / // % **``, parsed with `ast`); its errors
are the model's tool replies. ``get_reward()`` is 1.0 when some calculator result of the trajectory equals the gold
answer (the policy computed the right quantity), else 0.0: the ``environment`` term of ``data.rewards``, a shaping
bonus beside the answer's own check (``gsm8k_lenient``: the last number of the final answer).
"""

from __future__ import annotations

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
