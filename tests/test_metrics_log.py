# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.metrics_log: strict-JSON metrics lines (NaN → null), scalar conversion of NumPy/JAX values,
resume truncation (no duplicate steps, torn last line dropped), TensorBoard events read back with an independent
TFRecord parser, the progress bar's fields, samples, and the errors for bad input."""

import io
import json
import math
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from jaxgrpo import metrics_log as ml


def read_events(run_dir):
    """All TensorBoard events under run_dir/tb, parsed from the TFRecord framing (u64 length, u32 crc, payload,
    u32 crc) written by tensorboardX; returns a list per file, files in order of their first event's time."""
    files = sorted((run_dir / ml.TB_DIR).glob("events.out.tfevents.*"))
    out = []
    for f in files:
        data, pos, events = f.read_bytes(), 0, []
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos : pos + 8])
            ev = event_pb2.Event()
            ev.ParseFromString(data[pos + 12 : pos + 12 + n])
            events.append(ev)
            pos += 12 + n + 4
        out.append(events)
    return sorted(out, key=lambda evs: evs[0].wall_time)


def scalars(events):
    return {
        (v.tag, ev.step): v.simple_value
        for ev in events
        if ev.HasField("summary")
        for v in ev.summary.value
        if v.WhichOneof("value") == "simple_value"
    }


def test_log_writes_strict_json_and_tensorboard(tmp_path):
    with ml.MetricsLogger(tmp_path, tensorboard=True) as log:
        log.log(
            1,
            {
                "reward/mean": np.float32(0.25),
                "loss": jnp.asarray(1.5),
                "tokens": 12,
                "flag": True,
                "kl": float("nan"),
                "grad_norm": np.inf,
                "one_elem": np.ones((1,)),
                "bf16": jnp.asarray(0.75, jnp.bfloat16),
            },
        )
        log.log(2, {"reward/mean": 0.5, "loss": -2.0})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    first = json.loads(lines[0], parse_constant=no_constants)
    assert first == {
        "step": 1,
        "reward/mean": 0.25,
        "loss": 1.5,
        "tokens": 12,
        "flag": 1,
        "kl": None,
        "grad_norm": None,
        "one_elem": 1.0,
        "bf16": 0.75,
    }
    assert isinstance(first["tokens"], int)
    recs = ml.read_metrics(tmp_path)
    assert [r["step"] for r in recs] == [1, 2]
    assert math.isnan(recs[0]["kl"]) and math.isnan(recs[0]["grad_norm"])
    assert recs[1] == {"step": 2, "reward/mean": 0.5, "loss": -2.0}

    [events] = read_events(tmp_path)
    sc = scalars(events)
    assert sc[("reward/mean", 1)] == pytest.approx(0.25)
    assert sc[("reward/mean", 2)] == pytest.approx(0.5)
    assert sc[("loss", 2)] == pytest.approx(-2.0)
    assert math.isnan(sc[("kl", 1)])  # TensorBoard itself takes NaN


def test_resume_truncates_later_steps_and_torn_line(tmp_path):
    with ml.MetricsLogger(tmp_path, tensorboard=True) as log:
        for s in range(1, 6):
            log.log(s, {"x": float(s)})
            log.log_samples(s, [f"sample {s}"], rewards=[s / 10])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "x": 6.')  # killed mid-write
    # a fresh logger refuses to mix runs
    with pytest.raises(FileExistsError, match="resume_step"):
        ml.MetricsLogger(tmp_path, tensorboard=False)
    with ml.MetricsLogger(tmp_path, tensorboard=True, resume_step=3) as log:
        assert [r["step"] for r in ml.read_metrics(tmp_path)] == [1, 2, 3]
        with pytest.raises(ValueError, match="steps must increase"):
            log.log(3, {"x": 0.0})
        log.log(4, {"x": 40.0})
        log.log_samples(4, ["again"])
    recs = ml.read_metrics(tmp_path)
    assert [(r["step"], r["x"]) for r in recs] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
    samples = ml.read_samples(tmp_path)
    assert [(s["step"], s["texts"]) for s in samples] == [
        (1, ["sample 1"]),
        (2, ["sample 2"]),
        (3, ["sample 3"]),
        (4, ["again"]),
    ]
    assert samples[0]["rewards"] == [0.1]
    # TensorBoard: the resumed writer's file starts with a SessionLog.START at step 4, which makes TensorBoard
    # discard the first run's events at steps >= 4
    first, second = read_events(tmp_path)
    starts = [ev.step for ev in second if ev.HasField("session_log") and ev.session_log.status == 1]
    assert starts == [4]
    assert scalars(second) == {("x", 4): 40.0}
    assert ("x", 5) in scalars(first)
    texts = [v.tag for ev in second if ev.HasField("summary") for v in ev.summary.value if v.tag.startswith("samp")]
    assert texts  # sample text went to TensorBoard too


