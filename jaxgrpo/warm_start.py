# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Supervised warm start: fine-tune the policy on demonstrations before its first RL step (``warm_start.*``).

RL can only reinforce what the policy already samples. A small model that never writes a tool call (SmolLM2-135M
on the calculator task: 0 calls in 640 trajectories, docs/multiturn.md) gets no reward for calling and learns to
answer without the tool. A few dozen supervised demonstrations of the call format give RL something to reinforce;
this is the usual SFT-then-RL recipe (e.g. DeepSeek-R1's cold start, arXiv:2501.12948 §2.3.1; TRL's SFTTrainer
before GRPOTrainer), here as the first phase of the same run.

Demonstrations are conversations in TRL's conversational format (``{"messages": [...]}``: an optional system
message, the user's prompt, then assistant turns with ``content`` and/or ``tool_calls`` and the ``tool`` (or
``user``) replies between them), from a ``.jsonl`` file or from a ``package.module:function`` called with the
run's first ``warm_start.examples`` training examples (`jaxgrpo.rollout.arithmetic_env.demonstrations`).

Each conversation becomes the token history a multi-turn rollout would record had the policy written its assistant
turns (`demonstration_history`): the prompt rendered as the rollout renders it (the run's system prompt and tool
description unless the conversation has its own system message), each assistant turn's text (`tools.format_calls`
for its calls, the template family's call format) tokenized and ended with the template's end-of-turn token, and
the replies' template tokens appended as context (`ChatFormat.reply_tokens`). The loss is the negative
log-likelihood of the assistant tokens only (`action_mask`), a mean over the batch's assistant tokens (as TRL's
``assistant_only_loss``); the prompt, the replies and the template's tokens are attended and never trained on.

The run's optimizer settings apply (clipping, Adam, weight decay; LoRA: the adapters only) with
``warm_start.learning_rate``, constant, for ``warm_start.steps`` updates of ``warm_start.batch_size``
demonstrations, drawn epoch by epoch in a seeded order. The result is saved atomically in ``<run_dir>/warm_start``
(an Orbax checkpoint of the parameters and the per-step losses, `warm_start.jsonl` beside it) and is the run's
initial policy, and its KL reference with ``algo.kl_coef > 0`` (without LoRA; with LoRA the reference is the frozen
base, so the pair is refused). A resumed run restores it instead of training again; a run stopped during the warm
start redoes it.
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgrpo import checkpoint as ckpt_lib
from jaxgrpo import models
from jaxgrpo.config_sections import Config, OptimConfig, PerfConfig, WarmStartConfig
from jaxgrpo.errors import ConfigError, DataError
from jaxgrpo.example import Example
from jaxgrpo.learner import optim as optim_lib
from jaxgrpo.learner.batch import left_pad_prompts
from jaxgrpo.learner.logprobs import compute_logprobs
from jaxgrpo.learner.perf import layer_loop
from jaxgrpo.models import lora
from jaxgrpo.models.attention import Kernel
from jaxgrpo.rollout.env import load_object
from jaxgrpo.rollout.history import ChatFormat, Message, TurnHistory, to_rows
from jaxgrpo.rollout.tools import MalformedCall, ToolCall, as_call, format_calls, parse_tool_calls

__all__ = ["Rows", "load_conversations", "demonstration_history", "demonstration_rows", "nll", "make_sft_step",
           "train", "warm_start"]  # fmt: skip

Params = Any
_REPLY_ROLES = ("tool", "user")


class Rows(NamedTuple):
    """A batch of demonstrations: prompts left-padded, completions right-padded (the train step's layout)."""

    tokens: jax.Array  # [B, Tp + Tc] int32
    prompt_mask: jax.Array  # [B, Tp] bool
    completion_mask: jax.Array  # [B, Tc] bool: every real token after the prompt (attended)
    action_mask: jax.Array  # [B, Tc] bool: the assistant's tokens (trained on)


