# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Test helper: run a script body in two `jax.distributed` CPU processes (4 fake devices each, gloo collectives).

The body runs after ``jax.distributed.initialize`` with ``np``, ``jax``, ``pid`` (0 or 1) and ``out`` (an ``.npz``
path that process 0 writes its results to) defined, and with this tests directory importable.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np

PRELUDE = r"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4 " + os.environ.get("JAXGRPO_TEST_XLA_EXTRA", "")
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_default_matmul_precision", "highest")
port, pid, out, tests_dir = sys.argv[1:5]
pid = int(pid)
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=pid)
assert len(jax.devices()) == 8 and len(jax.local_devices()) == 4
sys.path.insert(0, tests_dir)
import numpy as np
"""

EPILOGUE = "\njax.distributed.shutdown()\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_two_processes(body: str, tmp_path: pathlib.Path, timeout: float = 600) -> dict[str, np.ndarray]:
    """Runs PRELUDE + body in two processes and returns what process 0 saved to ``out``."""
    tests_dir = pathlib.Path(__file__).resolve().parent
    script = tmp_path / "worker.py"
    script.write_text(PRELUDE + body + EPILOGUE)
    out = tmp_path / "result.npz"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tests_dir.parent), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen([sys.executable, str(script), str(port), str(i), str(out), str(tests_dir)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            logs.append(p.communicate()[0])
    assert all(p.returncode == 0 for p in procs), json.dumps([log[-3000:] for log in logs], indent=1)
    with np.load(out) as data:
        return {k: data[k] for k in data.files}
