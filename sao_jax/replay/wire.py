"""Trajectory <-> `replay.proto` message conversion (numpy only on the wire; style rule 9).

Arrays travel as packed little-endian bytes (int32 and float32: 4 bytes per token, bool: 1 byte of
0/1). Encoding refuses anything that is not a numpy array or a Python/numpy scalar, so a
`jax.Array` can never cross a process boundary. Decoding never raises on bad bytes: it returns a
rejection reason ("bad_encoding:<field>") instead. T = tokens of the trajectory.
"""

from __future__ import annotations

import numbers

import numpy as np

from sao_jax.replay import replay_pb2 as pb
from sao_jax.types import MetadataValue, Trajectory

# field -> wire dtype (little-endian, fixed width).
_WIRE_DTYPES = {
  "tokens": np.dtype("<i4"),
  "action_mask": np.dtype("u1"),
  "rollout_logprobs": np.dtype("<f4"),
  "policy_versions": np.dtype("<i4"),
}
_HOST_DTYPES = {"tokens": np.int32, "action_mask": bool, "rollout_logprobs": np.float32,
                "policy_versions": np.int32}  # fmt: skip


def _check_numpy(value, name: str):
  if not isinstance(value, np.ndarray):
    raise TypeError(
      f"Trajectory.{name} is a {type(value).__module__}.{type(value).__name__}; only numpy arrays "
      "cross process boundaries (convert with np.asarray before building the Trajectory)"
    )


def _encode_metadata_value(key: str, value: MetadataValue) -> pb.MetadataValue:
  if isinstance(value, str):
    return pb.MetadataValue(string_value=value)
  if isinstance(value, (bool, np.bool_, numbers.Integral)):
    return pb.MetadataValue(int_value=int(value))
  if isinstance(value, (float, np.floating)):
    return pb.MetadataValue(float_value=float(value))
  raise TypeError(
    f"Trajectory.metadata[{key!r}] is a {type(value).__module__}.{type(value).__name__}; "
    "metadata values must be str, int or float"
  )


def to_proto(traj: Trajectory) -> pb.Trajectory:
  """Encodes a trajectory for the wire.

  Args:
    traj: numpy fields of shape [T] (a field of another rank is sent flattened and then rejected
      by the server's length checks).

  Returns:
    A `sao_jax.replay.v1.Trajectory` message.

  Raises:
    TypeError: a field is not numpy (e.g. a jax.Array) or a metadata value is not str/int/float.
  """
  packed = {}
  for name, dtype in _WIRE_DTYPES.items():
    value = getattr(traj, name)
    _check_numpy(value, name)
    packed[name] = np.ascontiguousarray(value.reshape(-1), dtype=dtype).tobytes()
  if not isinstance(traj.reward, (float, int, np.floating, np.integer)):
    raise TypeError(f"Trajectory.reward is a {type(traj.reward)}; must be a Python/numpy scalar")
  msg = pb.Trajectory(
    uid=traj.uid, prompt_id=traj.prompt_id, group_id=traj.group_id, env=traj.env,
    reward=float(traj.reward), **packed,
  )  # fmt: skip
  for key, value in traj.metadata.items():
    msg.metadata[str(key)].CopyFrom(_encode_metadata_value(key, value))
  return msg


def from_proto(msg: pb.Trajectory) -> Trajectory | str:
  """Decodes a wire message.

  Args:
    msg: a `sao_jax.replay.v1.Trajectory`.

  Returns:
    The Trajectory (not yet validated), or a rejection reason "bad_encoding:<field>".
  """
  arrays = {}
  for name, dtype in _WIRE_DTYPES.items():
    raw = getattr(msg, name)
    if len(raw) % dtype.itemsize:
      return f"bad_encoding:{name}"
    arrays[name] = np.frombuffer(raw, dtype).astype(_HOST_DTYPES[name])
  if len(msg.action_mask) and np.frombuffer(msg.action_mask, np.uint8).max() > 1:
    return "bad_encoding:action_mask"
  metadata = {}
  for key, value in msg.metadata.items():
    kind = value.WhichOneof("kind")
    if kind is None:
      return "bad_encoding:metadata"
    metadata[key] = getattr(value, kind)
  return Trajectory(
    uid=msg.uid, prompt_id=msg.prompt_id, group_id=msg.group_id, env=msg.env,
    reward=msg.reward, metadata=metadata, **arrays,
  )  # fmt: skip