def load_conversations(ws: WarmStartConfig, examples: Sequence[Example]) -> list[list[Message]]:
    """The demonstrations of ``warm_start.demonstrations``: the lines of a ``.jsonl`` file (``{"messages": [...]}``
    each), or what a ``package.module:function`` returns for the first ``warm_start.examples`` examples (one
    conversation, or None to skip, per example; a ``{"messages": ...}`` dict is taken too)."""
    spec = ws.demonstrations
    if spec is None:
        return []
    if spec.endswith(".jsonl"):
        path = pathlib.Path(spec)
        if not path.is_file():
            raise DataError(f"warm_start.demonstrations={spec!r} does not exist; give a .jsonl file of "
                            '{"messages": [...]} lines')  # fmt: skip
        raw: list[Any] = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    raw.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"warm_start.demonstrations {spec}: line {n} is not JSON ({e.msg})") from None
    else:
        fn = load_object(spec, "warm_start.demonstrations")
        raw = [c for c in fn(list(examples[: ws.examples])) if c is not None]
    out = [c["messages"] if isinstance(c, dict) and "messages" in c else c for c in raw]
    for i, c in enumerate(out):
        if not isinstance(c, list) or not all(isinstance(m, dict) and "role" in m for m in c):
            raise DataError(f"warm_start demonstration {i} is not a list of messages with a 'role' each")
    if not out:
        raise DataError(f"warm_start.demonstrations={spec!r} gave no demonstration")
    return out


def _calls(message: Message, where: str) -> list[ToolCall]:
    """An assistant message's ``tool_calls`` (OpenAI/TRL form: ``{"function": {"name", "arguments"}}``, arguments a
    mapping or a JSON string; ``{"name", "arguments"}`` is taken too), read as the rollout reads a model's calls."""
    calls = []
    for c in message.get("tool_calls") or []:
        call = as_call(c.get("function", c) if isinstance(c, dict) else c, repr(c), ("arguments",))
        if isinstance(call, MalformedCall):
            raise DataError(f"{where}: malformed tool call {c!r}: {call.error}")
        calls.append(call)
    return calls


