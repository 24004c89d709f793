# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`python -m jaxgrpo.train [--config FILE] [--run-dir DIR] [--allow-config-change] [section.key=value ...]`.

With no arguments it runs `configs/default.yaml`, an offline demo that trains a small model of our Llama family
from scratch on a synthetic arithmetic task. Re-running with the same `--run-dir` resumes from its newest checkpoint
that restores, under the run's own config (a change other than the step budget or logging needs
``--allow-config-change``, and is recorded in the run directory).

Exit status: 0 when the run is complete; 2 for a bad config, data, checkpoint or reward (one ``error:`` line, no
traceback; a reward failure checkpoints first); 143 after SIGTERM and 130 after SIGINT (the step in flight is
checkpointed; one line says where it stopped and how to resume). This module imports no JAX at the top level, so
``--help`` and the malloc re-execution below cost no JAX start-up.

On Linux with glibc >= 2.35, when JAX will run on the CPU, the command re-executes itself once with glibc malloc
tunables (`malloc_env`; glibc reads them only at startup), chosen by ``JAXGRPO_MALLOC``. This is a CPU-only
workaround: with an accelerator backend (``JAX_PLATFORMS`` naming one, or a CUDA/ROCm/TPU plugin installed) the
device allocator owns the large buffers and nothing is changed. Why: XLA:CPU allocates each execution's temporary
buffers (GiBs for a train step) afresh and frees them at its end; glibc serves such large blocks with ``mmap`` and
unmaps them on free, so every step first-touches all of that memory again, one kernel page fault (and page clearing) per
page, and on a VM that hands freed guest memory back to its host, a host fault per page as well. The modes change
where memory comes from, never a computed value; docs/perf-log.md has their measurements.

* ``keep`` (default): one malloc arena, no ``mmap``, no trimming (``arena_max=1:mmap_max=0:trim_threshold=2^62``),
  plus huge pages as below: freed memory stays in the process and the next step reuses it, no page faults after
  warm-up. The cost: the process keeps its peak heap for its lifetime (as the GPU allocators of JAX and PyTorch do),
  and a heap cannot shrink around live blocks, so the peak can exceed that of glibc's defaults by about one
  temporary block. Where memory is tight, use ``hugepages``.
* ``hugepages``: only ``glibc.malloc.hugetlb=1``, large allocations backed by transparent huge pages (when the
  kernel offers them): 512x fewer faults than 4 KiB pages, memory returned to the OS on free.
* ``default``: glibc's defaults (no re-execution). A ``GLIBC_TUNABLES`` that already sets a tunable keeps it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import signal
import sys
import time
from collections.abc import Mapping

from jaxgrpo.cli import SECTION_NAMES, build_parser
from jaxgrpo.errors import CheckpointError, ConfigError, RewardError, cli_error

__all__ = ["SECTION_NAMES", "build_parser", "cpu_backend", "main", "malloc_env"]

MALLOC_MODES = ("keep", "hugepages", "default")  # the first is the default
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
_HUGEPAGES = {"glibc.malloc.hugetlb": "1"}
_KEEP = {"glibc.malloc.arena_max": "1", "glibc.malloc.mmap_max": "0", "glibc.malloc.trim_threshold": str(2**62)}


def _thp_mode() -> str | None:
    """The kernel's transparent-huge-page mode ("always", "madvise", "never"), or None when it has none."""
    try:
        text = open(_THP_SETTING).read()
    except OSError:
        return None
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else None


_ACCELERATOR_PLUGINS = ("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm", "libtpu")  # distribution-name prefixes


def cpu_backend(environ: Mapping[str, str]) -> bool:
    """Whether JAX will run on the CPU, decided without importing it: ``JAX_PLATFORMS`` (or ``JAX_PLATFORM_NAME``)
    when set, else whether no accelerator plugin (CUDA, ROCm, TPU) is installed."""
    platforms = environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME")
    if platforms:
        return all(p.strip() == "cpu" for p in platforms.split(",") if p.strip())
    names = {(d.metadata["Name"] or "").lower() for d in importlib.metadata.distributions()}
    return not any(n.startswith(_ACCELERATOR_PLUGINS) for n in names)


