# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Judging decode for an accelerator on a host without one: `jaxgrpo.hlo` (bytes per kernel of a loop body, launches,
copies/transposes/pads/sorts) on a hand-written HLO module whose bytes are computed by hand; `aot.gpu_devices`' one-line
message when the CUDA plugin or ptxas is missing; and, where they are present, the H100 compile of the CLI and of the
Qwen2.5-0.5B config's decode loop (report fields, the roofline bound) and of the token draw (no full-vocabulary sort).
"""

from __future__ import annotations

import importlib.util
import shutil

import jax
import jax.numpy as jnp
import pytest

from jaxgrpo import aot, decode_report, hlo, train_report
from jaxgrpo import compile as compile_cli
from jaxgrpo import config as config_lib
from jaxgrpo.errors import ConfigError

MISSING = aot.gpu_compiler_missing()
needs_cuda = pytest.mark.skipif(bool(MISSING), reason=f"cannot compile for an H100: missing {' and '.join(MISSING)}")

# An outer loop (the "token loop") whose body: adds to its counter, dynamic-slices one [256, 128] bf16 layer out of
# four inside a fusion, multiplies it in a cuBLAS call with a workspace, updates one column of an f32[8, 1024] buffer
# in place, copies a [256, 128] bf16 buffer, runs an inner loop of 3 trips (`i < 3`) that transposes that buffer,
# and sorts an f32[8, 1024] row-wise; the entry also has a cheaper loop.
MODULE = """HloModule hand_written

%fused_slice (p0: bf16[4,256,128], p1: s32[]) -> bf16[1,256,128] {
  %p0 = bf16[4,256,128]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %c0 = s32[] constant(0)
  ROOT %ds = bf16[1,256,128]{2,1,0} dynamic-slice(%p0, %p1, %c0, %c0), dynamic_slice_sizes={1,256,128}
}

%fused_dus (q0: f32[8,1024], q1: f32[8,1], q2: s32[]) -> f32[8,1024] {
  %q0 = f32[8,1024]{1,0} parameter(0)
  %q1 = f32[8,1]{1,0} parameter(1)
  %q2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = f32[8,1024]{1,0} dynamic-update-slice(%q0, %q1, %z, %q2)
}

%fused_transpose (t0: bf16[256,128]) -> bf16[128,256] {
  %t0 = bf16[256,128]{1,0} parameter(0)
  ROOT %t = bf16[128,256]{1,0} transpose(%t0), dimensions={1,0}
}

%cmp (a: f32[], b: f32[], c: s32[], d: s32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = s32[] parameter(2)
  %d = s32[] parameter(3)
  ROOT %gt = pred[] compare(%a, %b), direction=GT
}

%inner_body (arg: (s32[], bf16[256,128])) -> (s32[], bf16[256,128]) {
  %arg = (s32[], bf16[256,128]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%arg), index=0
  %x = bf16[256,128]{1,0} get-tuple-element(%arg), index=1
  %one = s32[] constant(1)
  %j1 = s32[] add(%j, %one)
  %xt = bf16[128,256]{1,0} fusion(%x), kind=kInput, calls=%fused_transpose
  %y = bf16[256,128]{1,0} bitcast(%xt)
  ROOT %out = (s32[], bf16[256,128]{1,0}) tuple(%j1, %y)
}

