# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""GPU benchmark: train-step MFU and decode throughput against the HBM roofline, Qwen2.5-0.5B shape, bfloat16.

Model: `models.get_preset("qwen2.5-0.5b")` (24 layers, hidden 896, 14/2 heads of 64, vocab 151936, tied embeddings)
with random weights: float32 masters, bfloat16 compute (``model.dtype``), as the packaged Qwen config trains.
Speed does not depend on the weights' values, only on the shapes. Three parts and a modifier (``--parts``):

* ``check``: the cuDNN attention kernel against the plain one on the GPU: loss and gradients of one policy-gradient
  step of a 4-layer bf16 model at this shape, ``perf.attention`` dense vs chunked vs cudnn, prefix sharing on and off.
* ``train``: one train step of ``configs/qwen2.5-0.5b-instruct_gsm8k.yaml``'s rollout (P prompts x G samples,
  prompts of ``--prompt-len`` tokens at most, left-padded, random lengths in [len/2, len]; completions of
  ``--completion-len`` tokens, random lengths in [len/2, len]; binary rewards; gradient accumulation as configured)
  for each ``--attention`` kind and ``--remat`` policy: jitted step (state donated), ``--repeats`` timed steps after
  one warm-up (compile) step; the median is reported. Model FLOPs per step are counted from the shapes
  (`jaxgrpo.aot.train_step_flops`, remat recomputation not counted) and MFU = FLOPs / step time / peak, with the
  chip's dense bf16 peak (`aot.CHIPS`).
* ``decode``: `sampling.generate` of ``--decode-prompts`` prompts x G samples; no EOS, so every row runs the full
  length. Decode-only step time = (time for N2 new tokens - time for N1) / (N2 - N1), which removes the prefill and
  the fixed per-call costs. HBM roofline of a decode step: every weight read once (bf16) plus the KV cache slots
  attended (each prompt's shared prefix once, each row's own completion keys/values), at the chip's bandwidth.
* ``profile``: with ``decode``, its longer run once more under `jax.profiler`, device time per kernel name per token
  step (`benchmarks/kernel_profile.py`; CUDA graphs kept while profiling); with ``train``, one more step of each
  train configuration under the profiler, per kernel name.

Writes one JSON (``--out``), printing a table. Run on the GPU: ``python benchmarks/gpu.py --out results.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing
sys.path.insert(0, str(REPO / "benchmarks"))  # the rollout maker of train_step.py

from train_step import random_rollout  # noqa: E402  (benchmarks/train_step.py)

from jaxgrpo import aot, models, padding, sampling  # noqa: E402
from jaxgrpo import config as config_lib  # noqa: E402
from jaxgrpo.config import AlgoConfig, PerfConfig  # noqa: E402
from jaxgrpo.learner import fused_head  # noqa: E402
from jaxgrpo.learner import train_step as ts  # noqa: E402

LAYERS = [24]  # the preset's depth; --layers overrides it (a quick run of the script itself on any backend)
CONFIG = REPO / "jaxgrpo" / "configs" / "qwen2.5-0.5b-instruct_gsm8k.yaml"


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_batch(P: int, G: int, Tp: int, Tc: int, vocab: int, seed: int = 0) -> ts.Batch:
    """`train_step.random_rollout` (benchmarks/train_step.py) with every group informative and sampler log-probs."""
    rng = np.random.default_rng(seed)
    raw = random_rollout(P, G, Tp, Tc, vocab, rng)
    raw["rewards"][:, 0], raw["rewards"][:, 1] = 1.0, 0.0  # every group informative
    old = np.where(raw["completion_mask"], -rng.exponential(2.0, size=(P * G, Tc)), 0.0).astype(np.float32)
    return ts.Batch(**raw, old_logprobs=old)


