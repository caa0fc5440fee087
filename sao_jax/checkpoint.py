"""Orbax checkpoints of the whole training state, plus host-side state, in one manifest per step.

A checkpoint step holds three items (design.md §6, last bullet):
  state: the TrainState pytree (both models, both optimizers, step, version, RNG, running baseline),
    restored into the shardings of the abstract state you pass (so a resumed run continues exactly);
  host: numpy arrays of host-side state (replay contents, the lag ring's versions, ...) as one npz
    blob (orbax cannot save zero-size arrays; an npz can);
  meta: JSON (data iterator state, counters, config).

`save` is asynchronous by default; call `wait()` before reading a checkpoint back, and `close()` at
the end. Only the primary process writes host and meta items (multi-host runs keep per-host data
positions symmetric, so process 0's state describes every host).
"""

from __future__ import annotations

import io
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

_ARRAY = "__array__"


def _split_host(tree: Any, arrays: dict[str, np.ndarray], path: str = "") -> Any:
  """Replaces numpy arrays in a nested dict/list by placeholders; collects them in `arrays`."""
  if isinstance(tree, np.ndarray | np.generic):
    key = f"a{len(arrays)}"
    arrays[key] = np.asarray(tree)
    return {_ARRAY: key}
  if isinstance(tree, dict):
    return {str(k): _split_host(v, arrays, f"{path}/{k}") for k, v in tree.items()}
  if isinstance(tree, list | tuple):
    return [_split_host(v, arrays, f"{path}/{i}") for i, v in enumerate(tree)]
  if isinstance(tree, jax.Array):
    raise TypeError(f"host state at {path or '/'} is a jax.Array; convert it to numpy first")
  return tree


def _join_host(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
  if isinstance(tree, dict):
    if set(tree) == {_ARRAY}:
      return arrays[tree[_ARRAY]]
    return {k: _join_host(v, arrays) for k, v in tree.items()}
  if isinstance(tree, list):
    return [_join_host(v, arrays) for v in tree]
  return tree


def _to_npz_bytes(arrays: dict[str, np.ndarray]) -> np.ndarray:
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  return np.frombuffer(buf.getvalue(), np.uint8).copy()


def _from_npz_bytes(blob: np.ndarray) -> dict[str, np.ndarray]:
  with np.load(io.BytesIO(np.asarray(blob, np.uint8).tobytes())) as z:
    return {k: z[k] for k in z.files}


def abstract_like(state: Any) -> Any:
  """ShapeDtypeStructs (with shardings) describing `state`, the target of a restore."""
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), state
  )


class Checkpointer:
  """Saves and restores (state, host) pairs under `directory/<step>/`.

  Args:
    directory: where checkpoints live (local path or a GCS path on TPU pods).
    keep: checkpoints kept; older ones are deleted.
    async_save: return from `save` before the data is written.
  """

  def __init__(self, directory: str, *, keep: int = 2, async_save: bool = True):
    self.directory = os.path.abspath(directory) if "://" not in directory else directory
    options = ocp.CheckpointManagerOptions(
      max_to_keep=max(keep, 1), enable_async_checkpointing=async_save, create=True
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, *, host: dict[str, Any] | None = None) -> None:
    """Saves `state` (a pytree of jax arrays) and `host` (nested dicts/lists of numpy + JSON)."""
    arrays: dict[str, np.ndarray] = {}
    meta = _split_host(host or {}, arrays)
    args = ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      host=ocp.args.PyTreeSave({"npz": _to_npz_bytes(arrays)}),
      meta=ocp.args.JsonSave(meta),
    )
    self._manager.save(int(step), args=args, force=True)

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Restores (state, host) of `step` (default: the latest) into `abstract_state`'s shardings.

    Args:
      abstract_state: a pytree of jax.ShapeDtypeStruct with shardings (see `abstract_like`).
      step: which checkpoint; None for the latest.

    Returns:
      The restored state pytree and the host dict as saved.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    restored = self._manager.restore(
      int(step),
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        host=ocp.args.PyTreeRestore(),
        meta=ocp.args.JsonRestore(),
      ),
    )
    arrays = _from_npz_bytes(restored.host["npz"])
    return restored.state, _join_host(restored.meta, arrays)

  def wait(self):
    self._manager.wait_until_finished()

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()
