# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""benchmarks/kernel_profile.py: per-kernel device time of a Perfetto trace, against a hand-written GPU trace (sums
by hand: two CUDA streams counted, the host's events not) and a real `jax.profiler` trace of a CPU loop (each kernel
of the loop body launched once per trip)."""

from __future__ import annotations

import gzip
import json

import benchmark_module
import jax
import jax.numpy as jnp
import pytest


@pytest.fixture(scope="module")
def kp():
    return benchmark_module.load("kernel_profile")


def _meta(kind: str, pid: int, name: str, tid: int | None = None) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, **({} if tid is None else {"tid": tid}), "args": {"name": name}}


def test_kernel_times_of_a_hand_written_gpu_trace(kp, tmp_path):
    events = [_meta("process_name", 1, "/host:CPU"), _meta("process_name", 7, "/device:GPU:0"),
              _meta("thread_name", 7, "Stream #13(Compute)", 13), _meta("thread_name", 7, "Stream #14(MemcpyD2D)", 14),
              {"ph": "X", "pid": 1, "tid": 2, "name": "PjitFunction(f)", "ts": 0, "dur": 500},  # host: not counted
              {"ph": "X", "pid": 7, "tid": 13, "name": "gemm", "ts": 10, "dur": 4.0},
              {"ph": "X", "pid": 7, "tid": 13, "name": "decode_attend", "ts": 16, "dur": 9.0},
              {"ph": "X", "pid": 7, "tid": 13, "name": "gemm", "ts": 27, "dur": 6.0},
              {"ph": "X", "pid": 7, "tid": 14, "name": "memcpy", "ts": 30, "dur": 2.0},
              {"ph": "i", "pid": 7, "tid": 13, "name": "marker", "ts": 40}]  # fmt: skip
    path = tmp_path / "perfetto_trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    got = kp.kernel_times(kp.trace_file(tmp_path))
    assert list(got["kernels"]) == ["gemm", "decode_attend", "memcpy"]  # heaviest first
    assert got["kernels"]["gemm"] == {"count": 2, "total_us": 10.0, "mean_us": 5.0}
    assert got["busy_us"] == 19.0 and got["span_us"] == 23.0  # 10 .. 33; the memcpy overlaps the second gemm
    assert got["timelines"] == ["/device:GPU:0"]
    lines = kp.format_profile(dict(got, wall_us=60.0), steps=2)
    assert "device busy 9.5 us per step over a 11.5 us span (wall 30.0 us)" in lines[0]
    assert "1.0 x     5.00 us =      5.0 us/step  gemm" in lines[1]


def test_profile_of_a_cpu_loop_counts_each_kernel_once_per_trip(kp, tmp_path):
    f = jax.jit(lambda x, w: jax.lax.fori_loop(0, 5, lambda i, x: jnp.tanh(x @ w), x))
    x, w = jnp.ones((32, 128)), jnp.full((128, 128), 0.01)
    f(x, w).block_until_ready()  # compiled before the trace
    rep = kp.profile(lambda: f(x, w), tmp_path)
    tanh = [k for name, k in rep["kernels"].items() if "tanh" in name]
    assert tanh and all(k["count"] == 5 for k in tanh), rep["kernels"]
    assert 0 < rep["busy_us"] <= rep["span_us"] * 1.01 and rep["span_us"] <= rep["wall_us"]
    with pytest.raises(FileNotFoundError, match="create_perfetto_trace"):
        kp.trace_file(tmp_path / "nothing")