def part_check() -> dict:
    """Loss and gradient of the dense, chunked and cuDNN attention in one bf16 policy-gradient step."""
    mcfg = models.get_preset("qwen2.5-0.5b", dtype="bfloat16").replace(num_layers=min(4, LAYERS[0]))
    params = models.init_params(mcfg, jax.random.key(0))
    batch = make_batch(4, 4, 96, 128, mcfg.vocab_size)
    out = {}
    for sharing in (True, False):
        res = {}
        for kind in ("dense", "chunked", "cudnn"):
            perf = PerfConfig(attention=kind, prefix_sharing=sharing, prompt_packing=False)
            fn = jax.jit(lambda p, b, perf=perf: ts.policy_gradient(mcfg, AlgoConfig(), p, b, perf=perf,
                                                                    temperature=1.0)[:2])  # fmt: skip
            res[kind] = jax.device_get(fn(params, batch))
        ref_loss, ref_grad = res["dense"]
        for kind in ("chunked", "cudnn"):
            loss, grad = res[kind]
            err = _rel_l2(grad, ref_grad)
            out[f"{kind}_vs_dense_prefix{int(sharing)}"] = {
                "loss": float(loss), "dense_loss": float(ref_loss), "grad_rel_err": err}
            _log(f"check prefix_sharing={sharing} {kind}: loss {float(loss):.6f} vs dense {float(ref_loss):.6f}, "
                 f"grad rel err {err:.2e}")  # fmt: skip
    out["lm_head"] = _check_lm_head(mcfg, params, batch)
    return out


def _rel_l2(tree, ref) -> float:
    """Relative L2 distance of two gradient trees, over all their leaves, in float32."""
    num = sum(float(np.sum((np.float32(a) - np.float32(b)) ** 2)) for a, b in zip(jax.tree.leaves(tree),
                                                                                  jax.tree.leaves(ref)))  # fmt: skip
    return (num / sum(float(np.sum(np.float32(b) ** 2)) for b in jax.tree.leaves(ref))) ** 0.5


def _check_lm_head(mcfg: models.ModelConfig, params, batch: ts.Batch) -> dict:
    """The fused Pallas LM head (Triton) against the chunked XLA head on the GPU: log-probs, loss and gradients."""
    from jaxgrpo.learner.logprobs import compute_logprobs

    res = {}
    for head in ("xla", "fused"):
        perf = PerfConfig(attention="cudnn", lm_head=head)
        lp = jax.jit(lambda p, b, h=head: compute_logprobs(mcfg, p, b, 1.0, lm_head=h)[0])(params, batch)
        fn = jax.jit(lambda p, b, perf=perf: ts.policy_gradient(mcfg, AlgoConfig(), p, b, perf=perf,
                                                                temperature=1.0)[:2])  # fmt: skip
        res[head] = (np.asarray(lp, np.float32), *jax.device_get(fn(params, batch)))
    mask = np.asarray(batch.completion_mask, bool)
    (lp_x, loss_x, g_x), (lp_f, loss_f, g_f) = res["xla"], res["fused"]
    out = {"logp_max_abs_diff": float(np.max(np.abs(lp_f - lp_x)[mask])),
           "logp_mean_abs_diff": float(np.mean(np.abs(lp_f - lp_x)[mask])), "loss_xla": float(loss_x),
           "loss_fused": float(loss_f), "grad_rel_err": _rel_l2(g_f, g_x),
           "finite": bool(np.isfinite(lp_f[mask]).all() and np.isfinite(loss_f))}  # fmt: skip
    _log(f"check lm_head fused vs xla: |dlogp| max {out['logp_max_abs_diff']:.2e} "
         f"mean {out['logp_mean_abs_diff']:.2e}, "
         f"loss {out['loss_fused']:.6f} vs {out['loss_xla']:.6f}, grad rel err {out['grad_rel_err']:.2e}")
    return out


