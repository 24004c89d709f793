# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tool use of an untrained policy: SmolLM2-135M-Instruct on the words task with the calculator tool (CPU).

Runs `jaxgrpo.rollout.multiturn.rollout` (the simple turn loop over `sampling.generate`) on held-out prompts and
prints the tool-call rate, tool-error rate, turns, action-token share and accuracy (`gsm8k_lenient`: the last number
of the final answer), with and without the tool. No training: the starting point a tool-use run would improve on.

    python benchmarks/multiturn_tool_rate.py --level 4 --prompts 8 --group 4 [--system-prompt TEXT]
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from jaxgrpo import build, data, models, rewards
from jaxgrpo.config import load_config
from jaxgrpo.config_sections import DataConfig
from jaxgrpo.rollout import history, multiturn
from jaxgrpo.rollout.env import Toolbox
from jaxgrpo.rollout.tools import ToolRunner, calculator


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--level", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--system-prompt", default=None,
                    help="the system turn before the tools' description (default: configs/smollm2_tools.yaml's)")
    args = ap.parse_args()
    if args.system_prompt is None:
        args.system_prompt = load_config("smollm2_tools", []).data.system_prompt
    path = build.resolve_model_path("smollm2")
    tok = build.load_tokenizer(path)
    config, params = models.load_pretrained(path)
    examples = data.load_dataset(DataConfig(source="words", difficulty=args.level, split="test",
                                            num_examples=args.prompts, shuffle=False), args.seed)  # fmt: skip
    _, score = rewards.resolve("gsm8k_lenient")
    eos = list(build.eos_ids(config, tok))
    for tools in ([calculator], []):
        settings = multiturn.TurnSettings(max_turns=args.max_turns if tools else 1, max_new_tokens=args.max_new_tokens)
        box = Toolbox(None, tools) if tools else None  # None: one answer turn, no tools described
        out = multiturn.rollout(config, params, tok, box, ToolRunner(workers=4, timeout=5.0), examples,
                                group_size=args.group, settings=settings, eos_token_ids=eos,
                                key=jax.random.key(args.seed), system_prompt=args.system_prompt)  # fmt: skip
        exs = [ex for ex in examples for _ in range(args.group)]
        acc = float(np.mean([score(a, ex) or 0.0 for a, ex in zip(out.answers, exs)]))
        m = history.metrics(out.histories)
        called = float(np.mean([h.tool_calls > 0 for h in out.histories]))
        print(json.dumps({"tools": [t.__name__ for t in tools], "level": args.level, "trajectories": len(exs),
                          "system_prompt": args.system_prompt,
                          "accuracy": acc, "called_tool_frac": called, **m}))  # fmt: skip
        print(json.dumps(out.messages[0][-3:])[:600])


if __name__ == "__main__":
    main()
