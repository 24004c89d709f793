# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Train-step throughput: ``jaxgrpo.learner.train_step`` vs the same model, loss and optimizer in PyTorch, in one run.

Workload: a Llama-architecture model with the SmolLM2-135M config (``jaxgrpo.models.presets``: vocab 49152, hidden
576, MLP 1536, 9 heads / 3 kv heads, tied embeddings; ``--layers`` overrides the depth, default all 30) and random
weights (``models.init_params``), written once with ``models.save_pretrained`` and loaded by transformers'
``LlamaForCausalLM`` so both sides hold *the same weights*. One rollout of ``--prompts`` × ``--group`` rows, prompts
left-padded to ``--prompt-len``, completions right-padded to ``--completion-len`` (random lengths), binary rewards.

One step = forward + backward + optimizer update, on both sides:

- jaxgrpo: ``make_train_step`` (GRPO advantages in-step, clipped token-mean loss, global-norm clip 1.0, AdamW), jitted,
  state donated; completion log-probs via the chunked LM head (no prompt positions).
- PyTorch: ``LlamaForCausalLM(input_ids, attention_mask, position_ids, logits_to_keep=Tc+1)`` (transformers also
  skips the prompt positions' LM head), ``log_softmax`` in float32, the same GRPO advantages and clipped token-mean
  loss written in torch, ``clip_grad_norm_(1.0)``, ``torch.optim.AdamW``.

Before timing, the first-step losses of both sides are compared (same weights, same batch: they must agree to
~1e-4), so the two sides provably compute the same thing. Warm-up (jit compilation, torch allocator) is excluded:
each side runs ``--warmup`` steps, then ``--repeats`` timed steps interleaved (jax, torch, jax, torch, ...) so that
both see the same machine load; reported is the median.

    tokens/s = B * (Tp + Tc) / median_step_seconds       (all row tokens through forward + backward)

Run: ``python benchmarks/train_step.py`` (prints a table and one JSON line with the conditions: CPU count, load
average before/after, thread counts, versions). Timings on a shared CPU are noisy; compare within one run only.

Recorded run (2026-11-21, dev machine: 2 vCPUs shared with ~5 other workers' test runs, load average 5.3 → 4.5
during the run; jax 0.10.2 CPU, 1 device; torch 2.13 CPU, 2 threads; transformers 5.23; full 30-layer SmolLM2-135M
config, float32, B=8 × T=96): jaxgrpo 12.8 s/step = 60.0 tokens/s (steps 24.6, 11.4, 12.8 s), torch 36.9 s/step =
20.8 tokens/s (37.3, 36.9, 34.7 s): 2.9× in jaxgrpo's favour; jit compilation 60 s (excluded); torch's completion
log-probs matched jaxgrpo's to a mean |Δ| of 7.5e-7. With 2 layers (LM-head bound, vocab 49152): 200 vs 132
tokens/s. The heavy, varying load makes single steps swing by 2×; rerun on an idle machine before quoting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import models
from jaxgrpo.config import AlgoConfig, OptimConfig
from jaxgrpo.learner import train_step as ts
from jaxgrpo.models.presets import get_preset

CLIP_LOW, CLIP_HIGH, LR, MAX_NORM, EPS_ADV = 0.2, 0.28, 1e-6, 1.0, 1e-6


def random_rollout(P: int, G: int, Tp: int, Tc: int, vocab: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A rollout of random tokens: prompts left-padded to ``Tp`` and completions right-padded to ``Tc`` (lengths
    uniform from half to full), binary rewards, every sample valid (the fields of
    `jaxgrpo.learner.train_step.Batch`)."""
    B = P * G
    plen = rng.integers(Tp // 2, Tp + 1, size=P).repeat(G)
    clen = rng.integers(Tc // 2, Tc + 1, size=B)
    prompt_mask = np.arange(Tp)[None] >= (Tp - plen)[:, None]
    completion_mask = np.arange(Tc)[None] < clen[:, None]
    prompts = rng.integers(3, vocab, size=(P, Tp)).repeat(G, axis=0)
    completions = rng.integers(3, vocab, size=(B, Tc))
    tokens = np.concatenate([np.where(prompt_mask, prompts, 0), np.where(completion_mask, completions, 0)], 1)
    rewards = rng.integers(0, 2, size=(P, G)).astype(np.float32)
    return dict(tokens=tokens.astype(np.int32), prompt_mask=prompt_mask, completion_mask=completion_mask,
                rewards=rewards, valid=np.ones((P, G), bool))  # fmt: skip


def make_batch(args: argparse.Namespace, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    raw = random_rollout(args.prompts, args.group, args.prompt_len, args.completion_len, vocab,
                         np.random.default_rng(seed))  # fmt: skip
    raw["rewards"][0] = [1.0] + [0.0] * (args.group - 1)  # at least one informative group
    return raw


def torch_side(hf_dir: str, raw: dict, old_logprobs: np.ndarray, args: argparse.Namespace):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    Tp, Tc = args.prompt_len, args.completion_len
    attn = torch.from_numpy(np.concatenate([raw["prompt_mask"], raw["completion_mask"]], 1).astype(np.int64))
    ids = torch.from_numpy(raw["tokens"].astype(np.int64))
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    targets = ids[:, Tp:]
    mask = torch.from_numpy(raw["completion_mask"]).float()
    old = torch.from_numpy(old_logprobs)
    rewards = torch.from_numpy(raw["rewards"])

    def step() -> tuple[float, float]:
        # GRPO advantages (group mean / std with ddof=1, degenerate groups -> 0), as jaxgrpo.advantages.grpo
        mean = rewards.mean(-1, keepdim=True)
        std = rewards.std(-1, keepdim=True, unbiased=True)
        deg = (rewards.amax(-1, keepdim=True) - rewards.amin(-1, keepdim=True)) <= 1e-6
        adv = torch.where(deg, torch.zeros_like(rewards), (rewards - mean) / (std + EPS_ADV)).reshape(-1, 1)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=Tc + 1).logits
        logp = torch.log_softmax(logits[:, :-1].float() / args.temperature, -1)
        logp = logp.gather(-1, targets[..., None])[..., 0]
        ratio = torch.exp(torch.clamp(logp - old, -20, 20))
        per_tok = torch.maximum(-ratio * adv, -torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH) * adv)
        loss = (per_tok * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        with torch.no_grad():  # torch's log-probs vs jaxgrpo's (the old_logprobs): same weights, same numbers
            diff = float(((logp - old).abs() * mask).sum() / mask.sum())
        return float(loss.detach()), diff

    return step, torch.get_num_threads()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=30, help="depth (SmolLM2-135M has 30)")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-torch", action="store_true")
    args = ap.parse_args()
    if args.repeats < 3:
        raise SystemExit("--repeats must be >= 3 (the median of at least three timed steps is reported)")

    load_before = os.getloadavg()
    config = get_preset("smollm2-135m").replace(num_layers=args.layers)
    params = models.init_params(config, jax.random.key(0))
    raw = make_batch(args, config.vocab_size)
    B, T = raw["tokens"].shape
    batch0 = ts.Batch(**raw, old_logprobs=np.zeros(raw["completion_mask"].shape, np.float32))
    logp, _ = jax.jit(lambda p, b: ts.compute_logprobs(config, p, b, args.temperature))(params, batch0)
    old = np.where(raw["completion_mask"], np.asarray(logp), 0.0).astype(np.float32)  # "sampler" = current policy
    batch = ts.Batch(**raw, old_logprobs=old)

    hf_dir = tempfile.mkdtemp(prefix="jaxgrpo_bench_")
    models.save_pretrained(config, params, hf_dir)
    algo = AlgoConfig(clip_low=CLIP_LOW, clip_high=CLIP_HIGH)
    optim = OptimConfig(learning_rate=LR, max_grad_norm=MAX_NORM)
    init_fn, step_fn = ts.make_train_step(config, algo, optim, temperature=args.temperature, total_steps=1000)
    state = {"s": init_fn(params, jax.random.key(1))}
    del params

    def jax_step() -> float:
        state["s"], m = step_fn(state["s"], batch)
        return float(jax.block_until_ready(m["loss"]))

    t0 = time.perf_counter()
    jax_loss0 = jax_step()  # includes compilation
    compile_s = time.perf_counter() - t0
    for _ in range(args.warmup):
        jax_step()

    sides = {"jaxgrpo": jax_step}
    threads = None
    if not args.skip_torch:
        torch_step, threads = torch_side(hf_dir, raw, old, args)
        torch_loss0, logp_diff = torch_step()
        # Same weights, same batch: torch's completion log-probs equal jaxgrpo's, and so do the first-step losses.
        if logp_diff > 1e-3 or not np.isclose(torch_loss0, jax_loss0, rtol=1e-3, atol=1e-5):
            raise SystemExit(f"sides disagree: loss jax {jax_loss0} vs torch {torch_loss0}, mean |dlogp| {logp_diff}")
        for _ in range(args.warmup - 1):
            torch_step()
        sides["torch"] = torch_step

    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)

    rows = []
    for name, ts_ in times.items():
        med = statistics.median(ts_)
        rows.append(dict(side=name, median_s=med, tokens_per_s=B * T / med, times_s=[round(x, 3) for x in ts_]))
    print(f"model: SmolLM2-135M config, {args.layers} layers, random weights, float32; batch B={B} x T={T} "
          f"(Tp={args.prompt_len}, Tc={args.completion_len})")  # fmt: skip
    print(f"{'side':10s} {'median s/step':>14s} {'tokens/s':>10s}  steps (s)")
    for r in rows:
        print(f"{r['side']:10s} {r['median_s']:14.3f} {r['tokens_per_s']:10.1f}  {r['times_s']}")
    if len(rows) == 2:
        print(f"jaxgrpo / torch throughput: {rows[0]['tokens_per_s'] / rows[1]['tokens_per_s']:.2f}x")
    cond = dict(
        cpu_count=os.cpu_count(), load_before=[round(x, 2) for x in load_before],
        load_after=[round(x, 2) for x in os.getloadavg()], torch_threads=threads, jax=jax.__version__,
        backend=jax.default_backend(), devices=len(jax.devices()), xla_flags=os.environ.get("XLA_FLAGS", ""),
        platform=platform.platform(), jax_compile_s=round(compile_s, 1), first_step_loss=jax_loss0,
        torch_vs_jax_logp_mean_abs_diff=None if args.skip_torch else logp_diff,
    )  # fmt: skip
    print(json.dumps(dict(results=rows, layers=args.layers, B=B, T=T, conditions=cond)))


if __name__ == "__main__":
    jnp.zeros(())  # initialise the backend before timing anything
    main()