def part_train(cfg: config_lib.Config, args: argparse.Namespace, chip: aot.Chip) -> dict:
    mcfg = models.get_preset("qwen2.5-0.5b", dtype="bfloat16").replace(num_layers=LAYERS[0])
    r = cfg.rollout
    P, G = r.prompts_per_step, r.group_size
    batch = jax.device_put(make_batch(P, G, args.prompt_len, args.completion_len, mcfg.vocab_size))
    lengths = np.asarray(batch.prompt_mask)[::G].sum(1)
    out = {}
    default_options = dict(ts.GPU_TRAIN_COMPILER_OPTIONS)
    runs = [(k, r, h, False) for k in args.attention for r in args.remat for h in args.lm_head]
    if args.before:  # the first configuration once more as the program was before (BENCHMARKS §12)
        runs.append((*runs[0][:3], True))
    for kind, remat, head, before in runs:
        # before: XLA's dot merger on (now off on GPUs: train_step.GPU_TRAIN_COMPILER_OPTIONS) and the layers in a
        # scan (now unrolled on GPUs: perf.layer_loop=auto)
        ts.GPU_TRAIN_COMPILER_OPTIONS = {} if before else default_options
        perf = PerfConfig(attention=kind, remat=remat, lm_head=head, layer_loop="scan" if before else "auto")
        run_cfg = dataclasses.replace(cfg, perf=perf, rollout=dataclasses.replace(
            r, max_new_tokens=args.completion_len))
        width = ts.packed_prompt_width(lengths, args.prompt_len, cfg.algo, perf)
        init_fn, step_fn = ts.make_train_step(mcfg, cfg.algo, cfg.optim, perf=perf, temperature=1.0,
                                              total_steps=cfg.train.steps)  # fmt: skip
        name = f"{kind}/{remat}/{head}" + ("/before: dot merger on, layer scan" if before else "")
        try:
            state = init_fn(models.init_params(mcfg, jax.random.key(0)), jax.random.key(1))
            t0 = time.perf_counter()
            state, m = step_fn(state, batch, packed_prompt_width=width)
            jax.block_until_ready(m)
            first = time.perf_counter() - t0
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                state, m = step_fn(state, batch, packed_prompt_width=width)
                jax.block_until_ready(m)
                times.append(time.perf_counter() - t0)
            if "profile" in args.parts and not before:  # one more step under the profiler
                one, held = _stepper(step_fn, state, batch, width)
                prof = _profiled(one, args, f"train_{kind}_{remat}_{head}", steps=1)
                state = held[0]
        except Exception as e:  # noqa: BLE001 -- e.g. out of memory at remat=none: recorded, not fatal
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            _log(f"train {name}: FAILED {out[name]['error']}")
            continue
        finally:
            state = None
            ts.GPU_TRAIN_COMPILER_OPTIONS = default_options
        step_s = statistics.median(times)
        prompt_tokens = int(lengths.sum()) if width else 0  # packed prompts: the decoder runs their real tokens
        no_remat = dataclasses.replace(run_cfg, perf=dataclasses.replace(run_cfg.perf, remat="none"))
        flops = aot.train_step_flops(no_remat, mcfg, args.prompt_len, prompt_tokens)  # model FLOPs: no recompute
        tokens = int(np.asarray(batch.prompt_mask).sum() + np.asarray(batch.completion_mask).sum())
        stats = jax.devices()[0].memory_stats() or {}
        out[name] = {"first_step_s": first, "step_s": times, "median_step_s": step_s, "model_flops": flops,
                     "mfu": flops / step_s / chip.peak_flops, "tokens_per_s": tokens / step_s,
                     "packed_prompt_width": int(width),
                     # the process's peak so far: this configuration's own only for the first one run
                     "process_peak_bytes_in_use": stats.get("peak_bytes_in_use"),
                     "loss": float(m["loss"])}  # fmt: skip
        if "profile" in args.parts and not before:
            out[name]["profile"] = prof
        _log(f"train {name}: {step_s:.3f} s/step (first {first:.1f} s), {out[name]['tokens_per_s']:.0f} tokens/s, "
             f"MFU {out[name]['mfu']:.3f}, process peak {stats.get('peak_bytes_in_use', 0) / 2**30:.1f} GiB")
    return out


def _stepper(step_fn, state: ts.TrainState, batch: ts.Batch, width: int) -> tuple:
    """A call of one train step with no arguments, and the one-item list it keeps the (donated) state in."""
    held = [state]

    def one() -> dict:
        held[0], metrics = step_fn(held[0], batch, packed_prompt_width=width)
        return metrics

    return one, held


