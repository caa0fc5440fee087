"""GGUF (llama.cpp) checkpoints: hyperparameters, dequantized weights, and the embedded tokenizer.

Supported: `general.architecture == "llama"` (SmolLM2 and other Llama models), any quantization
the `gguf` package can dequantize (Q4_1, Q8_0, F16, ...). Weights are dequantized one tensor at a
time to float32 `[out, in]` and handed to the same builder as Hugging Face safetensors.

llama.cpp stores the rows of attn_q / attn_k permuted for its interleaved RoPE; we undo that so the
usual rotate-half RoPE applies: `w.reshape(heads, H // 2, 2, D).swapaxes(1, 2).reshape(w.shape)`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from sao_jax import sharding as shd
from sao_jax.models.config import ModelConfig

# GGUF tensor name (per block `blk.{i}.`) -> Hugging Face tensor name (per `model.layers.{i}.`).
_BLOCK_NAMES = {
  "attn_norm": "input_layernorm",
  "ffn_norm": "post_attention_layernorm",
  "attn_q": "self_attn.q_proj",
  "attn_k": "self_attn.k_proj",
  "attn_v": "self_attn.v_proj",
  "attn_output": "self_attn.o_proj",
  "ffn_gate": "mlp.gate_proj",
  "ffn_up": "mlp.up_proj",
  "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
  "token_embd": "model.embed_tokens",
  "output_norm": "model.norm",
  "output": "lm_head",
}


@functools.lru_cache(maxsize=2)
def open_gguf(path: str) -> tuple[Any, dict[str, Any]]:
  """(gguf.GGUFReader, metadata fields), cached: parsing a 49k-token vocabulary takes seconds."""
  import gguf

  reader = gguf.GGUFReader(path)
  return reader, read_fields(reader)


def read_fields(reader: Any) -> dict[str, Any]:
  """All GGUF metadata fields as Python values (strings, numbers, lists)."""
  out = {}
  for key, field in reader.fields.items():
    try:
      out[key] = field.contents()
    except Exception:  # A field gguf cannot decode is one we do not need.
      continue
  return out


def config_from_gguf(fields: dict[str, Any], tensor_names: set[str], **overrides) -> ModelConfig:
  """A ModelConfig from GGUF metadata; raises ValueError naming an unsupported field."""
  arch = fields.get("general.architecture")
  if arch != "llama":
    raise ValueError(f"GGUF general.architecture = {arch!r} is not supported (only 'llama')")

  def get(name, default=None):
    value = fields.get(f"llama.{name}", default)
    if value is None:
      raise ValueError(f"GGUF field llama.{name} is missing")
    return value

  heads, d = int(get("attention.head_count")), int(get("embedding_length"))
  tokens = fields.get("tokenizer.ggml.tokens")
  kw = dict(
    name=str(fields.get("general.name", "gguf")),
    vocab_size=int(fields.get("llama.vocab_size") or len(tokens)),
    d_model=d,
    num_layers=int(get("block_count")),
    num_heads=heads,
    num_kv_heads=int(get("attention.head_count_kv", heads)),
    head_dim=int(fields.get("llama.rope.dimension_count") or d // heads),
    mlp_dim=int(get("feed_forward_length")),
    qk_norm=False,
    tie_embeddings="output.weight" not in tensor_names,
    rope_theta=float(get("rope.freq_base", 10000.0)),
    norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
    max_seq_len=int(get("context_length", 4096)),
    bos_id=_opt_int(fields.get("tokenizer.ggml.bos_token_id")),
    eos_id=_opt_int(fields.get("tokenizer.ggml.eos_token_id")),
  )
  kw.update(overrides)
  return ModelConfig(**kw)


def hf_name(gguf_name: str) -> str:
  """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight' (ValueError if unknown)."""
  parts = gguf_name.split(".")
  if parts[0] == "blk" and len(parts) == 4 and parts[2] in _BLOCK_NAMES:
    return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
  if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
    return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
  raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face equivalent we support")


