# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Multi-turn runs on two JAX processes (`multiturn_step.sample_across_processes`, two CPU processes of 4 fake
devices each, `multihost.run_two_processes`): each host runs its block of every step's prompts, their turns, tools
and rewards, on rollout devices of its own, and the hosts swap the scored trajectories; the learner's mesh spans the
other devices of both hosts. Against one process (the tiny random model on SmolLM2's tokenizer with the calculator
environment, `test_multiturn_train.small`):

* the multi-turn engine on one rollout device per host (``mesh.rollout=2``), synchronous, with the in-training
  evaluation after step 2 (each host its block of the held-out prompts): the one-process run step for step, its
  ``eval/*`` figures included (the rows of each host's block draw with their ids in the whole step or evaluation,
  ``row_offset``);
* the simple loop on two rollout devices per host (``mesh.rollout=4``), one step off policy, with a scripted policy
  that calls the calculator once per trajectory and then answers, and the evaluation after step 2: the one-process
  run step for step, and each host ran the tool calls of its own half of the trajectories and of its block of the
  evaluation only (no call runs twice).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_multiturn_train import ENGINE, calculating_policy, small

from jaxgrpo import metrics_log, multiturn_step, trainer

BASE = ["train.steps=2", "checkpoint.every=0"]


def fingerprinted(step_metrics):
    """`multiturn_step.step_metrics` plus ``test/tokens``, a fingerprint of every trajectory's tokens in order (the
    tiny random model's other metrics hardly depend on which tokens it drew)."""

    def metrics(scored, group_size):
        tokens = [t for h in scored.rollout.histories for t in h.tokens]
        return {**step_metrics(scored, group_size), "test/tokens": float(np.dot(np.arange(1, len(tokens) + 1) % 997,
                                                                                 tokens))}  # fmt: skip

    return metrics


ENGINE_ARGS = [ENGINE, "rollout.prompts_per_step=6", "train.eval_every=2", "train.eval_examples=5",
               "mesh.distributed=true"]  # 12 trajectories a step; 5 held-out prompts: 3 on host 0, 2 on host 1
LOOP_ARGS = ["rollout.prompts_per_step=4", "rollout.max_staleness=1", "train.eval_every=2",
             "train.eval_examples=5"]  # 8 trajectories a step; the evaluation's 10: 6 on host 0, 4 on host 1

BODY = r"""
import functools, pathlib
from jaxgrpo import multiturn_step, trainer
from jaxgrpo.build import load_tokenizer, resolve_model_path
from jaxgrpo.rollout import tools
from test_multiturn_train import calculating_policy, small
from test_multiturn_multihost import BASE, ENGINE_ARGS, LOOP_ARGS, fingerprinted
gguf, runs = resolve_model_path("smollm2"), pathlib.Path(out).parent
multiturn_step.step_metrics = fingerprinted(multiturn_step.step_metrics)
calls, real_run = [], tools.ToolRunner.run

def run(self, batch, toolsets):  # the tool calls this host runs
    calls.append(len(batch))
    return real_run(self, batch, toolsets)

tools.ToolRunner.run = run
# the learner on 3 + 3 devices, each host's block on its 4th device
trainer.run(small(gguf, *BASE, *ENGINE_ARGS, "mesh.fsdp=6", "mesh.rollout=2"), runs / "engine")
multiturn_step.MultiTurn.generate = staticmethod(calculating_policy(load_tokenizer(gguf), 0))
calls.clear()
# the learner on 2 + 2 devices, each host's block over its other 2
trainer.run(small(gguf, *BASE, *LOOP_ARGS, "mesh.fsdp=4", "mesh.rollout=4"), runs / "loop")
np.savez(runs / f"calls{pid}.npz", calls=np.asarray(calls))
np.savez(out, done=np.ones(1))  # (the helper reads process 0's)
"""


def assert_same_run(got: list[dict], want: list[dict]) -> None:
    """Step for step, the metrics that are a function of the config and seed (not timings, not the engine's
    schedule), to float32 rounding across meshes."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        for k, v in w.items():
            if k.startswith(("time/", "throughput/", "rollout/", "async/")) or k.endswith("_per_s"):
                continue
            np.testing.assert_allclose(g[k], v, rtol=1e-4, atol=1e-6, err_msg=f"step {w['step']}: {k}")


@pytest.mark.slow
def test_two_hosts_run_the_one_process_multiturn_run(smollm2_gguf, tmp_path, monkeypatch):
    from multihost import run_two_processes

    from jaxgrpo.build import load_tokenizer

    run_two_processes(BODY, tmp_path)
    monkeypatch.setattr(multiturn_step, "step_metrics", fingerprinted(multiturn_step.step_metrics))
    trainer.run(small(smollm2_gguf, *BASE, *ENGINE_ARGS[:-1]), tmp_path / "engine1")
    got, want = metrics_log.read_metrics(tmp_path / "engine"), metrics_log.read_metrics(tmp_path / "engine1")
    assert_same_run(got, want)
    assert "eval/mean_reward" in want[1] and "eval/multiturn/turns" in want[1], "step 2 evaluated"
    both, one = (json.loads((tmp_path / r / "eval" / "step2" / "eval.json").read_text()) for r in ("engine", "engine1"))
    assert both["num_prompts"] == one["num_prompts"] == 5 and both["success_counts"] == one["success_counts"]
    assert [x["conversation"] for x in both["samples"]] == [x["conversation"] for x in one["samples"]]
    assert got[0]["test/tokens"] != got[1]["test/tokens"]
    tok = load_tokenizer(str(smollm2_gguf))
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", staticmethod(calculating_policy(tok, 0)))
    trainer.run(small(smollm2_gguf, *BASE, *LOOP_ARGS, "mesh.rollout=1"), tmp_path / "loop1")
    got, want = metrics_log.read_metrics(tmp_path / "loop"), metrics_log.read_metrics(tmp_path / "loop1")
    assert_same_run(got, want)
    assert [r["async/policy_version"] for r in got] == [0.0, 0.0]  # step 1 sampled with version 0: one step off
    assert all(r["multiturn/tool_calls"] == 1.0 for r in got)  # one call per trajectory
    per_host = [int(np.load(tmp_path / f"calls{p}.npz")["calls"].sum()) for p in (0, 1)]
    assert want[1]["eval/pass@1"] == 1.0 and want[1]["eval/multiturn/tool_calls"] == 1.0  # the scripted policy's
    assert per_host == [8 + 6, 8 + 4], ("each host ran the calls of its own half of the 2 steps x 8 trajectories and "
                                        "of its block of the evaluation's 5 prompts x 2, once")
