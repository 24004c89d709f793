# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests of jaxgrpo.rollout.sandbox: the caller survives whatever the code does, each run bounded in time.

Hostile programs: an infinite loop (wall clock and CPU limit), huge output, a 4 GiB allocation, a file over the
size limit, writing outside the work directory, a network connection to a listener of the test, killing the parent
and the parent's process group, a fork bomb. Layers that the machine cannot provide (no unprivileged user
namespaces; root without a pids cgroup) skip only their own assertions, saying why.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile

import pytest

from jaxgrpo.rollout import sandbox as S

ISO = S.isolation()
needs_ns = pytest.mark.skipif(not ISO["namespaces"], reason="no unprivileged user namespaces (unshare -rmnp)")
FAST = S.SandboxLimits(wall_seconds=3.0, cpu_seconds=2, max_processes=16)


def sandbox_processes() -> list[int]:
    """Processes still running a sandbox launcher (its command line holds the work directory's prefix)."""
    pids = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"jaxgrpo-sandbox-" in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def test_runs_code_in_a_fresh_directory_that_is_removed():
    r = S.run_python("import os\nprint(open('data.txt').read(), os.getcwd())", FAST, files={"data.txt": "42"})
    assert r.ok and r.returncode == 0 and r.stderr == ""
    value, cwd = r.stdout.split()
    assert value == "42" and os.path.basename(cwd).startswith("jaxgrpo-sandbox-")
    assert not os.path.exists(cwd)
    with pytest.raises(ValueError, match="leaves the work directory"):
        S.run_python("pass", FAST, files={"../escape.txt": "x"})


def test_infinite_loop_is_stopped_by_the_wall_clock():
    limits = S.SandboxLimits(wall_seconds=1.0, cpu_seconds=30)
    r = S.run_python("while True:\n    pass", limits)
    assert r.timed_out and r.returncode is None and not r.ok
    assert r.seconds < limits.wall_seconds + 3.0
    assert sandbox_processes() == []


def test_cpu_limit_kills_a_busy_program():
    r = S.run_python("while True:\n    pass", S.SandboxLimits(wall_seconds=15.0, cpu_seconds=1))
    assert not r.ok
    # SIGXCPU (128 + 24) or SIGKILL at the hard limit; on a very busy machine the wall clock may come first
    assert r.timed_out or r.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL, -signal.SIGKILL)


def test_huge_output_is_capped_and_the_program_stopped():
    limits = S.SandboxLimits(wall_seconds=5.0, output_bytes=1000)
    r = S.run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stdout.flush()", limits)
    assert r.output_truncated and not r.timed_out and not r.ok
    assert r.stdout == "x" * 1000


def test_memory_and_file_size_limits():
    r = S.run_python("x = bytearray(4 << 30)", FAST)
    assert r.returncode == 1 and "MemoryError" in r.stderr
    limits = S.SandboxLimits(wall_seconds=3.0, file_bytes=1 << 16)
    r = S.run_python("open('big', 'wb').write(b'0' * (1 << 20))", limits)  # Python ignores SIGXFSZ: EFBIG
    assert r.returncode == 1 and "File too large" in r.stderr


@needs_ns
def test_writing_outside_the_work_directory_fails():
    target = os.path.join(tempfile.gettempdir(), f"jaxgrpo-outside-{os.getpid()}")
    r = S.run_python(f"open({target!r}, 'w').write('escaped')\nprint('wrote')", FAST)
    assert r.returncode == 1 and "Read-only file system" in r.stderr and "wrote" not in r.stdout
    assert not os.path.exists(target)
    r = S.run_python("open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())", FAST)
    assert r.ok and r.stdout == "ok\n"


@needs_ns
def test_no_network():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
        r = S.run_python(code, FAST)
        assert r.returncode == 1 and "connected" not in r.stdout and "Error" in r.stderr
        assert S.run_python(code, S.SandboxLimits(wall_seconds=3.0, network=True)).stdout == "connected\n"


@pytest.fixture(params=["isolated", "plain"])
def mode(request, monkeypatch):
    """Each layer set as this machine allows, or (plain) with namespaces and the cgroup turned off."""
    if request.param == "plain":
        monkeypatch.setattr(S, "isolation", lambda: {"namespaces": False, "pids_cgroup": False,
                                                     "nproc_limit": os.geteuid() != 0})  # fmt: skip
    return request.param


@pytest.mark.parametrize(
    "code",
    ["import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)",
     "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('alive')"],
    ids=["parent-group", "parent"],
)
def test_killing_its_parent_never_reaches_the_caller(code, mode):
    r = S.run_python(code, FAST)
    assert not r.timed_out  # the run ended on its own and came back
    assert os.getpgid(0) == os.getpgrp()  # this process (and its group) is alive: we are here
    assert S.run_python("print(1)", FAST).stdout == "1\n"
    assert sandbox_processes() == []


@pytest.mark.skipif(not (ISO["pids_cgroup"] or ISO["nproc_limit"]),
                    reason="root without a writable pids cgroup: no process-count limit to bound a fork bomb")
def test_fork_bomb_is_bounded_and_cleaned_up():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = S.run_python(code, S.SandboxLimits(wall_seconds=2.0, max_processes=16))
    assert r.timed_out and not r.ok
    assert sandbox_processes() == []
    if ISO["pids_cgroup"]:  # its cgroup is removed
        assert not [d for d in os.listdir(S._PIDS_CGROUP) if d.startswith("jaxgrpo-sandbox-")]
    assert S.run_python("print('after')", FAST).stdout == "after\n"


def test_code_reward_and_python_tool():
    tests = "assert add(2, 3) == 5\nassert add(-1, 1) == 0"
    good = "Here:\n```python\ndef add(a, b):\n    return a + b\n```"
    assert S.code_reward(good, tests, FAST) == 1.0
    assert S.code_reward("```python\ndef add(a, b):\n    return a - b\n```", tests, FAST) == 0.0
    assert S.code_reward("```python\ndef add(a, b):\n    while True: pass\n```", tests,
                         S.SandboxLimits(wall_seconds=1.0)) == 0.0  # fmt: skip
    assert S.code_reward("no code here", tests, FAST) == 0.0
    tool = S.python_tool(FAST)
    assert tool("print(6 * 7)") == "42\n"
    out = tool("raise ValueError('bad input')")
    assert out.startswith("Error (exit status 1)") and "ValueError: bad input" in out