%inner_cond (arg: (s32[], bf16[256,128])) -> pred[] {
  %arg = (s32[], bf16[256,128]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%arg), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

%outer_body (st: (s32[], bf16[4,256,128], bf16[8,256], f32[8,1024], f32[8,1], bf16[256,128], s32[8,1024])) -> (s32[], bf16[4,256,128], bf16[8,256], f32[8,1024], f32[8,1], bf16[256,128], s32[8,1024]) {
  %st = (s32[], bf16[4,256,128]{2,1,0}, bf16[8,256]{1,0}, f32[8,1024]{1,0}, f32[8,1]{1,0}, bf16[256,128]{1,0}, s32[8,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%st), index=0
  %w = bf16[4,256,128]{2,1,0} get-tuple-element(%st), index=1
  %h = bf16[8,256]{1,0} get-tuple-element(%st), index=2
  %buf = f32[8,1024]{1,0} get-tuple-element(%st), index=3
  %val = f32[8,1]{1,0} get-tuple-element(%st), index=4
  %x = bf16[256,128]{1,0} get-tuple-element(%st), index=5
  %ids = s32[8,1024]{1,0} get-tuple-element(%st), index=6
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %ws = bf16[1,256,128]{2,1,0} fusion(%w, %i), kind=kLoop, calls=%fused_slice
  %wsb = bf16[256,128]{1,0} bitcast(%ws)
  %mm = (bf16[8,128]{1,0}, s8[1024]{0}) custom-call(%h, %wsb), custom_call_target="__cublas$lt$matmul"
  %log = f32[8,1024]{1,0} fusion(%buf, %val, %i), kind=kLoop, calls=%fused_dus
  %cp = bf16[256,128]{1,0} copy(%x)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[256,128]{1,0}) tuple(%zero, %cp)
  %inner = (s32[], bf16[256,128]{1,0}) while(%init), condition=%inner_cond, body=%inner_body
  %srt = (f32[8,1024]{1,0}, s32[8,1024]{1,0}) sort(%log, %ids), dimensions={1}, to_apply=%cmp
  ROOT %next = (s32[], bf16[4,256,128]{2,1,0}, bf16[8,256]{1,0}, f32[8,1024]{1,0}, f32[8,1]{1,0}, bf16[256,128]{1,0}, s32[8,1024]{1,0}) tuple(%i1, %w, %h, %log, %val, %x, %ids)
}

%outer_cond (st: (s32[], bf16[4,256,128], bf16[8,256], f32[8,1024], f32[8,1], bf16[256,128], s32[8,1024])) -> pred[] {
  %st = (s32[], bf16[4,256,128]{2,1,0}, bf16[8,256]{1,0}, f32[8,1024]{1,0}, f32[8,1]{1,0}, bf16[256,128]{1,0}, s32[8,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%st), index=0
  %n = s32[] constant(10)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (s0: (s32[], bf16[4,256,128], bf16[8,256], f32[8,1024], f32[8,1], bf16[256,128], s32[8,1024]), s1: (s32[], bf16[256,128])) -> (s32[], bf16[256,128]) {
  %s0 = (s32[], bf16[4,256,128]{2,1,0}, bf16[8,256]{1,0}, f32[8,1024]{1,0}, f32[8,1]{1,0}, bf16[256,128]{1,0}, s32[8,1024]{1,0}) parameter(0)
  %s1 = (s32[], bf16[256,128]{1,0}) parameter(1)
  %small = (s32[], bf16[256,128]{1,0}) while(%s1), condition=%inner_cond, body=%inner_body
  %big = (s32[], bf16[4,256,128]{2,1,0}, bf16[8,256]{1,0}, f32[8,1024]{1,0}, f32[8,1]{1,0}, bf16[256,128]{1,0}, s32[8,1024]{1,0}) while(%s0), condition=%outer_cond, body=%outer_body, backend_config={"known_trip_count":{"n":"10"}}
  ROOT %r = (s32[], bf16[256,128]{1,0}) tuple(%small)
}
"""  # noqa: E501


def test_loop_bytes_of_a_hand_written_module():
    rep = hlo.loop_report(MODULE, min_bytes=256 * 128 * 2, vocab=1000)
    assert rep.body == "outer_body" and rep.unknown_trip_counts == 0
    layer = 256 * 128 * 2  # one bf16 [256, 128] buffer: 65,536 bytes
    expected = {
        "add": (4 + 4) + 4,  # counter: two s32 read, one written
        "fusion:ws": (layer + 4) + layer,  # only the dynamic slice of the stacked [4, 256, 128] is read, + its index
        "custom-call:__cublas$lt$matmul": (8 * 256 * 2 + layer) + 8 * 128 * 2,  # h and the slice; workspace not written
        "fusion:log": (0 + 8 * 4 + 4) + 8 * 4,  # in place: the [8, 1] update and the index read, the update written
        "copy": layer + layer,
        "fusion:xt": 3 * (layer + layer),  # 3 trips of the inner loop's transpose
        "inner add": 3 * ((4 + 4) + 4),
        "sort": (8 * 1024 * 4 + 8 * 1024 * 4) + (8 * 1024 * 4 + 8 * 1024 * 4),
    }
    assert rep.bytes_per_iteration == sum(expected.values()) == 858_232
    assert rep.launches_per_iteration == 5 + 1 + 3 * 2  # add, slice, matmul, update, copy, sort + 3 x (add, transpose)
    by_name = {k.name: k for k in rep.kernels}
    assert (by_name["ws"].read, by_name["ws"].write) == (layer + 4, layer)
    assert (by_name["log"].read, by_name["log"].write) == (36, 32)
    assert by_name["xt"].count == 3 and by_name["mm"].write == 2048
    assert sorted(f.op for f in rep.findings) == ["copy", "dynamic-slice", "sort", "transpose"]
    # a larger threshold keeps only the sort; a vocabulary wider than the sort's rows drops it
    assert [f.op for f in hlo.loop_report(MODULE, min_bytes=layer + 1, vocab=1000).findings] == ["sort"]
    assert [f.op for f in hlo.loop_report(MODULE, min_bytes=layer + 1, vocab=1025).findings] == []
    assert [f.where for f in hlo.sorts(MODULE, 1024)] == ["outer_body"] and hlo.sorts(MODULE, 1025) == []
    assert hlo.array_bytes("(bf16[2,3]{1,0}, pred[4], f32[])") == 12 + 4 + 4


def test_missing_cuda_plugin_or_ptxas_is_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("jax_plugins") else
                        real(name, *a))  # fmt: skip
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ConfigError) as e:
        aot.gpu_devices("h100")
    msg = str(e.value)
    assert "\n" not in msg and f'pip install "jax[cuda13-local]=={jax.__version__}"' in msg and "ptxas" in msg
    with pytest.raises(ConfigError, match="valid choices: h100, h200"):
        aot.gpu_devices("a100")


@needs_cuda
@pytest.mark.slow
def test_cli_compiles_for_an_h100_and_dumps_the_decode_hlo(tmp_path, capsys):
    args = ["--platform", "cuda", "--chip", "h100", "--dump-hlo", str(tmp_path), "rollout.max_new_tokens=5",
            "model.dtype=bfloat16"]  # fmt: skip
    assert compile_cli.main(args) == 0
    out = capsys.readouterr().out
    assert "x h100 (" in out and "decode step:" in out and "MiB ideal" in out and out.strip().endswith("fits")
    assert "host launches per token step: 1 (1 of them CUDA graphs" in out
    text = (tmp_path / "decode.hlo.txt").read_text()
    assert "__cublas" in text or "cublas" in text  # compiled by XLA:GPU, not the CPU backend
    assert (tmp_path / "prefill.hlo.txt").exists()


@pytest.fixture(scope="module")
def qwen_decode():
    """The Qwen2.5-0.5B-Instruct GSM8K config's decode loop compiled for an H100 (random weights: shapes only; the
    prefill's attention is the config's, chunked where cuDNN is not installed, as `python -m jaxgrpo.compile` does)."""
    cfg = config_lib.load_config("qwen2.5-0.5b-instruct_gsm8k", [] if aot.has_cudnn() else ["perf.attention=chunked"])
    mcfg = aot.model_config(cfg)
    texts: dict[str, str] = {}
    figures = aot.compile_rollout(cfg, mcfg, aot.gpu_devices("h100"), texts, windows=3)  # of 16 windows: 32, 288, 512
    ideal = decode_report.decode_ideal_bytes(cfg, mcfg)
    return cfg, mcfg, ideal, dict(decode_report.decode_report(cfg, mcfg, texts, ideal), figures=figures["decode"])


@needs_cuda
@pytest.mark.slow
def test_qwen_decode_report_fields(qwen_decode):
    cfg, mcfg, ideal, rep = qwen_decode
    # the ideal from the shapes: bf16 weights once (tied head), 32 prompts x 384 prefix slots, 256 rows x 256 slots
    kv = 2 * 24 * 2 * 64 * 2
    assert ideal["prefix_kv"] == kv * 32 * 384 and ideal["decode_kv"] == kv * 256 * 256
    assert ideal["weights"] == pytest.approx(494_032_768 * 2)
    assert rep["ideal_bytes_per_step"] == ideal["total"] and rep["ratio"] == rep["bytes_per_step"] / ideal["total"]
    assert rep["unknown_trip_counts"] == 0  # the layer loop's 24 trips are known
    assert rep["bytes_per_step"] > ideal["weights"]  # every weight is read each step
    assert rep["launches_per_step"] > 24  # at least one kernel per layer
    assert rep["top"] and all(k.read + k.write > 0 for k in rep["top"])
    assert "\n".join(decode_report.format_decode_report(rep)).count("MiB") >= 3
    # the host launches the whole token step as one CUDA graph: every kernel, GEMMs and Pallas attention included
    host = {k: rep["figures"][k] for k in ("launches", "graphs", "graphed", "thunks")}
    assert host["launches"] == host["graphs"] == 1 and host["graphed"] == host["thunks"] >= 24 * 5, host


@needs_cuda
@pytest.mark.slow
def test_qwen_decode_near_the_roofline(qwen_decode):
    """The engine's decode (one program per window of decode slots, averaged over a full-length rollout's steps)
    moves at most 1.5x the ideal per token step, with no copy/transpose/pad of a weight or cache in any compiled
    window's loop; between the compiled windows the bytes grow by the own keys and values read (bf16, 24 layers x 2 kv
    heads x 64 x 256 rows x 2 per slot) and their mask (a byte per row and layer), nothing else: the report's linear
    interpolation of the other windows is exact."""
    cfg, mcfg, _, rep = qwen_decode
    assert rep["ratio"] <= 1.5, rep["ratio"]
    assert rep["findings"] == [], [(f.op, f.shape, f.bytes) for f in rep["findings"]]
    # RoPE, the cache writes and attention are one kernel a layer (`pallas_attention.decode_layer`), the qkv bias
    # is in its GEMM's epilogue: 8 kernels a layer + ~25 for the LM head and the draw (11 a layer when RoPE and the
    # two cache scatters were kernels of their own, 289 a step)
    assert rep["launches_per_step"] <= 24 * 8 + 30, rep["launches_per_step"]
    assert sum(n for n, _ in rep["windows"].values()) == cfg.rollout.max_new_tokens - 1 and max(rep["windows"]) == 512
    widths = [w for w in sorted(rep["windows"]) if w not in rep["interpolated"]]
    assert widths == [32, 288, 512] and len(rep["interpolated"]) == 13  # two intervals: the growth is linear
    per_slot = 24 * (2 * 64 * 256 * 2 * 2 + 256)
    for a, b in zip(widths, widths[1:]):
        assert rep["windows"][b][1] - rep["windows"][a][1] == pytest.approx(per_slot * (b - a), rel=2e-3)


@needs_cuda
def test_h100_token_draw_with_top_p_sorts_no_vocabulary():
    """The Qwen vocabulary's draw for 256 rows with top_p < 1, compiled for an H100: no sort of ``[rows, vocab]``
    (XLA:GPU turns a top-k of more than 16 into one), while the CPU compile of the same draw keeps its stable sort."""
    from jaxgrpo.token_sampling import sample_from_logits

    mesh = jax.sharding.Mesh(aot.gpu_devices("h100")[:1], ("x",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    logits = jax.ShapeDtypeStruct((256, 151936), jnp.float32, sharding=rep)
    keys = jax.ShapeDtypeStruct((256,), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=rep)
    draw = jax.jit(lambda k, z: sample_from_logits(k, z, 1.0, top_p=0.95))
    text = draw.lower(keys, logits).compile({"xla_gpu_enable_triton_gemm": False}).as_text()
    assert hlo.sorts(text, 151936) == []
    assert "TopK" in text  # the 16 candidates: XLA:GPU's top-k kernel
    cpu = jax.jit(lambda k, z: sample_from_logits(k, z, 1.0, top_p=0.95)).lower(
        jax.ShapeDtypeStruct((8,), keys.dtype), jax.ShapeDtypeStruct((8, 4096), jnp.float32)).compile()  # fmt: skip
    assert hlo.sorts(cpu.as_text(), 4096) != []  # the same check finds the CPU path's fallback sort


# XLA:GPU's thunk sequence of a program with two loops (dumped after its thunk passes, trimmed): the heavier loop's
# body is one host launch of a kernel, then a command buffer of three thunks, then a GEMM launched on its own.
THUNKS = """001: kCopy  [source | next=003 (1)] kCopy
002: kWhile [prev=001 (1) | sink]
condition:
    003: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    004: kCustomKernel [source | sink] loop_add_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
