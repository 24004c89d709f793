# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The decoder layer and the one scan over the stacked layers (being written)."""

from __future__ import annotations

from typing import Literal

RematPolicy = Literal["none", "projections", "full"]
MatmulBackward = Literal["auto", "explicit", "xla"]
