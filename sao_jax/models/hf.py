"""Hugging Face weights in and out: config.json <-> ModelConfig, safetensors <-> Policy.

`from_pretrained(path)` reads a Hugging Face directory (config.json + model.safetensors, or a
sharded `model.safetensors.index.json`) of a Llama, Qwen3 or Qwen3-MoE model, or a `.gguf` file
(sao_jax.models.gguf). Tensors are read one at a time, converted to our layout and placed straight
into their target sharding (`jax.make_array_from_callback`), so the host never holds more than one
tensor (one layer's stacked experts for an MoE) and a device only receives its own shard.

`export_hf(policy, path)` writes the on-disk Hugging Face layout (per-expert MoE tensors, `[out,
in]` linear weights) and a config.json that transformers and SGLang's `/update_weights_from_disk`
load.

Layout: our kernels are `[in..., out...]` (q_proj `[D, N, H]`, o_proj `[N, H, D]`); a Hugging Face
linear weight is `[prod(out), prod(in)]`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from sao_jax import sharding as shd
from sao_jax.models.config import ModelConfig
from sao_jax.models.policy import Policy

SUPPORTED = ("llama", "qwen3", "qwen3_moe")
ARCHITECTURES = {
  "llama": "LlamaForCausalLM",
  "qwen3": "Qwen3ForCausalLM",
  "qwen3_moe": "Qwen3MoeForCausalLM",
}
# Tensors a checkpoint may hold that the model does not use.
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  """How one of our parameters is stored on disk.

  Attributes:
    names: Hugging Face tensor names (one, or one per expert for stacked MoE weights).
    split: for linear weights, how many leading dims of our shape are inputs (0: copied as is).
    stacked: our leading dim stacks `names` (MoE experts).
  """

  names: tuple[str, ...]
  split: int = 0
  stacked: bool = False

  def to_ours(self, arrays: Sequence[np.ndarray], shape: Sequence[int]) -> np.ndarray:
    """Hugging Face array(s) -> one array of our `shape`."""
    if self.stacked:
      return np.stack([_linear_in(a, shape[1:], self.split) for a in arrays])
    return _linear_in(arrays[0], shape, self.split) if self.split else arrays[0]

  def to_hf(self, x: np.ndarray) -> list[np.ndarray]:
    """Our array -> Hugging Face array(s), in `names` order."""
    if self.stacked:
      return [_linear_out(x[e], self.split) for e in range(x.shape[0])]
    return [_linear_out(x, self.split) if self.split else x]

  def hf_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of each Hugging Face tensor for our `shape`."""
    shape = tuple(shape[1:]) if self.stacked else tuple(shape)
    if not self.split:
      return shape
    return (int(np.prod(shape[self.split :])), int(np.prod(shape[: self.split])))


def _linear_in(w: np.ndarray, shape: Sequence[int], split: int) -> np.ndarray:
  expected = (int(np.prod(shape[split:])), int(np.prod(shape[:split])))
  if w.shape != expected:
    raise ValueError(f"shape {w.shape}, expected {expected}")
  return np.ascontiguousarray(w.T).reshape(shape)


def _linear_out(x: np.ndarray, split: int) -> np.ndarray:
  return np.ascontiguousarray(x.reshape(int(np.prod(x.shape[:split])), -1).T)


def weight_map(cfg: ModelConfig) -> dict[str, TensorSpec]:
  """Our parameter path ('model.layers.0.attn.q_proj') -> its TensorSpec."""
  out = {
    "model.embed": TensorSpec(("model.embed_tokens.weight",)),
    "model.final_norm.scale": TensorSpec(("model.norm.weight",)),
  }
  if not cfg.tie_embeddings:
    out["lm_head"] = TensorSpec(("lm_head.weight",), split=1)
  for i in range(cfg.num_layers):
    ours, hf = f"model.layers.{i}", f"model.layers.{i}"
    out[f"{ours}.attn_norm.scale"] = TensorSpec((f"{hf}.input_layernorm.weight",))
    out[f"{ours}.mlp_norm.scale"] = TensorSpec((f"{hf}.post_attention_layernorm.weight",))
    for p in ("q_proj", "k_proj", "v_proj"):
      out[f"{ours}.attn.{p}"] = TensorSpec((f"{hf}.self_attn.{p}.weight",), split=1)
    out[f"{ours}.attn.o_proj"] = TensorSpec((f"{hf}.self_attn.o_proj.weight",), split=2)
    if cfg.qk_norm:
      for p in ("q_norm", "k_norm"):
        out[f"{ours}.attn.{p}.scale"] = TensorSpec((f"{hf}.self_attn.{p}.weight",))
    if cfg.is_moe:
      out[f"{ours}.mlp.router"] = TensorSpec((f"{hf}.mlp.gate.weight",), split=1)
      for p in ("gate_proj", "up_proj", "down_proj"):
        names = tuple(f"{hf}.mlp.experts.{e}.{p}.weight" for e in range(cfg.num_experts))
        out[f"{ours}.mlp.{p}"] = TensorSpec(names, split=1, stacked=True)
    else:
      for p in ("gate_proj", "up_proj", "down_proj"):
        out[f"{ours}.mlp.{p}"] = TensorSpec((f"{hf}.mlp.{p}.weight",), split=1)
  return out