005: kWhile [prev=002 (1) | sink]
condition:
    006: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    007: kCustomKernel   [source | sink] loop_add_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
    000: kCommandBuffer [source | sink]
        008: kCublasLtMatmul [source | next=009 (1)] kCublasLtMatmul
        009: kCustomKernel   [prev=008 (1) | next=010 (1)] loop_tanh_fusion grid: [1024, 1, 1] threads: [128, 1, 1]
        010: kCustomKernel   [prev=009 (1) | sink] input_reduce_fusion grid: [2, 1, 1] threads: [128, 1, 1]
    011: kCublasLtMatmul [source | sink] kCublasLtMatmul
012: kCopy  [prev=005 (1) | sink] kCopy
"""


def test_host_launches_of_a_hand_written_thunk_sequence():
    got = hlo.host_launches(THUNKS)
    assert got == hlo.HostLaunches(launches=3, graphs=1, graphed=3, thunks=5)
    with pytest.raises(ValueError, match="no while loop body"):
        hlo.host_launches(THUNKS.split("condition:")[0])


@needs_cuda
@pytest.mark.parametrize("chip", ["h100", "h200"])
def test_gpu_targets_give_a_gemm_loop_body_to_one_cuda_graph(tmp_path, chip):
    """XLA:GPU records cuBLAS(Lt) GEMMs into a command buffer (a CUDA graph) only when both the CUDA runtime and the
    driver are >= 12.3; a target description without a driver version reads 0 and leaves every GEMM a host launch of
    its own, which no machine with a CUDA 13 driver does. With ours, a loop body of two GEMMs and their elementwise
    kernels is one command buffer holding all four (XLA's thunk sequence after its thunk passes, dumped per compile)."""
    mesh = jax.sharding.Mesh(aot.gpu_devices(chip)[:1], ("x",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    x, w = (jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=rep) for s in ((256, 512), (512, 512)))
    body = lambda i, x, w: jnp.tanh(jnp.tanh(x @ w) @ w)  # noqa: E731
    loop = jax.jit(lambda x, w: jax.lax.fori_loop(0, 8, lambda i, x: body(i, x, w), x))
    loop.lower(x, w).compile({"xla_gpu_enable_triton_gemm": False, "xla_dump_to": str(tmp_path)})
    passes = list(tmp_path.glob("*thunk_sequence_after_thunk_passes.txt"))  # written when a thunk pass changed any
    (dump,) = passes or list(tmp_path.glob("*thunk_sequence.txt"))
    lines = dump.read_text().splitlines()
    body_at = next(i for i, line in enumerate(lines) if line.strip() == "body:")
    top = [line.split()[1] for line in lines[body_at + 1:] if line.startswith("    ") and line[4] != " "]
    inner = [line.split()[1] for line in lines[body_at + 1:] if line.startswith("        ")]
    assert top == ["kCommandBuffer"], top
    assert inner.count("kCublasLtMatmul") + inner.count("kGemm") == 2 and len(inner) >= 4, inner


@needs_cuda
def test_pallas_decode_attention_lowers_for_an_h100():
    """`pallas_attention.decode_attend_shared_prefix` at the Qwen2.5-0.5B rollout's shapes (32 prompts x 8 rows, 2 kv
    heads x 7, head 64, 384 prefix and 512 decode slots, bf16) compiles to Triton kernels for an H100; with values
    stored [.., S, H] no kernel copies or transposes a cache (only the queries are regrouped)."""
    from jaxgrpo.models import pallas_attention

    mesh = jax.sharding.Mesh(aot.gpu_devices("h100")[:1], ("x",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    s = lambda shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt, sharding=rep)  # noqa: E731
    P, G, K, R, H, Tp, M = 32, 8, 2, 7, 64, 384, 512
    args = (s((P * G, 1, K, R, H)), s((P, K, Tp, H)), s((P, K, Tp, H)), s((P, Tp), jnp.bool_), s((P * G, K, M, H)),
            s((P * G, K, M, H)), s((P * G, 1, M), jnp.bool_))  # fmt: skip
    fn = jax.jit(lambda *a: pallas_attention.decode_attend_shared_prefix(*a, values_key_minor=False))
    text = fn.lower(*args).compile({"xla_gpu_enable_triton_gemm": False}).as_text()
    comps = hlo.parse(text)
    kernels = hlo.body_report(comps, "__entry__").kernels
    assert sum(k.kind == "custom-call:__gpu$xla.gpu.triton" for k in kernels) == 2  # prefix part and own part
    cache = P * G * K * M * H * 2  # one decode cache (k or v), bf16
    moved = [k for k in kernels if "triton" not in k.kind and max(k.read, k.write) >= cache // 8]
    assert moved == [], moved


def test_program_bytes_and_wide_buffers_of_the_hand_written_module():
    """The whole program's bytes: the entry's two loops by their trip counts (the token loop's 10 x 858,232 bytes and
    the small loop's 3 x (add + transpose)); the float32 [*, 1024] buffers its kernels write: the token loop's carry,
    the in-place update's output and the sort's keys (the 1024 may be the logical or the in-memory last dimension)."""
    layer = 256 * 128 * 2
    rep = hlo.program_bytes(MODULE)
    assert rep.bytes_per_iteration == 10 * 858_232 + 3 * ((4 + 4) + 4 + 2 * layer)
    assert rep.unknown_trip_counts == 0
    assert sorted(f.op for f in hlo.wide_buffers(MODULE, "f32", 1024)) == ["fusion", "sort", "while"]
    assert hlo.wide_buffers(MODULE, "f32", 1025) == [] and hlo.wide_buffers(MODULE, "s32", 8) == []
    transposed = "HloModule t\n\nENTRY %m (p: f32[1024,8]) -> f32[1024,8] {\n  %p = f32[1024,8]{1,0} parameter(0)\n" \
                 "  ROOT %c = f32[1024,8]{0,1} copy(%p)\n}\n"  # fmt: skip
    assert [f.op for f in hlo.wide_buffers(transposed, "f32", 1024)] == ["copy"]  # [8, 1024] in memory


@needs_cuda
@pytest.mark.slow
def test_qwen_train_step_for_an_h100_has_no_float32_vocab_buffer(capsys):
    """The Qwen2.5-0.5B config's train step (a small rollout and 6 of the model's 24 layers: the vocabulary and the
    layer shapes are the config's) compiled for an H100: the LM head is the fused Pallas one (Triton kernels), so no
    kernel writes a float32 ``[*, 151936]`` buffer (logits, probabilities or a transposed float32 copy of the head);
    the report's bytes are counted. XLA's dot
    merger is off for it (`train_step.GPU_TRAIN_COMPILER_OPTIONS`): no kernel concatenates projections to run their
    GEMMs as one (at this size XLA merged q|k|v and gate|up; at the config's, the two streams' activations). The
    layers run unrolled (`perf.layer_loop=auto` on GPUs): no kernel writes a bf16 buffer stacked over the layers."""
    overrides = ["rollout.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=32",
                 "data.max_prompt_tokens=32", "algo.grad_accum_steps=2"]  # fmt: skip
    if not aot.has_cudnn():  # as `python -m jaxgrpo.compile` does
        overrides.append("perf.attention=chunked")
    cfg = config_lib.load_config("qwen2.5-0.5b-instruct_gsm8k", overrides)
    mcfg = aot.model_config(cfg).replace(num_layers=6)  # unrolled layers compile per layer
    texts: dict[str, str] = {}
    step = aot.compile_train_step(cfg, mcfg, aot.gpu_devices("h100"), texts)
    text = texts["train"]
    assert "__gpu$xla.gpu.triton" in text  # the fused head's kernels
    if aot.has_cudnn():  # remat "projections" keeps cuDNN attention's forward: one forward call per backward call
        calls = {k: text.count(f'custom_call_target="__cudnn$fmhaScaleBiasSoftmax{k}"') for k in ("", "Backward")}
        assert calls[""] == calls["Backward"] > 0, calls
    assert hlo.wide_buffers(text, "f32", mcfg.vocab_size) == []
    report = hlo.program_bytes(text)
    assert step["hbm_bytes"] == report.bytes_per_iteration > step["weights"]
    qkv = (mcfg.num_heads + 2 * mcfg.num_kv_heads) * mcfg.head_dim
    widths = {mcfg.intermediate_size, 2 * mcfg.intermediate_size, qkv}
    merged = [k.shape for k in report.kernels  # bf16 operands of a merged GEMM (not the f32 gradient stacks)
              if "concatenate" in k.kind and k.shape.startswith("bf16") and any(f",{w}]" in k.shape for w in widths)]
    assert merged == []
    # perf.layer_loop=auto unrolls the layers on GPUs: no activations stacked over them ([L, ...] in bf16)
    assert [k.shape for k in report.kernels if f"bf16[{mcfg.num_layers}," in k.shape] == []
    lines = train_report.format_train_report(step, text, mcfg.vocab_size, aot.CHIPS["h100"])
    assert "GiB HBM traffic" in lines[0] and lines[-1].endswith("buffers written by the train step's kernels: 0")
