# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Run logging: ``metrics.jsonl``, TensorBoard scalars, a progress bar, and sample completions.

Files in the run directory:

- ``metrics.jsonl``: one JSON object per logged step, ``{"step": s, "<name>": value, ...}``, appended and flushed
  line by line, so a crash loses at most the line being written. Values are Python/NumPy/JAX scalars converted to
  JSON numbers; NaN and ±inf are written as ``null`` (the file stays strict JSON, ``allow_nan=False``) and
  ``read_metrics`` turns ``null`` back into ``nan``.
- ``samples.jsonl``: one object per logged step, ``{"step": s, "texts": [...]}`` (plus ``"rewards"`` when given).
- ``tb/``: TensorBoard event files (tensorboardX): every metric as a scalar, samples as text.
- Weights & Biases (optional, ``wandb=True``; ``pip install 'jaxgrpo[wandb]'``): every metric at its step, samples as
  a table; the run is named after the run directory, its config is the resolved config, its files go to
  ``<run_dir>/wandb`` unless ``WANDB_DIR`` says otherwise, and ``WANDB_MODE`` (e.g. ``offline``) is wandb's own
  setting. The wandb run id is kept in ``<run_dir>/wandb_run_id``, so a resumed run continues the same wandb run;
  steps that wandb run already holds (logged after the checkpoint, then replayed identically) are not sent again.

Resuming. ``MetricsLogger(run_dir, resume_step=N)`` drops every line with ``step > N`` from both JSONL files (they
were written after the checkpoint the run resumes from, and will be written again; ``N = 0`` drops them all) and
tells TensorBoard to purge events after step N, so no step appears twice. A torn last line (process killed mid-
write) is dropped too. A logger opened without ``resume_step`` on a run directory whose ``metrics.jsonl`` already
holds records refuses to start rather than silently mixing two runs.

Only JAX process 0 writes (``active`` defaults to ``jax.process_index() == 0``).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import secrets
import string
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import jax
import numpy as np

from jaxgrpo.errors import ConfigError

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
TB_DIR = "tb"
WANDB_ID_FILE = "wandb_run_id"

# Shown in the progress bar's postfix when present: (metric name, short label, format).
PROGRESS_FIELDS = (
    ("reward/mean", "reward", "{:.3f}"),
    ("degeneracy/collapse_rate", "collapse", "{:.2f}"),
    ("throughput/tokens_per_s", "tok/s", "{:.0f}"),
)


def to_scalar(name: str, value: Any) -> int | float:
    """A metric value as a Python int/float. bools become 0/1; 1-element arrays their element; anything else that
    is not a real scalar raises ValueError naming the metric."""
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, int | float):
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # numpy / JAX arrays and scalars
        arr = np.asarray(value)
        if arr.size != 1:
            raise ValueError(f"metric {name!r} has shape {arr.shape}: log scalars (reduce it first)")
        item = arr.reshape(()).item()
        if isinstance(item, bool):
            return int(item)
        if isinstance(item, int | float):
            return item
    raise ValueError(f"metric {name!r} is a {type(value).__name__}: metric values must be real numbers")


def _parse_jsonl(path: pathlib.Path) -> tuple[list[dict[str, Any]], bool]:
    """(records, torn) for a JSONL file; a malformed *last* line (a write cut short) is dropped and reported as
    torn, a malformed earlier line is an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[dict[str, Any]] = []
    torn = False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "step" not in rec:
                raise ValueError("not an object with a 'step'")
        except ValueError as e:
            if i == len(lines) - 1:
                torn = True
                break
            why = f"{path}:{i + 1} is not a JSON record with a 'step' ({e})"
            raise ConfigError(f"{why}; fix or remove that line") from e
        records.append(rec)
    return records, torn


def _truncate_jsonl(path: pathlib.Path, max_step: int) -> None:
    """Rewrites `path` keeping only the records with step <= max_step (atomically: temp file + rename)."""
    if not path.exists():
        return
    records, _ = _parse_jsonl(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in records:
            if rec["step"] <= max_step:
                f.write(json.dumps(rec, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of `<run_dir>/metrics.jsonl` (or of the given .jsonl file), in file order; `null` values are
    returned as `nan`. A torn last line is skipped."""
    path = pathlib.Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: expected the metrics.jsonl written by `python -m jaxgrpo.train`")
    records, _ = _parse_jsonl(path)
    return [{k: (math.nan if v is None else v) for k, v in rec.items()} for rec in records]


