# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""A sandboxed Python runner for code tools and code rewards: whatever the code does, the caller goes on.

`run_python(code)` runs the code in a separate process and returns its (capped) output. The layers, each used
where the OS allows it (`isolation()` reports which are active on this machine):

* **Process**: a new session, and a launcher between the caller and the code, so killing "the parent" or "the
  parent's process group" hits the sandbox, never the caller. At the end the whole session is killed.
* **Namespaces** (``unshare -r -m -n -p --fork --kill-child``, util-linux, unprivileged user namespaces): no network
  (an empty network namespace), its own PID namespace (every process the code started dies with it, and signals to
  ``-1`` reach only the sandbox), and a mount namespace in which every mount is re-mounted read-only except the
  temporary working directory: writing outside it fails. Without ``unshare`` none of these hold (documented; code
  then runs with the caller's network and file permissions: run the trainer as an unprivileged user, or use a
  SandboxFusion-style server).
* **Resource limits** (``resource.setrlimit``): RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space), RLIMIT_FSIZE
  (largest file written), RLIMIT_NPROC (processes; the kernel ignores it for root), RLIMIT_CORE 0.
* **Process count for root**: where ``/sys/fs/cgroup/pids`` (v1) is writable, a pids cgroup with ``pids.max``
  bounds a fork bomb even for root; its processes are killed and the cgroup removed at the end.
* **Wall clock and output**: killed after ``wall_seconds``; stdout and stderr are each read up to
  ``output_bytes``, and the code is killed as soon as it writes more.

`code_reward` scores a completion's code block by running it with a test program appended (1.0 when it exits 0).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

_PIDS_CGROUP = "/sys/fs/cgroup/pids"
_UNSHARE = ("unshare", "-r", "-m", "-n", "-p", "--fork", "--kill-child", "--")

