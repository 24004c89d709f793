# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Model configuration for the Llama / Qwen2 / Qwen3 decoder family, and its translation from/to HF config.json.

One frozen, hashable dataclass (`ModelConfig`) describes every supported model; it is a valid `jax.jit` static
argument. The three families differ only in a few switches:

- ``llama`` (Llama 3.x, SmolLM2): no attention bias, no q/k norm, optional "llama3" RoPE frequency scaling.
- ``qwen2`` (Qwen2 / Qwen2.5): bias on the q, k and v projections.
- ``qwen3``: per-head RMSNorm on q and k (before RoPE), explicit ``head_dim`` (may differ from hidden/heads).

RoPE scaling (`RopeScaling`) supports the ``default`` (none), ``linear`` (inv_freq / factor) and ``llama3`` types.
The llama3 rule (Meta's Llama 3.1 release; transformers ``_compute_llama3_parameters``), with
``wavelen = 2π / inv_freq``, ``L = original_max_position_embeddings``:
``wavelen > L/low_freq_factor -> inv_freq / factor``; ``wavelen < L/high_freq_factor -> inv_freq``; otherwise
``(1 - s) * inv_freq / factor + s * inv_freq`` with ``s = (L / wavelen - low_freq_factor) / (high_freq_factor -
low_freq_factor)``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, Literal

ARCHITECTURES = ("llama", "qwen2", "qwen3")
# HF `architectures` / `model_type` names for each family.
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = ("float32", "bfloat16")


class ModelConfigError(ValueError):
    """A model configuration that jaxgrpo cannot represent (the message names what was found and what is supported)."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``rope_type`` is one of ``ROPE_TYPES``; unused fields keep their defaults."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ModelConfigError(f"unsupported rope scaling type {self.rope_type!r}; supported: {ROPE_TYPES}")
        if self.factor <= 0:
            raise ModelConfigError(f"rope scaling factor must be > 0, got {self.factor}")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ModelConfigError(
                f"llama3 rope scaling needs high_freq_factor > low_freq_factor, got "
                f"{self.high_freq_factor} <= {self.low_freq_factor}"
            )


LoraTarget = Literal["q", "k", "v", "o", "gate", "up", "down"]  # the dense projections an adapter may attach to
LORA_TARGETS: tuple[str, ...] = typing.get_args(LoraTarget)


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """Low-rank adapters (Hu et al. 2021, "LoRA"; PEFT's ``LoraConfig``): each targeted projection ``W`` reads
    ``W + (alpha / rank) · A B`` with ``A [in, rank]``, ``B [rank, out]`` (see `jaxgrpo.models.lora`)."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        if self.rank < 1:
            raise ModelConfigError(f"LoRA rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ModelConfigError(f"LoRA alpha must be > 0, got {self.alpha}")
        bad = [t for t in self.targets if t not in LORA_TARGETS]
        if bad or not self.targets or len(set(self.targets)) != len(self.targets):
            raise ModelConfigError(f"LoRA targets {self.targets} must be distinct names from {LORA_TARGETS}")

    @property
    def scale(self) -> float:
        """``alpha / rank``, the factor on ``A B`` (PEFT's ``scaling`` without rsLoRA)."""
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder hyper-parameters (names follow HF config.json where one exists)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None  # None -> hidden_size // num_heads
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    dtype: str = "float32"  # compute dtype: activations, KV caches, the weights as the forward reads them
    param_dtype: str = "float32"  # stored (master) weights: what the optimizer updates and checkpoints hold
    architecture: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # low-rank adapters on a frozen base (None = full fine-tuning); the base is then stored in the compute dtype
    lora: LoraSpec | None = None

    def __post_init__(self) -> None:
        for name in ("dtype", "param_dtype"):  # accept jnp.bfloat16 / np.float32 / np.dtype objects
            if not isinstance(getattr(self, name), str):
                object.__setattr__(self, name, _dtype_name(getattr(self, name)))
        if self.architecture not in ARCHITECTURES:
            raise ModelConfigError(f"unsupported architecture {self.architecture!r}; supported: {ARCHITECTURES}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ModelConfigError(f"unsupported {name} {getattr(self, name)!r}; supported: {DTYPES}")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ModelConfigError(
                    f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; set head_dim"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            if getattr(self, name) <= 0:
                raise ModelConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads} (GQA groups)"
            )
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(self, "rope_scaling", _rope_scaling_from_dict(dict(self.rope_scaling)))
        if self.rope_scaling is not None and self.rope_scaling.rope_type == "default":
            object.__setattr__(self, "rope_scaling", None)
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))

    @property
    def heads_per_kv(self) -> int:
        """R: query heads per key/value head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one cached token takes in the KV caches: a key and a value per layer and kv head, in the compute
        dtype."""
        import jax.numpy as jnp

        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * jnp.dtype(self.dtype).itemsize

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def _dtype_name(dtype: Any) -> str:
    import ml_dtypes  # registers bfloat16 with numpy
    import numpy as np

    del ml_dtypes
    try:
        return np.dtype(dtype).name
    except TypeError as e:
        raise ModelConfigError(f"unsupported dtype {dtype!r}; supported: {DTYPES}") from e


