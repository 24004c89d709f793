# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The train step judged without the accelerator: model FLOPs, HBM bytes of its optimized HLO (`jaxgrpo.hlo`), the
roofline time and the MFU they allow on a chip, the heaviest kernels and every float32 ``[*, vocab]`` buffer; used by
``python -m jaxgrpo.compile`` on the program `jaxgrpo.aot.compile_train_step` compiles."""

from __future__ import annotations

from jaxgrpo import aot, hlo


def format_train_report(step: dict[str, float], text: str, vocab: int, chip: aot.Chip | None,
                        top: int = 5) -> list[str]:  # fmt: skip
    """The train step's model FLOPs, HBM bytes (`aot.compile_train_step`'s ``hbm_bytes``), roofline time on ``chip`` and
    the MFU it allows (FLOPs / peak over the roofline time), its heaviest kernels and every float32 ``[*, vocab]``
    buffer its kernels write (`jaxgrpo.hlo.wide_buffers` of its optimized HLO ``text``), as printable lines."""
    gib = float(aot.GiB)
    flops, moved = step["counted_flops"], step["hbm_bytes"]
    seconds = aot.roofline_seconds(flops, moved, chip)
    bound = "" if chip is None else (" (FLOP-bound" if flops / chip.peak_flops >= moved / chip.hbm_bandwidth
                                     else " (bytes-bound") + f"; MFU at most {flops / chip.peak_flops / seconds:.0%})"
    lines = [f"  train step: {flops / 1e12:.2f} TFLOP per chip (counted from the shapes), {moved / gib:.2f} GiB HBM "
             f"traffic (optimized HLO, loops by trip count), roofline {seconds:.3f} s{bound}"]  # fmt: skip
    rep = hlo.program_bytes(text)
    if rep.unknown_trip_counts:
        lines.append(f"    ({rep.unknown_trip_counts} loops of unknown trip count counted once: a lower bound)")
    for k in rep.top(top):
        lines.append(f"    {k.count:>5d} x {k.kind[:40]:<40s} {(k.read + k.write) * k.count / gib:8.2f} GiB  {k.shape}")
    wide = hlo.wide_buffers(text, "f32", vocab)
    lines.append(f"  float32 [*, {vocab}] buffers written by the train step's kernels: {len(wide)}"
                 + (":" if wide else ""))  # fmt: skip
    for f in wide[:top]:
        lines.append(f"    {f.op:<13s} {f.bytes / 2**20:9.1f} MiB  {f.shape}  ({f.source[-60:] or f.where})")
    return lines