def test_resume_from_zero_starts_over(tmp_path):
    with ml.MetricsLogger(tmp_path, tensorboard=False) as log:
        log.log(1, {"x": 1.0})
    with ml.MetricsLogger(tmp_path, tensorboard=False, resume_step=0) as log:
        log.log(1, {"x": 2.0})
    assert ml.read_metrics(tmp_path) == [{"step": 1, "x": 2.0}]
    with ml.MetricsLogger(tmp_path, tensorboard=False, resume_step=0) as log:  # a step-0 record starts over too
        log.log(0, {"y": 3.0})
    assert ml.read_metrics(tmp_path) == [{"step": 0, "y": 3.0}]


def test_progress_bar_shows_reward_collapse_speed(tmp_path):
    buf = io.StringIO()
    with ml.MetricsLogger(tmp_path, tensorboard=False, progress_total=10, resume_step=2, progress_file=buf) as log:
        log.log(3, {"reward/mean": 0.5, "degeneracy/collapse_rate": 0.25, "throughput/tokens_per_s": 1234.4})
        log.log_samples(3, ["the answer is 4"])
    out = buf.getvalue()
    assert "3/10" in out
    assert "reward=0.500" in out and "collapse=0.25" in out and "tok/s=1234" in out
    assert "the answer is 4" in out


def test_bad_input_errors(tmp_path):
    with ml.MetricsLogger(tmp_path, tensorboard=False) as log:
        with pytest.raises(ValueError, match=r"metric 'v' has shape \(3,\)"):
            log.log(1, {"v": np.zeros(3)})
        with pytest.raises(ValueError, match="metric 's' is a str"):
            log.log(1, {"s": "text"})
        with pytest.raises(ValueError, match="'step' is reserved"):
            log.log(1, {"step": 1})
        with pytest.raises(ValueError, match="step=-1"):
            log.log(-1, {})
        with pytest.raises(ValueError, match="texts must be a list of strings"):
            log.log_samples(1, "abc")
        with pytest.raises(ValueError, match="2 rewards for 1 texts"):
            log.log_samples(1, ["a"], rewards=[1.0, 2.0])
    with pytest.raises(ValueError, match="resume_step=-2"):
        ml.MetricsLogger(tmp_path, resume_step=-2)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        ml.read_metrics(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        ml.read_metrics(tmp_path / "missing")


def test_inactive_process_writes_nothing(tmp_path):
    with ml.MetricsLogger(tmp_path / "r", tensorboard=True, progress_total=3, active=False) as log:
        assert log.log(1, {"x": np.float32(2.0)}) == {"x": 2.0}
        log.log_samples(1, ["a"])
    assert not (tmp_path / "r").exists()


def test_a_fresh_logger_drops_a_torn_line_left_before_the_first_record(tmp_path):
    """A run killed while writing its first record leaves only a torn line; a new logger (no resume step) must not
    glue its records onto it."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/me')
    with ml.MetricsLogger(tmp_path, tensorboard=False, active=True) as logger:
        logger.log(1, {"a": 1.0})
        logger.log(2, {"a": 2.0})
    assert [r["step"] for r in ml.read_metrics(tmp_path)] == [1, 2]
