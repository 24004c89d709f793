# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The rollout half: sampling trajectories, and the environments and tools of multi-turn rollouts
(`jaxgrpo.rollout.env`, `jaxgrpo.rollout.tools`, `jaxgrpo.rollout.history`, `jaxgrpo.rollout.sandbox`)."""
