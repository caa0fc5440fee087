"""Async vs sync end-to-end throughput under long-tailed episode lengths (issue 8 targets).

  python benchmarks/bench_async.py                        # simulated episodes, sigma 0.5 / 1 / 1.5
  python benchmarks/bench_async.py --real                 # + the tiny model on the embedded engine

Both modes get the same rollout resources: S slots (episodes in flight at once), B trajectories per
learner step, and episode lengths drawn from one lognormal per episode, as in agentic rollouts.

  sync   the learner loop of `sao_jax.train` in mode 'sync': run B episodes (`AgentLoop.run`, S at
         once), train, publish, repeat. Slots idle while the slowest episode finishes and while the
         learner trains; the learner idles while episodes run.
  async  `RolloutWorkers` keep S episodes in flight without pause and push each one into an
         `InMemoryQueue` (capacity 2B, max_policy_lag 4) as it finishes; the learner takes the next
         B fresh ones (`next_batch`), trains, and publishes with `publish_weights`.

What is real and what is simulated:
  * always real: the agent loop, the workers, the queue (validation, staleness drops, backpressure),
    weight publishing (`InProcessPublisher`), the metrics (`sao_jax.async_metrics`);
  * simulated learner (both modes, both parts): one step is a fixed sleep of L seconds, chosen so
    the learner consumes `--learner-headroom` times the rollout capacity (L = B E[d] / (S h));
  * default part, simulated episodes: an engine with S slots where each episode holds one slot for
    d ~ lognormal(median, sigma) seconds (drawn from the episode's seed), no model;
  * `--real` part: the tiny model on the embedded JAX engine (S slots, continuous batching) decodes
    every token; each episode's length is lognormal in tokens (its max_new_tokens, stop tokens off),
    and the weight publish is a real device copy into the engine.

The ideal bound is min(rollout capacity, learner capacity): the rollout capacity S / mean(d)
episodes/s, with mean(d) measured over the episodes that actually ran (simulated part), or the
completion rate of a calibration stream that keeps all S slots busy (real part), and the learner
capacity B / L. The
learner step is sized so that the learner is the faster one by `--learner-headroom`, which makes the
rollout capacity the bound; on a shared machine the real part's calibration is noisy, so there the
learner may turn out to be the bound. Reported per row: trajectories/s consumed by the learner,
speed-up over sync, both capacities, the share of the ideal bound, the learner's idle fraction (time
waiting for a batch / wall time), and for async the lag histogram of consumed trajectories and the
share dropped as stale.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import threading
import time

import numpy as np

from sao_jax import async_metrics
from sao_jax.envs.base import StepResult
from sao_jax.models.tokenizer import load_tokenizer
from sao_jax.replay import InMemoryQueue
from sao_jax.rollout import AgentLoop, AgentSettings, GenerateRequest, GenerateResult
from sao_jax.rollout.agent import derive_seed
from sao_jax.rollout.protocol import GenerateEngine
from sao_jax.rollout.weights import InProcessPublisher
from sao_jax.rollout.workers import RolloutWorkers, publish_weights

TOK = load_tokenizer("byte")


class SimEngine(GenerateEngine):
  """S slots; a request holds one for d ~ lognormal(median_s, sigma) seconds (from its seed).

  Every output token carries the weight version current when the request took its slot.
  """

  def __init__(self, slots: int, median_s: float, sigma: float):
    self.median_s, self.sigma = median_s, sigma
    self._pool = concurrent.futures.ThreadPoolExecutor(slots, "sim-slot")
    self._version = 0
    self.durations: list[float] = []

  @property
  def version(self) -> int:
    return self._version

  def update_weights(self, params, version: int) -> None:
    del params
    self._version = int(version)

  def submit(self, request: GenerateRequest) -> concurrent.futures.Future:
    return self._pool.submit(self._run, request)

  def _run(self, request: GenerateRequest) -> GenerateResult:
    z = np.random.default_rng(request.seed).standard_normal()
    d, v = self.median_s * float(np.exp(self.sigma * z)), self._version
    time.sleep(d)
    self.durations.append(d)
    return GenerateResult(request.rid, [65, TOK.eos_id], [-0.7, -0.7], [v, v], "stop",
                          len(request.input_ids))  # fmt: skip

  def close(self) -> None:
    self._pool.shutdown(wait=False, cancel_futures=True)


class LognormalBudget(GenerateEngine):
  """Wraps a real engine: each request generates a lognormal number of tokens (stop tokens off)."""

  def __init__(self, engine, median_tokens: float, sigma: float, max_tokens: int):
    self.engine, self.median, self.sigma, self.max_tokens = engine, median_tokens, sigma, max_tokens

  @property
  def version(self) -> int:
    return self.engine.version

  def update_weights(self, params, version: int) -> None:
    self.engine.update_weights(params, version)

  @property
  def params(self):
    return self.engine.params

  def submit(self, request: GenerateRequest) -> concurrent.futures.Future:
    z = np.random.default_rng(request.seed).standard_normal()
    n = int(np.clip(round(self.median * np.exp(self.sigma * z)), 1, self.max_tokens))
    return self.engine.submit(GenerateRequest(request.input_ids, max_new_tokens=n, temperature=1.0,
                                              seed=request.seed))  # fmt: skip

  def close(self) -> None:
    self.engine.close()


class OneTurnEnv:
  """An episode is one generation; the environment is free (the engine holds all the time)."""

  def reset(self, task):
    return [{"role": "user", "content": task["problem"]}]

  def step(self, action):
    return StepResult(None, 1.0, True, {"finish_reason": "answer"})


def tasks():
  i = 0
  while True:
    yield {"id": f"t{i}", "problem": "go"}
    i += 1


def agent_for(engine, slots: int, max_seq_len: int = 512) -> AgentLoop:
  settings = AgentSettings(max_turns=1, max_seq_len=max_seq_len, max_new_tokens=max_seq_len - 64,
                           concurrency=slots)  # fmt: skip
  return AgentLoop(engine, TOK, OneTurnEnv, settings, env_name="bench")


def run_sync(engine, slots: int, batch: int, learner_s: float, steps: int) -> dict[str, float]:
  """The sync loop; returns throughput and the learner's idle fraction."""
  agent, publisher, it = agent_for(engine, slots), InProcessPublisher(engine), tasks()
  waited, t0 = 0.0, time.perf_counter()
  for step in range(steps):
    t1 = time.perf_counter()
    agent.run([next(it) for _ in range(batch)], seed=derive_seed("sync", step))
    waited += time.perf_counter() - t1
    time.sleep(learner_s)  # the simulated learner step
    publisher.publish(getattr(engine, "params", None), step + 1)
  wall = time.perf_counter() - t0
  return {"traj_per_s": steps * batch / wall, "learner_idle": waited / wall, "wall_s": wall}


