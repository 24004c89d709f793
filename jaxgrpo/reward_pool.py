# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Worker threads that run reward-function calls in parallel, each call cut off at a per-call timeout.

`RewardPool.run(calls)` runs a list of zero-argument callables and returns one `CallResult` per call, in the order
given (results never depend on which worker ran what or when). With ``workers=0`` the calls run one after another in
the calling thread and no timeout is possible.

Threads, not processes, and why:

* Reward functions are arbitrary callables (closures, lambdas, objects holding a tokenizer or an HTTP client, TRL
  functions): a thread calls them as they are; a process needs them and their arguments picklable.
* The trainer's process runs JAX, which is multithreaded: ``fork`` after JAX started can deadlock, and ``spawn`` or
  ``forkserver`` workers re-import the package (JAX included, seconds and ~100 MB each).
* Slow rewards are mostly waiting (a sandboxed program, a remote judge, a subprocess): threads overlap that. Pure-Python
  CPU-bound checks (SymPy inside Math-Verify) hold the GIL, so threads bound their time but do not add cores.

The price: a thread cannot be killed. A call past its deadline is abandoned: its sample is reported as timed out, the
pool starts a replacement worker so that its capacity stays the same, and the stuck thread (a daemon, which never
blocks the interpreter's exit) ends whenever the call returns; what it returns then is dropped. A function that
never returns holds its thread for good, so ``stuck_limit`` caps how many abandoned calls may be running at once;
`RewardPool.stuck` reports them, and the caller (`jaxgrpo.rewards.Scorer`) turns reaching the cap into an error
instead of leaking threads without end. Math-Verify's own timeouts use ``signal.alarm``, which only works in the main
thread; `jaxgrpo.reward_fns.math_verify_correct` turns them off in worker threads, where this pool's timeout applies.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


@dataclasses.dataclass
class CallResult:
    """The outcome of one call: its return value, or the exception it raised, or ``timed_out``."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    seconds: float = 0.0  # wall time of the call (up to the timeout when it timed out)


@dataclasses.dataclass(eq=False)
class _Job:
    fn: Callable[[], Any]
    label: str
    started: float | None = None
    done: bool = False
    abandoned: bool = False
    result: CallResult = dataclasses.field(default_factory=CallResult)


class RewardPool:
    """`workers` daemon threads (started on first use) running calls with a per-call `timeout` in seconds (None = no
    limit); `stuck_limit` (default ``max(16, 4 * workers)``) abandoned calls may still be running at once."""

    def __init__(self, workers: int, timeout: float | None = None, stuck_limit: int | None = None):
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
        if timeout is not None and workers == 0:
            raise ValueError("a timeout needs worker threads (workers >= 1): a call in the caller's thread cannot be "
                             "cut off")
        self.workers = workers
        self.timeout = timeout
        self.stuck_limit = max(16, 4 * workers) if stuck_limit is None else stuck_limit
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._live = 0  # worker threads taking calls (abandoned ones no longer count)
        self._spawned = 0
        self._stuck: collections.Counter[str] = collections.Counter()  # label -> abandoned calls still running
        self._closed = False

    @property
    def stuck(self) -> dict[str, int]:
        """Abandoned calls (past their timeout) still running, by label."""
        with self._cond:
            return {k: v for k, v in self._stuck.items() if v}

    def _spawn(self) -> None:
        threading.Thread(target=self._work, name=f"jaxgrpo-reward-{self._spawned}", daemon=True).start()
        self._live += 1
        self._spawned += 1

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._cond:
                job.started = time.monotonic()
                self._cond.notify_all()  # the caller now knows this call's deadline
            value, error = None, None
            try:
                value = job.fn()
            except BaseException as e:  # noqa: BLE001 -- any failure of user code is reported to the caller
                error = e
            with self._cond:
                if job.abandoned:  # timed out earlier: a replacement worker took this thread's place
                    self._stuck[job.label] -= 1
                    return
                job.result = CallResult(value, error, False, time.monotonic() - job.started)
                job.done = True
                self._cond.notify_all()

    def run(self, calls: Sequence[Callable[[], Any]], labels: Sequence[str] | None = None) -> list[CallResult]:
        """Runs `calls` (in parallel with workers) and returns their results in order; `labels[i]` names call i in
        `stuck`. Never raises for a failing call: its exception is in its result."""
        if self._closed:
            raise RuntimeError("the reward pool is closed")
        labels = list(labels) if labels is not None else [""] * len(calls)
        if self.workers == 0:
            out = []
            for fn in calls:
                t0 = time.monotonic()
                try:
                    out.append(CallResult(fn(), None, False, time.monotonic() - t0))
                except Exception as e:  # noqa: BLE001
                    out.append(CallResult(None, e, False, time.monotonic() - t0))
            return out
        jobs = [_Job(fn, label) for fn, label in zip(calls, labels, strict=True)]
        with self._cond:
            while self._live < self.workers:
                self._spawn()
        for job in jobs:
            self._queue.put(job)
        with self._cond:
            pending = list(jobs)
            while pending:
                now = time.monotonic()
                wait: float | None = None
                still = []
                for job in pending:
                    if job.done:
                        continue
                    if self.timeout is not None and job.started is not None:
                        left = job.started + self.timeout - now
                        if left <= 0:
                            job.abandoned = job.done = True
                            job.result = CallResult(timed_out=True, seconds=now - job.started)
                            self._stuck[job.label] += 1
                            self._live -= 1
                            self._spawn()  # keeps `workers` threads taking calls
                            continue
                        wait = left if wait is None else min(wait, left)
                    still.append(job)
                pending = still
                if pending:
                    self._cond.wait(timeout=wait)
        return [job.result for job in jobs]

    def close(self) -> None:
        """Stops the idle workers (a stuck one ends when its call returns). Further `run` calls raise."""
        self._closed = True
        with self._cond:
            for _ in range(self._live):
                self._queue.put(None)
            self._live = 0
