# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Which programs a training run compiles, on which thread and in which step, and why: ``python -m jaxgrpo.train``'s
arguments, run in this process with ``jax_log_compiles`` and ``jax_explain_cache_misses`` on and a log line at every
step's start and end, each line stamped with its thread (the background precompile thread's compilations are
expected after step 1; the main thread's are the ones ``time/compiles`` counts). On CPU ``jaxgrpo.train``
re-executes itself for its malloc tunables: run this with ``JAXGRPO_MALLOC=default`` there.

    python benchmarks/compile_log.py --run-dir DIR train.steps=4 ... 2> compiles.log
    grep -E "STEP|Compiling|CACHE MISS" compiles.log
"""

from __future__ import annotations

import logging
import sys

logging.basicConfig(format="%(relativeCreated)8.0f ms %(threadName)s %(message)s", level=logging.WARNING)

import pathlib  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # this checkout's jaxgrpo, installed or not
import jax  # noqa: E402

from jaxgrpo import train, trainer  # noqa: E402

jax.config.update("jax_log_compiles", True)
jax.config.update("jax_explain_cache_misses", True)  # why jit missed its cache: a new shape, placement, ...
_step = trainer.Trainer.step
_seen = {"names": (), "modules": set(sys.modules)}


def _context_names() -> tuple:
    """jit's tracing-context entries by name (a jaxlib that cannot name them: empty)."""
    try:
        return tuple(jax._src.config.trace_context_names())
    except (AttributeError, NotImplementedError):
        return ()


def _log_new_context() -> None:
    """The tracing-context entries and the modules that appeared since the last step: a config state registered by a
    module imported late lengthens every later tracing key, so jit retraces everything traced before it."""
    names, modules = _context_names(), set(sys.modules)
    new_names = [n for n in names if n not in _seen["names"]]
    new_modules = sorted(m for m in modules - _seen["modules"] if m.startswith("jax"))
    logging.warning("  tracing context: %d entries, new %s; jax modules imported since: %s", len(names), new_names,
                    new_modules[:40])  # fmt: skip
    _seen.update(names=names, modules=modules)


def _logged_step(self: trainer.Trainer, s: int) -> dict:
    logging.warning("STEP %d begin", s)
    _log_new_context()
    metrics = _step(self, s)
    logging.warning("STEP %d end: time/compiles %s", s, metrics.get("time/compiles"))
    return metrics


trainer.Trainer.step = _logged_step
if __name__ == "__main__":
    sys.argv[0] = "jaxgrpo.train"
    sys.exit(train.main())
