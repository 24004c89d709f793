# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The command line of ``python -m jaxgrpo.train``, in a module that imports nothing of the package (nor JAX), so
that ``--help`` answers at once; `jaxgrpo.config.parse_cli` parses with the same parser."""

from __future__ import annotations

import argparse

# The config sections, for --help without importing the config module (it imports JAX); tests check the list.
SECTION_NAMES = ("model", "lora", "data", "rollout", "algo", "perf", "optim", "train", "mesh", "checkpoint", "log",
                 "warm_start")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m jaxgrpo.train`` (`jaxgrpo.config.parse_cli` parses with it too)."""
    p = argparse.ArgumentParser(
        prog="python -m jaxgrpo.train",
        description="GRPO post-training. Without --config it runs the packaged default.yaml (an offline demo).",
        epilog=f"overrides: section.key=value with section one of {', '.join(SECTION_NAMES)}, or seed=N; "
        "e.g. algo.estimator=sign train.steps=50 algo.estimator_args.k=4 algo.clip_high=null. Exit status: 0 done, "
        "2 error, 143 SIGTERM / 130 SIGINT (checkpointed; re-run with the same --run-dir to resume).",
    )
    p.add_argument("--config", default=None, help="YAML file or packaged config name (default: default)")
    p.add_argument("--run-dir", default=None, help="run directory; re-running with it resumes (default: runs/...)")
    p.add_argument("--allow-config-change", action="store_true",
                   help="resume even though the config differs from the run's config.yaml (recorded in the run)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    return p
