"""ModelConfig: one frozen dataclass for Qwen3, Qwen3-MoE and Llama (SmolLM2), plus presets.

The three families differ only by flags: `qk_norm` (per-head q/k RMSNorm, Qwen3), `num_experts`
(> 0: every layer's feed-forward is a top-k MoE, Qwen3-MoE), `tie_embeddings` (the LM head is the
transposed embedding table). `hf_model_type` names the family for Hugging Face export.

Presets: `tiny` (tests and the CPU quickstart: 2 layers, d = 64, the byte tokenizer's vocabulary),
`tiny_moe`, `smollm2_135m`, `qwen3_0_6b`, `qwen3_8b`, `qwen3_30b_a3b` (the published configs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A decoder-only transformer: GQA attention with RoPE, SwiGLU MLP or MoE, RMSNorm.

  Attributes:
    name: preset or checkpoint name (informational).
    vocab_size: V, rows of the embedding table.
    d_model: D, residual width.
    num_layers: L, decoder layers.
    num_heads: N, query heads.
    num_kv_heads: K, key/value heads (N % K == 0; grouped-query attention).
    head_dim: H, per-head width (may differ from D / N, as in Qwen3).
    mlp_dim: F, SwiGLU width of dense layers.
    num_experts: E, experts per MoE layer (0 = dense model).
    experts_per_token: k, experts each token is routed to.
    moe_mlp_dim: SwiGLU width of one expert.
    norm_topk_prob: renormalize the top-k router probabilities to sum to 1 (Qwen3-MoE: True).
    qk_norm: per-head RMSNorm on queries and keys before RoPE (Qwen3).
    tie_embeddings: LM head = embedding table transposed (SmolLM2, Qwen3-0.6B).
    rope_theta: RoPE base frequency.
    norm_eps: RMSNorm epsilon.
    max_seq_len: longest position the model is meant for (exported as max_position_embeddings).
    init_std: std of the normal init of every matrix (HF initializer_range).
    dtype: compute dtype ('float32' or 'bfloat16'); softmax, norms and log-probs are float32.
    param_dtype: parameter storage dtype.
    remat: rematerialize every decoder layer in the backward pass.
    logprob_block_size: vocabulary tile of the fused log-prob kernel (0 = its default).
    bos_id: beginning-of-sequence id written to an exported config.json (None: omitted).
    eos_id: end-of-sequence id written to an exported config.json (None: omitted).
  """

  name: str = "custom"
  vocab_size: int = 272
  d_model: int = 64
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  mlp_dim: int = 128
  num_experts: int = 0
  experts_per_token: int = 0
  moe_mlp_dim: int = 0
  norm_topk_prob: bool = True
  qk_norm: bool = True
  tie_embeddings: bool = True
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-6
  max_seq_len: int = 4096
  init_std: float = 0.02
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False
  logprob_block_size: int = 0
  bos_id: int | None = None
  eos_id: int | None = None

  def __post_init__(self):
    for f in (
      "vocab_size",
      "d_model",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
      "mlp_dim",
      "max_seq_len",
    ):
      _check(getattr(self, f) >= 1, f, f"must be >= 1, got {getattr(self, f)}")
    _check(
      self.num_heads % self.num_kv_heads == 0,
      "num_heads",
      f"{self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}",
    )
    _check(self.head_dim % 2 == 0, "head_dim", f"RoPE needs an even head_dim, got {self.head_dim}")
    _check(self.num_experts >= 0, "num_experts", f"must be >= 0, got {self.num_experts}")
    if self.num_experts:
      _check(
        1 <= self.experts_per_token <= self.num_experts,
        "experts_per_token",
        f"must be in [1, num_experts={self.num_experts}], got {self.experts_per_token}",
      )
      _check(
        self.moe_mlp_dim >= 1, "moe_mlp_dim", f"must be >= 1 for an MoE, got {self.moe_mlp_dim}"
      )
    for f in ("dtype", "param_dtype"):
      _check(getattr(self, f) in DTYPES, f, f"must be one of {DTYPES}, got {getattr(self, f)!r}")
    _check(self.rope_theta > 0, "rope_theta", f"must be > 0, got {self.rope_theta}")
    _check(self.logprob_block_size >= 0, "logprob_block_size", "must be >= 0")

  @property
  def is_moe(self) -> bool:
    return self.num_experts > 0

  @property
  def hf_model_type(self) -> str:
    """'qwen3_moe', 'qwen3' or 'llama': the Hugging Face family this config exports as."""
    if self.is_moe:
      return "qwen3_moe"
    return "qwen3" if self.qk_norm else "llama"

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes: Any) -> ModelConfig:
    """A copy with some fields changed (validated again)."""
    return dataclasses.replace(self, **changes)


