"""Metrics of async mode for the learner's log: staleness, queue age, drops, idle time, publishing.

Functions of snapshots (pure, host-side) and one small windowing helper that the learner calls
once per step:

  meter = AsyncMetrics(queue, workers=workers, publisher=publisher)
  ...
  m.update(meter.collect())                          # since the previous collect()
  m.update(batch_lag_metrics(trajs, version=v, max_lag=config.replay.max_policy_lag))
  writer.write_histograms(step, {"policy_lag": batch_lags(trajs, version=v)})

Names (all floats): "async/learner_idle_fraction" (share of the window the learner waited for a
batch), "async/rollout_idle_fraction" (share of worker time blocked on a full queue or backing off;
without in-process workers, the gRPC producers' blocked share), "async/lag_hist/<k>" (share of the
window's consumed trajectories whose oldest action token was k versions old), "async/lag_mean",
"async/queue_age_{mean,p50,p90,max}_s", "async/dropped/<reason>" (queue rejections and stale drops
in the window), "async/worker_dropped/<reason>", "async/weight_publish_{last,mean,max}_s" and rates.
The replay queue's cumulative counters stay available through `replay.flatten_stats`.

Lag of a trajectory = learner version - the version of its oldest action token (algorithm.md §11.9).
B = trajectories in a batch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sao_jax.replay import window_metrics
from sao_jax.types import Trajectory


def batch_lags(trajs: Sequence[Trajectory], *, version: int) -> np.ndarray:
  """Policy lag of each trajectory's oldest action token.

  Args:
    trajs: the B trajectories of a batch.
    version: the learner's policy version they are trained at.

  Returns:
    int64[B]; 0 for a trajectory without action tokens.
  """
  return np.asarray([version - t.oldest_version if t.oldest_version >= 0 else 0 for t in trajs],
                    np.int64)  # fmt: skip


def batch_lag_metrics(
  trajs: Sequence[Trajectory], *, version: int, max_lag: int
) -> dict[str, float]:
  """Lag histogram of one batch: the share of trajectories at each lag 0..max_lag.

  Args:
    trajs: the B trajectories of a batch.
    version: the learner's policy version.
    max_lag: the staleness bound (config.replay.max_policy_lag); larger lags land in the last bin.

  Returns:
    {"policy_lag/batch_hist/<k>": share for k in 0..max_lag, "policy_lag/batch_mean",
    "policy_lag/batch_max"}.
  """
  lags = batch_lags(trajs, version=version)
  counts = np.bincount(np.clip(lags, 0, max_lag), minlength=max_lag + 1)
  out = {f"policy_lag/batch_hist/{k}": c / max(len(lags), 1) for k, c in enumerate(counts)}
  out["policy_lag/batch_mean"] = float(lags.mean()) if lags.size else 0.0
  out["policy_lag/batch_max"] = float(lags.max()) if lags.size else 0.0
  return out


def queue_window(
  prev: Mapping[str, Any], cur: Mapping[str, Any], elapsed_s: float, *, num_producers: int = 1
) -> dict[str, float]:
  """What the queue did between two `stats()` snapshots.

  Args:
    prev: the earlier `ReplayQueue.stats()`.
    cur: the later one.
    elapsed_s: seconds between them.
    num_producers: producers sharing the queue (their blocked time is averaged over them).

  Returns:
    Window counts ("async/accepted", "async/consumed"), the window's lag histogram and mean, queue
    age (window mean; p50/p90/max over recent items), drops by reason, the learner's idle fraction
    and the producers' blocked fraction.
  """
  w = window_metrics(prev, cur, elapsed_s, num_producers=num_producers)
  consumed = int(cur["consumed"]) - int(prev["consumed"])
  out = {
    "async/learner_idle_fraction": w["replay/learner_wait_fraction"],
    "async/producer_blocked_fraction": w["replay/producer_blocked_fraction"],
    "async/accepted": float(int(cur["accepted"]) - int(prev["accepted"])),
    "async/consumed": float(consumed),
    "async/consumed_per_s": w["replay/consumed_per_s"],
    "async/queued": float(cur["queued"]),
    "async/queue_age_p50_s": float(cur["age_p50_s"]),
    "async/queue_age_p90_s": float(cur["age_p90_s"]),
    "async/queue_age_max_s": float(cur["age_max_s"]),
  }
  age_sum = float(cur["age_mean_s"]) * int(cur["consumed"])
  age_sum -= float(prev["age_mean_s"]) * int(prev["consumed"])
  out["async/queue_age_mean_s"] = age_sum / consumed if consumed else 0.0
  out.update(_histogram_window(prev["lag_histogram"], cur["lag_histogram"]))
  drops = _counter_delta(prev["rejected"], cur["rejected"])
  drops.pop("stale", None)  # counted with the queued items that went stale, just below
  drops["stale"] = int(cur["dropped_stale"]) - int(prev["dropped_stale"])
  out.update({f"async/dropped/{r}": float(n) for r, n in drops.items() if n or r == "stale"})
  return out


def worker_window(
  prev: Mapping[str, Any], cur: Mapping[str, Any], elapsed_s: float
) -> dict[str, float]:
  """What in-process rollout workers did between two `RolloutWorkers.stats()` snapshots.

  Returns:
    {"async/rollout_idle_fraction", "async/episodes_started_per_s", "async/episodes_finished",
    "async/in_flight", "async/worker_errors", "async/worker_dropped/<reason>"}.
  """
  if elapsed_s <= 0:
    raise ValueError(f"elapsed_s must be > 0, got {elapsed_s}")
  idle = float(cur["idle_s"]) - float(prev["idle_s"])
  out = {
    "async/rollout_idle_fraction": min(1.0, idle / (elapsed_s * max(int(cur["num_workers"]), 1))),
    "async/episodes_started_per_s": (cur["episodes_started"] - prev["episodes_started"])
    / elapsed_s,
    "async/episodes_finished": float(cur["episodes_finished"] - prev["episodes_finished"]),
    "async/in_flight": float(cur["in_flight"]),
    "async/worker_errors": float(cur["errors"] - prev["errors"]),
  }
  drops = _counter_delta(prev["dropped"], cur["dropped"])
  out.update({f"async/worker_dropped/{r}": float(n) for r, n in drops.items() if n})
  return out


def publish_metrics(prev: Mapping[str, float], cur: Mapping[str, float]) -> dict[str, float]:
  """Weight-publish latency from two `WeightPublisher.stats()` snapshots.

  Returns:
    {"async/weight_publishes" (in the window), "async/weight_publish_last_s", "..._mean_s",
    "..._max_s" (over recent publishes), and the last publish's breakdown ("..._last_write_s",
    "..._last_load_s" for HTTP)}.
  """
  out = {
    "async/weight_publishes": float(cur["count"] - prev.get("count", 0.0)),
    "async/weight_publish_last_s": float(cur["last_s"]),
    "async/weight_publish_mean_s": float(cur["mean_s"]),
    "async/weight_publish_max_s": float(cur["max_s"]),
  }
  for k, v in cur.items():
    if k.startswith("last_") and k != "last_s":
      out[f"async/weight_publish_{k}"] = float(v)
  return out


class AsyncMetrics:
  """Windows of the queue, workers and publisher counters between `collect()` calls.

  Args:
    queue: the learner's ReplayQueue.
    workers: in-process RolloutWorkers (None: producers are remote actors).
    publisher: the WeightPublisher (None: not reported).
    num_producers: producers for the blocked fraction (default: the workers' count, else 1).
    clock: seconds, monotonic (tests may pass a fake).
  """

  def __init__(self, queue: Any, *, workers: Any = None, publisher: Any = None,
               num_producers: int | None = None, clock=time.monotonic):  # fmt: skip
    self.queue, self.workers, self.publisher, self.clock = queue, workers, publisher, clock
    self.num_producers = num_producers or (workers.num_workers if workers is not None else 1)
    self._prev = self._snapshot()

  def _snapshot(self) -> dict[str, Any]:
    return {
      "t": self.clock(),
      "queue": self.queue.stats(),
      "workers": self.workers.stats() if self.workers is not None else None,
      "publisher": self.publisher.stats() if self.publisher is not None else None,
    }

  def collect(self) -> dict[str, float]:
    """Metrics of the window since the previous call (or since construction)."""
    cur, prev = self._snapshot(), self._prev
    self._prev = cur
    elapsed = max(cur["t"] - prev["t"], 1e-9)
    out = queue_window(prev["queue"], cur["queue"], elapsed, num_producers=self.num_producers)
    if cur["workers"] is not None:
      out.update(worker_window(prev["workers"], cur["workers"], elapsed))
    else:
      out["async/rollout_idle_fraction"] = out["async/producer_blocked_fraction"]
    if cur["publisher"] is not None:
      out.update(publish_metrics(prev["publisher"], cur["publisher"]))
    out["async/window_s"] = elapsed
    return out


def _counter_delta(prev: Mapping[Any, Any], cur: Mapping[Any, Any]) -> dict[Any, int]:
  return {k: int(v) - int(prev.get(k, 0)) for k, v in cur.items()}


def _histogram_window(prev: Mapping[Any, Any], cur: Mapping[Any, Any]) -> dict[str, float]:
  """The share of the window's consumed items at each lag, and their mean lag."""
  before = {int(k): int(v) for k, v in prev.items()}
  delta = {int(k): int(v) - before.get(int(k), 0) for k, v in cur.items()}
  delta = {k: n for k, n in delta.items() if n}
  total = sum(delta.values())
  if not total:
    return {"async/lag_mean": 0.0}
  out = {f"async/lag_hist/{k}": n / total for k, n in sorted(delta.items())}
  out["async/lag_mean"] = sum(k * n for k, n in delta.items()) / total
  return out
