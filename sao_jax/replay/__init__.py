"""Replay queue: the bridge between rollout producers and the learner (design.md §1, §5, §6).

* `ReplayQueue` (base.py): the interface; `InMemoryQueue` (memory.py): the single-host default.
* `ReplayServer` (server.py): gRPC `sao_jax.replay.v1.ReplayService` over a queue (replay.proto);
  `ReplayClient` (client.py): the pushing side for rollout hosts.
* `python -m sao_jax.replay.serve`: a standalone server; `python -m sao_jax.replay.gen`
  regenerates replay_pb2*.py from replay.proto.
* `flatten_stats(queue.stats())`: the queue's metrics ("replay/...") for the metrics writer;
  `window_metrics(prev, cur, elapsed_s)`: rates and learner/producer idle fractions.
"""

from sao_jax.replay.base import (
  CANCELLED,
  QUEUE_FULL,
  QueueClosed,
  ReplayQueue,
  flatten_stats,
  is_stale,
  policy_lag,
  window_metrics,
)
from sao_jax.replay.memory import InMemoryQueue, make_queue

# The gRPC side loads on first use, so the in-process path (and `gen`, which must run even when
# the generated modules are missing or stale) does not import grpc or replay_pb2.
_LAZY = {
  "PushResult": "client",
  "ReplayAuthError": "client",
  "ReplayClient": "client",
  "ReplayUnavailable": "client",
  "ReplayServer": "server",
  "ReplayServicer": "server",
  "make_server": "server",
}


def __getattr__(name: str):
  if name in _LAZY:
    import importlib

    return getattr(importlib.import_module(f"sao_jax.replay.{_LAZY[name]}"), name)
  raise AttributeError(f"module 'sao_jax.replay' has no attribute {name!r}")


__all__ = [
  "CANCELLED",
  "QUEUE_FULL",
  "InMemoryQueue",
  "PushResult",
  "QueueClosed",
  "ReplayAuthError",
  "ReplayClient",
  "ReplayQueue",
  "ReplayServer",
  "ReplayServicer",
  "ReplayUnavailable",
  "flatten_stats",
  "is_stale",
  "make_queue",
  "make_server",
  "policy_lag",
  "window_metrics",
]