# Runs inside the sandbox (pid 1 of its namespace when unshare is used): join the cgroup, set limits, make every
# mount but the work directory read-only, then fork the code (so its "parent" is this launcher) and relay its status.
_LAUNCHER = r"""
import ctypes, json, os, resource, runpy, signal, sys
cfg = json.loads(sys.argv[1])
if cfg["cgroup"]:
    with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w") as f:
        f.write("0")
for name, value in cfg["limits"].items():
    try:
        resource.setrlimit(getattr(resource, name), (value, value))
    except (ValueError, OSError):
        pass
work = cfg["work"]
if cfg["readonly"]:
    libc = ctypes.CDLL(None, use_errno=True)
    BIND, REMOUNT, RDONLY, REC = 4096, 32, 1, 16384
    FLAGS = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
    if libc.mount(work.encode(), work.encode(), None, BIND | REC, None) != 0:
        sys.exit("sandbox: cannot bind the work directory")
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for m in mounts:
        target = m[4].encode().decode("unicode_escape")
        if target == work:
            continue
        extra = sum(FLAGS.get(o, 0) for o in m[5].split(","))
        libc.mount(None, target.encode(), None, REMOUNT | BIND | RDONLY | extra, None)
os.chdir(work)
os.environ.update(HOME=work, TMPDIR=work, PWD=work)
pid = os.fork()
if pid == 0:
    sys.argv = ["main.py"]
    sys.path.insert(0, work)
    runpy.run_path("main.py", run_name="__main__")
    sys.exit(0)
while True:
    try:
        done, status = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    if done == pid:
        code = os.waitstatus_to_exitcode(status)
        sys.stdout.flush()
        os._exit(code if code >= 0 else 128 - code)
"""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. ``network=True`` skips only the network namespace."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 5
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    max_processes: int = 32
    output_bytes: int = 64 << 10
    network: bool = False


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """``returncode`` is the code's exit status (128 + n when killed by signal n), None when the sandbox killed it."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool = False
    output_truncated: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_truncated


@functools.cache
def isolation() -> dict[str, bool]:
    """Which layers work on this machine: ``namespaces`` (unshare), ``pids_cgroup``, ``nproc_limit``."""
    ns = False
    if shutil.which("unshare"):
        try:
            ns = subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ns = False
    cg = os.geteuid() == 0 and os.access(_PIDS_CGROUP, os.W_OK)
    return {"namespaces": ns, "pids_cgroup": cg, "nproc_limit": os.geteuid() != 0}


def _make_cgroup(max_processes: int) -> str | None:
    if not isolation()["pids_cgroup"]:
        return None
    path = os.path.join(_PIDS_CGROUP, f"jaxgrpo-sandbox-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(max_processes + 2))  # + the launcher and unshare
        return path
    except OSError:
        return None


def _kill_cgroup(path: str | None) -> None:
    if path is None:
        return
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
    try:
        os.rmdir(path)
    except OSError:
        pass


def _reader(stream, cap: int, out: list[bytes], over: threading.Event) -> None:
    size = 0
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            return
        if size < cap:
            out.append(chunk[: cap - size])
        size += len(chunk)
        if size > cap:
            over.set()
            return


def run_python(code: str, limits: SandboxLimits | None = None, files: dict[str, str] | None = None) -> SandboxResult:
    """Runs ``code`` as ``main.py`` in a fresh temporary directory (with ``files``: name -> text) under ``limits``."""
    limits = limits or SandboxLimits()
    work = os.path.realpath(tempfile.mkdtemp(prefix="jaxgrpo-sandbox-"))
    cgroup = _make_cgroup(limits.max_processes)
    try:
        for name, text in {**(files or {}), "main.py": code}.items():
            path = os.path.realpath(os.path.join(work, name))
            if not path.startswith(work + os.sep):
                raise ValueError(f"sandbox file name {name!r} leaves the work directory")
            with open(path, "w") as f:
                f.write(text)
        iso = isolation()
        rl = {"RLIMIT_CPU": int(limits.cpu_seconds), "RLIMIT_AS": int(limits.memory_bytes),
              "RLIMIT_FSIZE": int(limits.file_bytes), "RLIMIT_CORE": 0}  # fmt: skip
        if iso["nproc_limit"]:  # counts all of the user's processes: allow the ones already running
            rl["RLIMIT_NPROC"] = _user_processes() + limits.max_processes
        cfg = {"cgroup": cgroup, "limits": rl, "work": work, "readonly": iso["namespaces"]}
        prefix = list(_UNSHARE) if iso["namespaces"] else []
        if prefix and limits.network:
            prefix.remove("-n")
        cmd = [*prefix, sys.executable, "-I", "-c", _LAUNCHER, json.dumps(cfg)]
        return _run(cmd, work, limits)
    finally:
        _kill_cgroup(cgroup)
        shutil.rmtree(work, ignore_errors=True)


def _user_processes() -> int:
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n += os.stat(f"/proc/{pid}").st_uid == uid
            except OSError:
                pass
    return n


def _run(cmd: list[str], work: str, limits: SandboxLimits) -> SandboxResult:
    env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    over = threading.Event()
    outs: tuple[list[bytes], list[bytes]] = ([], [])
    readers = [threading.Thread(target=_reader, args=(s, limits.output_bytes, o, over), daemon=True)
               for s, o in zip((proc.stdout, proc.stderr), outs)]  # fmt: skip
    for r in readers:
        r.start()
    timed_out = False
    deadline = t0 + limits.wall_seconds
    while proc.poll() is None:
        if over.is_set():
            break
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(0.005)
    killed = proc.poll() is None
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session: the code and anything it started (no PID namespace)
    except OSError:
        pass
    proc.wait()
    for r in readers:
        r.join(timeout=1.0)
    for s in (proc.stdout, proc.stderr):
        s.close()
    text = [b"".join(o).decode("utf-8", "replace") for o in outs]
    return SandboxResult(stdout=text[0], stderr=text[1], returncode=None if killed else proc.returncode,
                         timed_out=timed_out, output_truncated=over.is_set(),
                         seconds=time.monotonic() - t0)  # fmt: skip


_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str | None:
    """The last fenced code block of a completion (```python ... ```), or None."""
    blocks = _CODE_BLOCK.findall(completion)
    return blocks[-1] if blocks else None


def code_reward(completion: str, tests: str, limits: SandboxLimits | None = None) -> float:
    """1.0 when the completion's last code block followed by ``tests`` (e.g. asserts) exits 0 in the sandbox
    within the limits, else 0.0 (no code block, an exception, a timeout, too much output)."""
    code = extract_code(completion)
    if code is None:
        return 0.0
    return float(run_python(code + "\n\n" + tests, limits).ok)


def python_tool(limits: SandboxLimits | None = None):
    """A tool function running Python in the sandbox (its stdout, or the error), for ``data.tools`` wrappers."""

    def python(code: str) -> str:
        """Run a Python program in a sandbox and return what it prints.

        Args:
            code: The Python program; print the values you want to see.
        """
        r = run_python(code, limits)
        if r.timed_out:
            return "Error: the program ran out of time."
        out = r.stdout + ("\n[output truncated]" if r.output_truncated else "")
        if r.returncode not in (0, None):
            return f"{out}\nError (exit status {r.returncode}):\n{r.stderr[-2000:]}".strip()
        return out

    return python