def _check(ok: bool, field: str, why: str):
  if not ok:
    raise ValueError(f"ModelConfig.{field}: {why}")


PRESETS: dict[str, ModelConfig] = {
  # 2 layers, d = 64; vocab 272 holds the byte tokenizer (256 bytes + ChatML specials).
  "tiny": ModelConfig(name="tiny"),
  "tiny_moe": ModelConfig(
    name="tiny_moe", num_experts=4, experts_per_token=2, moe_mlp_dim=32, tie_embeddings=False
  ),
  # HuggingFaceTB/SmolLM2-135M(-Instruct): Llama architecture.
  "smollm2_135m": ModelConfig(
    name="smollm2_135m",
    vocab_size=49152,
    d_model=576,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    mlp_dim=1536,
    qk_norm=False,
    tie_embeddings=True,
    rope_theta=100_000.0,
    norm_eps=1e-5,
    max_seq_len=8192,
    init_std=0.041666666666666664,
    bos_id=1,
    eos_id=2,
  ),
  # Qwen/Qwen3-0.6B.
  "qwen3_0_6b": ModelConfig(
    name="qwen3_0_6b",
    vocab_size=151936,
    d_model=1024,
    num_layers=28,
    num_heads=16,
    num_kv_heads=8,
    head_dim=128,
    mlp_dim=3072,
    qk_norm=True,
    tie_embeddings=True,
    rope_theta=1_000_000.0,
    norm_eps=1e-6,
    max_seq_len=40960,
    bos_id=151643,
    eos_id=151645,
  ),
  # Qwen/Qwen3-8B.
  "qwen3_8b": ModelConfig(
    name="qwen3_8b",
    vocab_size=151936,
    d_model=4096,
    num_layers=36,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    mlp_dim=12288,
    qk_norm=True,
    tie_embeddings=False,
    rope_theta=1_000_000.0,
    norm_eps=1e-6,
    max_seq_len=40960,
    bos_id=151643,
    eos_id=151645,
  ),
  # Qwen/Qwen3-30B-A3B: 48 layers, 128 experts with 8 active, expert FFN 768.
  "qwen3_30b_a3b": ModelConfig(
    name="qwen3_30b_a3b",
    vocab_size=151936,
    d_model=2048,
    num_layers=48,
    num_heads=32,
    num_kv_heads=4,
    head_dim=128,
    mlp_dim=6144,
    num_experts=128,
    experts_per_token=8,
    moe_mlp_dim=768,
    norm_topk_prob=True,
    qk_norm=True,
    tie_embeddings=False,
    rope_theta=1_000_000.0,
    norm_eps=1e-6,
    max_seq_len=40960,
    bos_id=151643,
    eos_id=151645,
  ),
}


def get_preset(name: str) -> ModelConfig:
  """The ModelConfig of a preset (see PRESETS); raises ValueError naming the known ones."""
  if name not in PRESETS:
    raise ValueError(f"model.preset: unknown preset {name!r}; known: {sorted(PRESETS)}")
  return PRESETS[name]


def config_from(section: Any) -> ModelConfig:
  """A ModelConfig from a config section like `config.model` (sao_jax/config.py).

  The section's `preset` picks the base; any other key that is a ModelConfig field (vocab_size,
  num_layers, d_model, dtype, param_dtype, remat, logprob_block_size, ...) overrides it. Keys that
  are not model fields (path, tokenizer) are ignored.

  Args:
    section: an ml_collections ConfigDict or a plain mapping.

  Returns:
    The ModelConfig.
  """
  data = section.to_dict() if hasattr(section, "to_dict") else dict(section)
  base = get_preset(data.get("preset", "tiny"))
  fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"name"}
  return base.replace(**{k: v for k, v in data.items() if k in fields})
