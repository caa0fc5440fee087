"""`InMemoryQueue`: the single-host replay queue, and the store behind the gRPC service.

A FIFO deque guarded by one lock and two conditions (not full / not empty). Validation runs
outside the lock (numpy work); the uid, staleness and room checks run under it, so concurrent
producers of the same uid get exactly one acceptance. See `base.py` for the contract and the
rejection reasons. Shapes: T = tokens of one trajectory, Q = trajectories queued, N = sum of T.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from sao_jax.replay.base import (
  CANCELLED,
  QUEUE_FULL,
  QueueClosed,
  ReplayQueue,
  is_stale,
  policy_lag,
)
from sao_jax.types import Trajectory

# Consumed items whose queue age feeds the percentiles (the mean and max cover all of them).
_AGE_WINDOW = 4096
# How often a put blocked on a full queue polls its `cancel` callback.
_CANCEL_POLL_S = 0.1
_ARRAY_FIELDS = ("tokens", "action_mask", "rollout_logprobs", "policy_versions")


@dataclasses.dataclass
class _Counters:
  accepted: int = 0
  rejected: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  dropped_stale: int = 0
  consumed: int = 0
  put_timeouts: int = 0
  lag_histogram: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  age_sum_s: float = 0.0
  age_count: int = 0
  age_max_s: float = 0.0
  put_wait_s: float = 0.0
  get_wait_s: float = 0.0

  def to_json(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["rejected"] = dict(self.rejected)
    d["lag_histogram"] = {str(k): v for k, v in self.lag_histogram.items()}
    return d

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> _Counters:
    d = dict(d)
    d["rejected"] = collections.Counter(d.get("rejected", {}))
    d["lag_histogram"] = collections.Counter(
      {int(k): int(v) for k, v in d.get("lag_histogram", {}).items()}
    )
    return cls(**d)


class InMemoryQueue(ReplayQueue):
  """Bounded in-process replay queue (see `ReplayQueue` for every method's contract).

  Args:
    capacity: most trajectories held at once; `put` blocks beyond it.
    max_policy_lag: trajectories whose oldest action token is more than this many versions behind
      the learner are dropped (algorithm.md §11.9).
    vocab_size: token ids must be below it (None: not checked).
    max_len: most tokens per trajectory (None: not checked).
    version: the learner's policy version to start from.
  """

  def __init__(self, capacity: int, *, max_policy_lag: int, vocab_size: int | None = None,
               max_len: int | None = None, version: int = 0):  # fmt: skip
    if capacity < 1:
      raise ValueError(f"capacity must be >= 1, got {capacity}")
    if max_policy_lag < 0:
      raise ValueError(f"max_policy_lag must be >= 0, got {max_policy_lag}")
    if vocab_size is not None and vocab_size < 1:
      raise ValueError(f"vocab_size must be >= 1 or None, got {vocab_size}")
    self.capacity = capacity
    self.max_policy_lag = max_policy_lag
    self.vocab_size = vocab_size
    self.max_len = max_len
    self._lock = threading.Lock()
    self._not_full = threading.Condition(self._lock)
    self._not_empty = threading.Condition(self._lock)
    self._items: collections.deque[tuple[Trajectory, float]] = collections.deque()
    self._seen: set[str] = set()
    self._version = version
    self._scanned_version = version  # items were checked for staleness at this version
    self._closed = False
    self._c = _Counters()
    self._ages: collections.deque[float] = collections.deque(maxlen=_AGE_WINDOW)

  # ------------------------------------------------------------------ producers

  def put(
    self,
    traj: Trajectory,
    timeout: float | None = None,
    *,
    cancel: Callable[[], bool] | None = None,
  ) -> tuple[bool, str | None]:
    if not traj.uid:
      self.reject("missing_uid")
      return False, "missing_uid"
    # Shapes and values do not depend on the queue's state, so check them outside the lock; the
    # version check needs the current version and runs under it.
    reason = traj.validate(vocab_size=self.vocab_size, max_len=self.max_len)
    if reason is not None:
      self.reject(reason)
      return False, reason
    deadline = None if timeout is None else time.monotonic() + timeout
    with self._lock:
      while True:
        reason = self._refusal(traj)
        if reason is not None:
          self._c.rejected[reason] += 1
          if reason == "stale":
            self._c.dropped_stale += 1
          return False, reason
        if len(self._items) < self.capacity:
          self._items.append((traj, time.monotonic()))
          self._seen.add(traj.uid)
          self._c.accepted += 1
          self._not_empty.notify_all()
          return True, None
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
          self._c.put_timeouts += 1
          return False, QUEUE_FULL
        if cancel is not None:
          if cancel():
            return False, CANCELLED
          remaining = _CANCEL_POLL_S if remaining is None else min(remaining, _CANCEL_POLL_S)
        self._c.put_wait_s += _timed_wait(self._not_full, remaining)

  def _refusal(self, traj: Trajectory) -> str | None:
    """Reasons that depend on the queue's state; call with the lock held."""
    if self._closed:
      return "closed"
    if traj.uid in self._seen:
      return "duplicate"
    v = traj.policy_versions[traj.action_mask]
    if v.size and int(v.max()) > self._version:
      return "version_from_future"
    if is_stale(traj, self._version, self.max_policy_lag):
      return "stale"
    return None

  def reject(self, reason: str) -> None:
    with self._lock:
      self._c.rejected[reason] += 1

  # ------------------------------------------------------------------ consumer

  def get_batch(
    self, n: int, *, current_version: int | None = None, timeout: float | None = None
  ) -> list[Trajectory]:
    if not 1 <= n <= self.capacity:
      raise ValueError(f"get_batch: n must be in [1, capacity={self.capacity}], got {n}")
    deadline = None if timeout is None else time.monotonic() + timeout
    with self._lock:
      if current_version is not None and current_version > self._version:
        self._version = int(current_version)
      while True:
        self._drop_stale()
        if len(self._items) >= n:
          return self._pop(n)
        if self._closed:
          raise QueueClosed(f"replay queue closed with {len(self._items)} < {n} trajectories")
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
          raise TimeoutError(
            f"get_batch: {len(self._items)} of {n} fresh trajectories after {timeout} s"
          )
        self._c.get_wait_s += _timed_wait(self._not_empty, remaining)

  def _pop(self, n: int) -> list[Trajectory]:
    now = time.monotonic()
    batch = []
    for _ in range(n):
      traj, t_in = self._items.popleft()
      lag = policy_lag(traj, self._version)
      if lag is not None:
        self._c.lag_histogram[lag] += 1
      age = now - t_in
      self._ages.append(age)
      self._c.age_sum_s += age
      self._c.age_count += 1
      self._c.age_max_s = max(self._c.age_max_s, age)
      batch.append(traj)
    self._c.consumed += n
    self._not_full.notify_all()
    return batch

  def _drop_stale(self):
    """Drops queued items made stale by a version bump; call with the lock held."""
    if self._scanned_version == self._version:
      return  # items are checked on arrival, so only a new version can make them stale
    kept = [it for it in self._items if not is_stale(it[0], self._version, self.max_policy_lag)]
    dropped = len(self._items) - len(kept)
    if dropped:
      self._items = collections.deque(kept)
      self._c.dropped_stale += dropped
      self._not_full.notify_all()
    self._scanned_version = self._version

  # ------------------------------------------------------------------ version, stats, lifecycle

  def set_version(self, version: int) -> None:
    with self._lock:
      self._version = int(version)
      self._drop_stale()  # frees room for blocked producers now, not at the next get_batch
      self._not_empty.notify_all()

  @property
  def version(self) -> int:
    return self._version

  def stats(self) -> dict[str, Any]:
    with self._lock:
      c = self._c
      ages = np.asarray(self._ages, np.float64)
      return {
        "accepted": c.accepted,
        "rejected": dict(c.rejected),
        "duplicates": c.rejected.get("duplicate", 0),
        "dropped_stale": c.dropped_stale,
        "queued": len(self._items),
        "consumed": c.consumed,
        "version": self._version,
        "capacity": self.capacity,
        "put_timeouts": c.put_timeouts,
        "lag_histogram": dict(c.lag_histogram),
        "age_mean_s": c.age_sum_s / c.age_count if c.age_count else 0.0,
        "age_p50_s": float(np.percentile(ages, 50)) if ages.size else 0.0,
        "age_p90_s": float(np.percentile(ages, 90)) if ages.size else 0.0,
        "age_max_s": c.age_max_s,
        "put_wait_s": c.put_wait_s,
        "get_wait_s": c.get_wait_s,
      }

  def close(self) -> None:
    with self._lock:
      self._closed = True
      self._not_full.notify_all()
      self._not_empty.notify_all()

  @property
  def closed(self) -> bool:
    return self._closed

  def __len__(self) -> int:
    with self._lock:
      return len(self._items)

  # ------------------------------------------------------------------ checkpoint

  def state_dict(self) -> dict[str, Any]:
    """Packs the queue into 1-D arrays (concatenated over the Q queued trajectories) plus JSON.

    Returns:
      {"arrays": {"tokens": int32[N], "action_mask": bool[N], "rollout_logprobs": float32[N],
      "policy_versions": int32[N], "lengths": int64[Q], "rewards": float64[Q]},
      "meta": {"version", "uids", "prompt_ids", "group_ids", "envs", "metadata", "ages_s",
      "seen_uids", "counters"}}. Array shapes vary with the contents, so restore them without a
      fixed target (e.g. orbax PyTreeRestore without an abstract tree, or numpy savez/load).
    """
    with self._lock:
      now = time.monotonic()
      trajs = [t for t, _ in self._items]
      arrays = {f: _concat([getattr(t, f) for t in trajs], f) for f in _ARRAY_FIELDS}
      arrays["lengths"] = np.asarray([len(t) for t in trajs], np.int64)
      arrays["rewards"] = np.asarray([t.reward for t in trajs], np.float64)
      meta = {
        "version": self._version,
        "uids": [t.uid for t in trajs],
        "prompt_ids": [t.prompt_id for t in trajs],
        "group_ids": [t.group_id for t in trajs],
        "envs": [t.env for t in trajs],
        "metadata": [_json_metadata(t.metadata) for t in trajs],
        "ages_s": [now - t_in for _, t_in in self._items],
        "seen_uids": sorted(self._seen),
        "counters": self._c.to_json(),
      }
      return {"arrays": arrays, "meta": meta}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Restores `state_dict()` output; may exceed capacity (producers then wait for room)."""
    arrays, meta = state["arrays"], state["meta"]
    lengths = np.asarray(arrays["lengths"], np.int64)
    if not len(lengths) == len(meta["uids"]) == len(meta["ages_s"]):
      raise ValueError("replay state: lengths, uids and ages_s disagree in count")
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    for f in _ARRAY_FIELDS:
      if len(arrays[f]) != bounds[-1]:
        raise ValueError(f"replay state: arrays[{f!r}] has {len(arrays[f])} != {bounds[-1]} tokens")
    now = time.monotonic()
    items = collections.deque()
    for i, uid in enumerate(meta["uids"]):
      sl = slice(int(bounds[i]), int(bounds[i + 1]))
      traj = Trajectory(
        uid=uid, prompt_id=meta["prompt_ids"][i], group_id=meta["group_ids"][i],
        env=meta["envs"][i], reward=float(arrays["rewards"][i]), metadata=dict(meta["metadata"][i]),
        **{f: np.array(arrays[f][sl]) for f in _ARRAY_FIELDS},
      )  # fmt: skip
      items.append((traj, now - float(meta["ages_s"][i])))
    with self._lock:
      self._items = items
      self._seen = set(meta["seen_uids"]) | set(meta["uids"])
      self._version = self._scanned_version = int(meta["version"])
      self._c = _Counters.from_json(meta["counters"])
      self._not_empty.notify_all()


def make_queue(config, *, vocab_size: int | None, version: int = 0) -> InMemoryQueue:
  """The learner's queue from a run config (`config.replay.*`, `config.max_seq_len`).

  Args:
    config: a full run config (sao_jax.config.base_config() plus overrides).
    vocab_size: the policy's vocabulary size (token ids must be below it).
    version: the policy version the run starts (or resumes) at.

  Returns:
    An InMemoryQueue with the configured capacity, staleness bound and length limit.
  """
  r = config.replay
  return InMemoryQueue(r.capacity, max_policy_lag=r.max_policy_lag, vocab_size=vocab_size,
                       max_len=config.max_seq_len, version=version)  # fmt: skip


def _json_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
  """Metadata with numpy scalars turned into Python ones (JSON-serialisable)."""
  return {str(k): v.item() if isinstance(v, np.generic) else v for k, v in metadata.items()}


def _timed_wait(cond: threading.Condition, timeout: float | None) -> float:
  """Waits on `cond` (lock held) and returns the seconds spent waiting."""
  start = time.monotonic()
  cond.wait(timeout)
  return time.monotonic() - start


def _concat(parts: list[np.ndarray], field: str) -> np.ndarray:
  dtype = {"tokens": np.int32, "action_mask": bool, "rollout_logprobs": np.float32,
           "policy_versions": np.int32}[field]  # fmt: skip
  return np.concatenate(parts).astype(dtype) if parts else np.zeros((0,), dtype)
