"""Checkpoints restore state bit for bit, into the requested shardings, with host state intact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sao_jax import checkpoint
from sao_jax.types import Trajectory


def _state(mesh):
  w = jax.device_put(jnp.arange(16.0).reshape(8, 2), NamedSharding(mesh, P("data", None)))
  return {"w": w, "step": jnp.int32(7), "rng": jax.random.key_data(jax.random.key(3))}


def test_round_trip_state_and_host(tmp_path):
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  state = _state(mesh)
  traj = Trajectory(
    "u1",
    "p",
    "g",
    "math",
    [1, 2, 3],
    [False, True, True],
    [0, -0.5, -1.0],
    [-1, 2, 2],
    1.0,
    {"turns": 1},
  )
  host = {
    "data": {"index": 12, "seed": 0},
    "replay": [traj.to_dict()],
    "empty": np.zeros((0, 3), np.float32),
    "name": "x",
  }
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"), keep=2)
  ckpt.save(5, state, host=host)
  ckpt.save(9, jax.tree.map(lambda x: x + 1, state), host={"data": {"index": 20}})
  ckpt.wait()
  assert ckpt.latest_step() == 9

  restored, got = ckpt.restore(checkpoint.abstract_like(state), step=5)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert restored["w"].sharding.spec == P("data", None)
  assert got["data"] == {"index": 12, "seed": 0} and got["name"] == "x"
  assert got["empty"].shape == (0, 3)
  back = Trajectory.from_dict(got["replay"][0])
  np.testing.assert_array_equal(back.rollout_logprobs, traj.rollout_logprobs)
  assert back.metadata == {"turns": 1} and back.uid == "u1"

  latest, got = checkpoint.Checkpointer(str(tmp_path / "ckpt")).restore(
    checkpoint.abstract_like(state)
  )
  assert int(latest["step"]) == 8 and got == {"data": {"index": 20}}
  ckpt.close()


def test_restore_missing_raises(tmp_path):
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    checkpoint.Checkpointer(str(tmp_path)).restore({})


def test_jax_arrays_in_host_state_are_refused(tmp_path):
  with pytest.raises(TypeError, match="jax.Array"):
    checkpoint.Checkpointer(str(tmp_path)).save(0, {"x": jnp.zeros(2)}, host={"bad": jnp.ones(2)})
