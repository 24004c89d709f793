# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Checkpoints of everything a resume needs, through orbax, plus the preemption flag the training loop polls.

A checkpoint of step ``s`` is the directory ``<directory>/<s>/`` holding two orbax items:

- ``state``: the training-state pytree (params, optimizer state, step, PRNG key ...), written with orbax's
  PyTree handler (tensorstore/OCDBT, one file set for all arrays, sharded arrays written shard by shard);
- ``extra``: a small JSON object (data-iterator position, config hash, anything else the loop needs).

Atomicity. orbax writes a step into ``<s>.orbax-checkpoint-tmp-<timestamp>/`` and, only after every array and the
JSON are on disk, writes ``commit_success.txt`` and renames the directory to ``<s>/`` (``AtomicRenameTemporaryPath``
on a local/POSIX filesystem; on GCS, where rename is not atomic, the commit file alone marks completion). A process
killed mid-save leaves only the temporary directory, which ``latest_step``/``all_steps`` never list, so a restore
always picks the last *complete* step; leftover temporary directories are deleted when the next manager is opened.

PRNG keys. Typed keys (``jax.random.key``) and raw ``uint32`` keys (``jax.random.PRNGKey``) both round-trip: orbax
stores a typed key as its ``jax.random.key_data`` plus the implementation name and re-wraps it
(``jax.random.wrap_key_data``) when the restore target holds a typed key.

Walking back. A step that is listed but does not restore (a truncated or overwritten array file, an empty
``state/_METADATA``, a deleted ``extra/metadata``, arrays of other shapes) must not brick the run:
``restore_newest(attempt)`` tries the steps newest first and, once an older one restores, renames each newer failed
step to ``<s>.unrestorable`` (never deleted; orbax does not list it), saying so in one line each. When none restores it
moves nothing and raises one `CheckpointError` naming every step and why. A damaged step's failed read can leave a
callback on orbax's closed event loop; Python's "Event loop is closed" traceback for it is not printed then.

Preemption. ``install_signal_handlers()`` returns a ``PreemptionFlag`` that SIGTERM/SIGINT set instead of killing the
process; the loop polls it after each step, saves with ``force=True`` and stops with `Preempted`, whose exit status
is the shell's ``128 + signal`` (143 for SIGTERM, 130 for SIGINT), so a scheduler never mistakes a preempted run for a
finished one. A second SIGINT (Ctrl-C twice) raises ``KeyboardInterrupt`` at once. With several processes
(``jax.process_count() > 1``) all of them must save the same step: ``PreemptionFlag.any_process()`` agrees on the flag
across processes.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxgrpo.errors import CheckpointError, ConfigError

T = TypeVar("T")
STATE_ITEM = "state"
EXTRA_ITEM = "extra"
# orbax's marker for a step directory that is still being written (orbax.checkpoint._src.path.atomicity_types).
TMP_MARKER = ".orbax-checkpoint-tmp"
UNRESTORABLE = ".unrestorable"  # suffix of a step directory moved aside because it did not restore


CHECKPOINT_SUBDIR = "checkpoints"


def run_checkpoint_dir(run_dir: str | os.PathLike) -> pathlib.Path:
    """Where a training run keeps its checkpoints: ``<run_dir>/checkpoints`` (used by train and eval alike)."""
    return pathlib.Path(run_dir) / CHECKPOINT_SUBDIR