def malloc_env(
    environ: Mapping[str, str],
    *,
    thp_mode: str | None = None,
    libc: tuple[str, str] | None = None,
    cpu: bool | None = None,
) -> dict[str, str] | None:
    """``environ`` with the glibc malloc tunables of ``environ["JAXGRPO_MALLOC"]`` (module docstring) added to
    ``GLIBC_TUNABLES``, or None when there is nothing to add: mode ``default``, an accelerator backend (``cpu``
    defaults to `cpu_backend`), not glibc >= 2.35 (``libc`` defaults to `platform.libc_ver`), or every tunable
    already set (huge pages only where ``thp_mode``, default the kernel's, is ``always`` or ``madvise``). Raises
    ValueError for an unknown mode."""
    mode = environ.get("JAXGRPO_MALLOC", MALLOC_MODES[0])
    if mode not in MALLOC_MODES:
        raise ValueError(f"JAXGRPO_MALLOC={mode!r} is not one of {MALLOC_MODES}")
    if not (cpu_backend(environ) if cpu is None else cpu):
        return None
    name, version = libc if libc is not None else platform.libc_ver()
    try:
        new_enough = name == "glibc" and tuple(int(x) for x in version.split(".")[:2]) >= (2, 35)
    except ValueError:
        new_enough = False
    if mode == "default" or not new_enough:
        return None
    want = dict(_HUGEPAGES) if (thp_mode if thp_mode is not None else _thp_mode()) in ("always", "madvise") else {}
    if mode == "keep":
        want.update(_KEEP)
    tunables = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]
    present = {t.split("=")[0] for t in tunables}
    add = [f"{k}={v}" for k, v in want.items() if k not in present]
    if not add:
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(tunables + add)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_intermixed_args(list(argv))  # --help exits here, before any JAX import
    from jaxgrpo import config as config_lib

    try:
        config_path, run_dir, overrides = config_lib.parse_cli(argv)
        cfg = config_lib.load_config(config_path, overrides)
        if run_dir is not None and os.path.exists(run_dir) and not os.path.isdir(run_dir):
            raise ConfigError(f"--run-dir {run_dir} is a file, not a directory; pass a directory (new or a run's)")
    except ConfigError as e:
        return cli_error(str(e))
    if run_dir is None:
        run_dir = f"runs/{config_lib.config_name(config_path)}-{time.strftime('%Y%m%d-%H%M%S')}"
    from jaxgrpo import checkpoint, models, trainer  # after config validation: a bad key fails fast, before JAX starts

    print(f"jaxgrpo: run directory {run_dir}", file=sys.stderr)
    if os.environ.get("GLIBC_TUNABLES"):
        print(f"jaxgrpo: GLIBC_TUNABLES={os.environ['GLIBC_TUNABLES']} (JAXGRPO_MALLOC: {', '.join(MALLOC_MODES)})",
              file=sys.stderr)  # fmt: skip
    try:
        trainer.run(cfg, run_dir, allow_config_change=args.allow_config_change)
    except checkpoint.Preempted as e:
        print(f"jaxgrpo: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:  # Ctrl-C twice: out at once, without the step's checkpoint
        print(f"jaxgrpo: interrupted (second SIGINT) before checkpointing; re-run with --run-dir {run_dir} to resume "
              "from its last checkpoint", file=sys.stderr)
        return 128 + signal.SIGINT
    except (ConfigError, RewardError, CheckpointError, models.ModelConfigError, models.CheckpointError) as e:
        return cli_error(str(e))  # (the model's: another architecture, a damaged or mismatched checkpoint)
    return 0


if __name__ == "__main__":
    try:
        _env = malloc_env(os.environ)
    except ValueError as e:
        sys.exit(cli_error(str(e)))
    if _env is not None:  # glibc reads its tunables at startup: run again with them (same PID, command line, cwd)
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], _env)
    sys.exit(main())
