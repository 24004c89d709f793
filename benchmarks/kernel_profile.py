# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Where a program's device time goes: a `jax.profiler` trace of a call, summed per kernel name.

``profile(fn, directory)`` runs ``fn()`` (already compiled: call it once first) under `jax.profiler.trace` with a
Perfetto trace, and `kernel_times` reads that trace: every complete event (``"ph": "X"``) on the device's timelines
-- on a GPU the processes named ``/device:GPU:<n>`` (one thread per CUDA stream), on a CPU the thread that runs
XLA:CPU's thunks (``tf_XLAPjRtCpuClient...``) -- summed by name: launches, total and mean microseconds. Set against
the call's wall time, ``busy`` says how much of it the device spent in kernels and how much in gaps between them.

On a GPU, XLA records the kernels of a loop body into one CUDA graph (a command buffer) unless a profiler is active:
then it launches them one by one (``... (disabled for profiling)``), which is not the program that runs unprofiled.
`benchmarks/gpu.py --parts profile` therefore sets ``--xla_enable_command_buffers_during_profiling=true`` before jax
starts; CUPTI still times each kernel inside the graph.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import re
import time
from collections.abc import Callable
from typing import Any

DEVICE_PROCESS = re.compile(r"^/device:(GPU|TPU):\d+")
CPU_THUNK_THREAD = re.compile(r"^tf_XLAPjRtCpuClient")


def trace_file(directory: str | pathlib.Path) -> pathlib.Path:
    """The newest ``perfetto_trace.json.gz`` under ``directory`` (`jax.profiler.trace` nests it by run and host)."""
    found = sorted(pathlib.Path(directory).rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {directory}: was the trace taken with "
                                "create_perfetto_trace=True?")  # fmt: skip
    return found[-1]


def kernel_times(path: str | pathlib.Path) -> dict[str, Any]:
    """Per-kernel device time of a Perfetto trace (module docstring): ``kernels``, {name: {count, total_us,
    mean_us}} heaviest first; ``busy_us``, the time inside any of them; ``span_us``, from the first kernel's start to
    the last one's end; the ``timelines`` they were read from."""
    data = json.loads(gzip.open(path).read())
    events = data["traceEvents"] if isinstance(data, dict) else data
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e.get("tid"))] = e["args"]["name"]
    device = {pid for pid, name in processes.items() if DEVICE_PROCESS.match(name)}
    keep = (lambda e: e["pid"] in device) if device else (  # noqa: E731
        lambda e: bool(CPU_THUNK_THREAD.match(threads.get((e["pid"], e.get("tid")), ""))))
    sums: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    spans = []
    for e in events:
        if e.get("ph") != "X" or e["name"].startswith("end: ") or not keep(e):
            continue
        s = sums[e["name"]]
        s[0] += 1
        s[1] += float(e.get("dur", 0.0))
        spans.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))))
    kernels = {name: dict(count=n, total_us=t, mean_us=t / n) for name, (n, t) in
               sorted(sums.items(), key=lambda kv: -kv[1][1])}  # fmt: skip
    names = sorted({processes[p] for p in device}) or sorted({n for n in threads.values() if CPU_THUNK_THREAD.match(n)})
    span = max(b for _, b in spans) - min(a for a, _ in spans) if spans else 0.0
    return dict(kernels=kernels, busy_us=_covered(spans), span_us=span, timelines=names)


def _covered(spans: list[tuple[float, float]]) -> float:
    """Time inside at least one of the intervals: kernels on concurrent streams, or a loop's event around its body's
    (a CPU trace nests them), counted once."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def profile(fn: Callable[[], Any], directory: str | pathlib.Path) -> dict[str, Any]:
    """`kernel_times` of one ``fn()`` call (blocked on), with its wall time in ``wall_us``."""
    import jax

    with jax.profiler.trace(str(directory), create_perfetto_trace=True):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        wall = time.perf_counter() - t0
    return dict(kernel_times(trace_file(directory)), wall_us=wall * 1e6)


def format_profile(rep: dict[str, Any], steps: int, top: int = 15) -> list[str]:
    """The heaviest kernels of `profile` per token step (``steps`` decode steps in the call), as printable lines."""
    lines = [f"  device busy {rep['busy_us'] / steps:.1f} us per step over a {rep['span_us'] / steps:.1f} us span "
             f"(wall {rep['wall_us'] / steps:.1f} us) on {', '.join(rep['timelines'])}"]  # fmt: skip
    for name, k in list(rep["kernels"].items())[:top]:
        lines.append(f"    {k['count'] / steps:7.1f} x {k['mean_us']:8.2f} us = {k['total_us'] / steps:8.1f} us/step  "
                     f"{name[:70]}")  # fmt: skip
    return lines
