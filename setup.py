# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""jaxgrpo: GRPO-style RL post-training of language models in JAX, with degenerate groups taken seriously."""

from setuptools import find_packages, setup

setup(
    name="jaxgrpo",
    version="0.1.0",
    description="GRPO for LLM post-training in JAX/Flax, with degenerate-group diagnostics and remedies",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["jaxgrpo", "jaxgrpo.*"]),
    package_data={"jaxgrpo": ["configs/*.yaml", "gpu_targets/*.txtpb"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.6",
        "flax>=0.10",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11",
        "chex>=0.1.88",
        "numpy>=1.26",
        "transformers>=4.50",
        "datasets>=3.0",
        "safetensors>=0.4",
        "gguf>=0.10",
        "tokenizers>=0.20",
        "huggingface_hub>=0.25",
        "math-verify>=0.7",  # the math_verify reward (GSM8K/MATH answers, LaTeX included)
        "pyyaml>=6",
        "jinja2>=3.1",  # chat templates (transformers needs it for apply_chat_template)
        "tqdm>=4.60",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
    ],
    extras_require={
        # accelerator builds of jax at jax's own version: TPU (libtpu; also what `python -m jaxgrpo.compile --topology`
        # needs to compile for a TPU slice on any host) and CUDA
        "tpu": ["jax[tpu]"],
        # jax[cuda13] (jax >= 0.7; CUDA 13 wheels, NVIDIA driver >= 580) is what jax 0.10 and 0.11 name for current
        # GPUs; cuda12 for older drivers
        "cuda": ["jax[cuda13]>=0.7"],
        "cuda12": ["jax[cuda12]"],
        # compile for an H100/H200 on a host without a GPU (`python -m jaxgrpo.compile --platform cuda`): the CUDA
        # plugin at jax's own version without the NVIDIA libraries; ptxas (CUDA 13) must be on PATH
        "gpu-aot": ["jax[cuda13-local]"],
        "wandb": ["wandb>=0.17"],  # log.wandb
        # torch is pinned to the CPU build the CI machines carry; tests use it as an independent reference only.
        "test": [
            "pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "ruff>=0.6", "torch==2.13.0", "accelerate>=1.0",
            "nbformat>=5", "nbclient>=0.10", "ipykernel>=6",
            "peft>=0.13", "wandb>=0.17", "trl>=0.20",  # TRL: its own reward functions as a reference
        ],
    },
    classifiers=["License :: OSI Approved :: Apache Software License", "Programming Language :: Python :: 3"],
)
