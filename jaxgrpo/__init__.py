# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""jaxgrpo: GRPO-style RL post-training of language models in JAX, with degenerate groups taken seriously.

Research code imports the functional core directly: ``from jaxgrpo import advantages, degeneracy, losses``.
"""

from jaxgrpo import advantages, degeneracy, losses

__all__ = ["advantages", "degeneracy", "losses"]
__version__ = "0.1.0"
