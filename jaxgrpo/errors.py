# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The user-facing errors, in one module that imports nothing of the package, so any module may raise them.

Each message names the problem and the fix in one line. The command-line entry points catch them and print
``error: <message>`` without a traceback (`cli_error`). The modules that raise them re-export them
(``config.ConfigError``, ``data.DataError``, ``rewards.RewardError``, ``checkpoint.CheckpointError``).
"""

from __future__ import annotations

import sys


class ConfigError(ValueError):
    """A bad config key or value; the message names the key and the valid keys, choices or range."""


class DataError(ConfigError):
    """Bad data or data settings (a malformed row, a missing file, a prompt too long)."""


class RewardError(RuntimeError):
    """A reward function failed (raised, or returned something that is not a finite real number), or calls of a
    reward function or a multi-turn tool hang past their timeout.

    ``advice``, when given, is what to do about it; it ends the one-line message (``"{message}: {advice}"``) so that a
    caller can add what it did (e.g. the checkpoint it saved) to ``message`` and keep the advice last."""

    def __init__(self, message: str, advice: str | None = None):
        super().__init__(f"{message}: {advice}" if advice else message)
        self.message, self.advice = message, advice


class CheckpointError(RuntimeError):
    """A checkpoint cannot be found or does not match the structure it is restored into."""


def cli_error(msg: str) -> int:
    """Prints ``error: msg`` to stderr (no traceback) and returns the exit status 2: ``return cli_error(str(e))``."""
    print(f"error: {msg}", file=sys.stderr)
    return 2
