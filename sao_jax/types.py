"""Data contracts shared by every part of sao_jax (design.md §3).

`Trajectory` is host-side and numpy-only: it is what crosses threads, processes and the gRPC wire.
`TrainBatch` is its device-side, padded `[B, T]` form. Shapes: B = trajectories (rows) in a batch,
T = tokens per row.

Token alignment: the log-prob of token t comes from the model's output at position t - 1, so
`action_mask[0]` is always False and `rollout_logprobs[t]` / `policy_versions[t]` describe the
sampling of `tokens[t]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

MetadataValue = str | float | int


@dataclasses.dataclass
class Trajectory:
  """One scored episode, exactly as the engine saw it.

  Attributes:
    uid: unique id; the replay queue accepts each uid once.
    prompt_id: dataset record id (evaluation, resume, grouping).
    group_id: prompts sampled G times share it (GRPO); SAO uses G = 1.
    env: environment name.
    tokens: int32[T], prompt, actions and observations.
    action_mask: bool[T], True where `tokens[t]` was sampled by the policy.
    rollout_logprobs: float32[T], log pi_rollout(tokens[t] | tokens[:t]) on action tokens, else 0.
    policy_versions: int32[T], weight version that sampled `tokens[t]` on action tokens, else -1.
    reward: outcome reward; the learner places it on the last action token.
    metadata: turns, finish reason, tool errors, timings.
  """

  uid: str
  prompt_id: str
  group_id: str
  env: str
  tokens: np.ndarray
  action_mask: np.ndarray
  rollout_logprobs: np.ndarray
  policy_versions: np.ndarray
  reward: float
  metadata: dict[str, MetadataValue] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.tokens = np.asarray(self.tokens, np.int32)
    self.action_mask = np.asarray(self.action_mask, bool)
    self.rollout_logprobs = np.asarray(self.rollout_logprobs, np.float32)
    self.policy_versions = np.asarray(self.policy_versions, np.int32)
    self.reward = float(self.reward)

  def __len__(self) -> int:
    return int(self.tokens.shape[0])

  @property
  def num_action_tokens(self) -> int:
    return int(self.action_mask.sum())

  @property
  def oldest_version(self) -> int:
    """Smallest policy version among action tokens (-1 if there are none)."""
    v = self.policy_versions[self.action_mask]
    return int(v.min()) if v.size else -1

  def validate(
    self,
    *,
    vocab_size: int | None = None,
    current_version: int | None = None,
    max_len: int | None = None,
  ) -> str | None:
    """Returns None if the trajectory is well formed, else a short reason (design.md §6)."""
    t = len(self)
    for name in ("action_mask", "rollout_logprobs", "policy_versions"):
      if getattr(self, name).shape != (t,):
        return f"length_mismatch:{name}"
    if self.tokens.ndim != 1 or t == 0:
      return "empty"
    if max_len is not None and t > max_len:
      return "too_long"
    if self.action_mask[0]:
      return "action_at_position_0"
    if not np.isfinite(self.reward):
      return "nonfinite_reward"
    lp = self.rollout_logprobs[self.action_mask]
    if not np.all(np.isfinite(lp)):
      return "nonfinite_logprob"
    if np.any(lp > 0):
      return "positive_logprob"
    if np.any(self.tokens < 0) or (vocab_size is not None and np.any(self.tokens >= vocab_size)):
      return "token_out_of_range"
    v = self.policy_versions[self.action_mask]
    if np.any(v < 0):
      return "missing_version"
    if current_version is not None and v.size and int(v.max()) > current_version:
      return "version_from_future"
    return None

  def to_dict(self) -> dict[str, Any]:
    """A plain dict of numpy arrays and scalars (for checkpoints and JSON-free transport)."""
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> Trajectory:
    return cls(**d)


@dataclasses.dataclass
class TrainBatch:
  """Device-side batch: `[B, T]` token arrays plus `[B]` per-row fields (numpy until placed).

  Rows are trajectories padded to T (no packing: one trajectory per row, `segment_ids` 1 on real
  tokens and 0 on padding). `rewards` holds each trajectory's outcome reward on its last action
  token and 0 elsewhere. Padded rows (to fill a fixed batch shape) have `valid` False and no
  action tokens, so they contribute nothing to any token mean.
  """

  tokens: np.ndarray  # int32[B, T]
  positions: np.ndarray  # int32[B, T]
  segment_ids: np.ndarray  # int32[B, T]
  action_mask: np.ndarray  # bool[B, T]
  rollout_logprobs: np.ndarray  # float32[B, T]
  policy_versions: np.ndarray  # int32[B, T]
  rewards: np.ndarray  # float32[B, T]
  seq_rewards: np.ndarray  # float32[B]
  group_ids: np.ndarray  # int32[B], rows of one prompt group share an id
  valid: np.ndarray  # bool[B]

  @property
  def shape(self) -> tuple[int, int]:
    return tuple(self.tokens.shape)

  def padding_fraction(self) -> float:
    """Fraction of the B * T token slots that hold no real token."""
    return float(1.0 - (self.segment_ids > 0).mean())

  def as_dict(self) -> dict[str, np.ndarray]:
    return dataclasses.asdict(self)


def make_batch(
  trajectories: list[Trajectory], *, seq_len: int, batch_size: int | None = None, pad_id: int = 0
) -> TrainBatch:
  """Pads trajectories into a `[B, seq_len]` TrainBatch and puts each reward on its last action token.

  Args:
    trajectories: the batch, in order. Rows of one GRPO group must share `group_id`.
    seq_len: T; a trajectory longer than this is an error (the agent loop bounds the context).
    batch_size: B; extra rows are padding (`valid` False). Defaults to len(trajectories).
    pad_id: token id used for padding.

  Returns:
    A TrainBatch of numpy arrays.
  """
  n = len(trajectories)
  b = n if batch_size is None else batch_size
  if n > b:
    raise ValueError(f"{n} trajectories do not fit a batch of {b}")
  out = TrainBatch(
    tokens=np.full((b, seq_len), pad_id, np.int32),
    positions=np.zeros((b, seq_len), np.int32),
    segment_ids=np.zeros((b, seq_len), np.int32),
    action_mask=np.zeros((b, seq_len), bool),
    rollout_logprobs=np.zeros((b, seq_len), np.float32),
    policy_versions=np.full((b, seq_len), -1, np.int32),
    rewards=np.zeros((b, seq_len), np.float32),
    seq_rewards=np.zeros((b,), np.float32),
    group_ids=np.arange(b, dtype=np.int32),
    valid=np.zeros((b,), bool),
  )
  group_index: dict[str, int] = {}
  for i, traj in enumerate(trajectories):
    t = len(traj)
    if t > seq_len:
      raise ValueError(f"trajectory {traj.uid} has {t} tokens > seq_len {seq_len}")
    out.tokens[i, :t] = traj.tokens
    out.positions[i, :t] = np.arange(t)
    out.segment_ids[i, :t] = 1
    out.action_mask[i, :t] = traj.action_mask
    out.rollout_logprobs[i, :t] = np.where(traj.action_mask, traj.rollout_logprobs, 0.0)
    out.policy_versions[i, :t] = np.where(traj.action_mask, traj.policy_versions, -1)
    actions = np.flatnonzero(traj.action_mask)
    if actions.size:
      out.rewards[i, actions[-1]] = traj.reward
    out.seq_rewards[i] = traj.reward
    out.group_ids[i] = group_index.setdefault(traj.group_id, len(group_index))
    out.valid[i] = True
  # Padding rows get group ids of their own, after the real groups.
  out.group_ids[n:] = len(group_index) + np.arange(b - n)
  return out
