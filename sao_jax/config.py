"""Experiment configs: the base ConfigDict, spec loading, and validation.

Every experiment is a Python file `experiments/<name>.py` with `get_config(arg=None)` returning an
`ml_collections.ConfigDict` (big_vision style). `arg` is a comma-separated list of `key=value` or bare
flags (`"cpu,algo=grpo"`), parsed by `parse_arg`. `load("experiments/aime.py:cpu,algo=grpo")` imports
the file, calls `get_config`, and `validate` raises `ConfigError` naming the bad field before
anything expensive happens.

The base config below documents every field; experiments start from it and override.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
from typing import Any

import ml_collections

from sao_jax import algos

ConfigDict = ml_collections.ConfigDict

MODES = ("sync", "lag", "async")


class ConfigError(ValueError):
  """A config field has a bad value. The message starts with the dotted field name."""

  def __init__(self, field: str, why: str):
    self.field = field
    super().__init__(f"config.{field}: {why}")


def parse_arg(arg: str | None, **defaults: Any) -> ConfigDict:
  """Parses `"cpu,algo=grpo,seed=3"` into a ConfigDict, typed by `defaults`.

  Bare words become True booleans. Keys not in `defaults` are an error, so a typo in an experiment
  arg fails at once.

  Args:
    arg: the text after `:` in a config spec, or None.
    **defaults: every accepted key with its default value (the type is taken from it).

  Returns:
    A ConfigDict with one field per key in `defaults`.
  """
  out = ConfigDict(dict(defaults))
  if not arg:
    return out
  for item in arg.split(","):
    item = item.strip()
    if not item:
      continue
    key, _, value = item.partition("=")
    if key not in defaults:
      raise ConfigError(f"arg.{key}", f"unknown experiment argument; known: {sorted(defaults)}")
    if not _:
      value = "True"
    out[key] = _coerce(value, defaults[key], key)
  return out


def _coerce(value: str, default: Any, key: str) -> Any:
  if isinstance(default, bool):
    if value.lower() in ("1", "true", "yes", ""):
      return True
    if value.lower() in ("0", "false", "no"):
      return False
    raise ConfigError(f"arg.{key}", f"expected a boolean, got {value!r}")
  if isinstance(default, int):
    try:
      return int(value)
    except ValueError:
      raise ConfigError(f"arg.{key}", f"expected an integer, got {value!r}") from None
  if isinstance(default, float):
    try:
      return float(value)
    except ValueError:
      raise ConfigError(f"arg.{key}", f"expected a number, got {value!r}") from None
  return value


def base_config() -> ConfigDict:
  """All fields with their defaults (algorithm.md §11). Experiments override what they need."""
  c = ConfigDict()

  # Algorithm: one of sao_jax.algos.ALGOS (sao, grpo, ppo, ...). Set it with `apply_algo`, which
  # also fills in that algorithm's defaults for the knobs below.
  c.algo = "sao"
  # 'sync' (collect, train, repeat), 'lag' (rollouts for step v come from weights v - policy_lag,
  # deterministic), or 'async' (rollout workers and learner run concurrently).
  c.mode = "sync"
  # k in lag mode: rollouts for policy version v are sampled with the weights of version v - k.
  c.policy_lag = 0
  # Seed for parameters, sampling and data order.
  c.seed = 0
  # Number of policy updates (policy versions) to train for.
  c.total_steps = 100
  # Trajectories per optimizer step (B). SAO: B different prompts, one rollout each.
  c.batch_size = 8
  # Rollouts per prompt (G). SAO uses 1; GRPO/RLOO need >= 2; batch_size must be divisible by it.
  c.group_size = 1
  # Trajectories per micro-batch for gradient accumulation (0 = the whole batch at once).
  c.micro_batch_size = 0
  # Tokens per training row (T): prompt + all turns. Longer trajectories are truncated by the agent.
  c.max_seq_len = 512
  # Pack several trajectories into one row (segment_ids) to cut padding.
  c.pack_sequences = False
  # Write metrics every this many steps (metrics.jsonl gets every step regardless).
  c.log_every = 1
  # Evaluate (pass@1 on held-out tasks) every this many steps (0 = never; always at the end).
  c.eval_every = 20
  # Save a checkpoint every this many steps (0 = only at the end).
  c.checkpoint_every = 50
  # Checkpoints kept on disk.
  c.keep_checkpoints = 2
  # Consecutive non-finite steps tolerated (each is skipped) before the run stops with a checkpoint.
  c.max_nonfinite_steps = 3

  # ---------------------------------------------------------------- model
  c.model = ConfigDict()
  # Preset name in sao_jax.models (tiny, smollm2_135m, qwen3_0_6b, qwen3_8b, qwen3_30b_a3b).
  c.model.preset = "tiny"
  # Pretrained weights: an HF directory or a .gguf file; '' = random init from the preset.
  c.model.path = ""
  # Tokenizer: 'byte' (built in, for tiny models), an HF tokenizer.json / directory, or 'model'
  # (the one that comes with model.path).
  c.model.tokenizer = "byte"
  # Parameter and compute dtypes ('float32' or 'bfloat16'); softmax and log-probs are always fp32.
  c.model.param_dtype = "float32"
  c.model.dtype = "float32"
  # Rematerialize each decoder layer in the backward pass (memory for compute).
  c.model.remat = False
  # Vocabulary block size of the fused log-prob kernel (0 = its default).
  c.model.logprob_block_size = 0

  # ---------------------------------------------------------------- critic
  c.critic = ConfigDict()
  # Initialize the critic trunk from the policy's weights (else a fresh random trunk).
  c.critic.init_from_policy = True
  # Freeze the critic's attention (q/k/v/o projections and q/k norms): no update, no optimizer state.
  c.critic.frozen_attention = True
  # Std of the value head's weight init, divided by sqrt(d_model); bias starts at 0.
  c.critic.head_init_std = 0.02

  # ---------------------------------------------------------------- optimizers
  c.optim = ConfigDict()
  for name, lr, warmup in (("policy", 1e-6, 0), ("critic", 5e-6, 10)):
    o = ConfigDict()
    # Peak learning rate.
    o.lr = lr
    # Linear warm-up steps from 0 to lr (optimizer steps of this model).
    o.warmup_steps = warmup
    # 'constant' or 'cosine' (to 0.1 * lr at total_steps) after warm-up.
    o.schedule = "constant"
    # AdamW.
    o.b1 = 0.9
    o.b2 = 0.999
    o.eps = 1e-8
    o.weight_decay = 0.0
    # Global gradient-norm clip (0 = off).
    o.clip_norm = 1.0
    c.optim[name] = o

  # ---------------------------------------------------------------- loss and advantages
  c.loss = ConfigDict()
  # DIS band: tokens whose ratio pi_theta / pi_rollout is outside (1 - eps_low, 1 + eps_high) are
  # masked out (reasoning 0.3 / 5.0, coding 0.8 / 3.0).
  c.loss.eps_low = 0.3
  c.loss.eps_high = 5.0
  # 'detached' (keep-mask is a constant: the IS policy gradient) or 'literal' (printed objective).
  c.loss.dis_gradient = "detached"
  # PPO-style clip for grpo / ppo / vapo / decoupled_ppo (asymmetric: clip-higher).
  c.loss.clip_low = 0.2
  c.loss.clip_high = 0.28
  # Dual-clip constant c for negative advantages (0 = off; verl uses 3).
  c.loss.dual_clip = 0.0
  # Decoupled PPO: behaviour weights pi_prox / pi_rollout above this cap are masked out.
  c.loss.behav_cap = 5.0
  # Truncated IS cap for variants that use TIS (0 = off).
  c.loss.tis_cap = 0.0
  # Critic updates per policy update (K).
  c.loss.critic_steps = 2
  # Critic-only steps at the start of training, before the first policy update.
  c.loss.critic_only_steps = 10
  # Discount.
  c.loss.gamma = 1.0
  # GAE lambda for the critic's targets.
  c.loss.lam_critic = 1.0
  # Policy lambda: if length_adaptive, 1 - 1 / (lam_alpha * l) per trajectory; else lam_policy.
  c.loss.length_adaptive = True
  c.loss.lam_alpha = 1.5
  c.loss.lam_policy = 0.95
  # Values used for the policy's advantages: 'pre' (before the K critic steps) or 'post'.
  c.loss.advantage_values = "pre"
  # Whiten advantages over the action tokens of the batch.
  c.loss.whiten_advantages = False
  # Value loss 0.5 (V - R)^2 on action tokens; clip range around the old values (0 = unclipped).
  c.loss.value_clip = 0.0
  # Running-mean baseline window (running_mean algo).
  c.loss.baseline_window = 128
  # GRPO: divide by the group's reward std (False = Dr.GRPO).
  c.loss.scale_by_std = True
  # VAPO positive-example NLL coefficient (0 = off).
  c.loss.nll_coef = 0.0
  # KL to the rollout policy (k3 estimator) and entropy bonus coefficients (0 = off).
  c.loss.kl_coef = 0.0
  c.loss.entropy_coef = 0.0

  # ---------------------------------------------------------------- environment and data
  c.env = ConfigDict()
  # Environment name in sao_jax.envs (math_tool, swe, humaneval, style, ...).
  c.env.name = "math_tool"
  # Maximum agent turns per episode.
  c.env.max_turns = 4
  # Tool-call syntax: 'qwen3' (<tool_call>{json}</tool_call>) or 'compact' (small models).
  c.env.tool_format = "compact"
  # Sandbox limits for tool code.
  c.env.timeout_s = 5.0
  c.env.memory_mb = 512
  # Observations longer than this many characters are truncated.
  c.env.max_observation_chars = 2000
  # SWE runtime: 'local' (sandboxed workspace copy) or 'docker' (SWE-bench images; needs an engine).
  c.env.runtime = "local"
  # Online style simulation: steps at which the preferred style switches, and the judge
  # ('local' = deterministic feature judge; 'llm' = an OpenAI-compatible endpoint at judge_url).
  c.env.style_switch_steps = (150, 300)
  c.env.style_judge = "local"
  # The style judge's quality check requires the prompt's topic (off: any fluent paragraph).
  c.env.style_topic_check = True
  # Sentences per paragraph in the style simulation's SFT demonstrations (1-4).
  c.env.style_sentences = 3
  c.env.judge_url = ""
  c.env.judge_model = "default"

  c.data = ConfigDict()
  # Task source: 'procedural' (generated), 'reasoning_gym', 'jsonl', 'gsm8k_test', 'champ',
  # 'humaneval', 'swe_jsonl'.
  c.data.source = "procedural"
  # Path for file-based sources.
  c.data.path = ""
  # reasoning-gym dataset name(s) or procedural task family, and its difficulty level.
  c.data.task = "arith"
  c.data.difficulty = 1
  # Number of training / held-out evaluation tasks (procedural sources).
  c.data.num_train = 100_000
  c.data.num_eval = 64

  # ---------------------------------------------------------------- rollout
  c.rollout = ConfigDict()
  # 'embedded' (the JAX engine in this process) or 'http' (SGLang or sao_jax.serve at urls).
  c.rollout.engine = "embedded"
  # HTTP engines, comma-separated base URLs.
  c.rollout.urls = ""
  # Concurrent sequences in the embedded engine (slots sharing one KV cache).
  c.rollout.num_slots = 16
  # Embedded engine: cache lengths a decode step may attend to, comma-separated; each is one
  # compiled decode step, and max_seq_len is always one ('' = 64, 128, 256, ... up to it). Fewer
  # windows compile faster; more make each step read closer to what the sequences hold.
  c.rollout.decode_windows = ""
  # Episodes in flight at once in the agent loop.
  c.rollout.concurrency = 16
  # Generation per turn.
  c.rollout.max_new_tokens = 64
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  c.rollout.top_k = 0
  # Rollout worker threads in the learner process (async mode; 0 = only remote `sao_jax.actor`s,
  # which push to the ReplayService at replay.serve_address).
  c.rollout.num_workers = 1
  # Where HTTP engines' weights are published (default <workdir>/weights; must be readable by
  # the engines), how many versions to keep, and the same directory as the engines see it.
  c.rollout.weights_dir = ""
  c.rollout.weights_keep = 2
  c.rollout.weights_engine_dir = ""

  # ---------------------------------------------------------------- replay queue
  c.replay = ConfigDict()
  # Capacity in trajectories; a full queue blocks producers (backpressure).
  c.replay.capacity = 1024
  # Trajectories whose oldest action token is more than this many versions behind are dropped.
  c.replay.max_policy_lag = 4
  # gRPC ReplayService on the learner: 'host:port' to serve on ('' = in-process queue only).
  c.replay.serve_address = ""
  # Shared token for `authorization: Bearer <token>` (read from $SAO_REPLAY_TOKEN if empty).
  c.replay.auth_token = ""
  # Largest gRPC message in bytes.
  c.replay.max_message_bytes = 64 * 1024 * 1024
  # Append the uid of every consumed trajectory to <workdir>/consumed.txt (audits, tests).
  c.replay.log_consumed = False

  # ---------------------------------------------------------------- evaluation
  c.eval = ConfigDict()
  # Samples per held-out task; the score is the mean pass@1 over them.
  c.eval.num_samples = 1
  # Sampling temperature for evaluation (0 = greedy).
  c.eval.temperature = 0.0

  # ---------------------------------------------------------------- supervised warm start
  c.sft = ConfigDict()
  # SFT steps on demonstration traces before RL (0 = none).
  c.sft.steps = 0
  c.sft.lr = 1e-3
  c.sft.batch_size = 16
  # Demonstrations generated for SFT.
  c.sft.num_demos = 2000
  # Fraction of demonstrations that use the tool; the rest answer directly with the final answer
  # only (as a weaker teacher would), so RL has a better strategy to discover.
  c.sft.tool_fraction = 1.0

  # ---------------------------------------------------------------- device mesh
  c.mesh = ConfigDict()
  # Axis sizes; -1 on one axis takes the remaining devices.
  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  c.mesh.expert = 1
  # Logical axis -> mesh axis rules (the only place mesh axis names meet model code).
  c.mesh.rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("vocab", "tensor"),
    ("expert", "expert"),
  )

  return c


def apply_algo(config: ConfigDict, algo: str) -> ConfigDict:
  """Sets `config.algo` and the knob defaults that algorithm uses (sao_jax.algos.ALGOS)."""
  if algo not in algos.ALGOS:
    raise ConfigError("algo", f"unknown algorithm {algo!r}; known: {sorted(algos.ALGOS)}")
  config.algo = algo
  for key, value in algos.ALGOS[algo].defaults.items():
    section, _, field = key.rpartition(".")
    target = config[section] if section else config
    target[field] = value
  return config


def load(spec: str) -> ConfigDict:
  """Loads `path/to/experiment.py[:args]` and returns its (unlocked) config.

  Args:
    spec: an experiment file, optionally followed by `:` and its arguments.

  Returns:
    The ConfigDict from the file's `get_config(arg)`.
  """
  path, _, arg = spec.partition(":")
  if not os.path.exists(path):
    raise ConfigError("spec", f"no experiment file {path!r}")
  name = "sao_jax_experiment_" + pathlib.Path(path).stem
  module_spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ConfigError("spec", f"{path} defines no get_config(arg)")
  return module.get_config(arg or None)


def int_list(text: str) -> tuple[int, ...]:
  """'128, 512' or '128 512' -> (128, 512); '' -> (). Raises ValueError on anything else.

  For list-valued string fields such as `rollout.decode_windows` (and the matching CLI flags).
  """
  return tuple(int(w) for w in text.replace(",", " ").split())


def _check(ok: bool, field: str, why: str):
  if not ok:
    raise ConfigError(field, why)


def validate(config: ConfigDict, num_devices: int | None = None) -> ConfigDict:
  """Checks every field a run depends on; raises ConfigError naming the first bad one.

  Args:
    config: a full config (from `base_config` plus overrides).
    num_devices: devices the mesh must cover (default: `jax.device_count()` if jax is imported).

  Returns:
    The same config, for chaining.
  """
  _validate_run(config)
  _validate_model_and_optim(config)
  _validate_loss(config)
  _validate_rollout(config)
  _validate_mesh(config, num_devices)
  return config


def _validate_run(c: ConfigDict):
  _check(
    c.algo in algos.ALGOS, "algo", f"unknown algorithm {c.algo!r}; known: {sorted(algos.ALGOS)}"
  )
  spec = algos.ALGOS[c.algo]
  _check(c.mode in MODES, "mode", f"must be one of {MODES}, got {c.mode!r}")
  _check(c.policy_lag >= 0, "policy_lag", f"must be >= 0, got {c.policy_lag}")
  _check(c.mode == "lag" or c.policy_lag == 0, "policy_lag", "is only used in mode='lag'")
  _check(c.total_steps >= 0, "total_steps", f"must be >= 0, got {c.total_steps}")
  _check(c.batch_size >= 1, "batch_size", f"must be >= 1, got {c.batch_size}")
  _check(c.group_size >= 1, "group_size", f"must be >= 1, got {c.group_size}")
  _check(
    c.batch_size % c.group_size == 0,
    "batch_size",
    f"{c.batch_size} is not divisible by group_size {c.group_size}",
  )
  if spec.needs_group:
    _check(
      c.group_size >= 2,
      "group_size",
      f"{c.algo} needs group_size >= 2 (its advantage is undefined or zero for a group of 1; "
      "use algo=sao or running_mean for single rollouts)",
    )
    _check(
      c.mode != "async",
      "mode",
      f"{c.algo} needs whole groups of group_size rollouts, but async rollout workers and the "
      "replay queue deliver single trajectories; use mode='sync' or 'lag'",
    )
  mb = c.micro_batch_size
  _check(mb >= 0, "micro_batch_size", f"must be >= 0, got {mb}")
  _check(
    mb == 0 or c.batch_size % mb == 0,
    "micro_batch_size",
    f"batch_size {c.batch_size} is not divisible by micro_batch_size {mb}",
  )
  _check(c.max_seq_len >= 8, "max_seq_len", f"must be >= 8, got {c.max_seq_len}")
  for f in ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
    _check(c[f] >= 0, f, f"must be >= 0, got {c[f]}")
  _check(c.max_nonfinite_steps >= 1, "max_nonfinite_steps", "must be >= 1")


# Presets that only make sense with pretrained weights (random init would train noise).
PRETRAINED_ONLY = ("qwen3_0_6b", "qwen3_8b", "qwen3_30b_a3b", "smollm2_135m")


def _validate_model_and_optim(c: ConfigDict):
  _check(
    c.model.preset not in PRETRAINED_ONLY or bool(c.model.path),
    "model.path",
    f"preset {c.model.preset!r} needs pretrained weights: pass --config.model.path=DIR (a Hugging "
    "Face checkpoint directory, or a .gguf file), or run the experiment's :cpu variant "
    "(e.g. make train EXP=swe_bench:cpu)",
  )
  for f in ("param_dtype", "dtype"):
    _check(
      c.model[f] in ("float32", "bfloat16"),
      f"model.{f}",
      f"must be 'float32' or 'bfloat16', got {c.model[f]!r}",
    )

  for name in ("policy", "critic"):
    o = c.optim[name]
    _check(o.lr > 0, f"optim.{name}.lr", f"must be > 0, got {o.lr}")
    _check(o.warmup_steps >= 0, f"optim.{name}.warmup_steps", "must be >= 0")
    _check(
      o.schedule in ("constant", "cosine"),
      f"optim.{name}.schedule",
      f"must be 'constant' or 'cosine', got {o.schedule!r}",
    )
    _check(0 <= o.b1 < 1 and 0 <= o.b2 < 1, f"optim.{name}.b1", "Adam betas must be in [0, 1)")
    _check(o.clip_norm >= 0, f"optim.{name}.clip_norm", "must be >= 0")


def _validate_loss(c: ConfigDict):
  spec = algos.ALGOS[c.algo]
  lo = c.loss
  _check(0 < lo.eps_low < 1, "loss.eps_low", f"must be in (0, 1), got {lo.eps_low}")
  _check(lo.eps_high > 0, "loss.eps_high", f"must be > 0, got {lo.eps_high}")
  _check(
    lo.dis_gradient in ("detached", "literal"),
    "loss.dis_gradient",
    f"must be 'detached' or 'literal', got {lo.dis_gradient!r}",
  )
  _check(0 < lo.clip_low < 1, "loss.clip_low", f"must be in (0, 1), got {lo.clip_low}")
  _check(lo.clip_high > 0, "loss.clip_high", f"must be > 0, got {lo.clip_high}")
  _check(lo.dual_clip == 0 or lo.dual_clip > 1, "loss.dual_clip", "must be 0 (off) or > 1")
  _check(lo.behav_cap > 1, "loss.behav_cap", f"must be > 1, got {lo.behav_cap}")
  _check(lo.tis_cap == 0 or lo.tis_cap >= 1, "loss.tis_cap", "must be 0 (off) or >= 1")
  if spec.critic:
    _check(lo.critic_steps >= 1, "loss.critic_steps", f"{c.algo} trains a critic: must be >= 1")
  _check(lo.critic_only_steps >= 0, "loss.critic_only_steps", "must be >= 0")
  _check(0 < lo.gamma <= 1, "loss.gamma", f"must be in (0, 1], got {lo.gamma}")
  for f in ("lam_critic", "lam_policy"):
    _check(0 <= lo[f] <= 1, f"loss.{f}", f"must be in [0, 1], got {lo[f]}")
  _check(lo.lam_alpha > 0, "loss.lam_alpha", f"must be > 0, got {lo.lam_alpha}")
  _check(lo.advantage_values in ("pre", "post"), "loss.advantage_values", "must be 'pre' or 'post'")
  _check(lo.value_clip >= 0, "loss.value_clip", "must be >= 0")
  _check(lo.baseline_window >= 1, "loss.baseline_window", "must be >= 1")
  for f in ("nll_coef", "kl_coef", "entropy_coef"):
    _check(lo[f] >= 0, f"loss.{f}", "must be >= 0")


def _validate_rollout(c: ConfigDict):
  _check(c.env.max_turns >= 1, "env.max_turns", "must be >= 1")
  _check(
    c.env.tool_format in ("qwen3", "compact"), "env.tool_format", "must be 'qwen3' or 'compact'"
  )
  _check(c.env.timeout_s > 0, "env.timeout_s", "must be > 0")
  _check(1 <= c.env.style_sentences <= 4, "env.style_sentences", "must be in [1, 4]")

  r = c.rollout
  _check(r.engine in ("embedded", "http"), "rollout.engine", "must be 'embedded' or 'http'")
  _check(r.engine != "http" or bool(r.urls), "rollout.urls", "rollout.engine='http' needs urls")
  _check(r.num_slots >= 1, "rollout.num_slots", "must be >= 1")
  try:
    windows = int_list(r.decode_windows)
  except ValueError:
    windows = (0,)
  _check(
    all(1 <= w <= c.max_seq_len for w in windows),
    "rollout.decode_windows",
    f"comma-separated integers in [1, max_seq_len={c.max_seq_len}], got {r.decode_windows!r}",
  )
  _check(r.concurrency >= 1, "rollout.concurrency", "must be >= 1")
  _check(r.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
  _check(
    r.temperature > 0,
    "rollout.temperature",
    "must be > 0 (training needs the sampled distribution's log-probs)",
  )
  _check(0 < r.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
  _check(r.top_k >= 0, "rollout.top_k", "must be >= 0")
  _check(r.num_workers >= 0, "rollout.num_workers", "must be >= 0")
  _check(
    r.num_workers >= 1 or (c.mode == "async" and bool(c.replay.serve_address)),
    "rollout.num_workers",
    "0 in-process workers needs mode='async' and replay.serve_address for remote actors",
  )

  _check(
    c.replay.capacity >= c.batch_size,
    "replay.capacity",
    f"must hold at least one batch ({c.batch_size})",
  )
  _check(c.replay.max_policy_lag >= 0, "replay.max_policy_lag", "must be >= 0")
  if c.mode == "lag":
    _check(
      c.policy_lag <= c.replay.max_policy_lag,
      "policy_lag",
      f"{c.policy_lag} exceeds replay.max_policy_lag {c.replay.max_policy_lag}; every batch "
      "would be dropped as stale",
    )

  _check(c.eval.num_samples >= 1, "eval.num_samples", "must be >= 1")
  _check(c.eval.temperature >= 0, "eval.temperature", "must be >= 0")
  _check(c.sft.steps >= 0, "sft.steps", "must be >= 0")
  _check(0 <= c.sft.tool_fraction <= 1, "sft.tool_fraction", "must be in [0, 1]")


def mesh_shape(config: ConfigDict, num_devices: int) -> dict[str, int]:
  """Resolves the mesh axis sizes: one -1 takes the remaining devices.

  Without a -1 the axes may cover fewer devices than there are (the mesh then uses the first ones,
  e.g. `mesh.data=1` for a single-device run on a host with 8 fake CPU devices).
  """
  m = config.mesh
  sizes = {a: int(m[a]) for a in ("data", "fsdp", "tensor", "expert")}
  free = [a for a, s in sizes.items() if s == -1]
  _check(len(free) <= 1, "mesh", f"at most one axis may be -1, got {free}")
  for a, s in sizes.items():
    _check(s == -1 or s >= 1, f"mesh.{a}", f"must be >= 1 or -1, got {s}")
  fixed = 1
  for s in sizes.values():
    if s != -1:
      fixed *= s
  if free:
    _check(
      num_devices % fixed == 0,
      f"mesh.{free[0]}",
      f"{num_devices} devices are not divisible by the other axes' product {fixed}",
    )
    sizes[free[0]] = num_devices // fixed
  _check(
    fixed <= num_devices, "mesh", f"axes {sizes} need {fixed} devices, only {num_devices} exist"
  )
  return sizes


def mesh_size(config: ConfigDict, num_devices: int) -> int:
  """Devices the mesh uses (the product of `mesh_shape`)."""
  n = 1
  for s in mesh_shape(config, num_devices).values():
    n *= s
  return n


def _validate_mesh(c: ConfigDict, num_devices: int | None):
  if num_devices is None:
    import sys

    if "jax" not in sys.modules:
      return
    num_devices = sys.modules["jax"].device_count()
  sizes = mesh_shape(c, num_devices)
  rows = sizes["data"] * sizes["fsdp"]
  mb = c.micro_batch_size or c.batch_size
  _check(
    mb % rows == 0,
    "batch_size" if not c.micro_batch_size else "micro_batch_size",
    f"{mb} is not divisible by the mesh's batch axes data*fsdp = {rows}",
  )


def to_json(config: ConfigDict) -> str:
  """The resolved config as JSON (tuples become lists)."""
  return json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)
