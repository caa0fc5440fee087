"""Helpers for tests, benchmarks and notebooks: tiny configs and synthetic learner batches.

config = testing.tiny_config("sao")               # the quickstart, shrunk for 2-step CPU runs
batch = testing.synthetic_batch(policy, batch_size=4, seq_len=24)   # numpy TrainBatch dict
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sao_jax import config as config_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(algo: str = "sao", **overrides) -> config_lib.ConfigDict:
  """The quickstart experiment with `algo`, shrunk so a 2-step run takes seconds after compiling.

  Args:
    algo: an algorithm name from sao_jax.algos.
    **overrides: dotted field -> value, e.g. `**{"loss.critic_steps": 1}` or `total_steps=3`.
  """
  c = config_lib.load(os.path.join(REPO, "experiments", f"quickstart.py:algo={algo}"))
  c.total_steps = 2
  c.batch_size = 4 if c.group_size == 1 else 2 * c.group_size
  c.sft.steps = 0
  c.eval_every = c.checkpoint_every = 0
  c.data.num_eval = 4
  c.rollout.max_new_tokens = 12
  c.rollout.num_slots = 8
  c.loss.critic_only_steps = 1
  c.mesh.data = 1
  for key, value in overrides.items():
    section, _, field = key.rpartition(".")
    (c[section] if section else c)[field] = value
  return c


def synthetic_batch(
  policy,
  *,
  batch_size: int = 4,
  seq_len: int = 24,
  seed: int = 0,
  group_size: int = 1,
  logprob_noise: float = 0.3,
) -> dict[str, np.ndarray]:
  """A learner batch (`TrainBatch.as_dict()` layout) with realistic structure, no environment.

  Each row: a 4-token prompt, an action segment, 4 observation tokens, a second action segment
  ending 0-6 tokens before the row end (then padding). Rollout log-probs are the policy's own plus
  Gaussian noise (so DIS masks some tokens); rewards are 0/1 on each row's last action token.

  Args:
    policy: a `models.Policy` (its log-probs seed the rollout log-probs).
    batch_size: B (a multiple of group_size).
    seq_len: T (>= 20).
    seed: numpy seed.
    group_size: rows i * G .. (i + 1) * G - 1 share a group id.
    logprob_noise: std of the noise added to the rollout log-probs.

  Returns:
    dict of numpy arrays: [B, T] tokens, positions, segment_ids, action_mask, rollout_logprobs,
    policy_versions, rewards; [B] seq_rewards, group_ids, valid.
  """
  b, t = batch_size, seq_len
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, 200, size=(b, t)).astype(np.int32)
  lengths = rng.integers(t - 6, t + 1, size=b)
  mask = np.zeros((b, t), bool)
  for i, n in enumerate(lengths):
    mask[i, 4:10] = True
    mask[i, 14:n] = True
  seg = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  graphdef, params = nnx.split(policy)
  logp = jax.jit(lambda p, x, s: nnx.merge(graphdef, p).token_logprobs(x, None, s)[0])(
    params, jnp.asarray(tokens), jnp.asarray(seg)
  )
  noise = rng.normal(0, logprob_noise, (b, t))
  roll = np.where(mask, np.minimum(np.asarray(logp) + noise, 0.0), 0).astype(np.float32)
  seq_r = rng.integers(0, 2, size=b).astype(np.float32)
  rewards = np.zeros((b, t), np.float32)
  for i in range(b):
    rewards[i, np.flatnonzero(mask[i])[-1]] = seq_r[i]
  return {
    "tokens": tokens,
    "positions": np.where(seg, np.arange(t)[None], 0).astype(np.int32),
    "segment_ids": seg,
    "action_mask": mask,
    "rollout_logprobs": roll,
    "policy_versions": np.where(mask, 0, -1).astype(np.int32),
    "rewards": rewards,
    "seq_rewards": seq_r,
    "group_ids": (np.arange(b) // group_size).astype(np.int32),
    "valid": np.ones(b, bool),
  }
