"""Supervised warm start: train the policy on demonstration traces, loss on assistant tokens only.

Small models cannot discover a tool-call format by themselves; a short SFT on correct traces
(`envs.demonstration`) gives RL something to improve. A demonstration is tokenized exactly the way
the agent loop builds a trajectory (rollout/agent.py), so the SFT'd policy sees at RL time the very
token sequences it was trained on:

  prompt   = tokenizer.render_chat(system + user, add_generation_prompt=True)    loss off
  action   = tokenizer.encode(assistant text) + [eos]                           loss on
  observation = tokenizer.tool_observation_ids(tool output)                      loss off
  ... alternating until the final answer's action.

Shapes: B = demonstrations per step, T = `config.max_seq_len`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from sao_jax import metrics as metrics_lib

Message = dict[str, Any]


def demo_tokens(tokenizer: Any, messages: Sequence[Message]) -> tuple[list[int], list[bool]]:
  """Token ids of a demonstration and the mask of the tokens the policy would have sampled.

  Args:
    tokenizer: a `models.Tokenizer`.
    messages: chat messages (system/user, then assistant turns with tool/user turns between).

  Returns:
    (tokens, loss_mask): the trajectory's tokens and True on assistant (action) tokens.
  """
  first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
  if first is None:
    raise ValueError("demonstration has no assistant message")
  tokens = list(tokenizer.render_chat(messages[:first], add_generation_prompt=True))
  mask = [False] * len(tokens)
  i = first
  while i < len(messages):
    m = messages[i]
    if m["role"] == "assistant":
      ids = [*tokenizer.encode(m["content"]), tokenizer.eos_id]
      tokens, mask = tokens + ids, mask + [True] * len(ids)
      i += 1
      continue
    if m["role"] == "tool":
      results = []
      while i < len(messages) and messages[i]["role"] == "tool":
        results.append(messages[i]["content"])
        i += 1
      ids = tokenizer.tool_observation_ids(results)
    elif m["role"] == "user":
      ids = tokenizer.user_turn_ids(m["content"])
      i += 1
    else:
      raise ValueError(f"message {i}: unexpected role {m['role']!r} after the first assistant turn")
    tokens, mask = tokens + ids, mask + [False] * len(ids)
  return tokens, mask


def make_demo_batches(
  tokenizer: Any, demos: Sequence[Sequence[Message]], *, batch_size: int, seq_len: int, seed: int
) -> Callable[[int], dict[str, np.ndarray]]:
  """Tokenizes demonstrations once; returns `batch(step) -> dict` of [B, T] numpy arrays.

  Demonstrations longer than `seq_len` are dropped (counted in the returned function's
  `num_dropped` attribute). Batches cycle through a seeded permutation, epoch after epoch.
  """
  rows = [demo_tokens(tokenizer, d) for d in demos]
  kept = [r for r in rows if len(r[0]) <= seq_len]
  if not kept:
    raise ValueError(f"no demonstration fits max_seq_len {seq_len}")
  n = len(kept)
  # Rows as long as the longest demonstration (rounded up to 32), not max_seq_len: less padding.
  seq_len = min(seq_len, -(-max(len(t) for t, _ in kept) // 32) * 32)
  tokens = np.full((n, seq_len), tokenizer.pad_id, np.int32)
  mask = np.zeros((n, seq_len), bool)
  seg = np.zeros((n, seq_len), np.int32)
  for i, (t, m) in enumerate(kept):
    tokens[i, : len(t)], mask[i, : len(m)], seg[i, : len(t)] = t, m, 1
  rng = np.random.default_rng(seed)
  orders: list[np.ndarray] = []

  def batch(step: int) -> dict[str, np.ndarray]:
    start = step * batch_size
    while len(orders) * n < start + batch_size:
      orders.append(rng.permutation(n))
    idx = np.concatenate(orders)[start : start + batch_size]
    return {"tokens": tokens[idx], "loss_mask": mask[idx], "segment_ids": seg[idx]}

  batch.num_dropped = len(rows) - n
  batch.num_examples = n
  return batch


def _loss(graphdef, params, batch):
  policy = nnx.merge(graphdef, params)
  logp, _ = policy.token_logprobs(batch["tokens"], None, batch["segment_ids"])
  m = batch["loss_mask"]
  n = jnp.maximum(jnp.sum(m), 1)
  nll = -jnp.sum(jnp.where(m, logp, 0.0)) / n
  # Token accuracy needs the argmax, i.e. logits; the NLL is what is optimized and reported.
  return nll, {"sft/nll": nll}


def run(
  config: ml_collections.ConfigDict,
  policy: nnx.Module,
  tokenizer: Any,
  demos: Sequence[Sequence[Message]],
  *,
  writer: metrics_lib.MetricWriter | None = None,
  progress: bool | None = None,
) -> nnx.Module:
  """Trains `policy` in place for `config.sft.steps` steps on `demos`; returns it.

  Args:
    config: the run config (`sft.*`, `max_seq_len`, `seed`, `optim.policy.clip_norm`).
    policy: a `models.Policy`.
    tokenizer: the run's tokenizer.
    demos: demonstrations (`envs.demonstration(task, tool_format)` for training tasks).
    writer: optional metric writer for `sft/nll` per step (give it its own directory).
    progress: show a progress bar (default: on a terminal).

  Returns:
    The same policy object, trained.
  """
  s = config.sft
  batches = make_demo_batches(
    tokenizer, demos, batch_size=s.batch_size, seq_len=config.max_seq_len, seed=config.seed
  )
  graphdef, params = nnx.split(policy, nnx.Param)
  tx = optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(
      optax.warmup_cosine_decay_schedule(
        0.0, s.lr, max(s.steps // 20, 1), max(s.steps, 2), s.lr * 0.1
      )
    ),
  )
  opt_state = tx.init(params)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, batch):
    (_, m), grads = jax.value_and_grad(functools.partial(_loss, graphdef), has_aux=True)(
      params, batch
    )
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, m

  bar = metrics_lib.ProgressBar(s.steps, desc="sft", enabled=progress)
  for i in range(s.steps):
    params, opt_state, m = step(params, opt_state, batches(i))
    nll = float(m["sft/nll"])
    if not np.isfinite(nll):
      raise RuntimeError(f"SFT step {i}: non-finite loss {nll}; lower config.sft.lr")
    if writer is not None:
      writer.write(i, m)
    bar.update(1, nll=nll)
  bar.close()
  nnx.update(policy, params)
  return policy
