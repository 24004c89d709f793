# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Regenerate tests/data/engine_golden.npz with jaxgrpo.sampling.generate at main commit 0ac6937 (the sampler before
the rollout engine): `git checkout 0ac6937 && python tests/data/make_engine_golden.py` from the repository root."""
import sys

sys.path.insert(0, "tests")
import jax
import numpy as np
from test_sampling import PROMPTS, tiny_model

from jaxgrpo import sampling

CASES = {
    "plain": dict(num_samples=3, max_new_tokens=8, temperature=1.0, key=7),
    "topk_topp": dict(num_samples=4, max_new_tokens=6, temperature=0.8, top_k=5, top_p=0.8, key=3),
    "greedy": dict(num_samples=2, max_new_tokens=6, temperature=0.0, key=0),
    "eos_topp": dict(num_samples=2, max_new_tokens=5, top_p=0.9, eos_token_ids=(7,), key=5),
}
config, params = tiny_model()
out = {}
for name, kw in CASES.items():
    kw = dict(kw)
    key = jax.random.key(kw.pop("key"))
    c = sampling.generate(config, params, PROMPTS, key=key, **kw)
    out[f"{name}/tokens"] = np.asarray(c.tokens).astype(np.int8)
    out[f"{name}/logprobs"] = np.asarray(c.logprobs)
    out[f"{name}/mask"] = np.asarray(c.mask)
np.savez_compressed("tests/data/engine_golden.npz", **out)
