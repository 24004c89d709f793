# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""notebooks/degeneracy.ipynb runs top to bottom against the committed results (benchmarks/results/degeneracy), with
nbclient and the current interpreter's ipykernel ("python3" kernel spec), so the figures of docs/degeneracy.md cannot
rot: a broken cell, a renamed result column or a missing result file fails this test."""

from __future__ import annotations

import pathlib

import nbclient
import nbformat

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "degeneracy.ipynb"
RESULTS = REPO / "benchmarks" / "results" / "degeneracy"


def test_degeneracy_notebook_executes(monkeypatch, tmp_path):
    for f in ("synthetic/base.json", "synthetic/runs.csv", "synthetic/curves.csv", "synthetic/jensen_tiny.json",
              "jensen.json",
              "real/curves.csv", "real/summary.json", "real/base_success.json", "real/base_heldout.json",
              "real/base_retain.json", "real/grid_summary.json", "real/grid_curves.csv",
              "real2/claims.json", "real2/power.json", "real2/first_edition_audit.json"):
        assert (RESULTS / f).is_file(), f"committed result {f} is missing"
    monkeypatch.setenv("DEGENERACY_RESULTS", str(RESULTS))
    monkeypatch.setenv("DEGENERACY_FIGS", str(tmp_path))  # exercise the PNG export without touching docs/
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "runs: regimes" in outputs and "| regime | estimator |" in outputs
    assert "| G | arm | seeds | held-out accuracy |" in outputs and "| base model |" in outputs
    assert "too hard: level 3" in outputs and "| arm | seeds | steps with every group degenerate |" in outputs
    assert "| claim | cond | a > b |" in outputs and "| H1-lora-sign-dr_grpo |" in outputs  # second edition
    assert "| H5-m8-grpo | m8 | grpo:measured > grpo:iid | train_jensen_gap |" in outputs
    # the per-cell table follows the runner's CONDITIONS: hardpool's arms, no skip arm in hard (amendment 5)
    assert "| hardpool | grpo | 10 / 10 |" in outputs and "| hard | grpo_skip |" not in outputs
    assert "| retention: own start -> budget |" in outputs and " -> 0.9" in outputs  # amendment 8's own start
    for name in ("reward_curves", "collapse_split", "jensen", "real", "real_grid", "real_retention", "real2_claims"):
        assert (tmp_path / f"degeneracy_{name}.png").stat().st_size > 10_000, name