def config_from_hf(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
  """A ModelConfig from a Hugging Face config.json dict (Llama, Qwen3, Qwen3-MoE).

  Raises:
    ValueError naming the config.json field that is missing or that we do not support.
  """
  _check_hf_config(hf)
  mt, heads, d = hf["model_type"], _req(hf, "num_attention_heads"), _req(hf, "hidden_size")
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  kw = dict(
    name=hf.get("_name_or_path") or mt,
    vocab_size=_req(hf, "vocab_size"),
    d_model=d,
    num_layers=_req(hf, "num_hidden_layers"),
    num_heads=heads,
    num_kv_heads=hf.get("num_key_value_heads") or heads,
    head_dim=hf.get("head_dim") or d // heads,
    mlp_dim=_req(hf, "intermediate_size"),
    qk_norm=mt != "llama",
    tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
    norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
    max_seq_len=int(hf.get("max_position_embeddings", 4096)),
    init_std=float(hf.get("initializer_range", 0.02)),
    bos_id=_first(hf.get("bos_token_id")),
    eos_id=_first(hf.get("eos_token_id")),
  )
  if mt == "qwen3_moe":
    kw.update(
      num_experts=hf.get("num_local_experts") or _req(hf, "num_experts"),
      experts_per_token=_req(hf, "num_experts_per_tok"),
      moe_mlp_dim=_req(hf, "moe_intermediate_size"),
      norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
    )
  kw.update(overrides)
  return ModelConfig(**kw)


def _check_hf_config(hf: dict[str, Any]):
  """Raises ValueError naming the first config.json field this decoder cannot represent."""
  mt = hf.get("model_type")
  if mt not in SUPPORTED:
    raise ValueError(
      f"config.json: model_type {mt!r} (architectures {hf.get('architectures')}) "
      f"is not supported; supported: {SUPPORTED}"
    )
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  _need(rope_type == "default", "rope_parameters.rope_type", f"{rope_type!r} (only 'default')")
  _need(not hf.get("attention_bias", False), "attention_bias", "True (no attention biases)")
  _need(not hf.get("mlp_bias", False), "mlp_bias", "True (no MLP biases)")
  _need(hf.get("hidden_act", "silu") == "silu", "hidden_act", f"{hf.get('hidden_act')!r}")
  _need(not hf.get("use_sliding_window", False), "use_sliding_window", "True")
  if mt == "qwen3_moe":
    layers = hf.get("mlp_only_layers")
    _need(not layers, "mlp_only_layers", f"{layers} (all layers must be MoE)")
    step = hf.get("decoder_sparse_step", 1)
    _need(step == 1, "decoder_sparse_step", f"{step} (must be 1)")


def _req(hf: dict[str, Any], key: str) -> Any:
  if key not in hf:
    raise ValueError(f"config.json: required field {key!r} is missing")
  return hf[key]


def hf_config(cfg: ModelConfig, dtype: str | None = None) -> dict[str, Any]:
  """The config.json dict for `cfg` (transformers 5.x field names, plus top-level rope_theta)."""
  mt = cfg.hf_model_type
  out = dict(
    architectures=[ARCHITECTURES[mt]],
    model_type=mt,
    vocab_size=cfg.vocab_size,
    hidden_size=cfg.d_model,
    intermediate_size=cfg.mlp_dim,
    num_hidden_layers=cfg.num_layers,
    num_attention_heads=cfg.num_heads,
    num_key_value_heads=cfg.num_kv_heads,
    head_dim=cfg.head_dim,
    hidden_act="silu",
    max_position_embeddings=cfg.max_seq_len,
    rms_norm_eps=cfg.norm_eps,
    rope_theta=cfg.rope_theta,
    rope_parameters={"rope_theta": cfg.rope_theta, "rope_type": "default"},
    tie_word_embeddings=cfg.tie_embeddings,
    attention_bias=False,
    attention_dropout=0.0,
    initializer_range=cfg.init_std,
    use_cache=True,
    dtype=dtype or cfg.param_dtype,
    bos_token_id=cfg.bos_id,
    eos_token_id=cfg.eos_id,
  )
  if mt == "llama":
    out.update(mlp_bias=False, pretraining_tp=1)
  else:
    out.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.num_layers)
  if mt == "qwen3_moe":
    out.update(
      num_experts=cfg.num_experts,
      num_local_experts=cfg.num_experts,
      num_experts_per_tok=cfg.experts_per_token,
      moe_intermediate_size=cfg.moe_mlp_dim,
      norm_topk_prob=cfg.norm_topk_prob,
      decoder_sparse_step=1,
      mlp_only_layers=[],
      output_router_logits=False,
      router_aux_loss_coef=0.001,
    )
  return out