def to_json(obj: Any, where: str = "extra") -> Any:
    """Returns `obj` as plain JSON data: numpy/JAX scalars and arrays become numbers and (nested) lists, tuples
    become lists. Raises ValueError naming the offending entry for anything else (or a non-finite float)."""
    if isinstance(obj, bool | str) or obj is None:
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"{where} is {obj}: checkpoint extras must be finite JSON numbers")
        return obj
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise ValueError(f"{where} has a non-string key {k!r}: JSON objects need string keys")
            out[k] = to_json(v, f"{where}[{k!r}]")
        return out
    if isinstance(obj, list | tuple):
        return [to_json(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, jax.Array) and jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
        raise ValueError(f"{where} is a typed PRNG key: store jax.random.key_data(key).tolist() instead")
    if isinstance(obj, np.generic | np.ndarray | jax.Array):
        return to_json(np.asarray(obj).tolist(), where)
    raise ValueError(f"{where} has type {type(obj).__name__}, which is not JSON data (dict/list/str/number/bool/None)")


def _uncommitted(x: Any) -> bool:
    return isinstance(x, jax.Array) and not getattr(x, "committed", True)


def _is_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _uncommit(x: Any) -> jax.Array:
    """``x`` (restored into host memory, or a typed PRNG key restored onto the default device) as an uncommitted array
    on the default device."""
    if _is_key(x):
        return jax.random.wrap_key_data(jnp.asarray(jax.device_get(jax.random.key_data(x))),
                                        impl=jax.random.key_impl(x))  # fmt: skip
    return jnp.asarray(x)


def _restore_target(target: Any) -> tuple[Any, Any]:
    """(item, restore_args) for orbax: every array leaf becomes a ShapeDtypeStruct carrying its sharding, so the
    restored arrays land on the target's devices (a mesh-sharded TrainState restores onto the mesh). An uncommitted
    leaf (one device, no mesh: what jit returns for uncommitted inputs) is read into host memory instead and made an
    uncommitted device array again by `CheckpointManager.restore`: a committed copy would be lowered with its
    sharding, other programs than the fresh run's (compiled again in the process, and missing a persistent
    compilation cache filled by the fresh run)."""
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def abstract(x: Any) -> Any:
        if _uncommitted(x) and not _is_key(x):  # a key restores as one (below) and is uncommitted after
            return np.empty(x.shape, x.dtype)  # not touched: orbax reads into a new array of this shape and dtype
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None:
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=default)
        return x

    item = jax.tree.map(abstract, target)
    return item, ocp.checkpoint_utils.construct_restore_args(item)


CLOSED_LOOP = "Event loop is closed"


@contextlib.contextmanager
def _quiet_closed_loop_callbacks() -> Iterator[None]:
    """Drops one message, and only while a step restores: when a damaged step's read fails, orbax closes the event loop
    of that restore while tensorstore may still finish another of its reads on a thread of its own, whose callback
    then meets the closed loop. Python prints that as "Exception ignored ... RuntimeError: Event loop is closed", a
    traceback on a run that walks back as it should (the failed read is the error `restore_newest` reports). Every
    other unraisable exception goes on to the hook that was installed."""
    previous = sys.unraisablehook

    def hook(args: Any) -> None:
        if not (isinstance(args.exc_value, RuntimeError) and str(args.exc_value) == CLOSED_LOOP):
            previous(args)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        if sys.unraisablehook is hook:
            sys.unraisablehook = previous


