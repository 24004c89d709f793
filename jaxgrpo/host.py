# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Host copies of arrays that may span several JAX processes (imports nothing of jaxgrpo: the model package, the
exports and the trainer all use it)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def to_host(x: Any) -> np.ndarray:
    """Full numpy copy of a (possibly multi-host sharded) array. A collective when ``x`` spans processes: every
    process must call it, in the same order (the exports gather on every process and write on process 0 only)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
