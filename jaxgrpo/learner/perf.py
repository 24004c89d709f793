# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Which performance switches (`config.PerfConfig`) apply to a run: decided once, here, for trainer and train step."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jaxgrpo import padding
from jaxgrpo.config_sections import AlgoConfig, PerfConfig
from jaxgrpo.models.attention import Kernel
from jaxgrpo.models.layers import LayerLoop


def attention_kernel(perf: PerfConfig) -> Kernel:
    """The attention kernel of a resolved ``perf`` (`resolve_perf`): what the train step, the KL reference pass and
    the rollout's prefill run."""
    return Kernel(perf.attention, perf.attention_chunk)


def on_gpu(platform: str) -> bool:
    """Whether ``platform`` (a device's ``.platform``, or jax's backend name) is an NVIDIA GPU's."""
    return platform in ("gpu", "cuda")


def layer_loop(perf: PerfConfig) -> LayerLoop:
    """``perf.layer_loop`` as the models take it (`jaxgrpo.models.layers.LayerLoop`): a ``perf`` that did not go
    through `resolve_perf` (``"auto"``) runs the scan."""
    return "scan" if perf.layer_loop == "auto" else perf.layer_loop


def resolve_perf(
    algo: AlgoConfig, perf: PerfConfig, *, num_shards: int, platform: str, compute_dtype: str = "float32"
) -> tuple[PerfConfig, list[str]]:
    """The performance switches that apply to this run, and one note per requested switch that does not.

    The one place that decides them: ``perf.prompt_packing`` (needs prefix sharing);
    ``perf.matmul_backward="auto"`` (explicit on ``platform == "cpu"``, XLA's own elsewhere); ``perf.attention``
    ("auto": dense on CPU, cudnn on a GPU computing in bfloat16/float16, chunked otherwise; "cudnn" elsewhere falls
    back to chunked: cuDNN's flash attention exists on NVIDIA GPUs for 16-bit inputs only); ``perf.layer_loop``
    ("auto": unrolled on a GPU unless ``perf.remat="full"``, scan elsewhere: unrolled with full remat, XLA held 2.2x
    the scan's temporaries for the Llama-3.1-8B LoRA config, for 4% fewer bytes; BENCHMARKS §12)."""
    notes, changes = [], {}
    if perf.prompt_packing and not perf.prefix_sharing:
        changes["prompt_packing"] = False
        notes.append("perf.prompt_packing=true does not apply: it packs the shared prompts of perf.prefix_sharing")
    if perf.matmul_backward == "auto":
        changes["matmul_backward"] = "explicit" if platform == "cpu" else "xla"
    fused_ok = on_gpu(platform) and compute_dtype in ("bfloat16", "float16")
    if perf.attention == "auto":
        changes["attention"] = "dense" if platform == "cpu" else "cudnn" if fused_ok else "chunked"
    elif perf.attention == "cudnn" and not fused_ok and platform != "any":
        changes["attention"] = "chunked"
        notes.append(f'perf.attention="cudnn" does not apply: it needs an NVIDIA GPU and model.dtype bfloat16 or '
                     f"float16 (here {platform}, {compute_dtype}); using the chunked attention")
    if perf.layer_loop == "auto":
        changes["layer_loop"] = "unrolled" if on_gpu(platform) and perf.remat != "full" else "scan"
    return dataclasses.replace(perf, **changes), notes


def platform_of(mesh: Mesh | None) -> str:
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def packed_prompt_width(
    prompt_lengths: Any, prompt_width: int, algo: AlgoConfig, perf: PerfConfig, mesh: Mesh | None = None,
    ladder: tuple[int, int] | None = None,
) -> int:
    """The ``packed_prompt_width`` to give ``step_fn`` (and `policy_gradient`) for a rollout whose P prompts have
    these lengths in a batch of prompt width ``prompt_width``: with ``perf.prompt_packing`` (and prefix sharing) the
    train step runs each
    micro-batch's prompts packed end to end, one row per batch shard, instead of left-padded, so no decoder work is
    spent on prompt padding (`jaxgrpo.models.prefix`). The width holds the longest possible row (the
    ``P / (num_minibatches * grad_accum_steps * shards)`` longest prompts), rounded up to
    `jaxgrpo.padding.PACK_BUCKET` -- or, with the run's ``ladder`` (`shape_ladders`), up
    `jaxgrpo.padding.ladder_bucket`: one width for nearly every step of a run; 0 (padded rows) when packing is off or
    would not save."""
    if not (perf.prefix_sharing and perf.prompt_packing):
        return 0
    shards = 1 if mesh is None else int(mesh.shape["data"] * mesh.shape["fsdp"])
    parts = int(algo.num_minibatches) * int(algo.grad_accum_steps) * shards
    lengths = np.asarray(prompt_lengths)
    if len(lengths) % parts:
        raise ValueError(f"{len(lengths)} prompts cannot be split into {parts} parts (minibatches x accum x shards)")
    # each micro-batch has `shards` rows of P / parts prompts: size a row from the P / parts longest prompts
    return padding.packed_width(lengths, parts, prompt_width=prompt_width, ladder=ladder)


def shape_ladders(prompt_lengths: Any, prompts_per_step: int, slots: int, algo: AlgoConfig, mesh: Mesh | None = None,
                  draws: int = 512) -> dict[str, tuple[int, int]]:
    """The ``(floor, cap)`` ladders (`jaxgrpo.padding`) of a run whose steps draw ``prompts_per_step`` prompts from
    prompts of these lengths: ``"train"`` for the train step's packed width (`packed_prompt_width`), ``"engine"`` for
    the engine's first prefill (``slots`` prompts and 1-token pads in one row, on any mesh). ``cap``: the widest row
    the data can make; ``floor``: the rung of the 99th percentile of the rows of ``draws`` batches drawn (seeded)
    from the data."""
    lengths = np.asarray(prompt_lengths, np.int64)
    p, shards = int(prompts_per_step), 1 if mesh is None else int(mesh.shape["data"] * mesh.shape["fsdp"])
    q = max(p // (int(algo.num_minibatches) * int(algo.grad_accum_steps) * shards), 1)
    a = int(slots)  # the engine admits `slots` prompts first
    rng = np.random.default_rng(0)
    batches = [rng.choice(lengths, max(p, a), replace=len(lengths) < max(p, a)) for _ in range(draws)]
    needs = {"train": [int(np.sort(b)[-q:].sum()) for b in batches],
             "engine": [int(b[:a].sum()) + padding.batch_bucket(a) - a for b in batches]}
    caps = {"train": padding.PACK_BUCKET * -(-padding.widest_row(lengths, q) // padding.PACK_BUCKET),
            "engine": padding.prompt_bucket(padding.widest_row(lengths, a) + padding.batch_bucket(a) - a)}
    units = {"train": padding.PACK_BUCKET, "engine": padding.MIN_PROMPT_BUCKET}
    return {k: (padding.ladder_floor(needs[k], units[k], caps[k]), caps[k]) for k in needs}
