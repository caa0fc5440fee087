"""The `ReplayQueue` interface between rollout producers and the learner (design.md §1, §6).

Producers (rollout threads, or the gRPC service on behalf of remote actors) `put` one scored
`Trajectory` at a time; the learner takes the next `n` that are fresh enough with `get_batch`.
The queue validates (design §6), accepts each uid once, bounds its size with backpressure (a full
queue blocks producers; nothing is dropped silently), and drops trajectories whose oldest action
token is more than `max_policy_lag` versions behind the learner. Its contents, the uids it has seen
and its counters are part of the learner's checkpoint (`state_dict` / `load_state_dict`).

Rejection reasons (the `reason` strings of `put`, `stats()["rejected"]` and the wire's Rejection):
  * every reason of `Trajectory.validate` ("length_mismatch:<field>", "empty", "too_long",
    "action_at_position_0", "nonfinite_reward", "nonfinite_logprob", "positive_logprob",
    "token_out_of_range", "missing_version", "version_from_future");
  * "missing_uid", "duplicate" (uid seen before), "stale" (too old on arrival), "closed";
  * from the gRPC service: "bad_encoding:<field>" (byte length not a whole number of elements),
    and from the client before sending: "too_large" (message over the size limit).
A put that times out on a full queue is not a rejection: it returns (False, "queue_full"), is
counted in `put_timeouts`, and the same uid may be put again; likewise a put given up through its
`cancel` callback returns (False, "cancelled") and counts nowhere.

Staleness: with learner version v, a trajectory is stale when v - oldest_version > max_policy_lag,
where oldest_version is the smallest policy version among its action tokens (algorithm.md §11.9).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any

from sao_jax.types import Trajectory

QUEUE_FULL = "queue_full"
CANCELLED = "cancelled"


class QueueClosed(RuntimeError):
  """Raised by `get_batch` once the queue is closed and cannot supply a full batch."""


def policy_lag(traj: Trajectory, current_version: int) -> int | None:
  """Versions between the learner and the oldest action token (None if there are no actions)."""
  oldest = traj.oldest_version
  return None if oldest < 0 else current_version - oldest


def is_stale(traj: Trajectory, current_version: int, max_policy_lag: int) -> bool:
  """True when the trajectory's oldest action token is more than `max_policy_lag` versions old."""
  lag = policy_lag(traj, current_version)
  return lag is not None and lag > max_policy_lag


