"""Device layout: the mesh, logical axis names, and the rules that map one onto the other.

Model code names *logical* axes only (`EMBED`, `MLP`, `HEADS`, ...): parameters carry them as
`out_sharding` metadata and activations go through `constrain(x, (BATCH, LENGTH, None))`. The only
place logical names meet mesh axes ('data', 'fsdp', 'tensor', 'expert') is a rule table,
`config.mesh.rules`, e.g. `(("embed", "fsdp"), ("mlp", "tensor"), ...)`.

Turning names into a `PartitionSpec` follows three rules, so any rule table gives a valid layout:
a logical name without a rule (or with rule None) is replicated; a mesh axis already used by an
earlier dimension of the same array is not used again; and, when the mesh is known, a mesh axis
whose size does not divide the dimension is dropped (e.g. SmolLM2's 9 heads on tensor=2).

Typical use:

  mesh = sharding.make_mesh(config)
  rules = sharding.rules_from(config)
  policy = sharding.create_sharded(lambda: models.Policy(cfg, rngs=nnx.Rngs(0)), mesh, rules)
  with sharding.use_mesh(mesh, rules):
    loss = jax.jit(loss_fn)(policy, batch)   # activations constrained by the same rules

Models are never sharded eagerly by Flax (they work with no mesh at all); `create_sharded` builds
them inside `jax.jit` with `out_shardings`, so a large model is born sharded and never exists whole
on one device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

# Logical axis names. Model code uses these constants, never mesh axis names.
BATCH = "batch"  # rows of a batch (also KV-cache slots)
LENGTH = "length"  # token positions
EMBED = "embed"  # model width D
MLP = "mlp"  # feed-forward width F
HEADS = "heads"  # query heads N
KV_HEADS = "kv_heads"  # key/value heads K
HEAD_DIM = "head_dim"  # per-head width H
VOCAB = "vocab"  # vocabulary V
EXPERT = "expert"  # MoE experts E
LOGICAL_AXES = (BATCH, LENGTH, EMBED, MLP, HEADS, KV_HEADS, HEAD_DIM, VOCAB, EXPERT)

MESH_AXES = ("data", "fsdp", "tensor", "expert")

# The same table as `config.mesh.rules` in sao_jax/config.py (used when no config is given).
DEFAULT_RULES = (
  (BATCH, ("data", "fsdp")),
  (LENGTH, None),
  (EMBED, "fsdp"),
  (MLP, "tensor"),
  (HEADS, "tensor"),
  (KV_HEADS, "tensor"),
  (HEAD_DIM, None),
  (VOCAB, "tensor"),
  (EXPERT, "expert"),
)

Rules = Sequence[tuple[str, str | Sequence[str] | None]]
AxisNames = Sequence[str | None]


@dataclasses.dataclass
class _Context(threading.local):
  mesh: Mesh | None = None
  rules: tuple = ()


_CTX = _Context()


def rules_from(config: Any) -> tuple:
  """The logical -> mesh rule table of a config (`config.mesh.rules`), checked.

  Args:
    config: the full run config (a ConfigDict with a `mesh` section), or a rule sequence.

  Returns:
    A tuple of `(logical_name, mesh_axis | tuple of mesh axes | None)` pairs.
  """
  rules = config.mesh.rules if hasattr(config, "mesh") else config
  out = []
  for i, rule in enumerate(rules):
    if len(rule) != 2 or not isinstance(rule[0], str):
      raise ValueError(f"config.mesh.rules[{i}]: expected (logical_name, mesh_axes), got {rule!r}")
    name, target = rule
    for axis in _as_tuple(target):
      if axis not in MESH_AXES:
        raise ValueError(
          f"config.mesh.rules[{i}] ({name!r}): unknown mesh axis {axis!r}; known: {MESH_AXES}"
        )
    out.append(
      (name, None if target is None else target if isinstance(target, str) else tuple(target))
    )
  return tuple(out)


def make_mesh(
  config: Any = None,
  *,
  shape: Mapping[str, int] | None = None,
  devices: Sequence[jax.Device] | None = None,
) -> Mesh:
  """A 4-axis ('data', 'fsdp', 'tensor', 'expert') mesh with Auto (GSPMD-style) axis types.

  Args:
    config: the run config; `config.mesh` gives the axis sizes (one may be -1).
    shape: axis sizes instead of a config (missing axes are 1).
    devices: devices to use (default: all of `jax.devices()`).

  Returns:
    A `jax.sharding.Mesh` over `devices`.
  """
  devices = list(jax.devices() if devices is None else devices)
  if shape is None:
    from sao_jax.config import mesh_shape

    shape = mesh_shape(config, len(devices)) if config is not None else {"data": len(devices)}
  sizes = tuple(int(shape.get(a, 1)) for a in MESH_AXES)
  if int(np.prod(sizes)) != len(devices):
    raise ValueError(
      f"mesh shape {dict(zip(MESH_AXES, sizes, strict=True))} needs {np.prod(sizes)} devices, got {len(devices)}"
    )
  return jax.make_mesh(
    sizes, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
  )


def logical_to_spec(
  axes: AxisNames,
  rules: Rules = DEFAULT_RULES,
  *,
  shape: Sequence[int] | None = None,
  mesh_sizes: Mapping[str, int] | None = None,
) -> PartitionSpec:
  """Maps logical axis names to a PartitionSpec (see the module docstring for the three rules).

  Args:
    axes: one logical name (or None) per array dimension.
    rules: the logical -> mesh table.
    shape: the array shape; with `mesh_sizes`, mesh axes that do not divide a dimension are dropped.
    mesh_sizes: mesh axis name -> size (e.g. `dict(mesh.shape)`).

  Returns:
    A PartitionSpec with one entry per dimension.
  """
  table = dict(rules)
  used: set[str] = set()
  spec = []
  for dim, name in enumerate(axes):
    kept = []
    size = None if shape is None else int(shape[dim])
    for axis in _as_tuple(table.get(name)) if name is not None else ():
      n = 1 if mesh_sizes is None else int(mesh_sizes.get(axis, 1))
      if axis in used or (
        size is not None and mesh_sizes is not None and size % (n * _prod(kept, mesh_sizes)) != 0
      ):
        continue
      kept.append(axis)
      used.add(axis)
    spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return PartitionSpec(*spec)


def param_specs(
  state: Any, rules: Rules = DEFAULT_RULES, *, mesh_sizes: Mapping[str, int] | None = None
) -> Any:
  """PartitionSpecs for every Variable of an nnx state (from its `out_sharding` metadata).

  Args:
    state: `nnx.state(model)` (concrete or abstract from `nnx.eval_shape`).
    rules: the logical -> mesh table.
    mesh_sizes: mesh axis sizes, to drop axes that do not divide a dimension.

  Returns:
    The same tree with each array replaced by its PartitionSpec (Variables without logical axes
    are replicated).
  """

  def spec(v):
    axes = v.get_metadata().get("out_sharding") or (None,) * len(v.shape)
    return logical_to_spec(axes, rules, shape=v.shape, mesh_sizes=mesh_sizes)

  return jax.tree.map(lambda v: v.replace(spec(v)), state, is_leaf=_is_variable)


def param_shardings(state: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """NamedShardings for every Variable of an nnx state on `mesh` (see `param_specs`)."""
  specs = param_specs(state, rules, mesh_sizes=dict(mesh.shape))
  return jax.tree.map(
    lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
  )


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.Module:
  """Moves an existing model's variables to their shardings on `mesh`, in place.

  Args:
    model: an nnx Module (e.g. a Policy or Critic).
    mesh: the device mesh.
    rules: the logical -> mesh table.

  Returns:
    The same model object, now sharded.
  """
  state = nnx.state(model)
  nnx.update(model, jax.device_put(state, param_shardings(state, mesh, rules)))
  return model


def create_sharded(
  ctor: Callable[[], nnx.Module], mesh: Mesh, rules: Rules = DEFAULT_RULES
) -> nnx.Module:
  """Builds `ctor()` inside jit with sharded outputs: the model is born sharded.

  Args:
    ctor: a zero-argument function returning a fresh model (it creates its own `nnx.Rngs`).
    mesh: the device mesh.
    rules: the logical -> mesh table.

  Returns:
    The model, every variable placed with `param_shardings`.
  """
  graphdef, abstract = nnx.split(nnx.eval_shape(ctor))
  shardings = param_shardings(abstract, mesh, rules)
  state = jax.jit(lambda: nnx.state(ctor()), out_shardings=shardings)()
  return nnx.merge(graphdef, state)


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Iterator[Mesh]:
  """Context: `jax.set_mesh(mesh)` plus the rules that `constrain` applies to activations."""
  old = (_CTX.mesh, _CTX.rules)
  _CTX.mesh, _CTX.rules = mesh, tuple(rules)
  try:
    with jax.set_mesh(mesh):
      yield mesh
  finally:
    _CTX.mesh, _CTX.rules = old


def current_mesh() -> Mesh | None:
  """The mesh of the innermost `use_mesh` context, or None."""
  return _CTX.mesh


def constrain(x: jax.Array, axes: AxisNames) -> jax.Array:
  """`with_sharding_constraint` by logical names under `use_mesh`; the identity without a mesh.

  Args:
    x: an activation, e.g. `[B, T, D]`.
    axes: one logical name (or None) per dimension, e.g. `(BATCH, LENGTH, None)`.

  Returns:
    x, constrained to the layout the rules give (same values).
  """
  if _CTX.mesh is None:
    return x
  if len(axes) != x.ndim:
    raise ValueError(
      f"constrain: {len(axes)} axis names {tuple(axes)} for an array of rank {x.ndim}"
    )
  spec = logical_to_spec(axes, _CTX.rules, shape=x.shape, mesh_sizes=dict(_CTX.mesh.shape))
  return jax.lax.with_sharding_constraint(x, NamedSharding(_CTX.mesh, spec))


def bytes_per_device(state: Any, rules: Rules, mesh_sizes: Mapping[str, int]) -> list[int]:
  """Bytes one device holds of each array of an (abstract) nnx state, in `jax.tree.leaves` order.

  No devices are needed: a shard is the array's shape divided by the mesh axes its spec uses.

  Args:
    state: an nnx state (abstract from `nnx.eval_shape` is enough).
    rules: the logical -> mesh table.
    mesh_sizes: mesh axis name -> size.

  Returns:
    One byte count per array leaf.
  """
  specs = jax.tree.leaves(
    param_specs(state, rules, mesh_sizes=mesh_sizes), is_leaf=lambda x: isinstance(x, PartitionSpec)
  )
  out = []
  for v, spec in zip(jax.tree.leaves(state), specs, strict=True):
    n = int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
    for entry in spec:
      n //= _prod(_as_tuple(entry), mesh_sizes)
    out.append(n)
  return out


def _as_tuple(x: Any) -> tuple:
  if x is None:
    return ()
  return (x,) if isinstance(x, str) else tuple(x)


def _prod(axes: Sequence[str], mesh_sizes: Mapping[str, int]) -> int:
  return int(np.prod([int(mesh_sizes.get(a, 1)) for a in axes], dtype=np.int64))


def _is_variable(x: Any) -> bool:
  return isinstance(x, nnx.Variable)