def unpermute_qk(w_oi: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's Q/K row permutation. w_oi: [heads * H, D]; returns the same shape."""
  return (
    w_oi.reshape(num_heads, w_oi.shape[0] // num_heads // 2, 2, -1)
    .swapaxes(1, 2)
    .reshape(w_oi.shape)
  )


def load_gguf(path: str, *, mesh=None, rules: shd.Rules = shd.DEFAULT_RULES, **overrides):
  """A Policy from a GGUF file (see from_pretrained).

  Args:
    path: the .gguf file.
    mesh: optional mesh to place tensors on; rules: logical -> mesh rules.
    **overrides: ModelConfig fields (dtype, param_dtype, remat, ...).

  Returns:
    The Policy.
  """
  import gguf

  from sao_jax.models.hf import build_policy

  reader, fields = open_gguf(str(path))
  tensors = {t.name: t for t in reader.tensors}
  cfg = config_from_gguf(fields, set(tensors), **overrides)
  by_hf = {hf_name(n): n for n in tensors}

  def read(name: str) -> np.ndarray:
    t = tensors[by_hf[name]]
    w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
    if name.endswith("self_attn.q_proj.weight"):
      w = unpermute_qk(w, cfg.num_heads)
    elif name.endswith("self_attn.k_proj.weight"):
      w = unpermute_qk(w, cfg.num_kv_heads)
    return w

  return build_policy(cfg, read, set(by_hf), mesh=mesh, rules=rules, source=path)


def _opt_int(x) -> int | None:
  return None if x is None else int(x)


# ---------------------------------------------------------------------- tokenizer
def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
  keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
  extra = [b for b in range(256) if b not in keep]
  mapping = {b: chr(b) for b in keep}
  mapping.update({b: chr(256 + i) for i, b in enumerate(extra)})
  return mapping


def _pre_tokenizer(kind: str):
  from tokenizers import pre_tokenizers

  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  if kind in ("smollm", "starcoder", "refact"):  # llama.cpp: split every digit, then GPT-2 regex
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
  if kind in ("gpt-2", "gpt2", "default"):
    return byte_level
  raise ValueError(f"GGUF tokenizer.ggml.pre = {kind!r} is not supported (smollm, gpt2)")


def tokenizer_from_gguf(path: str):
  """The byte-level BPE tokenizer stored in a GGUF file's metadata, as an HFTokenizer.

  Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain added
  tokens; both are matched whole in text. The chat template's default system prompt is kept.
  """
  from tokenizers import AddedToken, Tokenizer, decoders, models

  from sao_jax.models.tokenizer import HFTokenizer, default_system_of

  _, fields = open_gguf(str(path))
  if fields.get("tokenizer.ggml.model") != "gpt2":
    raise ValueError(
      f"GGUF tokenizer.ggml.model = {fields.get('tokenizer.ggml.model')!r} is not "
      "supported (only byte-level BPE, 'gpt2')"
    )
  spelling = _bytes_to_unicode()
  alphabet = set(spelling.values())
  tokens = list(fields["tokenizer.ggml.tokens"])
  vocab = {
    t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode()): i
    for i, t in enumerate(tokens)
  }
  merges = [tuple(m.split(" ")) for m in fields["tokenizer.ggml.merges"]]
  tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
  tok.pre_tokenizer = _pre_tokenizer(fields.get("tokenizer.ggml.pre", "default"))
  tok.decoder = decoders.ByteLevel()
  types = list(fields.get("tokenizer.ggml.token_type") or [])
  tok.add_special_tokens(
    [
      AddedToken(t, normalized=False, special=True)
      for t, k in zip(tokens, types, strict=False)
      if k == 3
    ]
  )
  tok.add_tokens(
    [
      AddedToken(t, normalized=False, special=False)
      for t, k in zip(tokens, types, strict=False)
      if k == 4
    ]
  )
  template = fields.get("tokenizer.chat_template")
  return HFTokenizer(tok, default_system=default_system_of(template), chat_template=template)
