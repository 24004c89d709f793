# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The learner half: what turns a step's rollout into an update. `batch` (the record the rollout hands over, made a
``Batch``, and the train state), `minibatch` (the objective: advantages -> degenerate-group masks -> loss, with exact
gradient accumulation), `logprobs` and `fused_head` (the policy's log-probs, the LM head chunked or fused),
`train_step` (the jitted, sharded step), `optim` (optax), `perf` (every performance switch resolved once into the
options each forward receives). It imports config *sections* (`jaxgrpo.config_sections`), never the YAML loader, and
the rollout half (`jaxgrpo.rollout`) never imports it (`tests/test_imports.py`)."""
