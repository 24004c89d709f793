# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""A script of ``benchmarks/`` imported as a module by the tests that check it (the scripts are not a package)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, imported once per process (kept in `sys.modules`: its dataclasses resolve their
    annotations through it)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
