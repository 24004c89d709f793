# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`Example`: one task, the unit that datasets yield and reward functions judge (``fn(completion, example)``)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Example:
    """One prompt with its gold answer; `meta` carries provenance (source, index, ...) for error messages/logs."""

    prompt: str
    answer: str
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