def _text(message: Message, where: str) -> str:
    """A message's content as text: a string, or a list of ``{"type": "text", "text": ...}`` parts (TRL's
    conversational form, joined); None or missing is empty. Anything else is a one-line DataError naming the
    message (the rollout writes and reads text only)."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(c, dict) and c.get("type") == "text"
                                         and isinstance(c.get("text"), str) for c in content):  # fmt: skip
        return "".join(c["text"] for c in content)
    raise DataError(f"{where}: its content must be text (a string, or a list of {{type: text, text: ...}} parts), "
                    f"got {type(content).__name__} {content!r:.60}")


def demonstration_history(tokenizer: Any, schemas: Sequence[dict[str, Any]], system_prompt: str | None,
                          messages: Sequence[Message], eos_token_ids: Sequence[int], where: str = "demonstration"
                          ) -> TurnHistory:  # fmt: skip
    """The token history of a conversation, as a multi-turn rollout records it had the policy written the assistant
    turns: prompt tokens, then each assistant turn's tokens plus the template's end-of-turn token (``action``), and
    the template tokens of the replies after it (context). ``system_prompt``: the run's, used unless the
    conversation opens with a system message of its own (the tools' description is added to either where the
    template has no tool syntax)."""
    msgs = list(messages)
    if msgs and msgs[0]["role"] == "system":
        system_prompt = _text(msgs.pop(0), f"{where}, message 0")
    if not msgs or msgs[0]["role"] != "user":
        raise DataError(f"{where}: the conversation must start with the user's prompt (after an optional system "
                        "message)")  # fmt: skip
    chat = ChatFormat(tokenizer, schemas, system_prompt)
    base = chat.prompt_messages(_text(msgs[0], f"{where}, the user's prompt"))
    eot = chat.end_of_turn(base, eos_token_ids)
    hist = TurnHistory(prompt=chat.prompt_tokens(base))
    i = 1
    while i < len(msgs):
        m = msgs[i]
        if m["role"] != "assistant":
            raise DataError(f"{where}: message {i} is a {m['role']!r} message where an assistant turn must come")
        calls = _calls(m, f"{where}, message {i}")
        try:
            text = format_calls(calls, chat.format, _text(m, f"{where}, message {i}") or None)
        except ConfigError as e:
            raise DataError(f"{where}, message {i}: {e}") from None
        if parse_tool_calls(text, chat.format) != calls:
            raise DataError(f"{where}, message {i}: its text does not read back as its tool calls in the "
                            f"{chat.format} format (content that looks like a call?)")  # fmt: skip
        ids = chat.encode(text) + [eot]
        hist.add_policy(ids, [0.0] * len(ids))
        hist.tool_calls += len(calls)
        replies = []
        i += 1
        while i < len(msgs) and msgs[i]["role"] in _REPLY_ROLES:
            replies.append({**{k: v for k, v in msgs[i].items() if k in ("role", "name")},
                            "content": _text(msgs[i], f"{where}, message {i}")})
            i += 1
        if replies:
            if i == len(msgs):
                raise DataError(f"{where}: the conversation ends with a {replies[-1]['role']!r} message; it must end "
                                "with the assistant's answer")  # fmt: skip
            hist.add_context(chat.reply_tokens(base, replies, eot))
        elif i < len(msgs):
            raise DataError(f"{where}: message {i} is an assistant turn right after another; put the replies "
                            "between them")  # fmt: skip
        elif calls:
            raise DataError(f"{where}: the last assistant turn makes tool calls; end with the answer")
    if hist.turns == 0:
        raise DataError(f"{where}: the conversation has no assistant turn")
    hist.done = True
    return hist


def demonstration_rows(histories: Sequence[TurnHistory], prompt_width: int, completion_width: int,
                       pad_id: int) -> Rows:  # fmt: skip
    """`Rows` of ``histories``: prompts left-padded to ``prompt_width``, the rest right-padded to
    ``completion_width``."""
    prompt, pmask = left_pad_prompts([h.prompt for h in histories], 1, prompt_width, pad_id)
    r = to_rows(histories, completion_width)
    tokens = np.concatenate([prompt, np.where(r["completion_mask"], r["completion"], pad_id)], 1)
    return Rows(jnp.asarray(tokens, jnp.int32), jnp.asarray(pmask), jnp.asarray(r["completion_mask"]),
                jnp.asarray(r["action_mask"]))  # fmt: skip


def nll(model_config: models.ModelConfig, params: Params, rows: Rows, perf: PerfConfig | None = None
        ) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """``(loss, tokens)``: the mean negative log-likelihood of the batch's assistant tokens (temperature 1) and
    their count. Prompt, reply and padding positions are not in the mean."""
    perf = perf or PerfConfig()
    kernel = Kernel("dense" if perf.attention == "auto" else perf.attention, perf.attention_chunk)
    logp, _ = compute_logprobs(model_config, params, rows, 1.0, perf.logprob_chunk, remat=perf.remat,
                               matmul_backward=perf.matmul_backward, attention_kernel=kernel,
                               lm_head=perf.lm_head,
                               layer_loop=layer_loop(perf))  # fmt: skip
    mask = rows.action_mask & rows.completion_mask
    n = jnp.sum(mask)
    return -jnp.sum(jnp.where(mask, logp, 0.0)) / jnp.maximum(n, 1), n


def make_sft_step(model_config: models.ModelConfig, optim: OptimConfig, learning_rate: float,
                  perf: PerfConfig | None = None):  # fmt: skip
    """``(init(params) -> opt_state, step(params, opt_state, rows) -> (params, opt_state, metrics))``, jitted, params
    and optimizer state donated. The update is the run's optimizer direction (`optim.make_direction`: clipping,
    Adam, weight decay) times ``-learning_rate``, on `lora.trainable` (the adapters of a LoRA tree)."""
    direction = optim_lib.make_direction(optim)

    def loss_fn(train: Params, params: Params, rows: Rows):
        return nll(model_config, lora.with_trainable(params, train), rows, perf)

    @jax.jit
    def init(params: Params) -> optax.OptState:
        return direction.init(lora.trainable(params))

    def step(params: Params, opt_state: optax.OptState, rows: Rows):
        train = lora.trainable(params)
        (loss, n), grads = jax.value_and_grad(loss_fn, has_aux=True)(train, params, rows)
        d, opt_state = direction.update(grads, opt_state, train)
        train = optax.apply_updates(train, optim_lib.apply_learning_rate(d, jnp.float32(learning_rate)))
        metrics = {"warm_start/loss": loss, "warm_start/tokens": n,
                   "warm_start/grad_norm": optax.tree_utils.tree_norm(grads)}
        return lora.with_trainable(params, train), opt_state, metrics

    return init, jax.jit(step, donate_argnums=(0, 1))


def _order(n: int, steps: int, batch: int, seed: int) -> list[np.ndarray]:
    """The demonstrations of each step: epoch e is a permutation seeded by ``(seed, e)``, read ``batch`` at a time
    (an epoch's last, short batch is filled from the next epoch)."""
    flat: list[int] = []
    epoch = 0
    while len(flat) < steps * batch:
        flat += np.random.default_rng([seed, 7, epoch]).permutation(n).tolist()
        epoch += 1
    return [np.asarray(flat[s * batch:(s + 1) * batch]) for s in range(steps)]


def train(model_config: models.ModelConfig, params: Params, histories: Sequence[TurnHistory], cfg: Config,
          perf: PerfConfig | None = None, pad_id: int = 0, say: Callable[[str], None] | None = None
          ) -> tuple[Params, list[dict[str, float]]]:  # fmt: skip
    """``warm_start.steps`` supervised updates of ``params`` on ``histories``; returns the parameters and each
    step's metrics. Every batch has one shape (the longest prompt and the longest completion), so it compiles
    once."""
    ws = cfg.warm_start
    longest = max(len(h.prompt) + len(h.tokens) for h in histories)
    if longest > model_config.max_position_embeddings:
        raise DataError(f"a warm_start demonstration is {longest} tokens, longer than the model's context "
                        f"({model_config.max_position_embeddings})")  # fmt: skip
    tp, tc = max(len(h.prompt) for h in histories), max(len(h.tokens) for h in histories)
    init, step = make_sft_step(model_config, cfg.optim, ws.learning_rate, perf)
    params = jax.tree.map(jnp.copy, params)  # the step donates its input; the caller's tree stays valid
    opt_state = init(params)
    log: list[dict[str, float]] = []
    for s, idx in enumerate(_order(len(histories), ws.steps, ws.batch_size, cfg.seed), 1):
        rows = demonstration_rows([histories[i] for i in idx], tp, tc, pad_id)
        params, opt_state, metrics = step(params, opt_state, rows)
        log.append({"step": s, **{k: float(v) for k, v in jax.device_get(metrics).items()}})
        if say is not None and (s == 1 or s % 10 == 0 or s == ws.steps):
            say(f"jaxgrpo: warm start step {s}/{ws.steps}: loss {log[-1]['warm_start/loss']:.4f}")
    return params, log


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def warm_start(cfg: Config, model_config: models.ModelConfig, params: Params, tokenizer: Any,
               conversations: Sequence[Sequence[Message]], eos_token_ids: Sequence[int],
               schemas: Sequence[dict[str, Any]], run_dir: pathlib.Path, perf: PerfConfig | None = None,
               pad_id: int = 0) -> Params:  # fmt: skip
    """The run's initial policy after the warm start on ``conversations`` (`load_conversations`, read before the
    model loads): restored from ``<run_dir>/warm_start`` when a previous start finished it, else trained (`train`),
    its losses written to ``warm_start.jsonl`` and then its trained parameters saved there (atomically): with LoRA
    the adapters only, joined on restore to the base this run loaded (which the run's checkpoints fingerprint)."""
    directory = run_dir / "warm_start"
    with ckpt_lib.CheckpointManager(directory, keep=1, async_save=False) as mgr:
        steps = cfg.warm_start.steps
        if mgr.latest_step() == steps:
            restored, _ = mgr.restore(steps, {"params": lora.trainable(params)})
            _say(f"jaxgrpo: warm start restored from {directory} ({steps} steps)")
            return lora.with_trainable(params, restored["params"])
        histories = [demonstration_history(tokenizer, schemas, cfg.data.system_prompt, c, eos_token_ids,
                                           f"warm_start demonstration {i}") for i, c in enumerate(conversations)]
        _say(f"jaxgrpo: warm start: {steps} steps on {len(histories)} demonstrations "
             f"({sum(sum(h.action) for h in histories)} assistant tokens)")
        params, log = train(model_config, params, histories, cfg, perf, pad_id, _say)
        # the losses first: a finished checkpoint implies them (a start killed before the save trains again)
        (directory / "warm_start.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
        mgr.save(steps, {"params": lora.trainable(params)}, force=True)
        mgr.wait()
    return params
