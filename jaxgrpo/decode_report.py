# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The decode loop judged without the accelerator: bytes one token step of the compiled decode program moves
(`jaxgrpo.hlo`) against the roofline ideal, with the kernels, copies and sorts inside the loop; for the rollout
engine, the mean over the windows of decode slots a full-length rollout runs. Used by ``python -m jaxgrpo.compile``
on the programs `jaxgrpo.aot.compile_rollout` compiles."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from jaxgrpo import models, padding
from jaxgrpo.config import Config


def decode_ideal_bytes(cfg: Config, mcfg: models.ModelConfig, weight_share: float = 1.0,
                       row_shards: int = 1) -> dict[str, float]:  # fmt: skip
    """The bytes one token step of the decode loop must read per chip, at the mean step of a full-length rollout
    (the roofline ideal): every compute-dtype weight once (of the embedding table, only the rows looked up, unless it
    is also the LM head), each prompt's shared prefix keys and values once (``P`` prompts of the padded width), and
    each row's own decode keys and values at the mean step (``M / 2`` slots). On several chips each reads its own
    shard only: ``weight_share`` of the weights (a chip's bytes of the decode weights as they are placed over the
    whole weights, `jaxgrpo.aot.compile_rollout`'s ``weights["share"]``; an FSDP or tensor split leaves each chip
    its shard to read, the other chips' partial products travel between chips, not through its memory) and
    ``1 / row_shards`` of the caches (the engine splits its slots over the mesh's batch axes)."""
    c, r = mcfg, cfg.rollout
    item = jnp.dtype(c.dtype).itemsize
    weights = models.count_params(c.replace(lora=None)) * item
    rows = r.prompts_per_step * r.group_size
    if not c.tie_word_embeddings:
        weights -= (c.vocab_size - rows) * c.hidden_size * item
    kv = c.kv_bytes_per_token
    prefix = kv * r.prompts_per_step * padding.prompt_bucket(cfg.data.max_prompt_tokens)
    own = kv * rows * r.max_new_tokens / 2
    out = dict(weights=float(weights) * weight_share, prefix_kv=prefix / row_shards, decode_kv=own / row_shards)
    out["total"] = sum(out.values())
    return out


def decode_step_report(text: str, ideal: dict[str, float], vocab: int, min_bytes: int) -> dict[str, Any]:
    """Bytes moved per token step by the compiled decode program's loop body (`jaxgrpo.hlo.loop_report` of its
    optimized HLO ``text``) against ``ideal`` (`decode_ideal_bytes`): kernels per step, the ratio, the heaviest
    kernels, and every copy/transpose/pad/concatenation/dynamic-slice copy of at least ``min_bytes`` and every sort
    over the full vocabulary inside the loop."""
    from jaxgrpo import hlo

    loop = hlo.loop_report(text, min_bytes=min_bytes, vocab=vocab)
    moved = float(loop.bytes_per_iteration)
    return dict(bytes_per_step=moved, ideal_bytes_per_step=ideal["total"], ratio=moved / ideal["total"],
                launches_per_step=loop.launches_per_iteration, unknown_trip_counts=loop.unknown_trip_counts,
                findings=loop.findings, top=loop.top(8))  # fmt: skip


def format_decode_report(rep: dict[str, Any], top: int = 5) -> list[str]:
    """`decode_step_report` as printable lines."""
    mib = 2**20
    lines = [f"  decode step: {rep['bytes_per_step'] / mib:.1f} MiB moved per token step vs "
             f"{rep['ideal_bytes_per_step'] / mib:.1f} MiB ideal ({rep['ratio']:.2f}x), "
             f"{rep['launches_per_step']} kernels per step"]  # fmt: skip
    if rep.get("host"):  # `hlo.HostLaunches` of a GPU compile
        h = rep["host"]
        lines.append(f"    host launches per token step: {h['launches']} ({h['graphs']} of them CUDA graphs, i.e. "
                     f"command buffers, holding {h['graphed']} of the step's {h['thunks']} thunks)")  # fmt: skip
    if rep["unknown_trip_counts"]:
        lines.append(f"    ({rep['unknown_trip_counts']} inner loops of unknown trip count counted once)")
    if rep.get("windows"):
        each = ", ".join(f"{w}: {n} x {b / mib:.1f}" for w, (n, b) in rep["windows"].items())
        lines.append(f"    mean over the windows of decode slots a full-length rollout runs (width: steps x MiB per "
                     f"step): {each}")  # fmt: skip
    for k in rep["top"][:top]:
        lines.append(f"    {k.count:>3d} x {k.kind[:40]:<40s} {(k.read + k.write) * k.count / mib:9.1f} MiB  {k.shape}")
    found = rep["findings"]
    lines.append(f"  inside the loop: {len(found)} copies/transposes/pads/slice copies of a weight-sized buffer or "
                 "sorts of the vocabulary" + (":" if found else ""))  # fmt: skip
    for f in found:
        lines.append(f"    {f.op:<13s} {f.bytes / mib:8.2f} MiB  {f.shape}  ({f.source or f.where})")
    return lines


