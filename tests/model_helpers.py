# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Test helpers shared by the model tests: numpy-drawn random params, relative error, padded batches, and llama.cpp's
Llama 3.1 RoPE factors as an independent reference."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.models import ModelConfig, param_shapes


def random_params(config: ModelConfig, seed: int = 0, scale: float = 0.1, norm_scale: float | None = None,
                  dtype=None):
    """Random params drawn with numpy (no PRNG compiles): weights ``scale·N(0,1)``, norms ``1 + norm_scale·N(0,1)``
    (``norm_scale`` defaults to ``scale``), biases non-zero so that every parameter matters."""
    rng = np.random.default_rng(seed)
    norm_scale = scale if norm_scale is None else norm_scale

    def leaf(path, shape):
        z = rng.standard_normal(shape)
        x = 1.0 + norm_scale * z if "norm" in jax.tree_util.keystr(path) else scale * z
        return jnp.asarray(x, dtype or config.dtype)

    return jax.tree_util.tree_map_with_path(leaf, param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))


def rel_err(a, b) -> float:
    """max |a − b| / max |b|."""
    return float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))


def pad_rows(seqs: Sequence[np.ndarray], width: int, side: str) -> tuple[np.ndarray, np.ndarray]:
    """Ragged token rows packed into ``(tokens [N, width], mask [N, width])``, padded on the ``side`` given."""
    tok = np.zeros((len(seqs), width), np.int32)
    mask = np.zeros((len(seqs), width), bool)
    for i, s in enumerate(seqs):
        sl = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        tok[i, sl], mask[i, sl] = s, True
    return tok, mask


def llama_cpp_rope_factors(head_dim: int, theta: float, factor: float, low: float, high: float,
                           orig: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors): the ``rope_freqs`` divisors of Llama 3.1's
    RoPE scaling, recomputed here as the reference the loader and the exporter are checked against."""
    out = []
    for f in 1.0 / (theta ** (np.arange(0, head_dim, 2) / head_dim)):
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)
