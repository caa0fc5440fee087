"""Tests for sao_jax.sharding: rule mapping, meshes, and sharded = single-device numerics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from sao_jax import config as config_lib
from sao_jax import models
from sao_jax import sharding as shd


def test_logical_to_spec_rules():
  rules = shd.DEFAULT_RULES
  assert shd.logical_to_spec((shd.EMBED, shd.MLP), rules) == P("fsdp", "tensor")
  assert shd.logical_to_spec((shd.BATCH, shd.LENGTH, None), rules) == P(
    ("data", "fsdp"), None, None
  )
  # fsdp is taken by the batch dimension, so the embed dimension is not sharded again.
  assert shd.logical_to_spec((shd.BATCH, None, shd.EMBED), rules) == P(("data", "fsdp"), None, None)
  # An axis that does not divide the dimension is dropped (SmolLM2: 9 heads on tensor = 2).
  sizes = {"data": 1, "fsdp": 2, "tensor": 2, "expert": 1}
  spec = shd.logical_to_spec(
    (shd.EMBED, shd.HEADS, None), rules, shape=(576, 9, 64), mesh_sizes=sizes
  )
  assert spec == P("fsdp", None, None)
  # Unknown logical names are replicated.
  assert shd.logical_to_spec(("unknown", None), rules) == P(None, None)


def test_rules_and_mesh_from_config():
  c = config_lib.base_config()
  assert shd.rules_from(c) == shd.DEFAULT_RULES
  c.mesh.fsdp, c.mesh.tensor = 2, 2
  mesh = shd.make_mesh(c)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
  c.mesh.rules = (("embed", "pipeline"),)
  with pytest.raises(ValueError, match="mesh.rules"):
    shd.rules_from(c)
  with pytest.raises(ValueError, match="needs 6 devices"):
    shd.make_mesh(shape={"data": 3, "tensor": 2})


def test_bytes_per_device_by_hand():
  state = nnx.State(
    {
      "w": nnx.Param(
        jax.ShapeDtypeStruct((64, 128), jnp.float32),
        out_sharding=(shd.EMBED, shd.MLP),
        eager_sharding=False,
      )
    }
  )
  per_leaf = shd.bytes_per_device(state, shd.DEFAULT_RULES, {"fsdp": 4, "tensor": 2})
  assert per_leaf == [64 * 128 * 4 // 8]


def _fused_loss(model, tokens, seg):
  """Through the fused log-prob kernel (the training path)."""
  lp, ent = model.token_logprobs(tokens, segment_ids_bt=seg)
  return jnp.sum(lp * jnp.cos(ent)), lp


def _logits_loss(model, tokens, seg):
  """Through plain logits (cheaper to compile; used for the MoE case)."""
  logits = model.logits(tokens, segment_ids_bt=seg)
  lp = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], axis=-1)[..., 0]
  return jnp.sum(lp), lp


@pytest.mark.parametrize(
  "preset,shape,loss",
  [
    ("tiny", {"data": 2, "fsdp": 2, "tensor": 2}, _fused_loss),
    ("tiny_moe", {"fsdp": 2, "tensor": 2, "expert": 2}, _logits_loss),
  ],
)
def test_sharded_forward_and_grad_equal_single_device(preset, shape, loss):
  cfg = models.get_preset(preset)
  policy = models.Policy(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(0), (4, 16), 0, cfg.vocab_size)
  seg = jnp.repeat(jnp.array([[1] * 10 + [2] * 6]), 4, axis=0)
  step = jax.jit(nnx.value_and_grad(loss, has_aux=True))
  (loss0, lp0), g0 = step(policy, tokens, seg)

  mesh = shd.make_mesh(shape=shape)
  rules = shd.DEFAULT_RULES
  sharded = shd.shard_model(models.Policy(cfg, rngs=nnx.Rngs(0)), mesh, rules)
  q = sharded.model.layers[0].attn.q_proj[...]
  assert q.sharding.spec == P("fsdp", "tensor", None)
  if cfg.is_moe:
    assert sharded.model.layers[0].mlp.gate_proj[...].sharding.spec == P("expert", "fsdp", "tensor")
  batch_sharding = jax.NamedSharding(mesh, shd.logical_to_spec((shd.BATCH, None), rules))
  with shd.use_mesh(mesh, rules):
    (loss1, lp1), g1 = step(
      sharded, jax.device_put(tokens, batch_sharding), jax.device_put(seg, batch_sharding)
    )
  np.testing.assert_allclose(lp1, lp0, atol=2e-5)
  np.testing.assert_allclose(loss1, loss0, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_create_sharded_is_born_sharded():
  cfg = models.get_preset("tiny").replace(num_layers=1)
  mesh = shd.make_mesh(shape={"fsdp": 4, "tensor": 2})
  policy = shd.create_sharded(lambda: models.Policy(cfg, rngs=nnx.Rngs(0)), mesh)
  embed = policy.model.embed[...]
  assert embed.sharding.spec == P("tensor", "fsdp")
  assert embed.addressable_shards[0].data.shape == (cfg.vocab_size // 2, cfg.d_model // 4)
  assert float(jnp.std(embed)) == pytest.approx(cfg.init_std, rel=0.1)


def test_cache_shardings():
  cfg = models.get_preset("tiny")
  mesh = shd.make_mesh(shape={"data": 2, "fsdp": 2, "tensor": 2})
  cache = models.init_cache(cfg, num_slots=8, max_len=16)
  shardings = models.cache_shardings(cache, mesh)
  assert len(shardings.k) == cfg.num_layers
  assert shardings.k[0].spec == P(("data", "fsdp"), "tensor", None, None)
  assert shardings.lengths.spec == P(("data", "fsdp"))
  placed = jax.device_put(cache, shardings)
  assert placed.k[-1].addressable_shards[0].data.shape == (2, 1, 16, 16)  # [S, K, M, H] / mesh
