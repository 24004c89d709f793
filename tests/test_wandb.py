# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Weights & Biases logging (log.wandb) in offline mode: the metrics, config and run name land in wandb's own run
file, read back here with an independent parser of its framing (wandb's ``.wandb`` transaction log: the LevelDB log
format, 32 KiB blocks of ``crc32c u32, length u16, type u8, payload`` chunks after a 7-byte ``:W&B`` header) and
wandb's own protobuf schema (``wandb_internal_pb2.Record``); a resumed run continues under the same run id; a
missing package is a one-line error naming the fix."""

import importlib.util
import json
import math
import pathlib
import struct
import sys
import time

import jax.numpy as jnp
import pytest
from wandb.proto import wandb_internal_pb2

from jaxgrpo import config as config_lib
from jaxgrpo import metrics_log as ml
from jaxgrpo import trainer

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_wandb_file(path: pathlib.Path) -> list:
    """The `Record` protobufs of a ``run-<id>.wandb`` file, in order."""
    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), data[:7]
    pos, records, pending = 7, [], b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            records.append(rec)
            pending = b""
    return records


def finished_records(path: pathlib.Path, timeout: float = 60.0) -> list:
    """The records of a finished run's file: wandb's service process writes it on its own, so the last chunks may
    land shortly after ``finish()`` returns; wait for the run's ``exit`` record."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_wandb_file(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def run_files(root: pathlib.Path) -> list[pathlib.Path]:
    """The ``.wandb`` files of every offline run under root/wandb, oldest run first."""
    return sorted((root / "wandb").glob("offline-run-*/run-*.wandb"), key=lambda p: p.parent.name)


def history(records) -> dict[int, dict]:
    """step -> {key: value} of the history records (wandb stores values as JSON)."""
    out: dict[int, dict] = {}
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            row: dict = {}
            for item in rec.history.item:  # a nested value is one item per leaf: nested_key ["samples", "nrows"]
                *parents, leaf = list(item.nested_key) or [item.key]
                node = row
                for k in parents:
                    node = node.setdefault(k, {})
                node[leaf] = json.loads(item.value_json)
            out.setdefault(int(row.pop("_step")), {}).update(row)
    return out


def run_record(records):
    return next(r.run for r in records if r.WhichOneof("record_type") == "run")


def config_items(records) -> dict:
    """The run's config: the run record's, updated by any later config records."""
    items = [i for i in run_record(records).config.update]
    items += [i for r in records if r.WhichOneof("record_type") == "config" for i in r.config.update]
    return {i.key: json.loads(i.value_json) for i in items}


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)


def test_metrics_config_and_samples_land_in_the_offline_run(tmp_path, offline):
    run_dir = tmp_path / "my-run"
    with ml.MetricsLogger(run_dir, tensorboard=False, wandb=True, wandb_project="proj",
                          wandb_config={"algo": {"estimator": "grpo"}, "seed": 3}) as log:  # fmt: skip
        log.log(1, {"reward/mean": 0.25, "loss": jnp.float32(-1.5)})
        log.log(2, {"reward/mean": 0.5, "loss": math.nan})
        log.log_samples(2, ["3+4=7", "3+4=8"], rewards=[1.0, 0.0])
    run_id = (run_dir / ml.WANDB_ID_FILE).read_text().strip()
    (path,) = run_files(run_dir)  # under the run directory: WANDB_DIR is not set
    assert path.name == f"run-{run_id}.wandb"
    records = finished_records(path)
    run = run_record(records)
    assert (run.run_id, run.display_name, run.project) == (run_id, "my-run", "proj")
    assert config_items(records)["algo"] == {"estimator": "grpo"} and config_items(records)["seed"] == 3
    steps = history(records)
    assert steps[1]["reward/mean"] == 0.25 and steps[1]["loss"] == -1.5
    assert steps[2]["reward/mean"] == 0.5 and math.isnan(steps[2]["loss"])  # wandb writes NaN as JSON NaN
    assert steps[2]["samples"]["_type"] == "table-file" and steps[2]["samples"]["nrows"] == 2


def test_resumed_logger_continues_the_same_run_and_honours_wandb_dir(tmp_path, offline, monkeypatch):
    run_dir = tmp_path / "run"
    with ml.MetricsLogger(run_dir, tensorboard=False, wandb=True) as log:
        log.log(1, {"x": 1.0})
        log.log(2, {"x": 2.0})
    elsewhere = tmp_path / "wandb-files"
    elsewhere.mkdir()
    monkeypatch.setenv("WANDB_DIR", str(elsewhere))
    with ml.MetricsLogger(run_dir, tensorboard=False, wandb=True, resume_step=1) as log:
        log.log(2, {"x": 2.0})
        log.log(3, {"x": 3.0})
    (first,), (second,) = run_files(run_dir), run_files(elsewhere)
    assert first.name == second.name  # the same run id
    assert {s: h["x"] for s, h in history(finished_records(first)).items()} == {1: 1.0, 2: 2.0}
    assert {s: h["x"] for s, h in history(finished_records(second)).items()} == {2: 2.0, 3: 3.0}


def test_missing_wandb_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(config_lib.ConfigError, match=r"pip install 'jaxgrpo\[wandb\]'"):
        ml.MetricsLogger(tmp_path, tensorboard=False, wandb=True)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    with pytest.raises(config_lib.ConfigError, match=r"log.wandb=true needs the wandb package: pip install"):
        config_lib.load_config("default", ["log.wandb=true"])


@pytest.mark.slow
def test_training_run_logs_to_wandb_and_a_resume_keeps_the_run(tmp_path, offline):
    small = ["rollout.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=2", "checkpoint.every=1",
             "log.progress=false", "log.tensorboard=false", "log.sample_every=0", "log.wandb=true",
             "log.wandb_project=jaxgrpo-test"]  # fmt: skip
    run_dir = tmp_path / "demo-run"
    cfg = config_lib.load_config("default", [*small, "train.steps=1"])
    trainer.run(cfg, run_dir)
    trainer.run(config_lib.load_config("default", [*small, "train.steps=2"]), run_dir)  # resumes from step 1
    first, second = run_files(run_dir)
    assert first.name == second.name
    recs = ml.read_metrics(run_dir)
    for path, step in ((first, 1), (second, 2)):
        records = finished_records(path)
        assert run_record(records).display_name == "demo-run"
        logged = history(records)
        assert list(logged) == [step]
        assert logged[step]["reward/mean"] == pytest.approx(recs[step - 1]["reward/mean"])
    config = config_items(finished_records(first))
    assert config["algo"] == config_lib.to_dict(cfg)["algo"] and config["train"]["steps"] == 1
