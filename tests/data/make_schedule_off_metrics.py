# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Regenerate tests/data/schedule_off_metrics.json: the deterministic metrics of a 2-step tiny run of the trainer at
main commit 0ca1515 (the trainer before `rollout.schedule`). From the repository root:
``git archive 0ca1515 jaxgrpo tests | tar -x -C /tmp/base && python tests/data/make_schedule_off_metrics.py /tmp/base
tests/data/schedule_off_metrics.json``."""
import json
import os
import sys
import tempfile

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # as tests/conftest.py
os.environ["JAX_PLATFORMS"] = "cpu"
root = sys.argv[1]
sys.path.insert(0, root)
sys.path.insert(0, root + "/tests")
import jaxgrpo  # noqa: E402

assert jaxgrpo.__file__.startswith(root), jaxgrpo.__file__
from test_train import deterministic, small_config  # noqa: E402

from jaxgrpo import trainer  # noqa: E402

cfg = small_config("train.steps=2", "checkpoint.every=2", "checkpoint.export_final=false")
history = trainer.run(cfg, tempfile.mkdtemp() + "/run")
with open(sys.argv[2], "w") as f:
    json.dump([deterministic(m) for m in history], f, indent=1, sort_keys=True)