def _check_decode_layer(mcfg: models.ModelConfig, P: int, G: int, width: int, slots: int) -> dict:
    """The fused decode-layer kernel (`pallas_attention.decode_layer`, Triton) against its XLA reference
    (`models.decode.write_attend`) on this GPU, bf16, at the decode's shape: random q|k|v, prompts of ragged lengths,
    rows at random slots of a ``slots``-wide window (every 7th row finished: its slot past the window)."""
    from jaxgrpo.models import decode, pallas_attention

    rng = np.random.default_rng(1)
    B, K, R, H = P * G, mcfg.num_kv_heads, mcfg.heads_per_kv, mcfg.head_dim
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.bfloat16)  # noqa: E731
    lengths = rng.integers(1, width + 1, size=P)
    slot = np.where(np.arange(B) % 7 == 6, slots, rng.integers(0, slots, size=B))
    angle = rng.uniform(0, 500, (B, H // 2))
    args = (f(B, K, R + 2, H), jnp.asarray(np.cos(angle), jnp.float32), jnp.asarray(np.sin(angle), jnp.float32),
            f(P, K, width, H), f(P, K, H, width), jnp.asarray(np.arange(width)[None] >= width - lengths[:, None]),
            f(B, K, slots, H), f(B, K, H, slots), jnp.asarray(np.arange(slots)[None] <= slot[:, None]),
            jnp.asarray(slot, jnp.int32))  # fmt: skip
    ref = jax.device_get(jax.jit(decode.write_attend)(*args))
    got = jax.device_get(jax.jit(pallas_attention.decode_layer)(*args))
    out = {"out_max_abs_diff": float(np.max(np.abs(np.float32(got[0]) - np.float32(ref[0])))),
           "caches_equal": bool(all(np.array_equal(g, r) for g, r in zip(got[1:], ref[1:])))}  # fmt: skip
    _log(f"check decode_layer kernel vs XLA: |dout| max {out['out_max_abs_diff']:.2e}, caches equal "
         f"{out['caches_equal']}")  # fmt: skip
    return out


def part_decode(args: argparse.Namespace, chip: aot.Chip) -> dict:
    mcfg = models.get_preset("qwen2.5-0.5b", dtype="bfloat16").replace(num_layers=LAYERS[0])
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), models.init_params(mcfg, jax.random.key(0)))
    rng = np.random.default_rng(0)
    P, G = args.decode_prompts, args.decode_group
    prompts = [list(rng.integers(3, mcfg.vocab_size, size=int(n))) for n in rng.integers(64, 129, size=P)]
    n1, n2 = args.decode_tokens
    times = {}
    for n in (n1, n2):
        kw = dict(num_samples=G, max_new_tokens=n, temperature=1.0, eos_token_ids=())
        jax.block_until_ready(sampling.generate(mcfg, params, prompts, key=jax.random.key(0), **kw))  # compile
        ts_ = []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(sampling.generate(mcfg, params, prompts, key=jax.random.key(i + 1), **kw))
            ts_.append(time.perf_counter() - t0)
        times[n] = statistics.median(ts_)
        _log(f"decode {P}x{G} rows, {n} new tokens: {times[n]:.3f} s ({P * G * n / times[n]:.0f} tokens/s)")
    step_s = (times[n2] - times[n1]) / (n2 - n1)
    width = padding.prompt_bucket(max(len(p) for p in prompts))
    mean_slots = P * width + P * G * (n1 + n2) / 2  # KV slots attended at the average decode step of the span
    kv_bytes = 2 * mcfg.num_layers * mean_slots * mcfg.num_kv_heads * mcfg.head_dim * 2
    weight_bytes = models.count_params(mcfg) * 2
    roofline_s = (weight_bytes + kv_bytes) / chip.hbm_bandwidth
    check = _check_decode_layer(mcfg, P, G, width, 32 * -(-n2 // 32)) if jax.default_backend() == "gpu" else None
    out = {"layer_check": check, "rows": P * G, "prompt_width": width, "new_tokens": [n1, n2],
           "median_s": {str(k): v for k, v in times.items()},
           "decode_step_s": step_s, "decode_tokens_per_s": P * G / step_s, "weight_bytes": weight_bytes,
           "kv_bytes_mean": kv_bytes, "roofline_step_s": roofline_s, "roofline_fraction": roofline_s / step_s,
           "end_to_end_tokens_per_s": P * G * n2 / times[n2]}  # fmt: skip
    if "profile" in args.parts:  # the longer run once more, under the profiler: device time per token step
        kw = dict(num_samples=G, max_new_tokens=n2, temperature=1.0, eos_token_ids=())  # (its prefill's included)
        run = lambda: sampling.generate(mcfg, params, prompts, key=jax.random.key(1), **kw)  # noqa: E731
        out["profile"] = _profiled(run, args, "decode", steps=n2)
    return out


def _profiled(fn, args: argparse.Namespace, name: str, steps: int, top: int = 60) -> dict:
    """`kernel_profile.profile` of one ``fn()`` (a trace under ``<out>.trace/<name>``), printed per step, its
    ``top`` heaviest kernels kept."""
    from kernel_profile import format_profile, profile

    rep = profile(fn, pathlib.Path(args.out).with_suffix(".trace") / name)
    _log(f"profile of {name}:\n" + "\n".join(format_profile(rep, steps)))
    return dict(rep, kernels=dict(list(rep["kernels"].items())[:top]), steps=steps)


def _set_head_blocks(path: pathlib.Path) -> dict:
    """Set `fused_head.DEFAULT_BLOCKS` to the fused tiling of ``path`` (`benchmarks/head_tiles.py`'s JSON) with the
    least forward + backward time; the default stays where the file is missing or holds no fused tiling."""
    rows = json.loads(path.read_text())["results"] if path.exists() else {}
    timed = [r for r in rows.values() if r.get("blocks")]
    if not timed:
        _log(f"--head-tiles: no fused tiling in {path}; the head keeps {fused_head.DEFAULT_BLOCKS}")
        return fused_head.DEFAULT_BLOCKS._asdict()
    best = min(timed, key=lambda r: r["forward_backward_s"])
    fused_head.DEFAULT_BLOCKS = fused_head.Blocks(**best["blocks"])
    _log(f"--head-tiles: the fused head uses {fused_head.DEFAULT_BLOCKS} ({best['forward_backward_s'] * 1e3:.2f} ms "
         f"forward + backward in {path.name})")
    return best["blocks"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", default=["check", "train", "decode"],
                    choices=["check", "train", "decode", "profile"])  # fmt: skip
    ap.add_argument("--attention", nargs="+", default=["cudnn", "chunked"])
    ap.add_argument("--remat", nargs="+", default=["projections"])
    ap.add_argument("--lm-head", nargs="+", default=["auto"], choices=["auto", "xla", "fused"])
    ap.add_argument("--before", action="store_true",
                    help="train: also run the first configuration with XLA's dot merger on and the layers in a scan")
    ap.add_argument("--head-tiles", default="", help="train: a benchmarks/head_tiles.py JSON; the fused head uses its "
                    "fastest tiling (forward + backward) in place of fused_head.DEFAULT_BLOCKS")
    ap.add_argument("--prompt-len", type=int, default=384)
    ap.add_argument("--completion-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-prompts", type=int, default=32)
    ap.add_argument("--decode-group", type=int, default=8)
    ap.add_argument("--decode-tokens", type=int, nargs=2, default=[128, 384])
    ap.add_argument("--layers", type=int, default=24, help="model depth (24 = Qwen2.5-0.5B)")
    ap.add_argument("--prompts", type=int, default=0, help="P of the train step (0 = the config's)")
    ap.add_argument("--chip", default="h100", choices=sorted(aot.CHIPS))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu.json"))
    args = ap.parse_args()
    LAYERS[0] = args.layers
    if "profile" in args.parts:  # keep the CUDA graphs the unprofiled program runs (`kernel_profile`); jax has not
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")  # started its backend yet
                                   + " --xla_enable_command_buffers_during_profiling=true").strip()
    cfg = config_lib.load_config(str(CONFIG), [f"rollout.prompts_per_step={args.prompts}"] if args.prompts else [])
    chip = aot.CHIPS[args.chip]
    res = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "chip_figures": args.chip,
           "command": "python benchmarks/gpu.py " + " ".join(sys.argv[1:]),
           "train_shape": {"P": cfg.rollout.prompts_per_step, "G": cfg.rollout.group_size,
                           "prompt_len": args.prompt_len, "completion_len": args.completion_len,
                           "grad_accum": cfg.algo.grad_accum_steps}}  # fmt: skip
    if "check" in args.parts:
        res["check"] = part_check()
    if args.head_tiles:
        res["head_blocks"] = _set_head_blocks(pathlib.Path(args.head_tiles))
    if "train" in args.parts:
        res["train"] = part_train(cfg, args, chip)
    if "decode" in args.parts:
        res["decode"] = part_decode(args, chip)
        d = res["decode"]
        _log(f"decode step {d['decode_step_s'] * 1e3:.2f} ms = {d['decode_tokens_per_s']:.0f} tokens/s; roofline "
             f"{d['roofline_step_s'] * 1e3:.2f} ms ({d['roofline_fraction']:.2f} of it)")
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(res, indent=1))
    _log(f"written to {args.out}")


if __name__ == "__main__":
    main()
