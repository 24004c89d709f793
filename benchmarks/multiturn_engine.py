# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Multi-turn rollouts: the simple loop (`jaxgrpo.rollout.multiturn.rollout`, one `sampling.generate` call per turn)
vs the multi-turn engine (`jaxgrpo.rollout.turn_driver`, per-row caches), side by side in one run.

A random-init model at a preset's shape (``--preset``, default SmolLM2-135M's) over a character-level fake tokenizer
of the preset's vocabulary: ids 3.. are characters (the chat template's text), the top ``--call-frac`` of the ids
decode to a tool call ``calc(x)`` (``x`` = id mod 16) and ``--eos-frac`` of the ids below them are EOS ids. A
random model's next-token distribution is close to uniform, so at temperature 1 a policy turn ends at each step with
probability about ``eos_frac`` and contains a call with probability about ``1 - (1 - call_frac)^length``: turns of
geometric length, trajectories of 1 to ``--max-turns`` turns. The tool sleeps ``x / 15 * --tool-ms`` ms.

Both schedulers run the same prompts and settings (different samples: the loop draws per-turn keys, the engine
per-row keys; the same distribution). Each runs once untimed with the key of the timed rounds (so every program
either needs, one per batch size and context width the loop meets, is compiled before the timing), then the two are
timed alternately ``--rounds`` times, redrawing the same trajectories. Reported per scheduler:
wall seconds, policy tokens, policy tokens/s (best and median round), turns and tool calls per trajectory; for the
engine its `turn_driver.TurnStats` metrics. Writes ``benchmarks/results/multiturn_engine_<device>.json`` (or
``--out``).

Run: ``nice -n 15 python benchmarks/multiturn_engine.py --preset tiny ...`` on a CPU; on a GPU as it is.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from jaxgrpo import models  # noqa: E402
from jaxgrpo.rollout import multiturn as MT  # noqa: E402
from jaxgrpo.rollout import turn_driver  # noqa: E402
from jaxgrpo.rollout.env import Toolbox  # noqa: E402
from jaxgrpo.rollout.tools import ToolRunner  # noqa: E402

CHARS = " \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789{}\":,<>/_|.=+-*()?!'~"
TOOL_MS = 200.0


class FakeTokenizer:
    """Characters one id each, ``<|im_start|>`` 1, ``<|im_end|>`` 2, the top ids tool calls (module docstring)."""

    chat_template = "fake <|im_start|>"
    specials = {"<|im_start|>": 1, "<|im_end|>": 2}

    def __init__(self, vocab: int, call_frac: float):
        self.first_call = vocab - max(1, int(vocab * call_frac))
        self.vocab = vocab

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False, **kw):
        out = "<|im_start|>system\nT<|im_end|>\n" if tools else ""
        out += "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            sp = next((s for s in self.specials if text.startswith(s, i)), None)
            ids.append(self.specials[sp] if sp else 3 + CHARS.find(text[i]) % len(CHARS))
            i += len(sp) if sp else 1
        return {"input_ids": ids}

    def piece(self, i: int) -> str:
        if i >= self.first_call:
            return f'<tool_call>{{"name": "calc", "arguments": {{"x": {i % 16}}}}}</tool_call>'
        return ["", "<|im_start|>", "<|im_end|>"][i] if i < 3 else CHARS[(i - 3) % len(CHARS)]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.piece(int(i)) for i in ids if not (skip_special_tokens and int(i) < 3))


class SleepEnv:
    def reset(self, **kwargs):
        return None

    def calc(self, x: int) -> str:
        """Squares a number, slowly.

        Args:
            x: the number
        """
        time.sleep(x / 15 * TOOL_MS / 1000)
        return str(x * x)


def one(engine: bool, cfg, params, tok, examples, settings, eos, seed: int, group_size: int, block: int):
    runner = ToolRunner(workers=16, timeout=10.0)
    kw = dict(group_size=group_size, settings=settings, eos_token_ids=eos, key=jax.random.key(seed))
    t0 = time.perf_counter()
    try:
        if engine:
            out, stats = turn_driver.rollout(cfg, params, tok, Toolbox(SleepEnv), runner, examples, block=block, **kw)
        else:
            out, stats = MT.rollout(cfg, params, tok, Toolbox(SleepEnv), runner, examples, **kw), None
    finally:
        runner.close()
    wall = time.perf_counter() - t0
    hs = out.histories
    policy = sum(sum(h.action) for h in hs)
    res = {"wall_s": wall, "policy_tokens": policy, "tokens_per_s": policy / wall,
           "turns": float(np.mean([h.turns for h in hs])), "tool_calls": float(np.mean([h.tool_calls for h in hs])),
           "context_tokens": sum(len(h.tokens) - sum(h.action) for h in hs)}  # fmt: skip
    if stats is not None:
        res.update(stats.metrics())
    return res


def main() -> None:
    global TOOL_MS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="smollm2-135m", help="a models.presets name, or tiny")
    ap.add_argument("--dtype", default=None, help="compute dtype (default: bfloat16 on a GPU, float32 on a CPU)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--call-frac", type=float, default=0.01)
    ap.add_argument("--eos-frac", type=float, default=1 / 64)
    ap.add_argument("--tool-ms", type=float, default=TOOL_MS)
    ap.add_argument("--block", type=int, default=turn_driver.DEFAULT_BLOCK)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    TOOL_MS = a.tool_ms
    platform = jax.devices()[0].platform
    dtype = a.dtype or ("bfloat16" if platform == "gpu" else "float32")
    if a.preset == "tiny":  # a smoke-test size for a CPU
        cfg = models.ModelConfig(vocab_size=4096, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                                 num_kv_heads=2, max_position_embeddings=2048, dtype=dtype)  # fmt: skip
    else:
        cfg = models.get_preset(a.preset, dtype=dtype)
    params = models.compute_params(cfg, models.init_params(cfg, jax.random.key(0)))
    tok = FakeTokenizer(cfg.vocab_size, a.call_frac)
    n_eos = max(1, int(cfg.vocab_size * a.eos_frac))
    eos = tuple(range(tok.first_call - n_eos, tok.first_call)) + (2,)
    examples = [{"prompt": f"question {i}: what is {i} squared?"} for i in range(a.prompts)]
    settings = MT.TurnSettings(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, temperature=1.0)
    args = (cfg, params, tok, examples, settings, eos)
    result = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "args": vars(a), "rounds": []}
    for engine in (False, True):  # warm-up: compiles every program the timed rounds run (same key, same shapes)
        one(engine, *args, seed=1, group_size=a.samples, block=a.block)
    for _ in range(a.rounds):
        row = {name: one(engine, *args, seed=1, group_size=a.samples, block=a.block)
               for name, engine in (("loop", False), ("engine", True))}  # fmt: skip
        result["rounds"].append(row)
        print(json.dumps(row), flush=True)
    for name in ("loop", "engine"):
        tps = [row[name]["tokens_per_s"] for row in result["rounds"]]
        result[name] = {"best_tokens_per_s": max(tps), "median_tokens_per_s": float(np.median(tps))}
    result["speedup_median"] = result["engine"]["median_tokens_per_s"] / result["loop"]["median_tokens_per_s"]
    print(json.dumps({k: result[k] for k in ("device", "loop", "engine", "speedup_median")}))
    out = pathlib.Path(a.out or REPO / "benchmarks" / "results" / f"multiturn_engine_{platform}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
