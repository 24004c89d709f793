# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tool use of SmolLM2-135M-Instruct on the words task with the calculator, untrained or warm-started (CPU).

Runs `jaxgrpo.rollout.multiturn.rollout` (the simple turn loop over `sampling.generate`) on held-out prompts and
prints the tool-call rate, tool-error rate, turns, action-token share and accuracy (`gsm8k_lenient`: the last number
of the final answer), with the environment of ``configs/smollm2_tools.yaml`` (its calculator and system prompt) and
without tools. ``--warm-start``: first the config's supervised warm start (`jaxgrpo.warm_start`: its demonstrations
from the training split), as a training run would begin; ``KEY=VALUE`` arguments override the config.

    python benchmarks/multiturn_tool_rate.py --level 4 --prompts 8 --group 4 [--system-prompt TEXT]
    python benchmarks/multiturn_tool_rate.py --warm-start --no-plain [warm_start.steps=30 ...]
    python benchmarks/multiturn_tool_rate.py --no-plain --run-dir runs/tools [--checkpoint 20]
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from jaxgrpo import build, data, models, rewards, warm_start
from jaxgrpo import eval as eval_lib
from jaxgrpo.config import load_config
from jaxgrpo.config_sections import DataConfig
from jaxgrpo.rollout import history, multiturn
from jaxgrpo.rollout.env import Toolbox
from jaxgrpo.rollout.tools import ToolRunner


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
    ap.add_argument("--warm-start", action="store_true", help="the config's supervised warm start first")
    ap.add_argument("--no-plain", action="store_true", help="skip the run without tools")
    ap.add_argument("--run-dir", default=None, help="evaluate this training run's checkpoint instead")
    ap.add_argument("--checkpoint", type=int, default=None, help="--run-dir's step (default: the latest)")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of configs/smollm2_tools.yaml")
    args = ap.parse_args()
    cfg = load_config("smollm2_tools", args.overrides)
    if args.system_prompt is None:
        args.system_prompt = cfg.data.system_prompt
    path = build.resolve_model_path("smollm2")
    tok = build.load_tokenizer(path)
    config, params = models.load_pretrained(path)
    if args.run_dir is not None:  # the trained policy (its config is the run's own)
        params = eval_lib.load_policy_for_eval(load_config(f"{args.run_dir}/config.yaml", []), args.run_dir,
                                               args.checkpoint).params  # fmt: skip
    examples = data.load_dataset(DataConfig(source="words", difficulty=args.level, split="test",
                                            num_examples=args.prompts, shuffle=False), args.seed)  # fmt: skip
    _, score = rewards.resolve("gsm8k_lenient")
    eos = list(build.eos_ids(config, tok))
    box = Toolbox.from_config(cfg.data.environment, cfg.data.tools)
    log: list[dict] = []
    if args.warm_start:
        train = data.load_dataset(cfg.data, cfg.seed)
        convs = warm_start.load_conversations(cfg.warm_start, train)
        schemas = box.episodes(train[:1])[0].schemas
        hists = [warm_start.demonstration_history(tok, schemas, args.system_prompt, c, eos) for c in convs]
        params, log = warm_start.train(config, params, hists, cfg, say=print)
    for tools in [box] + ([] if args.no_plain else [None]):  # None: one answer turn, no tools described
        settings = multiturn.TurnSettings(max_turns=args.max_turns if tools else 1, max_new_tokens=args.max_new_tokens)
        out = multiturn.rollout(config, params, tok, tools, ToolRunner(workers=4, timeout=5.0), examples,
                                group_size=args.group, settings=settings, eos_token_ids=eos,
                                key=jax.random.key(args.seed), system_prompt=args.system_prompt)  # fmt: skip
        exs = [ex for ex in examples for _ in range(args.group)]
        correct = np.array([score(a, ex) or 0.0 for a, ex in zip(out.answers, exs)]).reshape(-1, args.group)
        acc = float(correct.mean())
        m = history.metrics(out.histories)
        called = float(np.mean([h.tool_calls > 0 for h in out.histories]))
        ws = cfg.warm_start
        print(json.dumps({"tools": ["calculator"] if tools else [], "level": args.level, "trajectories": len(exs),
                          "run_dir": args.run_dir, "checkpoint": args.checkpoint,
                          "system_prompt": args.system_prompt,
                          "warm_start": {"steps": ws.steps, "batch_size": ws.batch_size, "learning_rate":
                                         ws.learning_rate, "examples": ws.examples, "final_loss":
                                         log[-1]["warm_start/loss"]} if log else None,
                          "accuracy": acc, "called_tool_frac": called, **m,
                          "correct_per_prompt": correct.sum(1).tolist()}))  # fmt: skip
        print(json.dumps(out.messages[0][-3:])[:600])


if __name__ == "__main__":
    main()