class ReplayQueue(abc.ABC):
  """Bounded, validating, deduplicating, staleness-aware queue of trajectories. Thread-safe.

  Implementations: `InMemoryQueue` (single host; also the store behind the gRPC service).
  """

  @abc.abstractmethod
  def put(
    self,
    traj: Trajectory,
    timeout: float | None = None,
    *,
    cancel: Callable[[], bool] | None = None,
  ) -> tuple[bool, str | None]:
    """Adds one trajectory; blocks while the queue is full (backpressure).

    Args:
      traj: a scored trajectory (numpy fields). Ownership passes to the queue: do not mutate it.
      timeout: seconds to wait for room; None waits until there is room or the queue closes.
      cancel: polled while blocked; once it returns True the put gives up with (False,
        "cancelled"), which is not counted (e.g. a rollout thread told to stop, a gone client).

    Returns:
      (True, None) if accepted, else (False, reason); see the module docstring for reasons.
    """

  @abc.abstractmethod
  def get_batch(
    self, n: int, *, current_version: int | None = None, timeout: float | None = None
  ) -> list[Trajectory]:
    """Takes the next `n` fresh trajectories in arrival order (all or nothing).

    Queued trajectories that are stale for `current_version` are dropped and counted.

    Args:
      n: batch size, 1 <= n <= capacity.
      current_version: the learner's policy version. When given it also raises the queue's version
        (`set_version`) if larger. None uses the queue's version.
      timeout: seconds to wait for `n` fresh trajectories; None waits indefinitely.

    Returns:
      Exactly `n` trajectories.

    Raises:
      TimeoutError: fewer than `n` fresh trajectories arrived in time (none are consumed).
      QueueClosed: the queue was closed and holds fewer than `n` fresh trajectories.
    """

  @abc.abstractmethod
  def set_version(self, version: int) -> None:
    """Sets the learner's current policy version (validation rejects versions above it)."""

  @property
  @abc.abstractmethod
  def version(self) -> int:
    """The learner's current policy version as known to the queue."""

  @abc.abstractmethod
  def reject(self, reason: str) -> None:
    """Counts a rejection decided outside the queue (e.g. a wire decoding error)."""

  @abc.abstractmethod
  def stats(self) -> dict[str, Any]:
    """A snapshot of the counters.

    Returns:
      A dict with keys: accepted, rejected ({reason: count}), duplicates, dropped_stale, queued,
      consumed, version, capacity, put_timeouts, lag_histogram ({lag: consumed count}), age_mean_s,
      age_p50_s, age_p90_s, age_max_s (seconds consumed items spent queued), put_wait_s, get_wait_s
      (total seconds producers / the consumer spent blocked).
    """

  @abc.abstractmethod
  def state_dict(self) -> dict[str, Any]:
    """The queue's checkpoint: {"arrays": {name: 1-D numpy array}, "meta": JSON-able dict}."""

  @abc.abstractmethod
  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Replaces contents, seen uids, counters and version with those of `state_dict()`."""

  @abc.abstractmethod
  def close(self) -> None:
    """Closes the queue: later puts return (False, "closed"); blocked callers wake up."""

  @property
  @abc.abstractmethod
  def closed(self) -> bool:
    """Whether `close` was called."""

  @abc.abstractmethod
  def __len__(self) -> int:
    """Trajectories queued now."""


def window_metrics(
  prev: Mapping[str, Any], cur: Mapping[str, Any], elapsed_s: float, *, num_producers: int = 1
) -> dict[str, float]:
  """Rates and idle fractions between two `stats()` snapshots taken `elapsed_s` apart.

  Args:
    prev: the earlier snapshot.
    cur: the later snapshot.
    elapsed_s: wall-clock seconds between them (> 0).
    num_producers: producer threads or streams sharing the queue (put_wait_s sums over them).

  Returns:
    {"replay/learner_wait_fraction": share of the window the consumer spent waiting for data,
    "replay/producer_blocked_fraction": share of producer time spent blocked on a full queue,
    "replay/accepted_per_s", "replay/consumed_per_s", "replay/dropped_stale_per_s"}.
  """
  if elapsed_s <= 0:
    raise ValueError(f"elapsed_s must be > 0, got {elapsed_s}")
  d = {k: float(cur[k]) - float(prev[k]) for k in
       ("get_wait_s", "put_wait_s", "accepted", "consumed", "dropped_stale")}  # fmt: skip
  return {
    "replay/learner_wait_fraction": min(1.0, d["get_wait_s"] / elapsed_s),
    "replay/producer_blocked_fraction": min(1.0, d["put_wait_s"] / (elapsed_s * num_producers)),
    "replay/accepted_per_s": d["accepted"] / elapsed_s,
    "replay/consumed_per_s": d["consumed"] / elapsed_s,
    "replay/dropped_stale_per_s": d["dropped_stale"] / elapsed_s,
  }


def flatten_stats(stats: Mapping[str, Any], prefix: str = "replay/") -> dict[str, float]:
  """Turns `ReplayQueue.stats()` into flat scalar metrics for the metrics writer.

  Args:
    stats: the dict from `stats()` (or `client.stats_dict`).
    prefix: prepended to every key.

  Returns:
    {name: float}, e.g. "replay/accepted", "replay/rejected/duplicate", "replay/dropped_stale",
    "replay/lag/2" (fraction of consumed trajectories with policy lag 2), "replay/lag_mean".
  """
  out: dict[str, float] = {}
  for key, value in stats.items():
    if key == "rejected":
      for reason, count in value.items():
        out[f"{prefix}rejected/{reason}"] = float(count)
    elif key == "lag_histogram":
      total = sum(value.values())
      for lag, count in sorted(value.items()):
        out[f"{prefix}lag/{lag}"] = count / total if total else 0.0
      out[f"{prefix}lag_mean"] = sum(int(k) * c for k, c in value.items()) / total if total else 0.0
    else:
      out[prefix + key] = float(value)
  return out
