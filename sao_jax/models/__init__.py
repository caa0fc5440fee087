"""Models: one NNX decoder for Qwen3, Qwen3-MoE and Llama (SmolLM2), as policy and critic.

Public API (design.md §3.3 and the models issue):

  cfg = models.get_preset("tiny")               # or models.config_from(config.model)
  policy = models.Policy(cfg, rngs=nnx.Rngs(0))
  policy.logits(tokens_bt)                      # f32[B, T, V]
  policy.token_logprobs(tokens_bt)              # (logprobs_bt, entropy_bt), fused, shifted
  critic = models.critic_from_policy(policy, rngs=nnx.Rngs(1))
  critic.values(tokens_bt)                      # f32[B, T], shifted like the log-probs
  models.critic_param_labels(nnx.state(critic, nnx.Param))   # 'frozen' | 'trainable'
  cache = models.init_cache(cfg, num_slots, max_len)
  cache, logits = models.prefill(policy, cache, tokens_pt, lengths_p, slots_p)
  cache, logits = models.decode_step(policy, cache, tokens_s, active_s)
  policy = models.from_pretrained("dir_or.gguf"); models.export_hf(policy, "out_dir")
  tok = models.load_tokenizer("byte" | "dir" | "tokenizer.json" | "x.gguf")
"""

from sao_jax.models.config import PRESETS, ModelConfig, config_from, get_preset
from sao_jax.models.decoder import Decoder, default_positions, segment_starts
from sao_jax.models.hf import config_from_hf, export_hf, from_pretrained, hf_config
from sao_jax.models.inference import (
  KVCache,
  cache_shardings,
  decode_step,
  extend,
  init_cache,
  prefill,
)
from sao_jax.models.policy import (
  FROZEN,
  TRAINABLE,
  Critic,
  Policy,
  critic_from_policy,
  critic_param_labels,
)
from sao_jax.models.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = [
  "FROZEN",
  "PRESETS",
  "TRAINABLE",
  "ByteTokenizer",
  "Critic",
  "Decoder",
  "HFTokenizer",
  "KVCache",
  "ModelConfig",
  "Policy",
  "Tokenizer",
  "cache_shardings",
  "config_from",
  "config_from_hf",
  "critic_from_policy",
  "critic_param_labels",
  "decode_step",
  "default_positions",
  "export_hf",
  "extend",
  "from_pretrained",
  "get_preset",
  "hf_config",
  "init_cache",
  "load_tokenizer",
  "prefill",
  "segment_starts",
]
