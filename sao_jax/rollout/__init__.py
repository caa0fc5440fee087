"""Rollout: the generate interface, the embedded JAX engine, the HTTP client and the agent loop.

  engine = rollout.make_engine(config, policy)                         # from config.rollout, or:
  engine = rollout.Engine(policy, num_slots=16, max_len=1024)         # embedded, continuous batching
  engine = rollout.HttpEngine("http://host:30000")                     # SGLang or sao_jax.serve
  loop = rollout.AgentLoop(engine, tokenizer, envs.make(config.env),
                           rollout.AgentSettings.from_config(config))
  trajectories = loop.run(tasks, seed=step)                            # Trajectory per task, in order
  for traj in loop.stream(task_iter, seed=0): queue.put(traj)          # async mode

`python -m sao_jax.serve` puts an SGLang-compatible HTTP server on the embedded engine.
"""

from sao_jax.rollout.agent import AgentLoop, AgentSettings, derive_seed
from sao_jax.rollout.engine import Engine, default_buckets, default_windows
from sao_jax.rollout.factory import make_agent, make_engine
from sao_jax.rollout.http_client import HttpEngine, ServerError
from sao_jax.rollout.protocol import GenerateEngine, GenerateRequest, GenerateResult
from sao_jax.rollout.weights import (
  HttpPublisher,
  InProcessPublisher,
  WeightPublisher,
  make_publisher,
)
from sao_jax.rollout.workers import RolloutWorkerError, RolloutWorkers, next_batch, publish_weights

__all__ = [
  "AgentLoop",
  "AgentSettings",
  "Engine",
  "GenerateEngine",
  "GenerateRequest",
  "GenerateResult",
  "HttpEngine",
  "HttpPublisher",
  "InProcessPublisher",
  "RolloutWorkerError",
  "RolloutWorkers",
  "ServerError",
  "WeightPublisher",
  "default_buckets",
  "default_windows",
  "derive_seed",
  "make_agent",
  "make_engine",
  "make_publisher",
  "next_batch",
  "publish_weights",
]
