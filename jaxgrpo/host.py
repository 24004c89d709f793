# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Host copies of arrays that may span several JAX processes (imports nothing of jaxgrpo: the model package, the
exports and the trainer all use it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


def to_host(x: Any) -> np.ndarray:
    """Full numpy copy of a (possibly multi-host sharded) array. A collective when ``x`` spans processes: every
    process must call it, in the same order (the exports gather on every process and write on process 0 only)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


# The coordinator's key-value store takes values of a few MiB at most (gRPC): larger payloads travel in parts.
EXCHANGE_PART_BYTES = 2 << 20
EXCHANGE_TIMEOUT_S = 6 * 60 * 60.0


class ExchangeStopped(RuntimeError):
    """`exchange` gave up waiting because its ``should_stop`` said so."""


def exchange(name: str, payload: bytes, *, timeout_s: float = EXCHANGE_TIMEOUT_S,
             should_stop: Callable[[], bool] | None = None) -> list[bytes]:
    """Every JAX process's ``payload``, in process order: each process sets its bytes in the distributed runtime's
    key-value store (the coordinator that `jax.distributed.initialize` started, the store jax's own compilation
    cache sharing uses) under ``name`` and reads the others'. No device is involved, so it may run in any thread
    beside the devices' programs. Every process must call it with the same ``name``, once (names are not reused;
    `delete_exchanged` frees them). While it waits for another process it asks ``should_stop()`` every second and
    raises `ExchangeStopped` when it says so (a stopping run whose other processes will not send). One process:
    ``[payload]``."""
    if jax.process_count() == 1:
        return [payload]
    client = _client()
    me = jax.process_index()
    parts = [payload[i : i + EXCHANGE_PART_BYTES] for i in range(0, len(payload), EXCHANGE_PART_BYTES)] or [b""]
    for i, part in enumerate(parts):
        client.key_value_set_bytes(f"{name}/{me}/{i}", part)
    client.key_value_set(f"{name}/{me}/parts", str(len(parts)))  # set last: the parts are there when it is
    out = []
    for p in range(jax.process_count()):
        if p == me:
            out.append(payload)
            continue
        n = int(_wait(client, f"{name}/{p}/parts", timeout_s, should_stop))
        out.append(b"".join(client.blocking_key_value_get_bytes(f"{name}/{p}/{i}", 60_000) for i in range(n)))
    return out


def _wait(client: Any, key: str, timeout_s: float, should_stop: Callable[[], bool] | None) -> str:
    """The value of ``key`` once some process sets it: blocking reads of a second each (the coordinator answers as
    soon as it is set), asking ``should_stop`` in between."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.blocking_key_value_get(key, 1000)
        except jax.errors.JaxRuntimeError as e:
            if "DEADLINE_EXCEEDED" not in str(e):
                raise
        if should_stop is not None and should_stop():
            raise ExchangeStopped(f"stopped while waiting for {key}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no process set {key} within {timeout_s:.0f} s")


def _client() -> Any:
    from jax._src import distributed

    if distributed.global_state.client is None:
        raise RuntimeError("host.exchange needs jax.distributed.initialize (the distributed runtime's client)")
    return distributed.global_state.client


def delete_exchanged(name: str) -> None:
    """Deletes this process's keys of an earlier `exchange` (safe once every process has read them)."""
    if jax.process_count() == 1:
        return
    _client().key_value_delete(f"{name}/{jax.process_index()}")  # the key and those below it
