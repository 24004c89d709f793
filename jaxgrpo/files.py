# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""File-system helpers shared by the loaders and exporters; imports nothing of the package."""

from __future__ import annotations

import functools
import os
from typing import Any


def user_mode(*paths: str | os.PathLike) -> None:
    """Gives files the mode the user's umask asks for (``0o666 & ~umask``), as ``open`` would: safetensors creates
    its files 0600, which other users and tools (a serving process, a copy job) then cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    for p in paths:
        os.chmod(p, 0o666 & ~umask)


def gguf_reader(path: str | os.PathLike) -> Any:
    """A `gguf.GGUFReader` of ``path``, parsed once per process and file version.

    The reader builds a NumPy view per metadata element; for a vocabulary of 49k tokens and their merges that is ~7 s
    of CPU, and the model loader, the tokenizer and the compile tool each read the same file. The reader is read-only
    (its tensors are ``mode="r"`` memory maps), so sharing one is safe; a rewritten file (other size or mtime) is parsed
    again."""
    st = os.stat(path)
    return _gguf_reader(os.path.realpath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _gguf_reader(path: str, size: int, mtime_ns: int) -> Any:
    import gguf

    return gguf.GGUFReader(path)


def output_dir_error(path: str | os.PathLike | None, flag: str) -> str | None:
    """The one-line error for an output directory ``path`` (given by ``flag``) a command cannot write into, checked
    before any work: a file of that name, or a parent that is a file. None when it can be created or is a directory."""
    if path is None:
        return None
    p = os.path.abspath(os.fspath(path))
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent
    if not os.path.isdir(p):
        return f"{flag} {os.fspath(path)}: {p} is a file, not a directory; name a directory (new or existing)"
    if not os.access(p, os.W_OK):
        return f"{flag} {os.fspath(path)}: {p} is not writable; name a directory you can write to"
    return None
