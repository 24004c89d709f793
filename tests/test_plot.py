# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.plot: PNGs from a synthetic metrics.jsonl are real images (PNG signature, IHDR size, not blank),
panels without metrics are skipped, the moving average matches hand-computed values, and the command's exit codes."""

import json
import os
import pathlib
import struct
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from jaxgrpo import plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir: pathlib.Path, steps: int = 30, with_kl: bool = True) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            p = s / steps
            rec = {
                "step": s,
                "reward/mean": p,
                "reward/std": 0.1,
                "degeneracy/all_fail": (1 - p) ** 8,
                "degeneracy/all_pass": p**8,
                "degeneracy/collapse_rate": (1 - p) ** 8 + p**8,
                "degeneracy/iid_rate": (1 - p) ** 8 + p**8,
                "completion/len_mean": 10 + s,
                "completion/truncated_frac": 0.1,
            }
            if with_kl:
                rec["kl"] = None if s == 5 else 0.01 * s  # a NaN logged as null must not break the plot
            f.write(json.dumps(rec) + "\n")


def assert_png(path: pathlib.Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 300 and height >= 200
    assert len(data) > 5_000
    img = matplotlib.image.imread(path)
    assert img.shape[:2] == (height, width)
    assert float(np.std(img[..., :3])) > 0.01  # something was drawn


def test_plot_run_writes_valid_pngs(tmp_path):
    write_run(tmp_path / "run")
    paths = plot.plot_run(tmp_path / "run", tmp_path / "out")
    names = sorted(p.name for p in paths)
    assert names == ["collapse.png", "completion_length.png", "kl.png", "overview.png", "reward.png"]
    for p in paths:
        assert p.parent == tmp_path / "out"
        assert_png(p)


def test_missing_panel_is_skipped(tmp_path):
    write_run(tmp_path / "run", steps=5, with_kl=False)
    paths = plot.plot_run(tmp_path / "run")  # default output: RUN_DIR/plots
    assert sorted(p.name for p in paths) == ["collapse.png", "completion_length.png", "overview.png", "reward.png"]
    assert all(p.parent == tmp_path / "run" / "plots" for p in paths)


def test_diversity_and_retain_panels(tmp_path):
    write_run(tmp_path / "run", steps=6)
    path = tmp_path / "run" / "metrics.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    for r in recs:
        r["diversity/distinct_frac"], r["diversity/entropy"] = 1 - r["step"] / 12, 2.0 / r["step"]
        if r["step"] % 3 == 0:
            r["retain/easy/accuracy"], r["retain/gsm8k/accuracy"] = 0.5, 0.1 * r["step"] / 3
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    paths = {p.name: p for p in plot.plot_run(tmp_path / "run", tmp_path / "out")}
    assert {"diversity.png", "retain.png", "overview.png"} <= set(paths)
    for name in ("diversity.png", "retain.png"):
        assert_png(paths[name])
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    assert plot.PANELS["retain"](ax, recs)
    assert sorted(line.get_label() for line in ax.get_lines()) == ["easy", "gsm8k"]
    np.testing.assert_allclose(ax.get_lines()[1].get_ydata(), [0.1, 0.2])
    plt.close(fig)


def test_moving_average_and_series_by_hand():
    y = np.array([1.0, 3.0, np.nan, 5.0, 7.0])
    # window 2, trailing, nan ignored: [1, (1+3)/2, 3, 5, (5+7)/2]
    np.testing.assert_allclose(plot.moving_average(y, 2), [1.0, 2.0, 3.0, 5.0, 6.0])
    steps, vals = plot.series([{"step": 1, "a": 1.0}, {"step": 2}, {"step": 3, "a": None}], "a")
    np.testing.assert_array_equal(steps, [1.0, 3.0])
    assert vals[0] == 1.0 and np.isnan(vals[1])


def test_empty_metrics_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty metrics.jsonl"):
        plot.plot_run(tmp_path)
    assert plot.main([str(tmp_path)]) == 2


def run_cli(*args: str) -> subprocess.CompletedProcess:
    repo = str(pathlib.Path(plot.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run(
        [sys.executable, "-m", "jaxgrpo.plot", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_command_exit_codes(tmp_path):
    write_run(tmp_path / "run", steps=4)
    ok = run_cli(str(tmp_path / "run"), "--out", str(tmp_path / "pngs"))
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert (tmp_path / "pngs" / "overview.png").exists()
    assert str(tmp_path / "pngs" / "reward.png") in ok.stdout


def test_missing_file_exits_2(tmp_path, capsys):
    assert plot.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl" in err and "not found" in err


def test_out_naming_a_file_exits_2_in_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert plot.main([str(tmp_path), "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err == f"jaxgrpo.plot: error: --out {afile}: {afile} is a file, not a directory; name a directory (new " \
                  "or existing)\n"
