# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`jaxgrpo.hlo`'s byte count where a kernel does not move its whole operands, on hand-written HLO modules whose bytes
are computed by hand: a TPU prefetch into on-chip memory (read from HBM once), a Pallas kernel and a cuBLAS call with
outputs aliased to operands, an in-place update under a bitcast root, and an in-place scatter.
"""

from __future__ import annotations

from jaxgrpo import hlo

# A TPU-style loop body: the weight prefetched from HBM into on-chip VMEM (memory space 1 in its layout) by an
# asynchronous copy, then read there by the matmul fusion, whose activation and output live in HBM.
TPU_PREFETCH = """HloModule tpu_prefetch

%fused_mm (a: bf16[8,1024], w: bf16[1024,1024]) -> bf16[8,1024] {
  %a = bf16[8,1024]{1,0:T(8,128)(2,1)} parameter(0)
  %w = bf16[1024,1024]{1,0:T(8,128)(2,1)S(1)} parameter(1)
  ROOT %d = bf16[8,1024]{1,0:T(8,128)(2,1)} dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (st: (s32[], bf16[8,1024], bf16[1024,1024])) -> (s32[], bf16[8,1024], bf16[1024,1024]) {
  %st = (s32[], bf16[8,1024]{1,0:T(8,128)(2,1)}, bf16[1024,1024]{1,0:T(8,128)(2,1)}) parameter(0)
  %i = s32[] get-tuple-element(%st), index=0
  %a = bf16[8,1024]{1,0:T(8,128)(2,1)} get-tuple-element(%st), index=1
  %w = bf16[1024,1024]{1,0:T(8,128)(2,1)} get-tuple-element(%st), index=2
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %cs = (bf16[1024,1024]{1,0:T(8,128)(2,1)S(1)}, bf16[1024,1024]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%w)
  %cd = bf16[1024,1024]{1,0:T(8,128)(2,1)S(1)} copy-done(%cs)
  %mm = bf16[8,1024]{1,0:T(8,128)(2,1)} fusion(%a, %cd), kind=kOutput, calls=%fused_mm
  ROOT %next = (s32[], bf16[8,1024]{1,0:T(8,128)(2,1)}, bf16[1024,1024]{1,0:T(8,128)(2,1)}) tuple(%i1, %mm, %w)
}

%cond (st: (s32[], bf16[8,1024], bf16[1024,1024])) -> pred[] {
  %st = (s32[], bf16[8,1024]{1,0:T(8,128)(2,1)}, bf16[1024,1024]{1,0:T(8,128)(2,1)}) parameter(0)
  %i = s32[] get-tuple-element(%st), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (s: (s32[], bf16[8,1024], bf16[1024,1024])) -> (s32[], bf16[8,1024], bf16[1024,1024]) {
  %s = (s32[], bf16[8,1024]{1,0:T(8,128)(2,1)}, bf16[1024,1024]{1,0:T(8,128)(2,1)}) parameter(0)
  ROOT %loop = (s32[], bf16[8,1024]{1,0:T(8,128)(2,1)}, bf16[1024,1024]{1,0:T(8,128)(2,1)}) while(%s), condition=%cond, body=%body
}
"""  # noqa: E501


def test_a_prefetch_into_on_chip_memory_is_read_from_hbm_once():
    """The weight is read from HBM once per iteration, by its copy into VMEM (2 MiB); writing and reading the VMEM
    copy (``S(1)``) and the copy's completion move no HBM bytes (they were charged three times more before)."""
    rep = hlo.loop_report(TPU_PREFETCH)
    by_name = {k.name: k for k in rep.kernels}
    weight, act = 1024 * 1024 * 2, 8 * 1024 * 2
    assert (by_name["cs"].read, by_name["cs"].write) == (weight, 0)
    assert (by_name["cd"].read, by_name["cd"].write) == (0, 0)
    assert (by_name["mm"].read, by_name["mm"].write) == (act, act)
    assert rep.bytes_per_iteration == weight + 2 * act + (4 + 4) + 4
    assert rep.launches_per_iteration == 3  # the add, the copy into VMEM and the product; the copy's wait is none
    assert hlo.array_bytes("(bf16[2,4]{1,0:S(1)}, f32[3]{0}, u32[]{:S(2)})") == 12


# a loop body with a Pallas kernel that updates its cache operand in place (output 1 aliased to operand 1) and a
# cuBLAS GEMM whose fused residual add writes its addend's buffer (output 0 aliased to operand 2)
GPU_IN_PLACE = """HloModule gpu_in_place

%body (st: (s32[], bf16[8,64], bf16[64,1024], bf16[8,64])) -> (s32[], bf16[8,64], bf16[64,1024], bf16[8,64]) {
  %st = (s32[], bf16[8,64]{1,0}, bf16[64,1024]{1,0}, bf16[8,64]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%st), index=0
  %x = bf16[8,64]{1,0} get-tuple-element(%st), index=1
  %c = bf16[64,1024]{1,0} get-tuple-element(%st), index=2
  %w = bf16[8,64]{1,0} get-tuple-element(%st), index=3
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %pc = (bf16[8,64]{1,0}, bf16[64,1024]{1,0}) custom-call(%x, %c), custom_call_target="__gpu$xla.gpu.triton", \
output_to_operand_aliasing={{1}: (1, {})}, metadata={op_name="pallas_call"}
  %o = bf16[8,64]{1,0} get-tuple-element(%pc), index=0
  %c1 = bf16[64,1024]{1,0} get-tuple-element(%pc), index=1
  %mm = (bf16[8,64]{1,0}, s8[1024]{0}) custom-call(%o, %w, %x), custom_call_target="__cublas$lt$matmul", \
output_to_operand_aliasing={{0}: (2, {})}, metadata={op_name="dot_general"}
  %y = bf16[8,64]{1,0} get-tuple-element(%mm), index=0
  ROOT %next = (s32[], bf16[8,64]{1,0}, bf16[64,1024]{1,0}, bf16[8,64]{1,0}) tuple(%i1, %y, %c1, %w)
}

%cond (st: (s32[], bf16[8,64], bf16[64,1024], bf16[8,64])) -> pred[] {
  %st = (s32[], bf16[8,64]{1,0}, bf16[64,1024]{1,0}, bf16[8,64]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%st), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (p: (s32[], bf16[8,64], bf16[64,1024], bf16[8,64])) -> (s32[], bf16[8,64], bf16[64,1024], bf16[8,64]) {
  %p = (s32[], bf16[8,64]{1,0}, bf16[64,1024]{1,0}, bf16[8,64]{1,0}) parameter(0)
  ROOT %loop = (s32[], bf16[8,64]{1,0}, bf16[64,1024]{1,0}, bf16[8,64]{1,0}) while(%p), condition=%cond, body=%body
}
"""


def test_a_pallas_kernel_updating_its_operand_in_place_writes_only_its_other_outputs():
    """The Pallas kernel reads its cache (128 KiB) and writes only its first output (its aliased cache output is its
    own stores, not in the HLO); the cuBLAS call with an aliased output reads its addend and writes its output whole."""
    rep = hlo.loop_report(GPU_IN_PLACE)
    by_name = {k.name: k for k in rep.kernels}
    act, cache = 8 * 64 * 2, 64 * 1024 * 2
    assert (by_name["pc"].read, by_name["pc"].write) == (act + cache, act)
    assert (by_name["mm"].read, by_name["mm"].write) == (3 * act, act)


def test_in_place_update_under_a_bitcast_root_writes_its_update_only():
    """TPU HLO roots an in-place update fusion in a bitcast of the dynamic-update-slice: still the update's bytes
    (read and written) plus the index, not the whole [4, 8, 1024] float32 buffer."""
    module = """HloModule bitcast_root

%fused_bdus (q0: f32[4,8,1024], q1: f32[1,8,1024], q2: s32[]) -> f32[32,1024] {
  %q0 = f32[4,8,1024]{2,1,0} parameter(0)
  %q1 = f32[1,8,1024]{2,1,0} parameter(1)
  %q2 = s32[] parameter(2)
  %z = s32[] constant(0)
  %dus = f32[4,8,1024]{2,1,0} dynamic-update-slice(%q0, %q1, %q2, %z, %z)
  ROOT %b = f32[32,1024]{1,0} bitcast(%dus)
}

ENTRY %m (p0: f32[4,8,1024], p1: f32[1,8,1024], p2: s32[]) -> f32[32,1024] {
  %p0 = f32[4,8,1024]{2,1,0} parameter(0)
  %p1 = f32[1,8,1024]{2,1,0} parameter(1)
  %p2 = s32[] parameter(2)
  ROOT %f = f32[32,1024]{1,0} fusion(%p0, %p1, %p2), kind=kLoop, calls=%fused_bdus
}
"""
    update = 8 * 1024 * 4
    assert hlo.program_bytes(module).bytes_per_iteration == update + 4 + update


def test_in_place_scatter_writes_its_updates_only():
    """A per-row cache write (a fusion rooted in a scatter of one [2, 64] key per row into a bf16 [4, 2, 512, 64]
    cache, as the engine's decode step writes each row at its own slot; the keys sliced out of a wider projection
    output) reads the indices and the sliced keys and writes the keys, not the 512 KiB cache nor the whole projection;
    the same scatter unfused likewise."""
    module = """HloModule scatter_root

%add (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %s = bf16[] add(%a, %b)
}

%fused_scatter (c0: bf16[4,2,512,64], c1: s32[4,2], c2: bf16[4,2,4,64]) -> bf16[4,2,512,64] {
  %c0 = bf16[4,2,512,64]{3,2,1,0} parameter(0)
  %c1 = s32[4,2]{1,0} parameter(1)
  %c2 = bf16[4,2,4,64]{3,2,1,0} parameter(2)
  %k = bf16[4,2,1,64]{3,2,1,0} slice(%c2), slice={[0:4], [0:2], [1:2], [0:64]}
  %u = bf16[4,1,2,1,64]{4,3,2,1,0} bitcast(%k)
  ROOT %sc = bf16[4,2,512,64]{3,2,1,0} scatter(%c0, %c1, %u), update_window_dims={1,2,3,4}, inserted_window_dims={}, scatter_dims_to_operand_dims={0,2}, index_vector_dim=1, to_apply=%add
}

ENTRY %m (p0: bf16[4,2,512,64], p1: s32[4,2], p2: bf16[4,2,4,64], p3: bf16[4,1,2,1,64]) -> (bf16[4,2,512,64], bf16[4,2,512,64]) {
  %p0 = bf16[4,2,512,64]{3,2,1,0} parameter(0)
  %p1 = s32[4,2]{1,0} parameter(1)
  %p2 = bf16[4,2,4,64]{3,2,1,0} parameter(2)
  %p3 = bf16[4,1,2,1,64]{4,3,2,1,0} parameter(3)
  %f = bf16[4,2,512,64]{3,2,1,0} fusion(%p0, %p1, %p2), kind=kInput, calls=%fused_scatter
  %s = bf16[4,2,512,64]{3,2,1,0} scatter(%f, %p1, %p3), update_window_dims={1,2,3,4}, inserted_window_dims={}, scatter_dims_to_operand_dims={0,2}, index_vector_dim=1, to_apply=%add
  ROOT %r = (bf16[4,2,512,64]{3,2,1,0}, bf16[4,2,512,64]{3,2,1,0}) tuple(%f, %s)
}
"""  # noqa: E501
    update, indices = 4 * 2 * 64 * 2, 4 * 2 * 4
    assert hlo.program_bytes(module).bytes_per_iteration == 2 * (indices + update + update)
