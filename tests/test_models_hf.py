"""Parity with Hugging Face transformers: tiny random Qwen3, Qwen3-MoE and Llama checkpoints.

Weights are re-drawn with a large std (and norm scales around 1) so that logits are O(1-10):
transformers' default init gives near-zero logits that would hide layout mistakes.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sao_jax import models
from sao_jax import sharding as shd
from sao_jax.models import hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

COMMON = dict(
  vocab_size=272,
  hidden_size=64,
  intermediate_size=128,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=16,
  max_position_embeddings=256,
)
FAMILIES = {
  "qwen3": lambda: transformers.Qwen3Config(
    **COMMON, tie_word_embeddings=False, rope_theta=10000.0
  ),
  "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
    **COMMON,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    norm_topk_prob=True,
    mlp_only_layers=[],
    tie_word_embeddings=False,
    rope_theta=1e6,
  ),
  "llama": lambda: transformers.LlamaConfig(
    **COMMON, tie_word_embeddings=True, rope_theta=1e5, rms_norm_eps=1e-5
  ),
}
_logits = jax.jit(lambda m, t: m.logits(t))


def _tokens(seed=0, b=2, t=12):
  return np.random.default_rng(seed).integers(0, 272, size=(b, t)).astype(np.int64)


def _hf_logits(model, tokens):
  with torch.no_grad():
    return model(torch.tensor(tokens)).logits.float().numpy()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request, tmp_path_factory):
  """(family, directory, HF model) with scaled random weights, saved by transformers."""
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(FAMILIES[request.param]()).float().eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.uniform_(0.5, 1.5)
      else:
        p.normal_(0.0, 0.25 if "embed" in name else 0.12)
  path = str(tmp_path_factory.mktemp(request.param))
  model.save_pretrained(path)
  return request.param, path, model


def test_from_pretrained_matches_transformers(checkpoint):
  family, path, model = checkpoint
  policy = models.from_pretrained(path)
  assert policy.cfg.hf_model_type == family
  tokens = _tokens()
  ref = _hf_logits(model, tokens)
  assert 1.0 < np.abs(ref).max() < 60.0, "weights should give O(1-10) logits"
  out = np.asarray(_logits(policy, jnp.asarray(tokens, jnp.int32)))
  np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)


def test_incremental_decode_equals_full_forward(checkpoint):
  _, path, _ = checkpoint
  policy = models.from_pretrained(path)
  tokens = jnp.asarray(_tokens(1, 1, 12), jnp.int32)
  full = _logits(policy, tokens)
  cache = models.init_cache(policy.cfg, num_slots=2, max_len=16)
  bucket = jnp.pad(tokens[:, :4], ((0, 0), (0, 4)))
  cache, logits = jax.jit(models.prefill)(policy, cache, bucket, jnp.array([4]), jnp.array([1]))
  err = [float(jnp.abs(logits[0] - full[0, 3]).max())]
  step = jax.jit(models.decode_step)
  for t in range(4, 12):
    cache, logits = step(policy, cache, jnp.array([0, tokens[0, t]]), jnp.array([False, True]))
    err.append(float(jnp.abs(logits[1] - full[0, t]).max()))
  assert max(err) <= 1e-5


def test_export_reloads_in_transformers(checkpoint, tmp_path):
  _, path, model = checkpoint
  policy = models.from_pretrained(path)
  files = models.export_hf(policy, str(tmp_path), max_shard_bytes=200_000)
  assert len(files) > 1 and os.path.isfile(tmp_path / "model.safetensors.index.json")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).float().eval()
  tokens = _tokens(2)
  np.testing.assert_allclose(_hf_logits(reloaded, tokens), _hf_logits(model, tokens), atol=1e-5)
  # And our loader reads the sharded export back.
  again = models.from_pretrained(str(tmp_path))
  for a, b in zip(
    jax.tree.leaves(nnx.state(again)), jax.tree.leaves(nnx.state(policy)), strict=True
  ):
    np.testing.assert_array_equal(a, b)


def test_sharded_load_places_tensors(checkpoint):
  family, path, model = checkpoint
  mesh = shd.make_mesh(shape={"fsdp": 2, "tensor": 2, "expert": 2})
  policy = models.from_pretrained(path, mesh=mesh)
  q = policy.model.layers[1].attn.q_proj[...]
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  assert q.addressable_shards[0].data.shape == (32, 2, 16)
  if family == "qwen3_moe":
    gate = policy.model.layers[0].mlp.gate_proj[...]
    assert gate.addressable_shards[0].data.shape == (4, 32, 16)
  tokens = _tokens(3)
  with shd.use_mesh(mesh):
    out = np.asarray(_logits(policy, jnp.asarray(tokens, jnp.int32)))
  np.testing.assert_allclose(out, _hf_logits(model, tokens), atol=1e-4, rtol=0)


def _edit_config(path, **changes):
  with open(os.path.join(path, "config.json")) as f:
    conf = json.load(f)
  conf.update(changes)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(conf, f)


def test_bad_checkpoints_raise_named_errors(tmp_path):
  from safetensors.numpy import load_file, save_file

  cfg = models.get_preset("tiny").replace(tie_embeddings=False, bos_id=None)
  good = str(tmp_path / "good")
  models.export_hf(models.Policy(cfg, rngs=nnx.Rngs(0)), good)
  with open(os.path.join(good, "config.json")) as f:
    conf = json.load(f)
  with pytest.raises(ValueError, match="model_type 'gpt2'"):
    hf.config_from_hf({**conf, "model_type": "gpt2"})
  with pytest.raises(ValueError, match="rope_type"):
    hf.config_from_hf(
      {
        **conf,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0},
      }
    )
  tensors = load_file(os.path.join(good, "model.safetensors"))
  # A missing tensor.
  missing = tensors.copy()
  del missing["model.layers.1.self_attn.k_proj.weight"]
  save_file(missing, os.path.join(good, "model.safetensors"))
  with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
    models.from_pretrained(good)
  # A shape mismatch (config.json says 4 KV heads, the tensors hold 2).
  save_file(tensors, os.path.join(good, "model.safetensors"))
  _edit_config(good, num_key_value_heads=4)
  with pytest.raises(ValueError, match=r"k_proj\.weight.*shape \(32, 64\), expected \(64, 64\)"):
    models.from_pretrained(good)
  # A tensor the architecture does not use.
  _edit_config(good, num_key_value_heads=2)
  save_file(
    {**tensors, "model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)},
    os.path.join(good, "model.safetensors"),
  )
  with pytest.raises(ValueError, match=r"q_proj\.bias"):
    models.from_pretrained(good)
  with pytest.raises(FileNotFoundError, match="config.json"):
    models.from_pretrained(str(tmp_path))
