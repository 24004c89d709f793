# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""jaxgrpo: GRPO-style RL post-training of language models in JAX, with degenerate groups taken seriously.

Research code imports the functional core directly: ``from jaxgrpo import advantages, degeneracy, losses``.
"""

import importlib
from typing import Any

__all__ = ["advantages", "degeneracy", "losses"]


def __getattr__(name: str) -> Any:
    """``jaxgrpo.advantages`` etc. on first use: importing the package itself starts no JAX (a fast ``--help``)."""
    if name in __all__:
        return importlib.import_module(f"jaxgrpo.{name}")
    raise AttributeError(f"module 'jaxgrpo' has no attribute {name!r}")
__version__ = "0.1.0"