def from_pretrained(
  path: str,
  *,
  dtype: str = "float32",
  param_dtype: str | None = None,
  mesh: jax.sharding.Mesh | None = None,
  rules: shd.Rules = shd.DEFAULT_RULES,
  **overrides: Any,
) -> Policy:
  """Loads a Policy from a Hugging Face directory or a .gguf file.

  Args:
    path: directory with config.json + safetensors, or a `.gguf` file.
    dtype: compute dtype ('float32' or 'bfloat16').
    param_dtype: parameter dtype (default: `dtype`).
    mesh: place every tensor directly into its sharding on this mesh (default: one device).
    rules: logical -> mesh rules used with `mesh`.
    **overrides: ModelConfig fields to override (e.g. remat=True, logprob_block_size=4096).

  Returns:
    The Policy; `policy.logits(tokens)` works at once.
  """
  overrides.update(dtype=dtype, param_dtype=param_dtype or dtype)
  if str(path).endswith(".gguf"):
    from sao_jax.models import gguf

    return gguf.load_gguf(path, mesh=mesh, rules=rules, **overrides)
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise FileNotFoundError(f"from_pretrained: no config.json in {path!r} (and not a .gguf file)")
  with open(cfg_path) as f:
    cfg = config_from_hf(json.load(f), **overrides)
  with _SafetensorsDir(path) as reader:
    return build_policy(cfg, reader.read, reader.names, mesh=mesh, rules=rules, source=path)


def build_policy(
  cfg: ModelConfig,
  read: Callable[[str], np.ndarray],
  available: set[str],
  *,
  mesh=None,
  rules: shd.Rules = shd.DEFAULT_RULES,
  source: str = "",
) -> Policy:
  """Builds a Policy from a tensor reader keyed by Hugging Face names (shared with the GGUF loader).

  Args:
    cfg: the model config.
    read: Hugging Face tensor name -> numpy array (read lazily, one at a time).
    available: every tensor name the source holds (unused ones raise, except rotary buffers).
    mesh: optional mesh to place tensors on; rules: logical -> mesh rules.
    source: file or directory name, for error messages.

  Returns:
    The Policy.
  """
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Policy(cfg, rngs=nnx.Rngs(0))))
  shardings = _flat(shd.param_shardings(abstract, mesh, rules)) if mesh is not None else {}
  specs = weight_map(cfg)
  flat = _flat(abstract)
  _check_names(specs, available, cfg, source)
  values = {}
  for key in tqdm(flat, desc="loading weights", disable=None):
    spec, v = specs[key], flat[key]
    arrays = [read(n) for n in spec.names]
    try:
      arr = spec.to_ours(arrays, v.shape).astype(v.dtype)
    except ValueError as e:
      raise ValueError(f"{source}: tensor {spec.names[0]!r} (for {key}): {e}") from None
    values[key] = _place(arr, shardings.get(key))
  state = jax.tree_util.tree_map_with_path(lambda p, v: values[_path_str(p)], abstract)
  return nnx.merge(graphdef, state)


def _check_names(specs: dict[str, TensorSpec], available: set[str], cfg: ModelConfig, source: str):
  """Every tensor the model needs is there, and every tensor there is used (rotary buffers aside)."""
  needed = {n for s in specs.values() for n in s.names}
  missing = sorted(needed - available)
  if missing:
    raise ValueError(f"{source}: tensor {missing[0]!r} is missing ({len(missing)} missing in all)")
  unused = sorted(n for n in available - needed if not _IGNORED.match(n))
  if unused:
    raise ValueError(
      f"{source}: {len(unused)} tensors are not used by {cfg.hf_model_type} "
      f"(config.json and weights disagree?), e.g. {unused[:3]}"
    )


