# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""File-system helpers shared by the exporters; imports nothing of the package."""

from __future__ import annotations

import os


def user_mode(*paths: str | os.PathLike) -> None:
    """Gives files the mode the user's umask asks for (``0o666 & ~umask``), as ``open`` would: safetensors creates
    its files 0600, which other users and tools (a serving process, a copy job) then cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    for p in paths:
        os.chmod(p, 0o666 & ~umask)
