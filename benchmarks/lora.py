# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""LoRA against full fine-tuning, side by side in one run: train-step time and memory, and the sampler with the
adapters merged into the weights against unmerged.

Workload: the SmolLM2-135M shape (``models.presets``: vocab 49152, hidden 576, MLP 1536, 9 / 3 heads, tied
embeddings; ``--layers`` overrides the depth) with random weights, float32 on the local backend. Variants of the train
step (``make_train_step``: GRPO, clipped token-mean loss, AdamW) on the same rollout of ``--prompts`` × ``--group``
rows: ``full`` (every weight trained), ``lora-r8`` and ``lora-r64`` (adapters on all seven projections, base frozen).

* memory: bytes of the train state (params + optimizer state, what a checkpoint and the device hold between steps)
  and XLA's compiled temporaries of the step (``compiled.memory_analysis().temp_size_in_bytes``);
* time: median seconds per step over ``--repeats`` steps, the variants interleaved (full, r8, r64, full, ...) so that
  each sees the same machine load; compilation excluded;
* sampler (rank 64): ``sampling.generate`` of ``--prompts`` × ``--group`` completions of ``--new-tokens`` tokens with
  the adapters merged into the weights (what `models.compute_params` gives in float32) vs applied unmerged in every
  projection, interleaved likewise.

Run: ``python benchmarks/lora.py`` (writes ``benchmarks/results/lora.json`` and prints a table). Timings on a shared
CPU are noisy; compare within one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import models, sampling
from jaxgrpo.config import AlgoConfig, OptimConfig
from jaxgrpo.learner import train_step as ts
from jaxgrpo.models import lora
from jaxgrpo.models.presets import get_preset

OUT = pathlib.Path(__file__).resolve().parent / "results" / "lora.json"


def rollout(P: int, G: int, Tp: int, Tc: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    B = P * G
    prompt_mask = np.arange(Tp)[None] >= (Tp - rng.integers(Tp // 2, Tp + 1, size=P).repeat(G))[:, None]
    completion_mask = np.arange(Tc)[None] < rng.integers(Tc // 2, Tc + 1, size=B)[:, None]
    tokens = np.concatenate([np.where(prompt_mask, rng.integers(3, vocab, (P, Tp)).repeat(G, 0), 0),
                             np.where(completion_mask, rng.integers(3, vocab, (B, Tc)), 0)], 1)  # fmt: skip
    rewards = rng.integers(0, 2, size=(P, G)).astype(np.float32)
    rewards[0] = [1.0] + [0.0] * (G - 1)
    return dict(tokens=tokens.astype(np.int32), prompt_mask=prompt_mask, completion_mask=completion_mask,
                rewards=rewards, valid=np.ones((P, G), bool),
                old_logprobs=np.where(completion_mask, -3.0, 0.0).astype(np.float32))  # fmt: skip


def nbytes(tree) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    load_before = os.getloadavg()
    base_cfg = get_preset("smollm2-135m").replace(num_layers=args.layers)
    base = models.init_params(base_cfg, jax.random.key(0))
    batch = ts.Batch(**rollout(args.prompts, args.group, args.prompt_len, args.completion_len, base_cfg.vocab_size))
    algo, optim = AlgoConfig(clip_high=0.28), OptimConfig(learning_rate=1e-5)

    variants: dict[str, dict] = {}
    for name, rank in (("full", 0), ("lora-r8", 8), ("lora-r64", 64)):
        cfg = base_cfg if rank == 0 else base_cfg.replace(lora=models.LoraSpec(rank=rank, alpha=2.0 * rank))
        fresh = jax.tree.map(jnp.copy, base)  # each state owns its arrays (the step donates them)
        params = fresh if rank == 0 else lora.add_adapters(cfg, fresh, jax.random.key(rank))
        init_fn, step_fn = ts.make_train_step(cfg, algo, optim, total_steps=1000)
        state = init_fn(params, jax.random.key(1))
        compiled = step_fn.lower(state, batch).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes
        t0 = time.perf_counter()
        state, _ = step_fn(state, batch)
        jax.block_until_ready(state)
        variants[name] = dict(cfg=cfg, step=step_fn, state=state, times=[], compile_s=time.perf_counter() - t0,
                              state_bytes=nbytes(state.params) + nbytes(state.opt_state), temp_bytes=int(temp),
                              trainable=int(sum(x.size for x in jax.tree.leaves(lora.trainable(state.params)))))
    for _ in range(args.repeats):
        for v in variants.values():
            t0 = time.perf_counter()
            v["state"], m = v["step"](v["state"], batch)
            jax.block_until_ready(m["loss"])
            v["times"].append(time.perf_counter() - t0)

    # the sampler: rank-64 adapters (B drawn non-zero, as after training) merged vs unmerged
    cfg = variants["lora-r64"]["cfg"]
    trained = lora.join(lora.split(variants["lora-r64"]["state"].params)[0],
                        jax.tree.map(lambda x: x + 0.01, lora.trainable(variants["lora-r64"]["state"].params)))
    prompts = [list(range(3, 3 + args.prompt_len // 2))] * args.prompts
    sampler = {"merged": models.compute_params(cfg, trained), "unmerged": trained}
    gen_times: dict[str, list[float]] = {k: [] for k in sampler}
    texts = {}
    for rep in range(args.repeats + 1):
        for k, p in sampler.items():
            t0 = time.perf_counter()
            comp = sampling.generate(cfg, p, prompts, num_samples=args.group, max_new_tokens=args.new_tokens,
                                     temperature=1.0, key=jax.random.key(7))  # fmt: skip
            jax.block_until_ready(comp.tokens)
            if rep:  # the first round compiles
                gen_times[k].append(time.perf_counter() - t0)
            texts[k] = np.asarray(comp.tokens)
    same_tokens = float(np.mean(texts["merged"] == texts["unmerged"]))

    result = {
        "workload": vars(args) | {"shape": "smollm2-135m", "dtype": "float32"},
        "train_step": {k: {"median_s": statistics.median(v["times"]), "times_s": v["times"],
                           "compile_s": v["compile_s"], "state_bytes": v["state_bytes"],
                           "temp_bytes": v["temp_bytes"], "trainable_params": v["trainable"]}
                       for k, v in variants.items()},  # fmt: skip
        "sampler_r64": {k: {"median_s": statistics.median(t), "times_s": t} for k, t in gen_times.items()}
        | {"same_tokens_frac": same_tokens},
        "conditions": {"backend": jax.default_backend(), "cpus": os.cpu_count(), "load_before": load_before,
                       "load_after": os.getloadavg(), "jax": jax.__version__, "python": platform.python_version()},
    }  # fmt: skip
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    full = result["train_step"]["full"]
    print(f"{'variant':<10} {'trainable':>12} {'state MiB':>10} {'temp MiB':>9} {'s/step':>8} {'vs full':>8}")
    for k, v in result["train_step"].items():
        print(f"{k:<10} {v['trainable_params']:>12,} {v['state_bytes'] / 2**20:>10.0f} {v['temp_bytes'] / 2**20:>9.0f} "
              f"{v['median_s']:>8.2f} {full['median_s'] / v['median_s']:>7.2f}x")
    s = result["sampler_r64"]
    print(f"sampler r64: merged {s['merged']['median_s']:.2f} s, unmerged {s['unmerged']['median_s']:.2f} s "
          f"(same tokens: {same_tokens:.3f}); load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