def _on_every_process(ok: bool) -> bool:
    """``ok`` of every JAX process, and-ed (`multihost_utils.process_allgather`): hosts decide together."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


class CheckpointManager:
    """Saves and restores (state pytree, JSON extra) per step under `directory`, keeping the newest `keep` steps.

    `save_interval` is the cadence of `save(step, ...)` without `force`: a step is written when
    `step % save_interval == 0` (0 = only forced saves, e.g. at the end of training or on preemption).
    `async_save=True` returns from `save` once the arrays are copied to host memory and writes them in a background
    thread; `wait()` blocks until the last save is complete, `close()` waits and releases the manager.
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3, save_interval: int = 1, *, async_save: bool = True):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep={keep!r}: the number of checkpoints to keep must be an integer >= 1")
        if not isinstance(save_interval, int) or isinstance(save_interval, bool) or save_interval < 0:
            raise ValueError(f"save_interval={save_interval!r}: must be an integer >= 0 (0 = only forced saves)")
        self.directory = pathlib.Path(directory).absolute()
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"checkpoint directory {self.directory} exists and is not a directory")
        self.keep = keep
        self.save_interval = save_interval
        if jax.process_index() == 0:  # synchronously: orbax's own cleanup may still be running when we return
            for leftover in incomplete_checkpoints(self.directory):
                shutil.rmtree(leftover, ignore_errors=True)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            save_interval_steps=1,  # the cadence is decided in `should_save`; orbax writes what it is handed
            create=True,
            cleanup_tmp_directories=True,  # leftovers of a save that was killed half-way
            enable_async_checkpointing=async_save,
        )
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={STATE_ITEM: ocp.PyTreeCheckpointHandler(), EXTRA_ITEM: ocp.JsonCheckpointHandler()},
        )

    # -- queries -------------------------------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        """The steps with a checkpoint, ascending: the complete ones on disk (a save killed half-way is never
        listed) plus a save this manager started that is still being written (restores wait for it)."""
        return sorted(int(s) for s in self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest step of `all_steps()`, or None when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def should_save(self, step: int, force: bool = False) -> bool:
        """Whether `save(step, ..., force=force)` would write: on the cadence (or forced) and not already saved."""
        if force or (self.save_interval > 0 and step % self.save_interval == 0):
            return step not in self.all_steps()
        return False

    # -- save / restore ------------------------------------------------------------------------------------------
    def save(self, step: int, state: Any, extra: Mapping[str, Any] | None = None, *, force: bool = False) -> bool:
        """Writes `state` (a pytree of arrays/scalars) and `extra` (JSON data) as step `step`.

        Returns True if a checkpoint was started, False if the step is off the cadence (and not forced) or is
        already on disk. Raises ValueError for a negative step or an `extra` that is not JSON data.
        """
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"step={step!r}: checkpoint steps are integers >= 0")
        step = int(step)
        extra_json = to_json(dict(extra or {}), "extra")
        if not self.should_save(step, force):
            return False
        self._manager.save(
            step,
            args=ocp.args.Composite(
                **{STATE_ITEM: ocp.args.PyTreeSave(state), EXTRA_ITEM: ocp.args.JsonSave(extra_json)}
            ),
            force=True,
        )
        return True

    def _check_step(self, step: int | None) -> int:
        self.wait()  # a step this manager is still writing is restorable once it is complete
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(f"no complete checkpoint under {self.directory}")
        if step is None:
            return steps[-1]
        if step not in steps:
            raise CheckpointError(
                f"no complete checkpoint for step {step} under {self.directory}; available steps: {steps}"
            )
        return int(step)

    def _check_target(self, step: int, item: Any, partial: bool) -> None:
        """Compares the restore target with the checkpoint's metadata before any array is read, so a mismatch is
        one clear error naming the entry (and no read is left half-done)."""
        saved = ocp.tree.to_flat_dict(self._manager.item_metadata(step)[STATE_ITEM].tree)
        saved = {k: v for k, v in saved.items() if v is not None}
        flat = ocp.tree.to_flat_dict(ocp.tree.serialize_tree(item, keep_empty_nodes=True))
        wanted = {k: v for k, v in flat.items() if v is not None}
        where = f"checkpoint step {step} under {self.directory}"
        fix = "; the model and optimizer configuration must be the ones of the run that wrote it"
        missing = [k for k in wanted if k not in saved]
        if missing:
            raise CheckpointError(
                f"{where}: {'.'.join(missing[0])} (and {len(missing) - 1} more) of the restore "
                f"target are not in the checkpoint{fix}"
            )
        unused = [k for k in saved if k not in wanted]
        if unused and not partial:
            raise CheckpointError(
                f"{where}: {'.'.join(unused[0])} (and {len(unused) - 1} more) of the checkpoint "
                f"are not in the restore target{fix}"
            )
        for k, want in wanted.items():
            shape = getattr(want, "shape", None)
            if shape is None:
                continue
            if jax.dtypes.issubdtype(want.dtype, jax.dtypes.prng_key):  # stored as its key data
                shape = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, want.dtype)).shape
            have = getattr(saved[k], "shape", None)
            if have is not None and tuple(have) != tuple(shape):
                raise CheckpointError(
                    f"{where}: {'.'.join(k)} has shape {tuple(have)} in the checkpoint but "
                    f"{tuple(shape)} in the restore target{fix}"
                )

    def restore(self, step: int | None, target: Any) -> tuple[Any, dict[str, Any]]:
        """Restores step `step` (None = latest) into the structure of `target` → (state, extra).

        `target` is a pytree with the saved structure whose leaves are concrete arrays or `jax.ShapeDtypeStruct`s
        (e.g. from `jax.eval_shape`); each restored array takes the target leaf's dtype and sharding (a
        ShapeDtypeStruct without sharding lands on the first local device).
        """
        step = self._check_step(step)
        item, restore_args = _restore_target(target)
        self._check_target(step, item, partial=False)
        try:
            out = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    **{
                        STATE_ITEM: ocp.args.PyTreeRestore(item=item, restore_args=restore_args),
                        EXTRA_ITEM: ocp.args.JsonRestore(),
                    }
                ),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"checkpoint step {step} under {self.directory} does not match the restore target ({e}); the model "
                "and optimizer configuration must be the ones of the run that wrote it"
            ) from e
        state = jax.tree.map(lambda t, x: _uncommit(x) if _uncommitted(t) else x, target, out[STATE_ITEM])
        return state, dict(out[EXTRA_ITEM] or {})

    def restore_subtree(self, step: int | None, name: str, target: Any) -> Any:
        """Restores only the entry `name` of the saved state (e.g. "params" of a TrainState) into `target`'s
        structure, shardings and dtypes, without reading the rest (the optimizer state is never loaded)."""
        step = self._check_step(step)
        saved = self._manager.item_metadata(step)[STATE_ITEM]
        names = list(getattr(saved, "tree", saved) or {})
        if name not in names:
            raise CheckpointError(
                f"checkpoint step {step} under {self.directory} holds no {name!r} entry; "
                f"its entries: {sorted(map(str, names))}"
            )
        item, restore_args = _restore_target({name: target})
        self._check_target(step, item, partial=True)
        try:
            out = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    **{STATE_ITEM: ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)}
                ),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"checkpoint step {step} under {self.directory}: its {name!r} entry does not match the restore "
                f"target ({e})"
            ) from e
        return out[STATE_ITEM][name]

    def read_extra(self, step: int | None = None) -> dict[str, Any]:
        """The JSON `extra` of step `step` (None = latest), without touching the arrays."""
        step = self._check_step(step)
        out = self._manager.restore(step, args=ocp.args.Composite(**{EXTRA_ITEM: ocp.args.JsonRestore()}))
        return dict(out[EXTRA_ITEM] or {})

    def restore_newest(self, attempt: Callable[[int], T], say: Callable[[str], None] | None = None
                       ) -> tuple[int, T] | None:
        """``(step, attempt(step))`` for the newest step whose `attempt` (a restore) succeeds, or None when there is no
        checkpoint. Each newer step that failed is then moved aside (`move_aside`) with one line to `say` (default:
        stderr) naming it and why. A `ConfigError` from `attempt` (the run's config does not fit) is raised as is;
        when no step restores, nothing is moved and one CheckpointError lists every step and its failure. On several
        processes a step counts as restored only where every process restored it (a failure on one host, e.g. a
        check of the shards it read, walks every host back together; one inside orbax's own collective reads cannot
        be agreed on from here)."""
        say = say or _say
        self.wait()
        failed: list[tuple[int, str]] = []
        with _quiet_closed_loop_callbacks():  # the walk back's attempts, and the reads a failed one left
            for step in reversed(self.all_steps()):
                try:
                    result, why = attempt(step), None
                except ConfigError:
                    raise
                except Exception as e:  # noqa: BLE001 -- orbax/tensorstore/json raise many types for a damaged step
                    result, why = None, one_line(e)
                if not _on_every_process(why is None):  # each host reads its own shards: all restore, or none
                    failed.append((step, why or "it failed on another process"))
                    continue
                for bad, why in failed:
                    moved = self.move_aside(bad)
                    say(f"jaxgrpo: checkpoint step {bad} does not restore ({why}); moved it aside to {moved.name}, "
                        f"restoring step {step}")
                return step, result
        if not failed:
            return None
        raise CheckpointError(
            f"no checkpoint under {self.directory} restores: "
            + "; ".join(f"step {s}: {why}" for s, why in failed)
            + "; use a new --run-dir, or fix the config if it changed since these were written")

    def move_aside(self, step: int) -> pathlib.Path:
        """Renames step `step`'s directory to ``<step>.unrestorable`` (``.unrestorable-2`` ... if taken), which orbax
        no longer lists; returns the new path. Nothing is deleted."""
        src = self.directory / str(step)
        dst, n = src.with_name(f"{step}{UNRESTORABLE}"), 1
        while dst.exists():
            n += 1
            dst = src.with_name(f"{step}{UNRESTORABLE}-{n}")
        if jax.process_index() == 0:
            src.rename(dst)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"jaxgrpo-move-aside-{step}")
        self._manager.reload()
        return dst

    def wait(self) -> None:
        """Blocks until the last (asynchronous) save is complete and renamed into place."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager's threads."""
        self._manager.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def one_line(e: BaseException, limit: int = 240) -> str:
    """``Type: first line of the message``, cut to `limit` characters: an exception as one line of a report."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def incomplete_checkpoints(directory: str | os.PathLike) -> list[pathlib.Path]:
    """The temporary directories of saves that never completed (killed mid-save), for inspection or cleanup."""
    d = pathlib.Path(directory)
    return sorted(p for p in d.iterdir() if TMP_MARKER in p.name) if d.is_dir() else []


class PreemptionFlag:
    """Set by SIGTERM/SIGINT (after `install_signal_handlers`); the training loop polls it between steps."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def is_set(self) -> bool:
        return self._event.is_set()

    __bool__ = is_set

    def set(self, signum: int | None = None) -> None:
        self.signal = signum
        self._event.set()

    def clear(self) -> None:
        self.signal = None
        self._event.clear()

    def any_process(self) -> bool:
        """True if the flag is set on any JAX process (a collective: every process must call it at the same step)."""
        if jax.process_count() == 1:
            return self.is_set()
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.asarray([self.is_set()], np.int32))
        return bool(np.asarray(flags).any())

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.is_set():
            # Second Ctrl-C: the user wants out now, not after the next checkpoint.
            self.uninstall()
            raise KeyboardInterrupt
        self.set(signum)

    def uninstall(self) -> None:
        """Puts back the handlers that were installed before."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


def install_signal_handlers(signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> PreemptionFlag:
    """Routes `signals` to a fresh PreemptionFlag instead of their default action (termination).

    Must be called from the main thread (Python delivers signals there). Call `flag.uninstall()` to restore the
    previous handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("install_signal_handlers must be called from the main thread (Python's signal rule)")
    flag = PreemptionFlag()
    for signum in signals:
        flag._previous[signum] = signal.signal(signum, flag._handle)
    return flag


class Preempted(Exception):
    """A run stopped by a signal after checkpointing `step`; `exit_code` is the shell's ``128 + signum``."""

    def __init__(self, signum: int, step: int, run_dir: str | os.PathLike):
        self.signum, self.step, self.run_dir = int(signum), int(step), pathlib.Path(run_dir)
        self.exit_code = 128 + self.signum
        name = signal.Signals(self.signum).name
        super().__init__(f"stopped by {name} after step {step} (checkpoint saved); resume with: python -m "
                         f"jaxgrpo.train --config {self.run_dir / 'config.yaml'} --run-dir {self.run_dir}")