def read_samples(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of `<run_dir>/samples.jsonl` ([] when no samples were logged)."""
    path = pathlib.Path(run_dir) / SAMPLES_FILE
    return _parse_jsonl(path)[0] if path.is_file() else []


class MetricsLogger:
    """Writes one step's metrics to metrics.jsonl, TensorBoard and the progress bar; see the module docstring.

    Args:
      run_dir: the run directory (created if missing).
      tensorboard: also write TensorBoard event files under `<run_dir>/tb`.
      progress_total: show a tqdm progress bar up to this many steps (None = no bar).
      resume_step: the step the run resumes from (the checkpoint's step): later records are removed; 0 = start over
        in this directory (every record is removed, a step-0 one too). None = a fresh run directory.
      progress_file: where the bar is drawn (default stderr).
      active: whether this process writes (default: JAX process 0 only).
      wandb: also log to Weights & Biases (see the module docstring), in project `wandb_project` of
        `wandb_entity` (None = the account's default), with `wandb_config` (the resolved run config) as its config.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        tensorboard: bool = True,
        progress_total: int | None = None,
        *,
        resume_step: int | None = None,
        progress_file: TextIO | None = None,
        active: bool | None = None,
        wandb: bool = False,
        wandb_project: str = "jaxgrpo",
        wandb_entity: str | None = None,
        wandb_config: Mapping[str, Any] | None = None,
    ):
        if resume_step is not None and (not isinstance(resume_step, int | np.integer) or resume_step < 0):
            raise ValueError(f"resume_step={resume_step!r}: must be None (fresh run) or an integer >= 0")
        if progress_total is not None and (not isinstance(progress_total, int | np.integer) or progress_total < 0):
            raise ValueError(f"progress_total={progress_total!r}: must be None (no bar) or an integer >= 0")
        if active is None:
            active = jax.process_index() == 0
        self.active = bool(active)
        self.run_dir = pathlib.Path(run_dir)
        self.metrics_path = self.run_dir / METRICS_FILE
        self.samples_path = self.run_dir / SAMPLES_FILE
        self.last_step = -1 if not resume_step else int(resume_step)  # None or 0: nothing logged yet
        self._writer = None
        self._bar = None
        self._wandb: Any = None
        self._metrics_f = self._samples_f = None
        if not self.active:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            if self.metrics_path.exists():
                existing, _ = _parse_jsonl(self.metrics_path)
                if existing:
                    raise FileExistsError(
                        f"{self.metrics_path} already holds {len(existing)} records (last step "
                        f"{existing[-1]['step']}): pass resume_step=<checkpoint step> to continue that run (0 to "
                        "start it over), or use a new run directory"
                    )
            # no records: what is there is at most a torn line of a run killed before its first record ended
            _truncate_jsonl(self.metrics_path, -1)
            _truncate_jsonl(self.samples_path, -1)
        else:
            _truncate_jsonl(self.metrics_path, self.last_step)
            _truncate_jsonl(self.samples_path, self.last_step)
        self._metrics_f = open(self.metrics_path, "a", encoding="utf-8")
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = None if resume_step is None else self.last_step + 1
            # tensorboardX names files by the second; the suffix keeps a quick resume from overwriting the last file
            self._writer = SummaryWriter(
                str(self.run_dir / TB_DIR),
                purge_step=purge,
                flush_secs=30,
                filename_suffix=f".{os.getpid()}.{time.time_ns()}",
            )
        if wandb:
            self._wandb = start_wandb(self.run_dir, wandb_project, wandb_entity, wandb_config)
        if progress_total is not None:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=int(progress_total),
                initial=max(self.last_step, 0),
                unit="step",
                dynamic_ncols=True,
                file=progress_file if progress_file is not None else sys.stderr,
                desc="train",
            )

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, int | float]:
        """Records `metrics` (name → scalar) for `step`; steps must increase. Returns the converted values."""
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"step={step!r}: steps are integers >= 0")
        step = int(step)
        if step <= self.last_step:
            raise ValueError(
                f"step {step} logged after step {self.last_step}: steps must increase (a resumed run must pass "
                "resume_step to MetricsLogger)"
            )
        if "step" in metrics:
            raise ValueError("'step' is reserved for the step number: rename that metric")
        host = jax.device_get(dict(metrics))  # one transfer for all device scalars
        values = {str(k): to_scalar(str(k), v) for k, v in host.items()}
        self.last_step = step
        if not self.active:
            return values
        record = {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in values.items()}}
        self._metrics_f.write(json.dumps(record, allow_nan=False) + "\n")
        self._metrics_f.flush()
        if self._writer is not None:
            for k, v in values.items():
                self._writer.add_scalar(k, float(v), step)
        if self._wandb is not None and step >= self._wandb.step:  # on resume: skip steps the run already holds
            self._wandb.log(values, step=step)
        if self._bar is not None:
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
            post = {label: fmt.format(values[name]) for name, label, fmt in PROGRESS_FIELDS if name in values}
            self._bar.set_postfix(post, refresh=True)
        return values

    def log_samples(self, step: int, texts: Sequence[str], rewards: Sequence[float] | None = None) -> None:
        """Records sample completions (and optionally their rewards) for `step` in samples.jsonl and TensorBoard."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts must be a list of strings (decoded completions)")
        record: dict[str, Any] = {"step": int(step), "texts": list(texts)}
        if rewards is not None:
            if len(rewards) != len(texts):
                raise ValueError(f"{len(rewards)} rewards for {len(texts)} texts: give one reward per text")
            record["rewards"] = [None if not math.isfinite(r) else float(r) for r in map(float, rewards)]
        if not self.active:
            return
        if self._samples_f is None:
            self._samples_f = open(self.samples_path, "a", encoding="utf-8")
        self._samples_f.write(json.dumps(record, allow_nan=False) + "\n")
        self._samples_f.flush()
        if self._writer is not None:
            parts = []
            for i, t in enumerate(texts):
                head = f"**{i}**" + (f" (reward {record['rewards'][i]})" if rewards is not None else "")
                parts.append(head + "\n\n    " + t.replace("\n", "\n    "))
            self._writer.add_text("samples", "\n\n".join(parts), int(step))
        if self._wandb is not None and int(step) >= self._wandb.step:
            import wandb

            columns = ["text", "reward"] if rewards is not None else ["text"]
            rows = [[t, record["rewards"][i]] if rewards is not None else [t] for i, t in enumerate(texts)]
            self._wandb.log({"samples": wandb.Table(columns=columns, data=rows)}, step=int(step))
        if self._bar is not None and texts:
            self._bar.write(f"[step {int(step)}] sample: {texts[0][:160]!r}", file=self._bar.fp)

    def close(self) -> None:
        """Flushes and closes the files, the TensorBoard writer and the bar."""
        for f in (self._metrics_f, self._samples_f):
            if f is not None:
                f.close()
        self._metrics_f = self._samples_f = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def start_wandb(run_dir: pathlib.Path, project: str, entity: str | None, config: Mapping[str, Any] | None) -> Any:
    """A wandb run for `run_dir`: named after it, resumed under the id kept in ``<run_dir>/wandb_run_id`` (written on
    the first start), files under ``<run_dir>/wandb`` unless ``WANDB_DIR`` is set."""
    try:
        import wandb
    except ImportError as e:
        raise ConfigError("log.wandb=true needs the wandb package: pip install 'jaxgrpo[wandb]' "
                          "(or set log.wandb=false)") from e
    id_path = run_dir / WANDB_ID_FILE
    run_id = id_path.read_text(encoding="utf-8").strip() if id_path.is_file() else ""
    if not run_id:
        run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # wandb's id form
        id_path.write_text(run_id + "\n", encoding="utf-8")
    return wandb.init(project=project, entity=entity, name=run_dir.name, id=run_id, resume="allow",
                      config=dict(config) if config is not None else None,
                      dir=os.environ.get("WANDB_DIR") or str(run_dir))
