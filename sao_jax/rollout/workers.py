"""Rollout workers for async mode: threads that stream scored episodes into a replay queue.

Each of N worker threads runs the agent loop's streaming form (`AgentLoop.stream`) without end,
against the engine the agent holds (the embedded JAX engine, or HttpEngine), and puts every scored
trajectory into a queue the moment it finishes (`queue.put(traj, cancel=stop.is_set)`):

  workers = RolloutWorkers(agent, tasks, queue, num_workers=2, seed=config.seed)
  workers.load_state_dict(saved)               # on resume, before start
  workers.start()
  batch = workers.next_batch(B, version=v)     # the learner: queue.get_batch + crash checks
  saved = workers.state_dict()                 # for the checkpoint (JSON-able)
  workers.stop()

Tasks come from one iterator the workers share (a grain iterator: `data.make_iterator`). Worker w
seeds its episodes with `derive_seed(seed, "rollout_worker", w)` and numbers them 0, 1, 2, ...; an
episode's uid is derived from (its task id, its seed, its number), so uids never repeat. The
checkpoint is the iterator's state and each worker's count of episodes started, taken together
under one lock: a resumed run draws the next task and continues every worker's numbering, so it
neither repeats a uid the queue has seen nor replays a task. Episodes in flight at a checkpoint
or a crash are lost (design.md §6), and counted.

A worker that raises is reported, not lost: `check()` (and `next_batch`) raise RolloutWorkerError
with the cause chained. Errors listed in `retry_on` (default: `ServerError`, an HTTP engine that
failed every retry) restart that worker's stream after a backoff instead; its in-flight episodes
are counted as lost.

Counters (`stats()`): episodes started, finished, accepted by the queue, dropped by reason (the
queue's rejection reasons, 'cancelled' when a finished episode was not delivered because of stop,
'lost_in_flight' for episodes abandoned in flight), stream errors, and idle seconds (blocked on a
full queue, or backing off after an error). Always: started = accepted + sum(dropped) + in flight.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from absl import logging

from sao_jax.replay import QueueClosed
from sao_jax.rollout.agent import AgentLoop, derive_seed
from sao_jax.rollout.http_client import ServerError
from sao_jax.types import Trajectory

# Reasons of `stats()["dropped"]` that are not queue rejections.
CANCELLED = "cancelled"
LOST_IN_FLIGHT = "lost_in_flight"


class RolloutWorkerError(RuntimeError):
  """A rollout worker thread died. `worker` is its index; the exception is the `__cause__`."""

  def __init__(self, worker: int, error: BaseException, trace: str):
    self.worker, self.error, self.trace = worker, error, trace
    super().__init__(f"rollout worker {worker} failed: {type(error).__name__}: {error}\n{trace}")


@dataclasses.dataclass
class _Counters:
  started: int = 0
  finished: int = 0
  accepted: int = 0
  dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  errors: int = 0
  idle_s: float = 0.0


class RolloutWorkers:
  """N threads running `agent.stream` into `queue` until stopped. Thread-safe.

  Args:
    agent: an AgentLoop (its engine may be shared with other users).
    tasks: task records (an iterator, e.g. `data.make_iterator`, or any iterable), shared by the
      workers; checkpointable when the iterator has `get_state` / `set_state` (grain). If it
      ends, the workers finish once their episodes are done.
    queue: where trajectories go: a ReplayQueue, or anything with
      `put(traj, timeout=None, *, cancel=None) -> (accepted, reason)`.
    num_workers: worker threads; each keeps `agent.settings.concurrency` episodes in flight.
    seed: base seed of the episodes.
    metadata: added to every trajectory's metadata (e.g. {"actor": "host-3"}).
    retry_on: exception types that restart a worker's stream after a backoff instead of killing it.
    max_errors: consecutive failed streams (no trajectory in between) tolerated per worker before
      it dies; None: no limit.
    backoff_s: first delay after a failed stream; doubles per consecutive failure.
    max_backoff_s: longest delay.
  """

  def __init__(
    self,
    agent: AgentLoop,
    tasks: Iterable[dict[str, Any]],
    queue: Any,
    *,
    num_workers: int = 1,
    seed: int = 0,
    metadata: Mapping[str, str | float] | None = None,
    retry_on: tuple[type[BaseException], ...] = (ServerError,),
    max_errors: int | None = 5,
    backoff_s: float = 1.0,
    max_backoff_s: float = 30.0,
  ):
    if num_workers < 1:
      raise ValueError(f"RolloutWorkers.num_workers: must be >= 1, got {num_workers}")
    self.agent, self.queue, self.num_workers, self.seed = agent, queue, num_workers, int(seed)
    self.metadata = dict(metadata or {})
    self.retry_on, self.max_errors = tuple(retry_on), max_errors
    self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
    self._tasks = iter(tasks)
    self._task_lock = threading.Lock()  # the iterator and every `started` count move together
    self._lock = threading.Lock()  # counters and failures
    self._put_locks = [threading.Lock() for _ in range(num_workers)]
    self._counters = [_Counters() for _ in range(num_workers)]
    # Episodes each worker started in earlier runs (a loaded checkpoint): its numbering goes on
    # from there. Entries beyond num_workers are kept for the next checkpoint.
    self._offsets = [0] * num_workers
    self._stop = threading.Event()
    self._threads: list[threading.Thread] = []
    self._failures: list[RolloutWorkerError] = []

  # ------------------------------------------------------------------ lifecycle

  def start(self) -> RolloutWorkers:
    """Starts the worker threads (once)."""
    if self._threads:
      raise RuntimeError("RolloutWorkers.start: already started")
    self._threads = [
      threading.Thread(target=self._worker, args=(w,), name=f"sao-rollout-{w}", daemon=True)
      for w in range(self.num_workers)
    ]
    for t in self._threads:
      t.start()
    return self

  def stop(self, timeout: float = 30.0, *, abort: bool = True) -> bool:
    """Stops the workers: no new episode starts and nothing is put after this returns.

    Args:
      timeout: seconds to wait for the threads to end.
      abort: also abort the engine's requests (`engine.abort()`, when it has one) so episodes in
        flight end at once; every request on that engine is aborted, not just the workers'.

    Returns:
      True if every thread ended within `timeout` (the rest are daemons and put nothing more).
    """
    self._stop.set()
    for lock in self._put_locks:  # wait out a put in progress; later ones see the stop flag
      with lock:
        pass
    engine_abort = getattr(self.agent.engine, "abort", None)
    if abort and callable(engine_abort):
      engine_abort()
    deadline = time.monotonic() + timeout
    for t in self._threads:
      t.join(max(0.0, deadline - time.monotonic()))
    if abort and callable(engine_abort):
      engine_abort()  # turns that started while the first abort ran
    return not any(t.is_alive() for t in self._threads)

  @property
  def alive(self) -> int:
    """Worker threads running now."""
    return sum(t.is_alive() for t in self._threads)

  @property
  def stopping(self) -> bool:
    return self._stop.is_set()

  def check(self) -> None:
    """Raises the first worker failure (RolloutWorkerError), if any."""
    with self._lock:
      if self._failures:
        failure = self._failures[0]
        raise failure from failure.error

  # ------------------------------------------------------------------ learner side

  def next_batch(
    self, n: int, *, version: int, poll_s: float = 1.0, timeout: float | None = None
  ) -> list[Trajectory]:
    """The learner's next `n` fresh trajectories (see `next_batch`), checking these workers."""
    return next_batch(self.queue, n, version=version, workers=self, poll_s=poll_s, timeout=timeout)

  def state_dict(self) -> dict[str, Any]:
    """The task iterator's state and each worker's count of episodes started (JSON-able).

    Returns:
      {"data": the iterator's get_state() (None without one), "episodes_started": [int per
      worker], "seed": the base seed}.
    """
    with self._task_lock:
      data = self._tasks.get_state() if hasattr(self._tasks, "get_state") else None
      started = [o + c.started for o, c in zip(self._offsets, self._counters, strict=False)]
      started += self._offsets[self.num_workers :]
    return {"data": data, "episodes_started": started, "seed": self.seed}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Continues from `state_dict()` output (call before `start`).

    The iterator resumes at the saved position and worker w numbers its next episode
    `episodes_started[w]`. Counts of workers beyond `num_workers` are kept for the next checkpoint.
    """
    if self._threads:
      raise RuntimeError("RolloutWorkers.load_state_dict: call it before start()")
    if int(state["seed"]) != self.seed:
      raise ValueError(f"rollout state: saved seed {state['seed']} != this run's seed {self.seed}")
    if state.get("data") is not None:
      if not hasattr(self._tasks, "set_state"):
        raise ValueError("rollout state has a data position but the task iterator has no set_state")
      self._tasks.set_state(state["data"])
    started = [int(s) for s in state["episodes_started"]]
    self._offsets = started + [0] * (self.num_workers - len(started))

  def stats(self) -> dict[str, Any]:
    """Counters summed over workers, since `start` (episodes of a loaded checkpoint excluded).

    Returns:
      {"episodes_started", "episodes_finished", "accepted", "dropped": {reason: n}, "in_flight",
      "errors", "idle_s" (summed over workers), "num_workers", "alive", "failed"}.
    """
    with self._lock:
      cs = [dataclasses.replace(c, dropped=collections.Counter(c.dropped)) for c in self._counters]
      failed = len(self._failures)
    dropped = sum((c.dropped for c in cs), collections.Counter())
    started = sum(c.started for c in cs)
    accepted = sum(c.accepted for c in cs)
    return {
      "episodes_started": started,
      "episodes_finished": sum(c.finished for c in cs),
      "accepted": accepted,
      "dropped": dict(dropped),
      "in_flight": started - accepted - sum(dropped.values()),
      "errors": sum(c.errors for c in cs),
      "idle_s": sum(c.idle_s for c in cs),
      "num_workers": self.num_workers,
      "alive": self.alive,
      "failed": failed,
    }

  # ------------------------------------------------------------------ worker threads

  def _worker(self, w: int) -> None:
    """Runs streams until stopped, the tasks run out, or an error that is not retried."""
    c = self._counters[w]
    failures_in_row, finished_before = 0, c.finished
    try:
      while not self._stop.is_set():
        try:
          self._run_stream(w)
          return  # stopped, or the tasks ran out
        except self.retry_on as e:
          failures_in_row = 1 if c.finished > finished_before else failures_in_row + 1
          finished_before = c.finished
          with self._lock:
            c.errors += 1
          if self.max_errors is not None and failures_in_row > self.max_errors:
            raise
          delay = min(self.max_backoff_s, self.backoff_s * 2 ** (failures_in_row - 1))
          logging.warning("rollout worker %d: %s; restarting in %.1f s", w, e, delay)
          self._idle(w, lambda: self._stop.wait(delay))
    except BaseException as e:
      with self._lock:
        self._failures.append(RolloutWorkerError(w, e, traceback.format_exc()))
      logging.error("rollout worker %d failed: %s: %s", w, type(e).__name__, e)

  def _run_stream(self, w: int) -> None:
    """One `agent.stream`, until stopped or the tasks run out; in-flight losses are counted."""
    c = self._counters[w]
    started0, finished0 = c.started, c.finished
    seed = derive_seed(self.seed, "rollout_worker", w)
    index = self._offsets[w] + started0  # the number of this stream's first episode
    stream = self.agent.stream(self._draw(w), seed=seed, start_index=index)
    try:
      for traj in stream:
        with self._lock:
          c.finished += 1
        if not self._deliver(w, traj) or self._stop.is_set():
          break
    finally:
      stream.close()  # episodes still in flight end at their next turn, in the background
      with self._lock:
        lost = (c.started - started0) - (c.finished - finished0)
        if lost:
          c.dropped[LOST_IN_FLIGHT] += lost

  def _draw(self, w: int) -> Iterator[dict[str, Any]]:
    """Tasks for worker w's stream; each one drawn counts as an episode started."""
    c = self._counters[w]
    while not self._stop.is_set():
      with self._task_lock:
        task = next(self._tasks, None)
        if task is None:
          return
        with self._lock:
          c.started += 1
      yield task

  def _deliver(self, w: int, traj: Trajectory) -> bool:
    """Puts one trajectory (blocking while the queue is full); False when the worker must end."""
    if self.metadata:
      traj.metadata.update(self.metadata)
    c = self._counters[w]
    t0 = time.monotonic()
    with self._put_locks[w]:
      if self._stop.is_set():
        accepted, reason = False, CANCELLED
      else:
        accepted, reason = self.queue.put(traj, cancel=self._stop.is_set)
    with self._lock:
      c.idle_s += time.monotonic() - t0
      if accepted:
        c.accepted += 1
      else:
        c.dropped[reason] += 1
    return accepted or reason not in (CANCELLED, "closed")

  def _idle(self, w: int, wait: Callable[[], Any]) -> None:
    t0 = time.monotonic()
    wait()
    with self._lock:
      self._counters[w].idle_s += time.monotonic() - t0


