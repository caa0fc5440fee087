"""Parameter counts and per-device training memory for a preset on a mesh, without any devices.

  python -m sao_jax.models.memory --preset=qwen3_30b_a3b --mesh=data=8,fsdp=8

prints, per device: parameters, gradients and AdamW moments of the policy and of the critic
(whose frozen attention has no gradient and no optimizer state), from `nnx.eval_shape` and the
logical -> mesh rules; activations and the KV cache are not included.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from flax import nnx

from sao_jax import sharding as shd
from sao_jax.models.config import ModelConfig, get_preset
from sao_jax.models.policy import FROZEN, Critic, Policy, critic_param_labels


def abstract_state(cfg: ModelConfig, *, critic: bool = False) -> nnx.State:
  """`nnx.state` of a Policy (or Critic) built with `nnx.eval_shape`: shapes only, no memory."""
  ctor = (
    (lambda: Critic(cfg, rngs=nnx.Rngs(0))) if critic else (lambda: Policy(cfg, rngs=nnx.Rngs(0)))
  )
  return nnx.state(nnx.eval_shape(ctor), nnx.Param)


def count_params(cfg: ModelConfig) -> tuple[int, int]:
  """(total, active) parameters of the policy; active counts k of the E experts of each MoE layer.

  Embeddings and the LM head count in both (Qwen3-30B-A3B: about 30.5B total, 3.3B active).
  """
  flat = jax.tree_util.tree_flatten_with_path(abstract_state(cfg))[0]
  total = active = 0
  for path, v in flat:
    n = int(np.prod(v.shape))
    total += n
    is_expert = cfg.is_moe and any(
      getattr(k, "key", None) in ("gate_proj", "up_proj", "down_proj") for k in path
    )
    active += n * cfg.experts_per_token // cfg.num_experts if is_expert else n
  return total, active


def training_memory(
  cfg: ModelConfig,
  mesh_sizes: Mapping[str, int],
  rules: shd.Rules = shd.DEFAULT_RULES,
  *,
  opt_dtype: str = "float32",
  with_critic: bool = True,
) -> dict[str, int]:
  """Per-device bytes of params, grads and AdamW moments (mu, nu) for policy (and critic).

  Args:
    cfg: the model config (its param_dtype sets parameter and gradient bytes).
    mesh_sizes: mesh axis -> size, e.g. {'data': 8, 'fsdp': 8}.
    rules: logical -> mesh rules.
    opt_dtype: dtype of the two Adam moments.
    with_critic: include a critic with frozen attention.

  Returns:
    {'policy/params', 'policy/grads', 'policy/adam', 'critic/...', 'total'} in bytes.
  """
  scale = np.dtype(opt_dtype).itemsize / cfg.weight_dtype.itemsize
  out = {}
  models = [("policy", abstract_state(cfg))]
  if with_critic:
    models.append(("critic", abstract_state(cfg, critic=True)))
  for name, state in models:
    per_leaf = shd.bytes_per_device(state, rules, mesh_sizes)
    labels = jax.tree.leaves(critic_param_labels(state)) if name == "critic" else None
    trained = sum(n for i, n in enumerate(per_leaf) if labels is None or labels[i] != FROZEN)
    out[f"{name}/params"] = sum(per_leaf)
    out[f"{name}/grads"] = trained
    out[f"{name}/adam"] = int(2 * trained * scale)
  out["total"] = sum(out.values())
  return out


def parse_mesh(text: str) -> dict[str, int]:
  """'data=8,fsdp=8' -> {'data': 8, 'fsdp': 8} (axes not named are 1)."""
  sizes = {}
  for item in filter(None, (s.strip() for s in text.split(","))):
    axis, _, n = item.partition("=")
    if axis not in shd.MESH_AXES or not n.isdigit() or int(n) < 1:
      raise ValueError(f"--mesh: bad entry {item!r}; expected AXIS=N with AXIS in {shd.MESH_AXES}")
    sizes[axis] = int(n)
  return sizes


def main(argv: Sequence[str] | None = None):
  """Prints parameter counts and the per-device memory table."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--preset", default="qwen3_30b_a3b")
  ap.add_argument("--mesh", default="data=8,fsdp=8", help="e.g. data=8,fsdp=8 (a 64-chip pod)")
  ap.add_argument("--param_dtype", default="bfloat16", choices=("float32", "bfloat16"))
  ap.add_argument("--opt_dtype", default="float32", choices=("float32", "bfloat16"))
  ap.add_argument("--no_critic", action="store_true")
  args = ap.parse_args(argv)
  cfg = get_preset(args.preset).replace(param_dtype=args.param_dtype)
  mesh = parse_mesh(args.mesh)
  total, active = count_params(cfg)
  print(f"{args.preset}: {total / 1e9:.2f}B parameters, {active / 1e9:.2f}B active per token")
  print(
    f"mesh {mesh} ({int(np.prod(list(mesh.values())))} devices), params {args.param_dtype}, "
    f"Adam moments {args.opt_dtype}"
  )
  mem = training_memory(cfg, mesh, opt_dtype=args.opt_dtype, with_critic=not args.no_critic)
  print(f"{'per device':<18}{'GiB':>10}")
  for key, n in mem.items():
    print(f"{key:<18}{n / 2**30:>10.2f}")


if __name__ == "__main__":
  main()
