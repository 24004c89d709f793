# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""What the trainer evaluates while it trains: the held-out ``train.eval_every`` evaluation and the ``train.retain``
sets (`jaxgrpo.retain`), each through `jaxgrpo.eval.evaluate` with the rollout's sampler settings."""

from __future__ import annotations

from typing import Any

import jax

from jaxgrpo import data as data_lib
from jaxgrpo import eval as eval_lib
from jaxgrpo import models


def eval_sets(tr: Any) -> list[tuple[str, list[data_lib.Example], data_lib.DataConfig]]:
    """``(name, examples, data config)`` of what the trainer evaluates, in the order a step evaluates them: the
    held-out set (``train.eval_every``) first, then each ``train.retain`` set (the background precompiler compiles
    their sampling programs: `jaxgrpo.precompile.eval_jobs`)."""
    out = []
    if tr.cfg.train.eval_every:
        out.append(("held-out", held_out_examples(tr), tr.cfg.data))
    if tr.cfg.train.retain_every:
        out += [(f"retain {rs.name}", retain_examples(tr, rs), rs.data) for rs in tr.retain_sets]
    return out


def held_out_examples(tr: Any) -> list[data_lib.Example]:
    """The ``train.eval_examples`` held-out prompts (the split `jaxgrpo.data.held_out_split` names: "test", or
    "pair-test" for a words run on "pair-train"), read once."""
    if tr.eval_examples is None:
        data_cfg = data_lib.held_out_config(tr.cfg.data, tr.cfg.train.eval_examples)
        tr.eval_examples = data_lib.load_dataset(data_cfg, tr.cfg.seed)
    return tr.eval_examples


def retain_examples(tr: Any, rs: Any) -> list[data_lib.Example]:
    """The prompts of the `train.retain` set ``rs`` (a `jaxgrpo.retain.RetainSet`), read once."""
    if rs.name not in tr.retain_examples:
        tr.retain_examples[rs.name] = data_lib.load_dataset(rs.data, tr.cfg.seed)
    return tr.retain_examples[rs.name]


def evaluate_held_out(tr: Any, step: int) -> dict[str, float]:
    """The trainer's ``train.eval_every`` evaluation (``tr`` a `jaxgrpo.trainer.Trainer`): pass@1 / pass@G and
    measured vs i.i.d. degeneracy at G on `train.eval_examples` held-out prompts (`held_out_examples`), sampled
    like the rollouts (a multi-turn run's through its turns, `jaxgrpo.multiturn_eval.evaluate`: ``eval/multiturn/*``
    adds their turns and tool calls); written to <run_dir>/eval/step<N>/ too."""
    r = tr.cfg.rollout
    key = jax.random.fold_in(jax.random.fold_in(tr.key, step), 1)
    ks = sorted({*eval_lib.default_ks(r.group_size), r.group_size})  # pass@G too where G is not a power of 2
    if tr.multiturn is not None:
        from jaxgrpo import multiturn_eval  # (it imports jaxgrpo.eval)

        params, mesh, exchange = tr.state.params, tr.mesh, None
        if jax.process_count() > 1:  # each host its block, on its own rollout devices (`multiturn_eval.evaluate`)
            params = tr.place_rollout(models.compute_params(tr.model_config, params), tr.model_config)
            mesh, exchange = tr.rollout_mesh, _exchange
        result = multiturn_eval.evaluate(
            tr.cfg, tr.model_config, params, tr.tokenizer, held_out_examples(tr),
            eval_lib.correctness_reward(tr.cfg, None), num_samples=r.group_size, group_sizes=[r.group_size], key=key,
            summarize=eval_lib.summarize, ks=ks, attention=tr.prefill_attention, mesh=mesh,
            exchange=exchange)  # fmt: skip
        return _report(tr, step, result) | {f"eval/multiturn/{k.split('/', 1)[-1]}": v
                                            for k, v in result["multiturn"].items()}  # fmt: skip
    result = eval_lib.evaluate(
        tr.model_config, tr.state.params, tr.tokenizer, held_out_examples(tr),
        eval_lib.correctness_reward(tr.cfg, None), num_samples=r.group_size, group_sizes=[r.group_size], ks=ks,
        key=key, max_new_tokens=r.max_new_tokens,
        temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, eos_token_ids=tr.eos_token_ids,
        data_config=tr.cfg.data, mesh=tr.mesh, attention=tr.prefill_attention, exchange=_shared())
    return _report(tr, step, result)


def _exchange(payload: bytes) -> list[bytes]:
    """Every host's share of an evaluation (`jaxgrpo.host.exchange`), under the run's sequence of "eval" names (the
    rollout thread's swaps keep theirs; every host evaluates at the same steps, in the main thread). The previous
    evaluation's keys are deleted once this one's returns: every host had read them before it sent this one."""
    from jaxgrpo import async_rollout, host

    i = async_rollout.next_exchange("eval")
    parts = host.exchange(async_rollout.exchange_name("eval", i), payload)
    if i:
        host.delete_exchanged(async_rollout.exchange_name("eval", i - 1))
    return parts


def _shared() -> Any:
    """`_exchange` on several processes (each host scores its block of an evaluation's rows: `jaxgrpo.eval.score_rows`),
    else None."""
    return _exchange if jax.process_count() > 1 else None


def _report(tr: Any, step: int, result: dict[str, Any]) -> dict[str, float]:
    """The evaluation's report written to <run_dir>/eval/step<N>/ and its ``eval/*`` metrics."""
    if jax.process_index() == 0:  # every host holds the whole result; one writes it
        eval_lib.write_report(result, tr.run_dir / "eval" / f"step{step}")
    (deg,) = result["degeneracy"]
    out = {f"eval/pass@{k}": v for k, v in result["pass@k"].items()}
    out.update({"eval/mean_reward": result["mean_reward"], "eval/degeneracy_measured": deg["measured"],
                "eval/degeneracy_iid": deg["iid"]})
    return out


def retain_accuracy(tr: Any, step: int) -> dict[str, float]:
    """The trainer's ``train.retain`` figures (``tr`` a `jaxgrpo.trainer.Trainer`): ``retain/<name>/accuracy`` (mean
    success rate) of the policy on each `train.retain` set, G samples per prompt sampled like the rollouts."""
    r, out = tr.cfg.rollout, {}
    for i, rs in enumerate(tr.retain_sets):
        result = eval_lib.evaluate(
            tr.model_config, tr.state.params, tr.tokenizer, retain_examples(tr, rs), rs.reward,
            num_samples=r.group_size, group_sizes=[], key=jax.random.fold_in(jax.random.fold_in(tr.key, step),
                                                                               2 + i),
            max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
            eos_token_ids=tr.eos_token_ids, data_config=rs.data, mesh=tr.mesh,
            attention=tr.prefill_attention, exchange=_shared())  # fmt: skip
        out[f"retain/{rs.name}/accuracy"] = result["mean_success_rate"]
    return out
