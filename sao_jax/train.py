"""The training loop: `python -m sao_jax.train --config=experiments/X.py[:args] --workdir=DIR`.

Reads top to bottom (style.md rule 4): set up (config, workdir, mesh, tokenizer, data, environment),
models and engine, SFT warm start, init or restore, the loop, the final evaluation. Modes
(design.md §2):

  sync   rollouts for policy version v are sampled with the weights of version v;
  lag    ... with the weights of version v - k (a ring of past weights), so an experiment under
         policy lag k is reproducible bit for bit on CPU;
  async  rollout workers stream scored episodes into the replay queue with the newest weights while
         the learner trains on the next B fresh enough trajectories (staleness <= max_policy_lag).

Every step appends one line to WORKDIR/metrics.jsonl. Checkpoints (orbax) hold the whole state:
both models and optimizers, step, version, RNG, running baseline, the lag ring, the data iterator
and, in async mode, the replay queue's contents. A run started again in the same workdir resumes
where it stopped; a failure waits for pending checkpoint writes before it propagates.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
from absl import flags, logging
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from ml_collections import config_flags

from sao_jax import (
  algos,
  checkpoint,
  cli,
  data,
  envs,
  metrics,
  replay,
  rollout,
  sharding,
  train_step,
)
from sao_jax import config as config_lib
from sao_jax import train_lib as lib
from sao_jax.async_metrics import AsyncMetrics, batch_lag_metrics
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
  lib.quiet_library_logs()
  if _COORDINATOR.value:
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  config = config_lib.validate(_CONFIG.value, num_devices=jax.device_count())
  summary = train(config, _WORKDIR.value or os.path.join("runs", "default"))
  print(lib.format_summary(summary))


def train(
  config,
  workdir: str,
  *,
  progress: bool | None = None,
  callback: Callable[[int, dict[str, float]], Any] | None = None,
) -> dict[str, Any]:
  """Runs (or resumes) the experiment `config` in `workdir`.

  Args:
    config: a validated run config.
    workdir: run directory (created; an existing checkpoint there is resumed).
    progress: show progress bars (default: when stderr is a terminal).
    callback: called after every step with (step, metrics), e.g. to plot live in a notebook.

  Returns:
    The closing summary: steps, policy version, eval pass@1 after SFT and after RL, eval history.
  """
  # ------------------------------------------------------------------ set up
  os.makedirs(workdir, exist_ok=True)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config_lib.to_json(config))
  mesh, rules = lib.make_mesh(config), sharding.rules_from(config)
  tokenizer = lib.load_tokenizer(config)
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

  # ------------------------------------------------------------------ models and engine
  # Built outside the mesh context: loaders place every tensor on the mesh themselves.
  policy = lib.build_policy(config, tokenizer, mesh, rules)
  with sharding.use_mesh(mesh, rules):
    engine = rollout.make_engine(config, policy)
    publisher = rollout.make_publisher(
      config, engine, graphdef=nnx.graphdef(policy), directory=os.path.join(workdir, "weights")
    )
    agent = rollout.make_agent(config, engine, tokenizer, env_factory)
    ckpt = checkpoint.Checkpointer(
      os.path.join(workdir, "checkpoints"), keep=config.keep_checkpoints
    )
    resuming = ckpt.latest_step() is not None
    host: dict[str, Any] = {"eval": {}, "nonfinite": 0}

    # ---------------------------------------------------------------- SFT warm start
    if not resuming and config.sft.steps > 0:
      lib.run_sft(config, policy, tokenizer, workdir, progress)
      publisher.publish(nnx.state(policy, nnx.Param), 0)
      host["eval"]["sft"] = lib.evaluate(config, engine, tokenizer, env_factory, eval_tasks)
      logging.info("eval pass@1 after SFT: %.3f", host["eval"]["sft"])
      lib.export_sft(policy, os.path.join(workdir, "sft_model"), host["eval"]["sft"])

    # ---------------------------------------------------------------- init or restore
    critic = lib.build_critic(config, policy) if algo.critic else None
    learner, state = train_step.init_state(config, policy, critic)
    state = lib.place_state(state, mesh)
    ring = lib.LagRing(config.policy_lag if config.mode == "lag" else 0, state.policy)
    queue = server = workers = meter = None
    if config.mode == "async":
      queue = replay.make_queue(config, vocab_size=tokenizer.vocab_size)
      if config.rollout.num_workers:  # 0: only remote actors feed the queue
        workers = rollout.RolloutWorkers(
          agent, train_tasks, queue, seed=config.seed, num_workers=config.rollout.num_workers
        )
    if resuming:
      restored, host = ckpt.restore(checkpoint.abstract_like({"state": state, "ring": ring.params}))
      state, ring.params, ring.versions = restored["state"], restored["ring"], host["ring_versions"]
      train_tasks.set_state(host["data"])
      if queue is not None:
        queue.load_state_dict(host["replay"])
      if workers is not None:
        workers.load_state_dict(host["workers"])
      logging.info("resumed from step %d (policy version %d)", int(state.step), int(state.version))

    def save():
      h = dict(host, data=train_tasks.get_state(), ring_versions=list(ring.versions))
      if queue is not None:  # the queue first: a resume then never re-draws a queued task
        h["replay"] = queue.state_dict()
      if workers is not None:
        h["workers"] = workers.state_dict()
      ckpt.save(int(state.step), {"state": state, "ring": ring.params}, host=h)

    batch_sharding = NamedSharding(mesh, P(("data", "fsdp")))
    step_fn = train_step.make_train_step(
      config, learner, state_sharding=lib.tree_shardings(state), batch_sharding=batch_sharding
    )

    # ---------------------------------------------------------------- the loop
    bar = metrics.ProgressBar(config.total_steps, initial=int(state.step), enabled=progress)
    timers = metrics.Timers()
    published = -1  # the weight version the engines hold
    try:
      if queue is not None:
        server = replay.make_server(queue, config)
        published = publish(publisher, state.policy, int(state.version), queue)
        meter = AsyncMetrics(queue, workers=workers, publisher=publisher)
        if workers is not None:
          workers.start()
      for step in range(int(state.step), config.total_steps):
        version = int(state.version)
        env_factory.set_step(step)
        with timers.measure("rollout"):
          if queue is not None:
            trajs = rollout.next_batch(
              queue, lib.local_batch_size(config), version=version, workers=workers
            )
            if config.replay.log_consumed:
              lib.append_lines(os.path.join(workdir, "consumed.txt"), [t.uid for t in trajs])
          else:
            rollout_version, params = ring.get(version)
            if rollout_version != published:
              published = publish(publisher, params, rollout_version)
            tasks, groups = lib.next_tasks(train_tasks, config)
            trajs = agent.run(
              tasks, seed=rollout.derive_seed(config.seed, "train", step), group_ids=groups
            )
        batch = make_batch(
          trajs,
          seq_len=config.max_seq_len,
          batch_size=lib.local_batch_size(config),
          pad_id=tokenizer.pad_id,
        )
        with timers.measure("learner"):
          state, m = step_fn(state, lib.global_batch(batch.as_dict(), batch_sharding))
          m = lib.host_values(m)
        ring.push(int(state.version), state.policy)
        if queue is not None:
          if int(state.version) != published:
            published = publish(publisher, state.policy, int(state.version), queue)
          m.update(meter.collect())
          m.update(batch_lag_metrics(trajs, version=version, max_lag=config.replay.max_policy_lag))
        m.update(lib.rollout_metrics(trajs, batch, version))
        m.update(timers.summary())
        host["nonfinite"] = host["nonfinite"] + 1 if m["skipped"] else 0
        last = step + 1 == config.total_steps  # the final evaluation follows the loop
        if config.eval_every and (step + 1) % config.eval_every == 0 and not last:
          published = publish(publisher, state.policy, int(state.version), queue)
          m["eval/pass_at_1"] = host["eval"][str(step + 1)] = lib.evaluate(
            config, engine, tokenizer, env_factory, eval_tasks
          )
        lib.report(writer, bar, step, int(state.version), m, config.log_every)
        if callback is not None:
          callback(step, m)
        if host["nonfinite"] >= config.max_nonfinite_steps:
          save()
          raise RuntimeError(
            f"step {step}: {host['nonfinite']} consecutive non-finite steps (skipped); a "
            f"checkpoint was saved in {ckpt.directory}. Check the rewards and rollout log-probs, "
            "or lower the learning rates."
          )
        if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
          save()
      bar.close()
      if workers is not None:
        workers.stop()
      if server is not None:
        server.stop()
        server = None

      # -------------------------------------------------------------- final evaluation
      publish(publisher, state.policy, int(state.version), queue)
      final = host["eval"]["final"] = lib.evaluate(
        config, engine, tokenizer, env_factory, eval_tasks
      )
      if writer is not None:
        writer.write(int(state.step), {"eval/pass_at_1_final": final})
      if ckpt.latest_step() != int(state.step):
        save()
    except KeyboardInterrupt:
      if not any(x.is_deleted() for x in jax.tree.leaves(state)):  # not mid-step (donated)
        logging.warning("interrupted: saving a checkpoint at step %d", int(state.step))
        save()
      raise
    finally:
      for closer in (
        workers and workers.stop,
        server and server.stop,
        ckpt.close,
        engine.close,
        publisher.close,
        writer and writer.close,
      ):
        if closer:
          closer()
  return {
    "workdir": workdir,
    "algo": config.algo,
    "steps": int(state.step),
    "policy_version": int(state.version),
    "eval_sft": host["eval"].get("sft"),
    "eval_final": final,
    "eval_history": host["eval"],
  }


def publish(publisher, params, version: int, queue=None) -> int:
  """Hands `params` (as `version`) to the engines; the queue learns the version first."""
  rollout.publish_weights(publisher, params, version, queue=queue)
  return version


if __name__ == "__main__":
  cli.run(main)