def _rope_scaling_from_dict(d: dict[str, Any] | None) -> RopeScaling | None:
    """HF ``rope_scaling`` (transformers 4) or ``rope_parameters`` (transformers 5) dict -> RopeScaling or None."""
    if not d:
        return None
    rope_type = d.get("rope_type", d.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ModelConfigError(f"unsupported rope scaling type {rope_type!r} in config; supported: {ROPE_TYPES}")
    if rope_type == "default":
        return None
    kwargs: dict[str, Any] = {"rope_type": rope_type, "factor": float(d.get("factor", 1.0))}
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in d:
                raise ModelConfigError(f"llama3 rope scaling is missing {key!r}; found keys {sorted(d)}")
        kwargs.update(
            low_freq_factor=float(d["low_freq_factor"]),
            high_freq_factor=float(d["high_freq_factor"]),
            original_max_position_embeddings=int(d["original_max_position_embeddings"]),
        )
    return RopeScaling(**kwargs)


def from_hf_config(hf: Mapping[str, Any], dtype: str = "float32") -> ModelConfig:
    """ModelConfig from an HF ``config.json`` dict (LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM)."""
    model_type = hf.get("model_type")
    archs = list(hf.get("architectures") or [])
    arch = None
    if model_type in ARCHITECTURES:
        arch = model_type
    else:
        for name, hf_name in HF_ARCHITECTURES.items():
            if hf_name in archs:
                arch = name
    if arch is None:
        raise ModelConfigError(
            f"unsupported architecture: model_type={model_type!r}, architectures={archs}; supported model_type "
            f"{ARCHITECTURES} ({', '.join(HF_ARCHITECTURES.values())})"
        )
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if key not in hf:
            raise ModelConfigError(f"config.json is missing {key!r} (model_type {model_type!r})")
    rope_params = hf.get("rope_parameters") or {}
    rope_scaling = hf.get("rope_scaling") or None
    if rope_scaling is None and rope_params:
        rope_scaling = rope_params
    rope_theta = hf.get("rope_theta", rope_params.get("rope_theta", 10000.0))
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(f"hidden_act={act!r} is not supported; supported: 'silu' (SwiGLU MLP)")
    if hf.get("use_sliding_window", False):
        raise ModelConfigError("use_sliding_window=True is not supported (full causal attention only)")
    mlp_bias = hf.get("mlp_bias", False)
    if mlp_bias:
        raise ModelConfigError("mlp_bias=True is not supported (Llama/Qwen checkpoints have no MLP bias)")
    if arch in ("llama", "qwen3") and hf.get("attention_bias", False):
        raise ModelConfigError(
            f"attention_bias=True {arch} checkpoints are not supported (of the supported families only qwen2 has "
            f"q/k/v bias)"
        )
    eos = hf.get("eos_token_id")
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    num_heads = int(hf["num_attention_heads"])
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=hf.get("head_dim") or (128 if arch == "qwen3" else None),  # transformers' Qwen3Config default
        rope_theta=float(rope_theta),
        rope_scaling=_rope_scaling_from_dict(rope_scaling),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048 if arch == "llama" else 32768)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2",
        qk_norm=arch == "qwen3",
        dtype=dtype,
        architecture=arch,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


def to_hf_config(config: ModelConfig) -> dict[str, Any]:
    """HF ``config.json`` dict for `config` (transformers 4 and 5 both read ``rope_theta``/``rope_scaling``)."""
    torch_dtype = {"float32": "float32", "bfloat16": "bfloat16"}[config.dtype]
    out: dict[str, Any] = {
        "architectures": [HF_ARCHITECTURES[config.architecture]],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_dropout": 0.0,
        "torch_dtype": torch_dtype,
        "dtype": torch_dtype,
        "use_cache": True,
    }
    if config.architecture == "llama":
        out.update(attention_bias=False, mlp_bias=False)
    if config.architecture == "qwen3":
        out.update(attention_bias=False)
    if config.architecture in ("qwen2", "qwen3"):
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.num_layers)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        rs = config.rope_scaling
        scaling: dict[str, Any] = {"rope_type": rs.rope_type, "factor": rs.factor}
        if rs.rope_type == "llama3":
            scaling.update(
                low_freq_factor=rs.low_freq_factor,
                high_freq_factor=rs.high_freq_factor,
                original_max_position_embeddings=rs.original_max_position_embeddings,
            )
        out["rope_scaling"] = scaling
        rope.update(scaling)
    out["rope_parameters"] = rope
    if config.bos_token_id is not None:
        out["bos_token_id"] = config.bos_token_id
    if config.eos_token_ids:
        out["eos_token_id"] = config.eos_token_ids[0] if len(config.eos_token_ids) == 1 else list(config.eos_token_ids)
    return out
