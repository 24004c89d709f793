# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`python -m jaxgrpo.train [--config FILE] [--run-dir DIR] [section.key=value ...]`: the GRPO trainer.

With no arguments it runs `configs/default.yaml`, an offline demo that trains a small model of our Llama family
from scratch on a synthetic arithmetic task. Re-running with the same `--run-dir` resumes from its latest checkpoint.
"""

from __future__ import annotations

import sys
import time

from jaxgrpo import config as config_lib


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        config_path, run_dir, overrides = config_lib.parse_cli(argv)
        cfg = config_lib.load_config(config_path, overrides)
    except config_lib.ConfigError as e:
        return config_lib.cli_error(str(e))
    if run_dir is None:
        run_dir = f"runs/{config_lib.config_name(config_path)}-{time.strftime('%Y%m%d-%H%M%S')}"
    from jaxgrpo import trainer  # after config validation: a bad key fails fast, before JAX starts

    print(f"jaxgrpo: run directory {run_dir}", file=sys.stderr)
    try:
        trainer.run(cfg, run_dir)
    except config_lib.ConfigError as e:
        return config_lib.cli_error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
