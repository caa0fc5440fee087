"""Synthetic trajectories for tests of the replay queue and its producers (actors, load tests).

`make_trajectory` builds a well-formed multi-turn trajectory (prompt, then alternating action and
observation spans); `malformed` breaks one in a named way and returns the rejection reason the
queue must give. T = tokens of the trajectory.
"""

from __future__ import annotations

import numpy as np

from sao_jax.types import Trajectory

# kind -> the reason the queue gives for it (see base.py).
MALFORMED_KINDS = {
  "nan_logprob": "nonfinite_logprob",
  "positive_logprob": "positive_logprob",
  "token_out_of_range": "token_out_of_range",
  "negative_token": "token_out_of_range",
  "length_mismatch": "length_mismatch:action_mask",
  "version_from_future": "version_from_future",
  "missing_version": "missing_version",
  "action_at_position_0": "action_at_position_0",
  "nonfinite_reward": "nonfinite_reward",
  "missing_uid": "missing_uid",
  "too_long": "too_long",
}


def make_trajectory(uid: str, *, length: int = 32, vocab_size: int = 100, version: int = 0,
                    oldest_version: int | None = None, seed: int = 0) -> Trajectory:  # fmt: skip
  """A well-formed trajectory.

  Args:
    uid: its uid (also used in prompt_id).
    length: T >= 4.
    vocab_size: token ids are drawn from [0, vocab_size).
    version: policy version of the newest action tokens.
    oldest_version: policy version of the first action span (default `version`); spans in between
      get versions that step up to `version`, as in a trajectory sampled across weight updates.
    seed: RNG seed for tokens, lengths of spans and log-probs.

  Returns:
    A Trajectory with action_mask[0] False, log-probs < 0 on actions and 0 elsewhere.
  """
  if length < 4:
    raise ValueError(f"length must be >= 4, got {length}")
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab_size, length, dtype=np.int32)
  prompt = int(rng.integers(1, length // 2))
  mask = np.zeros(length, bool)
  t, action = prompt, True
  while t < length:  # alternate action / observation spans after the prompt
    span = int(rng.integers(1, 8))
    mask[t : t + span] = action
    t, action = t + span, not action
  if not mask.any():
    mask[-1] = True
  logprobs = np.where(mask, -rng.exponential(1.0, length) - 1e-3, 0.0).astype(np.float32)
  oldest = version if oldest_version is None else oldest_version
  # Versions step evenly from `oldest` (first action token) to `version` (last action token).
  steps = (np.cumsum(mask) - 1) * (version - oldest) // max(int(mask.sum()) - 1, 1)
  versions = np.where(mask, oldest + steps, -1).astype(np.int32)
  return Trajectory(
    uid=uid, prompt_id=f"p-{uid}", group_id=f"g-{uid}", env="synthetic", tokens=tokens,
    action_mask=mask, rollout_logprobs=logprobs, policy_versions=versions,
    reward=float(rng.normal()), metadata={"turns": int(rng.integers(1, 5)), "finish": "stop"},
  )  # fmt: skip


def _set(d: dict, field: str, index, value):
  d[field][index] = value


# kind -> mutation of a copied `Trajectory.to_dict()` with action positions `act`.
_MUTATIONS = {
  "nan_logprob": lambda d, act, vocab: _set(d, "rollout_logprobs", act[0], np.nan),
  "positive_logprob": lambda d, act, vocab: _set(d, "rollout_logprobs", act[-1], 0.5),
  "token_out_of_range": lambda d, act, vocab: _set(d, "tokens", -1, vocab),
  "negative_token": lambda d, act, vocab: _set(d, "tokens", 0, -1),
  "length_mismatch": lambda d, act, vocab: d.update(action_mask=d["action_mask"][:-1]),
  "version_from_future": lambda d, act, vocab: _set(
    d, "policy_versions", act[-1], int(d["policy_versions"][act].max()) + 1
  ),
  "missing_version": lambda d, act, vocab: _set(d, "policy_versions", act[0], -1),
  "action_at_position_0": lambda d, act, vocab: (
    _set(d, "action_mask", 0, True),
    _set(d, "policy_versions", 0, d["policy_versions"][act[0]]),
  ),
  "nonfinite_reward": lambda d, act, vocab: d.update(reward=float("inf")),
  "missing_uid": lambda d, act, vocab: d.update(uid=""),
}


def malformed(
  traj: Trajectory, kind: str, *, vocab_size: int, max_len: int
) -> tuple[Trajectory, str]:
  """Breaks `traj` (a copy) in the named way.

  Args:
    traj: a well-formed trajectory (from `make_trajectory`).
    kind: a key of MALFORMED_KINDS.
    vocab_size: the queue's vocabulary size.
    max_len: the queue's most tokens per trajectory ("too_long" builds one token longer).

  Returns:
    (the broken trajectory, the rejection reason the queue must give).
  """
  if kind not in MALFORMED_KINDS:
    raise ValueError(f"unknown malformed kind {kind!r}; known: {sorted(MALFORMED_KINDS)}")
  if kind == "too_long":
    newest = int(traj.policy_versions.max())
    longer = make_trajectory(traj.uid, length=max_len + 1, vocab_size=vocab_size, version=newest)
    return longer, "too_long"
  d = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in traj.to_dict().items()}
  _MUTATIONS[kind](d, np.flatnonzero(d["action_mask"]), vocab_size)
  return Trajectory.from_dict(d), MALFORMED_KINDS[kind]
