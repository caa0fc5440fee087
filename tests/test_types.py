"""Trajectory validation reasons and TrainBatch construction (reward on the last action token)."""

import numpy as np
import pytest

from sao_jax.types import Trajectory, make_batch


def _traj(uid="u", group="g", tokens=(5, 6, 7, 8, 9), mask=(0, 1, 1, 0, 1), reward=1.0, version=3):
  mask = np.array(mask, bool)
  return Trajectory(
    uid,
    "p",
    group,
    "math",
    np.array(tokens),
    mask,
    np.where(mask, -0.5, 0.0),
    np.where(mask, version, -1),
    reward,
  )


@pytest.mark.parametrize(
  "change,reason",
  [
    (lambda t: setattr(t, "action_mask", t.action_mask[:-1]), "length_mismatch:action_mask"),
    (lambda t: t.rollout_logprobs.__setitem__(1, np.nan), "nonfinite_logprob"),
    (lambda t: t.rollout_logprobs.__setitem__(1, 0.1), "positive_logprob"),
    (lambda t: t.tokens.__setitem__(0, 300), "token_out_of_range"),
    (lambda t: t.policy_versions.__setitem__(1, 9), "version_from_future"),
    (lambda t: t.action_mask.__setitem__(0, True), "action_at_position_0"),
    (lambda t: setattr(t, "reward", float("inf")), "nonfinite_reward"),
  ],
)
def test_validate_reasons(change, reason):
  t = _traj()
  assert t.validate(vocab_size=256, current_version=5) is None
  change(t)
  assert t.validate(vocab_size=256, current_version=5) == reason


def test_make_batch_places_reward_and_pads():
  a = _traj("a", "g1", reward=2.0)
  b = _traj("b", "g2", tokens=(1, 2, 3), mask=(0, 1, 0), reward=-1.0)
  c = _traj("c", "g1", reward=0.5)
  batch = make_batch([a, b, c], seq_len=8, batch_size=4)
  assert batch.shape == (4, 8)
  np.testing.assert_array_equal(batch.rewards[0], [0, 0, 0, 0, 2.0, 0, 0, 0])
  # b's trailing observation token does not get the reward: its last action token does.
  np.testing.assert_array_equal(batch.rewards[1], [0, -1.0, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(batch.group_ids, [0, 1, 0, 2])
  np.testing.assert_array_equal(batch.valid, [True, True, True, False])
  np.testing.assert_array_equal(batch.positions[1], [0, 1, 2, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(batch.policy_versions[1], [-1, 3, -1, -1, -1, -1, -1, -1])
  assert batch.padding_fraction() == 1 - 13 / 32
  assert not batch.action_mask[3].any()


def test_make_batch_rejects_overlong():
  with pytest.raises(ValueError, match="seq_len 4"):
    make_batch([_traj()], seq_len=4)