def run_async(
  engine, slots: int, batch: int, learner_s: float, steps: int, warmup: int, max_lag: int
) -> dict[str, float]:
  """The async loop; throughput, learner idle, lag histogram and stale share after `warmup` steps."""
  v0 = max(engine.version, 0)  # the engine may come from a sync run at a later version
  queue = InMemoryQueue(2 * batch, max_policy_lag=max_lag, vocab_size=TOK.vocab_size, version=v0)
  workers = RolloutWorkers(agent_for(engine, slots), tasks(), queue, num_workers=1, seed=0)
  publisher = InProcessPublisher(engine)
  workers.start()
  meter, waited, t0 = None, 0.0, 0.0
  for step in range(warmup + steps):
    if step == warmup:
      meter, waited, t0 = (
        async_metrics.AsyncMetrics(queue, workers=workers),
        0.0,
        time.perf_counter(),
      )
    t1 = time.perf_counter()
    workers.next_batch(batch, version=v0 + step, timeout=600)
    waited += time.perf_counter() - t1
    time.sleep(learner_s)
    publish_weights(publisher, getattr(engine, "params", None), v0 + step + 1, queue=queue)
  wall = time.perf_counter() - t0
  m = meter.collect()
  workers.stop(timeout=30)
  lags = {int(k.rsplit("/", 1)[1]): v for k, v in m.items() if k.startswith("async/lag_hist/")}
  return {
    "traj_per_s": m["async/consumed"] / wall,
    "learner_idle": waited / wall,
    "wall_s": wall,
    "lag_hist": [lags.get(k, 0.0) for k in range(max_lag + 1)],
    "stale_share": m["async/dropped/stale"] / max(m["async/accepted"], 1.0),
    "rollout_blocked": m["async/rollout_idle_fraction"],
  }


def simulated(args, sigma: float) -> list[dict]:
  """Sync and async rows for one sigma, on simulated episodes."""
  mean_d = args.median_s * np.exp(sigma**2 / 2)
  learner_s = args.batch * mean_d / (args.slots * args.learner_headroom)
  rows = []
  for mode in ("sync", "async"):
    engine = SimEngine(args.slots, args.median_s, sigma)
    if mode == "sync":
      r = run_sync(engine, args.slots, args.batch, learner_s, args.sync_steps)
    else:
      r = run_async(engine, args.slots, args.batch, learner_s, args.async_steps, args.warmup,
                    args.max_policy_lag)  # fmt: skip
    engine.close()
    r.update(mode=mode, part="simulated", sigma=sigma, learner_s=learner_s, batch=args.batch,
             capacity=args.slots / np.mean(engine.durations))  # fmt: skip
    rows.append(r)
  return rows


