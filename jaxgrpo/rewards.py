# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Reward functions: the registry, the two calling conventions, and `score` / `Scorer`, which run them.

Configs name reward functions in ``data.rewards: {name: weight}``: a name of the registry ``REWARDS`` (the built-ins
of `jaxgrpo.reward_fns`, re-exported here) or ``"package.module:function"`` for a user function. Two conventions:

* **per sample** (jaxgrpo's): ``fn(completion: str, example: Example) -> float | None``, called once per completion.
* **batched** (TRL's ``GRPOTrainer`` convention): ``fn(prompts, completions, **columns) -> list[float | None]``,
  keyword arguments only: ``prompts`` and ``completions`` are lists of strings (the example's prompt text as the
  dataset has it, before any chat template, and the decoded completion; never TRL's conversational message lists),
  ``completion_ids`` the completion token ids where the caller has them (the trainer does), and each dataset column
  a list with one entry per completion: ``answer`` (the canonical gold answer, e.g. ``"72"``) and every key of
  ``Example.meta`` (GSM8K: ``solution``, ``index``, ...; a key missing from an example gives None). Only the
  arguments that the function's signature accepts are passed, all of them when it takes ``**kwargs``. TRL's
  ``trainer_state``, ``log_extra`` and ``log_metric`` are not passed. In a multi-turn run with ``data.environment``,
  ``environments`` is each trajectory's environment instance after its last turn, as TRL's environment mode passes it
  (``def reward(completions, environments, **kwargs): return [e.get_reward() for e in environments]`` runs
  unchanged). The trainer calls a batched function once per prompt group (the G completions of one prompt), so it
  must not rely on seeing the whole step.

Which convention a function follows: it is batched when it is decorated with `batched`, or its signature has a
parameter named ``prompts`` or ``completions``, or it takes no positional parameter but ``**kwargs``; otherwise it is
per sample. `is_batched` applies the rule.

``None`` (TRL's "no reward"): the function does not score that sample and adds nothing to its weighted sum; a sample
that no function scores has no reward at all and is invalid (``valid=False``, reward 0, masked out of the update like
a failed sample under ``algo.on_reward_error=invalidate``). With one function, None therefore drops the sample.

Failures: a function that raises, returns something that is not a finite real number (or None), or a batched function
that returns the wrong number of rewards, stops the run with a one-line `RewardError` naming the function, the
sample and its prompt, and the fix (``on_error="error"``), or makes that sample invalid (``on_error="invalidate"``).
A NaN never reaches the update silently. A call that runs past the timeout (`Scorer`, ``data.reward_timeout``) is
cut off whatever ``on_error`` says: its samples are invalid, counted in ``reward/timeouts``, and the first timeout of
each function is reported once as a RuntimeWarning. `jaxgrpo.reward_pool` runs the calls in worker threads.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import math
import numbers
import time
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from jaxgrpo.errors import RewardError
from jaxgrpo.example import Example
from jaxgrpo.reward_fns import (
    MATH_VERIFY_TIMEOUT_S,
    Mode,
    arithmetic_correct,
    arithmetic_lenient,
    calibration_lenient,
    calibration_reward,
    extract_answer,
    extract_confidence,
    format_number,
    format_reward,
    gsm8k_correct,
    gsm8k_lenient,
    gsm8k_strict,
    math_verify_correct,
    normalize_number,
    strip_confidence,
)
from jaxgrpo.reward_pool import RewardPool

__all__ = [
    "CORRECTNESS_REWARDS", "MATH_VERIFY_TIMEOUT_S", "ON_REWARD_ERROR", "REWARDS", "REWARD_SOURCES", "Mode",
    "OnRewardError", "RewardError", "RewardFn", "Scorer", "Scores", "arithmetic_correct", "arithmetic_lenient",
    "batched", "calibration_lenient", "calibration_reward", "combine", "conversational", "extract_answer",
    "extract_confidence", "format_number", "format_reward", "gsm8k_correct", "gsm8k_lenient", "gsm8k_strict",
    "is_batched", "math_verify_correct", "normalize_number", "resolve", "score", "strip_confidence",
]

RewardFn = Callable[..., Any]  # per sample: (completion, example) -> float | None; batched: (**kw) -> list
# What `score` does with a failing reward function (the config's algo.on_reward_error).
OnRewardError = Literal["error", "invalidate"]
ON_REWARD_ERROR: tuple[str, ...] = typing.get_args(OnRewardError)

REWARDS: dict[str, RewardFn] = {
    "gsm8k": gsm8k_strict,
    "gsm8k_lenient": gsm8k_lenient,
    "math_verify": math_verify_correct,
    "format": format_reward,
    "calibration": calibration_reward,
    "calibration_lenient": calibration_lenient,
    "arithmetic": arithmetic_correct,
    "arithmetic_lenient": arithmetic_lenient,
}


# The rewards that define success (a correct answer), not shaping (format, calibration): what an evaluation or a
# retention set judges by when it is not told (`jaxgrpo.eval.correctness_reward`, `jaxgrpo.retain`).
CORRECTNESS_REWARDS: tuple[str, ...] = ("gsm8k", "gsm8k_lenient", "math_verify", "arithmetic", "arithmetic_lenient")

# Which data.source each registered reward is meant for (a strict GSM8K reward on the synthetic task, whose completions
# carry no "####", is always 0; the exact-match arithmetic reward on GSM8K reasoning is always 0).
REWARD_SOURCES: dict[str, tuple[str, ...]] = {
    "gsm8k": ("gsm8k",),
    "gsm8k_lenient": ("gsm8k", "synthetic", "words"),  # words: the last number of the completion
    "math_verify": ("gsm8k", "synthetic", "words"),
    "format": ("gsm8k",),
    "calibration": ("gsm8k",),
    "calibration_lenient": ("gsm8k",),
    "arithmetic": ("synthetic",),
    "arithmetic_lenient": ("synthetic",),
}

_BATCHED_ATTR = "_jaxgrpo_batched"
_RESERVED = ("prompts", "completions", "completion_ids", "prompt", "completion")


def batched(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks `fn` as a batched (TRL-convention) reward function, whatever its parameters are named."""
    try:
        setattr(fn, _BATCHED_ATTR, True)
        return fn
    except AttributeError:  # e.g. a bound method: mark a wrapper instead

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        setattr(wrapper, _BATCHED_ATTR, True)
        return wrapper


def conversational(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A batched function that hands `fn` (a TRL reward written for conversational datasets, which reads
    ``completion[0]["content"]``, such as ``trl.rewards.accuracy_reward``) TRL's message lists: each prompt as
    ``[{"role": "user", "content": prompt}]`` and each completion as ``[{"role": "assistant", "content": text}]``.
    Define ``my_rewards.accuracy = rewards.conversational(accuracy_reward)`` and configure ``my_rewards:accuracy``."""
    params = _parameters(fn) or []
    accepts = None if any(p.kind == p.VAR_KEYWORD for p in params) or not params else {p.name for p in params}

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        kwargs["prompts"] = [[{"role": "user", "content": p}] for p in kwargs["prompts"]]
        kwargs["completions"] = [[{"role": "assistant", "content": c}] for c in kwargs["completions"]]
        return fn(**(kwargs if accepts is None else {k: v for k, v in kwargs.items() if k in accepts}))

    del wrapper.__wrapped__  # the wrapper takes every column (**kwargs), whatever `fn` names
    setattr(wrapper, _BATCHED_ATTR, True)
    return wrapper


def _parameters(fn: Callable[..., Any]) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # some builtins have no signature
        return None


def is_batched(fn: Callable[..., Any]) -> bool:
    """Whether `fn` follows the batched convention (module docstring): marked by `batched`, or a parameter named
    ``prompts`` or ``completions``, or only keyword arguments through ``**kwargs``."""
    if getattr(fn, _BATCHED_ATTR, False):
        return True
    params = _parameters(fn)
    if params is None:
        return False
    if any(p.name in ("prompts", "completions") for p in params):
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    return not any(p.kind in positional for p in params) and any(p.kind == p.VAR_KEYWORD for p in params)


def resolve(name_or_fn: str | RewardFn) -> tuple[str, RewardFn]:
    """(display name, function) for a registry name, a ``"module:function"`` import path, or a callable."""
    if callable(name_or_fn):
        return getattr(name_or_fn, "__name__", repr(name_or_fn)), name_or_fn
    if not isinstance(name_or_fn, str):
        raise TypeError(f"a reward function is a name or a callable, got {type(name_or_fn).__name__}")
    if name_or_fn in REWARDS:
        return name_or_fn, REWARDS[name_or_fn]
    if ":" in name_or_fn:
        module_name, _, attr = name_or_fn.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot import reward function {name_or_fn!r}: {e}") from e
        if not callable(fn):
            raise ValueError(f"reward function {name_or_fn!r} is not callable")
        return name_or_fn, fn
    close = difflib.get_close_matches(name_or_fn, list(REWARDS), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(
        f"unknown reward function {name_or_fn!r}; {hint}valid names: {', '.join(REWARDS)} "
        "(or 'package.module:function' for your own)"
    )


class _Resolved(typing.NamedTuple):
    name: str
    fn: RewardFn
    weight: float
    batched: bool
    accepts: frozenset[str] | None  # keyword arguments a batched function takes; None = all (**kwargs)


def _check_weights(fns: Sequence[tuple[str | RewardFn, float]]) -> list[_Resolved]:
    if not fns:
        raise ValueError("no reward functions given: configure at least one, e.g. data.rewards={arithmetic: 1.0}")
    out = []
    for item in fns:
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise TypeError(f"reward functions are (name_or_fn, weight) pairs, got {item!r}")
        name, fn = resolve(item[0])
        w = item[1]
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise ValueError(f"the weight of reward function {name!r} must be a finite number, got {w!r}")
        params = _parameters(fn) or []
        accepts = (None if any(p.kind == p.VAR_KEYWORD for p in params) or not params
                   else frozenset(p.name for p in params))
        out.append(_Resolved(name, fn, float(w), is_batched(fn), accepts))
    return out


def _call_batched(r: _Resolved, texts: Sequence[str], examples: Sequence[Example],
                  completion_ids: Sequence[Sequence[int]] | None,
                  columns: Mapping[str, Sequence[Any]] | None = None) -> Any:
    """Calls a batched function TRL's way: prompts, completions, completion_ids, one list per dataset column and the
    caller's ``columns`` (rows of this call: a multi-turn run's ``environments``)."""
    kwargs: dict[str, Any] = {"prompts": [e.prompt for e in examples], "completions": list(texts), **(columns or {})}
    if completion_ids is not None:
        kwargs["completion_ids"] = [list(ids) for ids in completion_ids]
    kwargs["answer"] = [e.answer for e in examples]
    keys = dict.fromkeys(k for e in examples if isinstance(e.meta, dict) for k in e.meta)
    for k in keys:
        if k not in _RESERVED and k != "answer":
            kwargs[k] = [e.meta.get(k) if isinstance(e.meta, dict) else None for e in examples]
    if r.accepts is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in r.accepts}
    return r.fn(**kwargs)


def combine(fns: Sequence[tuple[str | RewardFn, float]]) -> Callable[[str, Example], float]:
    """One per-sample function computing ``sum_i w_i * fn_i(completion, example)`` over the functions that score the
    sample (None adds nothing; a batched function is called on one sample). No error handling: see `score`."""
    resolved = _check_weights(fns)

    def combined(completion: str, example: Example) -> float:
        total = 0.0
        for r in resolved:
            value = _call_batched(r, [completion], [example], None)[0] if r.batched else r.fn(completion, example)
            total += 0.0 if value is None else r.weight * float(value)
        return total

    combined.__name__ = "+".join(f"{r.weight:g}*{r.name}" for r in resolved)
    return combined


def _describe(i: int, example: Example) -> str:
    prompt = example.prompt if len(example.prompt) <= 60 else example.prompt[:57] + "..."
    where = f"sample {i}"
    if isinstance(example.meta, dict) and "index" in example.meta:
        where += f" (dataset example {example.meta['index']})"
    return f"{where}, prompt {prompt!r}"


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


def _check_value(value: Any) -> tuple[float | None, str | None]:
    """(the reward or None, None) for a good value, else (None, what is wrong with it)."""
    if value is None:
        return None, None
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.shape == ()):
        value = value.item()  # numpy scalars (including np.bool_) → Python numbers
    if not isinstance(value, numbers.Real):
        return None, f"returned {value!r} ({type(value).__name__}), not a real number or None"
    if not math.isfinite(float(value)):
        return None, f"returned the non-finite value {float(value)!r}"
    return float(value), None


class Scores(typing.NamedTuple):
    """What `Scorer` computes for N completions."""

    rewards: np.ndarray  # float32 [N]: the weighted sum (0 where invalid)
    valid: np.ndarray  # bool [N]: False = no reward (every function said None, a failure with invalidate, a timeout)
    timed_out: np.ndarray  # bool [N]: some call for this sample ran past the timeout


class Scorer:
    """Runs weighted reward functions over batches of completions, in `workers` threads with a per-call `timeout`
    (seconds; None = none; needs workers >= 1); batched functions get `batch_size` consecutive samples per call
    (None = the whole batch). `take_stats` returns the metrics since its last call. `close` stops the workers."""

    def __init__(self, fns: Sequence[tuple[str | RewardFn, float]], *, on_error: OnRewardError = "error",
                 workers: int = 0, timeout: float | None = None, batch_size: int | None = None):
        if on_error not in ON_REWARD_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_REWARD_ERROR)}, got {on_error!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        self.resolved = _check_weights(fns)
        self.on_error = on_error
        self.batch_size = batch_size
        self.pool = RewardPool(workers, timeout)
        self._warned: set[str] = set()
        self._stats = {"samples": 0, "invalid": 0, "timeouts": 0, "seconds": 0.0}

    def __call__(self, texts: Sequence[str], examples: Sequence[Example],
                 completion_ids: Sequence[Sequence[int]] | None = None,
                 columns: Mapping[str, Sequence[Any]] | None = None,
                 group_sizes: Sequence[int] | None = None) -> Scores:
        """Scores N completions; `examples[i]` is the example `texts[i]` answers (repeat it G times for a group).
        ``columns``: more keyword arguments for batched functions, one entry per completion (TRL's ``environments``:
        each trajectory's environment instance). ``group_sizes``: the rows of each group, consecutive (they sum to
        N); a batched function is then called once per group, whatever their sizes (an adaptive schedule's), else
        once per ``batch_size`` rows."""
        n = len(texts)
        columns = dict(columns or {})
        for name, col in columns.items():
            if name in _RESERVED or len(col) != n:
                raise ValueError(f"score: column {name!r} must be a new name with one entry per completion ({n})")
        if len(examples) != n or (completion_ids is not None and len(completion_ids) != n):
            raise ValueError(f"score: {n} completions but {len(examples)} examples"
                             + ("" if completion_ids is None else f" and {len(completion_ids)} completion_ids")
                             + "; pass one example per row")
        if group_sizes is not None:
            ends = np.cumsum([int(g) for g in group_sizes])
            if (len(ends) and ends[-1] != n) or (not len(ends) and n) or any(int(g) < 0 for g in group_sizes):
                raise ValueError(f"score: group sizes {list(group_sizes)} do not add up to the {n} completions")
            spans = [(int(a), int(b)) for a, b in zip([0, *ends[:-1]], ends) if b > a]
        else:
            step = self.batch_size or max(n, 1)
            spans = [(a, min(a + step, n)) for a in range(0, n, step)]
        t0 = time.perf_counter()
        calls, where = [], []  # where[c] = (function index, first sample, end sample) of call c
        for f, r in enumerate(self.resolved):
            if r.batched:
                for a, b in spans:
                    ids = None if completion_ids is None else completion_ids[a:b]
                    cols = {k: list(v[a:b]) for k, v in columns.items()}
                    calls.append(functools.partial(_call_batched, r, texts[a:b], examples[a:b], ids, cols))
                    where.append((f, a, b))
            else:
                for i in range(n):
                    calls.append(functools.partial(r.fn, texts[i], examples[i]))
                    where.append((f, i, i + 1))
        results = self.pool.run(calls, [self.resolved[f].name for f, _, _ in where])

        num_f = len(self.resolved)
        values = np.zeros((num_f, n))
        scored = np.zeros((num_f, n), bool)
        timed_out = np.zeros(n, bool)
        # (first sample, function) -> (problem, cause, end sample): a batched call that failed as a whole fails its rows
        problems: dict[tuple[int, int], tuple[str, BaseException | None, int]] = {}
        for (f, a, b), res in zip(where, results):
            name = self.resolved[f].name
            if res.timed_out:
                timed_out[a:b] = True
                if name not in self._warned:
                    self._warned.add(name)
                    warnings.warn(
                        f"reward function {name!r} ran past data.reward_timeout={self.pool.timeout:g}s on "
                        f"{_describe(a, examples[a])}; timed-out samples are invalid (metric reward/timeouts): make "
                        "the function faster or raise data.reward_timeout", RuntimeWarning, stacklevel=2)
                continue
            if res.error is not None:
                problems[(a, f)] = (f"raised {_one_line(res.error)}", res.error, b)
                continue
            out = [res.value] if not self.resolved[f].batched else res.value
            if self.resolved[f].batched and (isinstance(out, str | bytes) or not hasattr(out, "__len__")
                                             or len(out) != b - a):
                got = f"{len(out)} rewards" if hasattr(out, "__len__") else repr(out)
                problems[(a, f)] = (f"returned {got} for a batch of {b - a} completions (one reward or None per "
                                    f"completion expected; batch of samples {a}..{b - 1})", None, b)
                continue
            for k, value in enumerate(out):
                v, problem = _check_value(value)
                if problem is not None:
                    problems[(a + k, f)] = (problem, None, a + k + 1)
                elif v is not None:
                    values[f, a + k], scored[f, a + k] = v, True
        failed = np.zeros(n, bool)
        for (i, f) in sorted(problems):
            problem, cause, end = problems[(i, f)]
            if self.on_error == "error":
                raise RewardError(
                    f"reward {self.resolved[f].name!r} {problem} on {_describe(i, examples[i])}",
                    "fix the function, or set algo.on_reward_error=invalidate to drop such samples from the update",
                ) from cause
            failed[i:end] = True
        stuck = self.pool.stuck
        if sum(stuck.values()) >= self.pool.stuck_limit:
            raise RewardError(
                f"{sum(stuck.values())} calls of reward {', '.join(map(repr, stuck))} are still running long past "
                f"data.reward_timeout={self.pool.timeout:g}s: the function hangs; fix it so that every call returns")
        valid = scored.any(0) & ~failed & ~timed_out
        weights = np.array([r.weight for r in self.resolved])[:, None]
        rewards = np.where(valid, (weights * np.where(scored, values, 0.0)).sum(0), 0.0).astype(np.float32)
        s = self._stats
        s["samples"] += n
        s["invalid"] += int((~valid).sum())
        s["timeouts"] += int(timed_out.sum())
        s["seconds"] += time.perf_counter() - t0
        return Scores(rewards, valid, timed_out)

    def stats(self) -> dict[str, float]:
        """The counts behind `take_stats` since its last call: samples, invalid, timeouts, seconds."""
        return dict(self._stats)

    def add_stats(self, counts: dict[str, float]) -> None:
        """Adds other processes' counts (`jaxgrpo.async_rollout.score_across_processes`) to those `take_stats`
        reports."""
        for k, v in counts.items():
            self._stats[k] += type(self._stats[k])(v)

    def take_stats(self) -> dict[str, float]:
        """Metrics since the last call: ``reward/timeouts`` (samples whose reward call was cut off),
        ``reward/invalid_frac`` (share of scored samples without a valid reward), ``time/reward_s``."""
        s = self._stats
        out = {"reward/timeouts": float(s["timeouts"]), "reward/invalid_frac": s["invalid"] / max(s["samples"], 1),
               "time/reward_s": float(s["seconds"])}
        self._stats = {"samples": 0, "invalid": 0, "timeouts": 0, "seconds": 0.0}
        return out

    def close(self) -> None:
        self.pool.close()


def score(
    texts: Sequence[str],
    examples: Sequence[Example],
    fns: Sequence[tuple[str | RewardFn, float]],
    on_error: OnRewardError = "error",
    *,
    completion_ids: Sequence[Sequence[int]] | None = None,
    workers: int = 0,
    timeout: float | None = None,
    batch_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Weighted rewards of N completions: ``(rewards float32 [N], valid bool [N])`` (a one-off `Scorer`).

    `examples[i]` is the example completion `texts[i]` answers (repeat each example G times for groups). Failures,
    None and timeouts as in the module docstring; ``workers=0`` runs every call in the calling thread.
    """
    scorer = Scorer(fns, on_error=on_error, workers=workers, timeout=timeout, batch_size=batch_size)
    try:
        result = scorer(texts, examples, completion_ids)
    finally:
        scorer.close()
    return result.rewards, result.valid