def export_hf(
  policy: Policy, path: str, *, dtype: str | None = None, max_shard_bytes: int = 4 << 30
) -> list[str]:
  """Writes `policy` as a Hugging Face checkpoint directory (config.json + safetensors).

  Parameters are fetched and written shard by shard, so the host holds at most one shard
  (`max_shard_bytes`, or one parameter if larger). Each file appears atomically (written under a
  temporary name, then renamed); config.json is written last. Single-host: every parameter must be
  addressable from this process.

  Args:
    policy: the model.
    path: output directory (created; existing files of the same names are replaced).
    dtype: on-disk dtype ('float32' or 'bfloat16'; default: the parameter dtype).
    max_shard_bytes: start a new safetensors file beyond this size (then an index is written).

  Returns:
    The safetensors file names written.
  """
  from safetensors.numpy import save_file

  cfg = policy.cfg
  dtype = dtype or cfg.param_dtype
  os.makedirs(path, exist_ok=True)
  flat = _flat(nnx.state(policy, nnx.Param))
  specs = weight_map(cfg)
  plan = _plan_shards(flat, jnp.dtype(dtype).itemsize, max_shard_bytes)
  files = (
    ["model.safetensors"]
    if len(plan) == 1
    else [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
  )
  weight_files, total = {}, 0
  for fname, keys in tqdm(list(zip(files, plan, strict=True)), desc="exporting", disable=None):
    tensors = {}
    for key in keys:
      x = np.asarray(jax.device_get(flat[key])).astype(jnp.dtype(dtype))
      tensors.update(zip(specs[key].names, specs[key].to_hf(x), strict=True))
    save_file(tensors, os.path.join(path, fname + ".tmp"), metadata={"format": "pt"})
    os.replace(os.path.join(path, fname + ".tmp"), os.path.join(path, fname))
    weight_files.update(dict.fromkeys(tensors, fname))
    total += sum(a.nbytes for a in tensors.values())
  if len(files) > 1:
    index = {"metadata": {"total_size": total}, "weight_map": weight_files}
    _write_json(os.path.join(path, "model.safetensors.index.json"), index)
  _write_json(os.path.join(path, "config.json"), hf_config(cfg, dtype))
  return files


def _plan_shards(flat: dict[str, Any], itemsize: int, max_bytes: int) -> list[list[str]]:
  """Greedy split of the parameters (sorted by path) into files of at most max_bytes each."""
  plan, size = [[]], 0
  for key in sorted(flat):
    n = int(np.prod(flat[key].shape)) * itemsize
    if size and size + n > max_bytes:
      plan.append([])
      size = 0
    plan[-1].append(key)
    size += n
  return plan


class _SafetensorsDir:
  """Lazy reader over a directory's safetensors files (single file or sharded index)."""

  def __init__(self, path: str):
    from safetensors import safe_open

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
      with open(index) as f:
        self._file_of = json.load(f)["weight_map"]
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
      with safe_open(os.path.join(path, "model.safetensors"), "np") as f:
        self._file_of = {n: "model.safetensors" for n in f.keys()}  # noqa: SIM118
    else:
      raise FileNotFoundError(f"{path}: neither model.safetensors nor model.safetensors.index.json")
    self._path, self._open, self._handles = path, safe_open, {}
    self.names = set(self._file_of)

  def read(self, name: str) -> np.ndarray:
    fname = self._file_of[name]
    if fname not in self._handles:
      self._handles[fname] = self._open(os.path.join(self._path, fname), "np")
    return self._handles[fname].get_tensor(name)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._handles.clear()


def _place(arr: np.ndarray, sharding) -> jax.Array:
  if sharding is None:
    return jnp.asarray(arr)
  return jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])


def _flat(state: Any) -> dict[str, Any]:
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  return {_path_str(p): v for p, v in leaves}


def _path_str(path) -> str:
  keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path if not _is_value_key(k)]
  return ".".join(str(k) for k in keys)


def _is_value_key(k) -> bool:
  return isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value"


def _need(ok: bool, field: str, got: str):
  if not ok:
    raise ValueError(f"config.json: {field} = {got} is not supported")


def _first(x):
  return x[0] if isinstance(x, list | tuple) and x else (None if isinstance(x, list | tuple) else x)


def _write_json(path: str, obj: Any):
  with open(path + ".tmp", "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(path + ".tmp", path)