def next_batch(
  queue: Any,
  n: int,
  *,
  version: int,
  workers: RolloutWorkers | None = None,
  poll_s: float = 1.0,
  timeout: float | None = None,
) -> list[Trajectory]:
  """`queue.get_batch(n, current_version=version)` that notices dead rollout workers.

  Args:
    queue: the learner's ReplayQueue.
    n: batch size B.
    version: the learner's policy version (stale trajectories are dropped against it).
    workers: in-process workers to check while waiting (None: remote actors only).
    poll_s: how often to check the workers while the queue is short.
    timeout: seconds to wait in all; None: until a batch is ready.

  Returns:
    Exactly `n` trajectories, in arrival order.

  Raises:
    RolloutWorkerError: a worker died (its exception is chained).
    QueueClosed: the queue closed, or every worker finished (tasks ran out) before a full batch.
    TimeoutError: `timeout` passed.
  """
  deadline = None if timeout is None else time.monotonic() + timeout
  while True:
    if workers is not None:
      workers.check()
    wait = poll_s if deadline is None else min(poll_s, max(0.0, deadline - time.monotonic()))
    try:
      return queue.get_batch(n, current_version=version, timeout=wait)
    except TimeoutError:
      if deadline is not None and time.monotonic() >= deadline:
        raise
      if workers is not None and workers.alive == 0 and not workers.stopping:
        workers.check()
        raise QueueClosed(
          f"every rollout worker finished (the task iterator ran out) with {len(queue)} < {n} "
          "trajectories queued"
        ) from None


def publish_weights(
  publisher: Any, params: Any, version: int, *, queue: Any = None, env_factory: Any = None
) -> float:
  """Publishes a new policy version to the engines, after telling the queue and environments.

  The queue's version is raised first, so trajectories sampled with `version` are never refused
  as "version_from_future"; step-dependent environments (style) learn the step next.

  Args:
    publisher: a WeightPublisher (sao_jax.rollout.weights).
    params: the policy parameters (`TrainState.policy`).
    version: the new policy version.
    queue: the learner's ReplayQueue (None: skip).
    env_factory: an envs.EnvFactory with `set_step` (None: skip).

  Returns:
    Seconds the publish took.
  """
  if queue is not None:
    queue.set_version(int(version))
  if env_factory is not None and hasattr(env_factory, "set_step"):
    env_factory.set_step(int(version))
  return publisher.publish(params, int(version))