def engine_windows(cfg: Config, mcfg: models.ModelConfig, platform: str = "gpu") -> dict[int, int]:
    """``{decode cache width: token steps}`` of a full-length rollout of this config on the engine
    (`rollout.engine.windows`): the weights of the decode report's mean."""
    from jaxgrpo import aot
    from jaxgrpo.rollout import engine

    return engine.windows(aot.engine_spec(cfg, mcfg, platform))


def decode_report(cfg: Config, mcfg: models.ModelConfig, texts: dict[str, str], ideal: dict[str, float],
                  platform: str = "gpu") -> dict[str, Any]:  # fmt: skip
    """The decode report of the compiled programs in ``texts``: `decode_step_report` of ``texts["decode"]``, or, when
    the engine compiled one decode program per window of cache slots (``decode_w<width>``; ``decode`` the widest),
    their bytes per token step averaged over a full-length rollout's steps (`engine_windows`), which is what the
    ideal (at the mean step) is compared with; launches and the heaviest kernels are the widest's, the findings
    those of every compiled window, and ``windows`` gives each window's ``(steps, bytes per step)``;
    ``interpolated`` the windows not compiled (`aot.compile_rollout`'s ``windows``), whose bytes are linear between
    their compiled neighbours. ``platform``: the devices' (`engine.window_multiple`)."""
    args = (ideal, mcfg.vocab_size, smallest_moved_buffer(mcfg, cfg))
    rep = decode_step_report(texts["decode"], *args)
    if not any(name.startswith("decode_w") for name in texts):
        return rep
    steps = engine_windows(cfg, mcfg, platform)
    widest = max(steps)
    per = {w: (decode_step_report(texts[f"decode_w{w}"], *args) if w != widest else rep) for w in steps
           if w == widest or f"decode_w{w}" in texts}  # fmt: skip
    if min(steps) not in per:
        raise ValueError(f"the narrowest decode window ({min(steps)} slots) was not compiled")
    known = sorted(per)
    per_step = {w: per[w]["bytes_per_step"] for w in known}
    for w in steps:  # a window not compiled: linear between its compiled neighbours (a window's bytes are affine in
        if w not in per_step:  # its width: the test of the Qwen config checks it on the compiled ones)
            lo, hi = max(k for k in known if k < w), min(k for k in known if k > w)
            per_step[w] = per_step[lo] + (per_step[hi] - per_step[lo]) * (w - lo) / (hi - lo)
    moved = sum(per_step[w] * n for w, n in steps.items()) / sum(steps.values())
    findings = [f for w in known for f in per[w]["findings"]]
    unknown = sum(per[w]["unknown_trip_counts"] for w in known)
    return dict(rep, bytes_per_step=moved, ratio=moved / ideal["total"], findings=findings, unknown_trip_counts=unknown,
                windows={w: (n, per_step[w]) for w, n in sorted(steps.items())},
                interpolated=sorted(set(steps) - set(known)))  # fmt: skip


def smallest_moved_buffer(mcfg: models.ModelConfig, cfg: Config) -> int:
    """The smallest weight matrix or per-layer cache slab of the decode (a copy of any of them is worth reporting):
    one layer's ``k`` projection (``D x K x H``) or one layer's own-key cache for the rows (``N x K x H x M``)."""
    c, r = mcfg, cfg.rollout
    item = jnp.dtype(c.dtype).itemsize
    rows = r.prompts_per_step * r.group_size
    return int(min(c.hidden_size * c.num_kv_heads * c.head_dim, rows * c.num_kv_heads * c.head_dim * r.max_new_tokens)
               * item)  # fmt: skip
