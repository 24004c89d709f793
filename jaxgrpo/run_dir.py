# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Run-directory hygiene: one trainer per directory, resumes under the config that wrote the run, no empty leftovers.

- `RunLock`: an exclusive ``flock`` on ``<run_dir>/.lock`` (which records the owner's pid) for the life of a trainer,
  so a second trainer on the same directory stops with one line. The kernel drops the lock when its process dies
  (even by SIGKILL), so a lock file left by a dead process is taken over, with one line naming that pid.
- `config_changes` / `check_resume_config`: a resume whose config differs from the run's ``config.yaml`` in anything
  but the step budget (`RESUME_FREE`: ``train.steps``, ``train.max_sampled_tokens``), logging (``log.*``) and
  ``perf.precompile`` (when programs compile, not what they compute) is a ConfigError listing the differing keys,
  unless allowed; an allowed change is appended to ``config_changes.jsonl``.
- `remove_if_empty`: a start that failed leaves no run directory holding nothing but empty folders and the lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pathlib
import shutil
import sys
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from jaxgrpo import config as config_lib
from jaxgrpo.errors import ConfigError

LOCK_FILE = ".lock"
CONFIG_FILE = "config.yaml"
CHANGES_FILE = "config_changes.jsonl"
RESUME_FREE = ("train.steps", "train.max_sampled_tokens", "log.", "perf.precompile")  # a resume may change these


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def check_path(run_dir: str | os.PathLike) -> pathlib.Path:
    """`run_dir` as a Path; ConfigError when it names something that is not a directory, or a URL (its lock,
    metrics and checkpoints are files: on a pod, a directory every worker mounts)."""
    if "://" in str(run_dir):
        raise ConfigError(f"--run-dir {run_dir}: a run directory is a filesystem path, not a URL; on a pod pass a "
                          "directory every worker mounts (NFS/Filestore, or a bucket mounted with gcsfuse)")
    path = pathlib.Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--run-dir {path} is a file, not a directory; pass a directory (new or a run's)")
    return path


class RunLock:
    """The exclusive lock of a run directory (module docstring). `acquire` raises ConfigError naming the owner's pid
    when another live process holds it. `name` picks another lock file in the directory, for a job that holds the run
    around the trainer (which takes ``.lock`` itself), e.g. the study runner's workers."""

    def __init__(self, run_dir: str | os.PathLike, name: str = LOCK_FILE):
        self.path = pathlib.Path(run_dir) / name
        self._fd: int | None = None

    def acquire(self, say: Callable[[str], None] | None = None) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            owner = self.path.read_text().strip() or "?"
            raise ConfigError(f"run directory {self.path.parent} is in use by another trainer (pid {owner}, lock "
                              f"{self.path}); wait for it to stop or pass another --run-dir") from None
        previous = os.pread(fd, 64, 0).decode(errors="replace").strip()
        if previous and previous != str(os.getpid()):
            (say or _say)(f"jaxgrpo: took over the lock of {self.path.parent} left by pid {previous}, which is gone")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Empties the lock file and drops the lock (the file stays: removing it would race a starting trainer)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __del__(self) -> None:  # a trainer dropped without close() does not keep its directory locked
        self.release()

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


# fields whose value is a mapping of the user's own keys: compared whole (a reward added at its default weight is a
# change, not a key the saved file lacks because it predates it)
_WHOLE = ("data.rewards", "data.columns", "algo.estimator_args", "train.retain")


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v and key not in _WHOLE:
            out.update(_flat(v, f"{key}."))
        else:
            out[key] = v
    return out


def config_changes(saved: Mapping[str, Any], cfg: config_lib.Config) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (saved value, new value)}`` for every key where `cfg` differs from the `saved` config mapping
    (a run's ``config.yaml``), except `RESUME_FREE`. A key the saved file lacks (written before the key existed)
    counts only when `cfg` sets it away from its default."""
    new = _flat(yaml.safe_load(config_lib.to_yaml(cfg)))  # through YAML, as the saved file went: tuples are lists
    old = _flat(config_lib.drop_retired(saved))  # a retired key at its off value is dropped, as loading drops it
    default = _flat(yaml.safe_load(config_lib.to_yaml(config_lib.Config())))
    out = {}
    for key in sorted(set(new) | set(old)):
        if key.startswith(RESUME_FREE):
            continue
        if key not in old:
            if new[key] != default.get(key):
                out[key] = (None, new[key])
        elif old[key] != new.get(key):
            out[key] = (old[key], new.get(key))
    return out


def has_checkpoint(run_dir: pathlib.Path) -> bool:
    """Whether `run_dir` holds a complete-looking checkpoint step (``checkpoints/<digits>``), read without orbax."""
    ckpts = run_dir / "checkpoints"
    return ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir())


def check_resume_config(cfg: config_lib.Config, run_dir: pathlib.Path, allow: bool) -> dict[str, tuple[Any, Any]]:
    """The changes of a resume (`config_changes` against ``<run_dir>/config.yaml``; {} when the run has no checkpoint
    or no saved config); ConfigError listing them unless `allow`."""
    path = run_dir / CONFIG_FILE
    if not has_checkpoint(run_dir) or not path.is_file():
        return {}
    try:
        saved = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML ({' '.join(str(e).split())}); restore the run's config.yaml or "
                          "pass a new --run-dir") from None
    changes = config_changes(saved, cfg)
    if changes and not allow:
        listed = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())
        raise ConfigError(f"resuming {run_dir} with a config that differs from its {CONFIG_FILE} in {listed}; resume "
                          "with the same config, use a new --run-dir, or pass --allow-config-change (recorded in "
                          f"{CHANGES_FILE})")
    return changes


def record_changes(run_dir: pathlib.Path, step: int, changes: Mapping[str, tuple[Any, Any]]) -> None:
    """Appends ``{"step", "changes": {key: [old, new]}}`` to ``<run_dir>/config_changes.jsonl``."""
    if changes:
        with open(run_dir / CHANGES_FILE, "a") as f:
            f.write(json.dumps({"step": step, "changes": {k: list(v) for k, v in changes.items()}}) + "\n")


def remove_if_empty(run_dir: pathlib.Path) -> bool:
    """Deletes `run_dir` when it holds nothing but empty folders and an empty lock file (a start that failed);
    returns whether it did."""
    if not run_dir.is_dir():
        return False
    for path in run_dir.rglob("*"):
        if path.is_file() and not (path.name == LOCK_FILE and path.stat().st_size == 0):
            return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True
