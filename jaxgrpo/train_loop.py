# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The training loop around a started `jaxgrpo.trainer.Trainer`: steps, metrics, retain curves, checkpoints on the
schedule and on preemption, the final exports (`jaxgrpo.trainer.run` calls `loop`)."""

from __future__ import annotations

import signal
from typing import Any

from jaxgrpo import checkpoint as ckpt_lib
from jaxgrpo import export, metrics_log, rewards


def loop(trainer: Any, logger: metrics_log.MetricsLogger, stop: ckpt_lib.PreemptionFlag
         ) -> list[dict[str, float]]:
    """Steps ``trainer`` (a `jaxgrpo.trainer.Trainer`, which imports this module) until its run is finished
    (`train.steps`, or `train.max_sampled_tokens`) or ``stop`` is set on any process; logs, checkpoints (every
    `checkpoint.every` steps, at the end and on a stop), exports and returns the metrics of the steps it took. A fatal
    `RewardError` checkpoints the last completed step first, with the prompt iterator's position and the schedule's
    skip count put back to where they were before the failed step, so the resumed run draws (and
    counts the skips of) that step once."""
    cfg = trainer.cfg
    history = []
    step = trainer.start_step
    budget = cfg.train.max_sampled_tokens

    def finished() -> bool:
        return step >= cfg.train.steps or (budget is not None and trainer.sampled_tokens >= budget)

    def save() -> None:
        trainer.ckpt.save(step, trainer.saved_state(), trainer.checkpoint_extra(), force=True)

    if step == 0 and trainer.retain_sets and cfg.train.retain_every:
        logger.log(0, trainer.retain(0))  # step 0: the starting point of every retain/* curve, before any update
    preempted = False
    while not finished():
        # what a step changes before it is scored: the iterator's position and the skip rule's count (the schedule's
        # per-prompt history is recorded after scoring); a rollout thread drawing ahead owns both (the checkpoint
        # then takes them as of the last trained step, `trainer.consumed`)
        ahead, sch = getattr(trainer, "producer", None) is not None, getattr(trainer, "scheduler", None)
        position = None if ahead else trainer.iterator.state()
        skips = None if ahead or sch is None else sch.skipped_total
        state = trainer.state
        try:
            metrics = trainer.step(step)
        except rewards.RewardError as e:
            if trainer.state is not state:  # failed after the update: nothing consistent to save
                raise
            if position is not None:  # the resumed run draws this step's prompts again
                trainer.iterator.restore(position)
            if skips is not None:  # ... and counts its skips again
                sch.skipped_total = skips
            save()
            trainer.ckpt.wait()
            raise rewards.RewardError(
                f"{getattr(e, 'message', e)}; step {step} is checkpointed (re-run with --run-dir {trainer.run_dir} "
                "to resume)", getattr(e, "advice", None) or "fix the reward function") from e
        step += 1
        trainer.sampled_tokens += int(metrics["tokens/sampled"])
        metrics["tokens/sampled_total"] = float(trainer.sampled_tokens)
        if finished() and trainer.retain_sets and cfg.train.retain_every and step % cfg.train.retain_every:
            metrics.update(trainer.retain(step))  # the end of the run, whatever retain_every: what the run kept
        history.append(metrics)
        if step % cfg.log.every == 0:
            logger.log(step, metrics)
        if cfg.log.sample_every and step % cfg.log.sample_every == 0:
            logger.log_samples(step, *trainer.last_samples)
        preempted = stop.any_process()  # a collective on pods: every host stops at the same step
        if preempted or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0):
            save()
        if preempted:
            break
    done = finished()
    if done and (not cfg.checkpoint.every or step % cfg.checkpoint.every):  # the end (checkpoint.every=0 included)
        save()
    trainer.ckpt.wait()
    if done and cfg.checkpoint.export_final:
        export.final(trainer)
    if done and cfg.checkpoint.export_gguf:
        export.gguf(trainer)
    if preempted and not done:
        raise ckpt_lib.Preempted(stop.signal or signal.SIGTERM, step, trainer.run_dir)
    return history