def real(args) -> list[dict]:
  """Sync and async rows on the tiny model (real decoding, simulated learner)."""
  from flax import nnx

  from sao_jax import models
  from sao_jax.rollout import Engine

  policy = models.Policy(models.get_preset("tiny"), rngs=nnx.Rngs(0))
  inner = Engine(policy, num_slots=args.real_slots, max_len=512, seed=0)
  inner.warmup()  # every prefill bucket and decode window, so no compile lands in a timed run
  engine = LognormalBudget(inner, args.real_median_tokens, args.real_sigma, max_tokens=440)
  agent_for(engine, args.real_slots).run([next(tasks()) for _ in range(2)], seed=1)  # compile
  capacity = steady_rate(engine, args.real_slots, 8 * args.real_slots)
  learner_s = args.batch / (capacity * args.learner_headroom)
  print(f"real: capacity {capacity:.1f} episodes/s with {args.real_slots} slots", flush=True)
  rows = []
  for mode in ("sync", "async"):
    if mode == "sync":
      r = run_sync(engine, args.real_slots, args.batch, learner_s, args.real_sync_steps)
    else:
      r = run_async(engine, args.real_slots, args.batch, learner_s, args.real_async_steps,
                    args.warmup, args.max_policy_lag)  # fmt: skip
    r.update(mode=mode, part="real tiny", sigma=args.real_sigma, capacity=capacity,
             learner_s=learner_s, batch=args.batch)  # fmt: skip
    rows.append(r)
  engine.close()
  return rows


def steady_rate(engine, slots: int, n: int) -> float:
  """Episodes/s with every slot busy: completions n after the first `slots` (no drain at the end)."""
  stream = agent_for(engine, slots).stream(tasks(), seed=2)
  t0 = 0.0
  for i, _ in enumerate(stream):
    if i == slots:
      t0 = time.perf_counter()
    if i == slots + n:
      break
  rate = n / (time.perf_counter() - t0)
  stream.close()
  return rate


def table(rows: list[dict]) -> str:
  """Markdown table; ideal = min(rollout capacity, learner capacity B / L)."""
  head = ("| part | sigma | mode | traj/s | vs sync | rollout capacity | learner B/L | % of ideal "
          "| learner idle | lag 0/1/2/... (share) | stale dropped |")  # fmt: skip
  lines = [head, "|" + "---|" * 11]
  sync = {}
  for r in rows:
    key = (r["part"], r["sigma"])
    if r["mode"] == "sync":
      sync[key] = r["traj_per_s"]
    learner_cap = r["batch"] / r["learner_s"]
    ideal = min(r["capacity"], learner_cap)
    lag = "/".join(f"{x:.2f}" for x in r["lag_hist"]) if "lag_hist" in r else "0 (on-policy)"
    stale = f"{r['stale_share']:.1%}" if "stale_share" in r else "-"
    lines.append(
      f"| {r['part']} | {r['sigma']:.1f} | {r['mode']} | {r['traj_per_s']:.1f} | "
      f"{r['traj_per_s'] / sync[key]:.2f}x | {r['capacity']:.1f} | {learner_cap:.1f} | "
      f"{r['traj_per_s'] / ideal:.1%} | {r['learner_idle']:.1%} | {lag} | {stale} |"
    )
  return "\n".join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--slots", type=int, default=32, help="S: episodes in flight (both modes)")
  p.add_argument("--batch", type=int, default=32, help="B: trajectories per learner step")
  p.add_argument("--median-s", type=float, default=0.1, help="median simulated episode seconds")
  p.add_argument("--sigmas", default="0.5,1.0,1.5", help="lognormal sigmas (simulated part)")
  p.add_argument("--learner-headroom", type=float, default=1.05,
                 help="learner speed / rollout capacity (the simulated step is sized by it)")  # fmt: skip
  p.add_argument("--max-policy-lag", type=int, default=4, help="the queue's staleness bound")
  p.add_argument("--sync-steps", type=int, default=12)
  p.add_argument("--async-steps", type=int, default=60)
  p.add_argument("--warmup", type=int, default=5, help="async steps before measuring")
  p.add_argument("--real", action="store_true", help="also run the tiny model (a few minutes)")
  p.add_argument("--real-slots", type=int, default=16)
  p.add_argument("--real-median-tokens", type=float, default=24.0)
  p.add_argument("--real-sigma", type=float, default=1.0)
  p.add_argument("--real-sync-steps", type=int, default=8)
  p.add_argument("--real-async-steps", type=int, default=30)
  args = p.parse_args()
  rows = []
  for sigma in (float(s) for s in args.sigmas.split(",") if s):
    rows += simulated(args, sigma)
    print(table(rows), flush=True)
  if args.real:
    rows += real(args)
  print()
  print(table(rows))
  steps = ", ".join(f"{r['part']} sigma {r['sigma']}: {r['learner_s']:.3f}" for r in rows[::2])
  print(f"\nB={args.batch}, S={args.slots} slots (simulated) / {args.real_slots} (real), "
        f"max_policy_lag={args.max_policy_lag}, queue capacity 2B, learner headroom "
        f"{args.learner_headroom}; learner step L (s): {steps}")  # fmt: skip


if __name__ == "__main__":
  threading.current_thread().name = "bench"
  main()
