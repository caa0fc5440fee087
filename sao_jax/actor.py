"""A rollout host: the agent loop against HTTP engines, pushing to the learner's ReplayService.

    python -m sao_jax.actor --replay=HOST:PORT --engine=URL[,URL...]
        --config=experiments/X.py[:args] [--auth-token=T] [--actor-id=ID] [--seed=S]
        [--max-trajectories=N] [--config.rollout.concurrency=32 ...]

Runs `rollout.num_workers` RolloutWorkers threads (sao_jax.rollout.workers), each keeping
`rollout.concurrency` episodes in flight on the engines (SGLang or `sao_jax.serve`, through
HttpEngine: balanced, retried), and pushes every scored trajectory to the learner with a
ReplayClient. Token versions come from the engines' responses (the learner publishes weights to
the engines, not to actors).

The learner may restart: a push that cannot reach it is retried with backoff for as long as it
takes (the equivalent of `ReplayClient(max_retries=None)`, done here so that SIGTERM can still
interrupt it), and a trajectory whose earlier attempt may have been delivered is counted once: the
learner accepts each uid once and its "duplicate" answer to our own retry means delivered. Uids
are unique per episode: each actor process seeds its episodes from (config seed, actor id, --seed),
and --seed defaults to a fresh random number per process, so a restarted actor never re-sends a
uid. The token comes from --auth-token, else `config.replay.auth_token`, else $SAO_REPLAY_TOKEN.

SIGTERM or SIGINT: no new episode starts, episodes in flight are abandoned (counted as lost), the
push in progress finishes, and the actor prints one JSON line of counters on stdout and exits 0.
It exits 1 when a worker fails for good (bad token, bad request), with the error on stderr.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from absl import flags, logging
from ml_collections import config_flags

from sao_jax import cli
from sao_jax import config as config_lib
from sao_jax.replay import CANCELLED, QUEUE_FULL, ReplayClient, ReplayUnavailable
from sao_jax.types import Trajectory

# gRPC codes after which a push is retried (the learner is down, restarting, or dropped the call).
_RETRY_CODES = ("UNAVAILABLE", "CANCELLED")


class ReplayClientQueue:
  """`ReplayQueue.put` over a ReplayClient, for RolloutWorkers on a rollout host.

  Each attempt is one Push with a deadline of `poll_s` (a full learner queue holds the call:
  backpressure). While the learner is unreachable, attempts repeat with exponential backoff until
  they succeed or `cancel` says stop. A "duplicate" answer after an attempt that may have been
  delivered (deadline passed, connection lost) counts as accepted ("resent"), so nothing is
  counted twice.

  Args:
    client: a ReplayClient (its own retries are not used: build it with max_retries=0).
    poll_s: deadline of one attempt, and how often `cancel` is checked while the queue is full.
    backoff_s: first delay after a failed attempt; doubles up to `max_backoff_s`.
    max_backoff_s: longest delay.
  """

  def __init__(self, client: ReplayClient, *, poll_s: float = 2.0, backoff_s: float = 0.1,
               max_backoff_s: float = 5.0):  # fmt: skip
    self.client, self.poll_s = client, poll_s
    self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
    self.version = -1  # the learner's policy version at the last answer
    self.counters: Counter = Counter()
    self._lock = threading.Lock()

  def put(
    self,
    traj: Trajectory,
    timeout: float | None = None,
    *,
    cancel: Callable[[], bool] | None = None,
  ) -> tuple[bool, str | None]:
    """Pushes one trajectory; the contract of `ReplayQueue.put`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    maybe_delivered, failures = False, 0
    while True:
      if cancel is not None and cancel():
        return self._settle(traj) if maybe_delivered else (False, CANCELLED)
      if deadline is not None and time.monotonic() >= deadline:
        return False, QUEUE_FULL
      try:
        result = self.client.push([traj], timeout=self.poll_s)
      except TimeoutError:  # the learner's queue is full (or it is slow): try again
        maybe_delivered = True
        self._count("timeouts")
        continue
      except ReplayUnavailable as e:
        code = getattr(getattr(e.__cause__, "code", lambda: None)(), "name", "")
        if code not in _RETRY_CODES:
          self._count(f"failed:{code}")
          return False, f"push_failed:{code}"
        maybe_delivered, failures = True, failures + 1
        self._count("unavailable")
        self._sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 1)), cancel)
        continue
      return self._outcome(result, maybe_delivered)

  def _settle(self, traj: Trajectory, attempts: int = 10) -> tuple[bool, str | None]:
    """Told to stop after an attempt that may have landed: one more answered push settles it (the
    learner says "duplicate" if it had), so the accepted count stays exact. A full learner queue
    answers nothing (deadline passed) while a held attempt may still land, so that is retried, up
    to `attempts` deadlines; an unreachable learner cannot settle it: CANCELLED."""
    for _ in range(attempts):
      try:
        return self._outcome(self.client.push([traj], timeout=self.poll_s), maybe_delivered=True)
      except TimeoutError:
        self._count("timeouts")
      except ReplayUnavailable:
        break
    return False, CANCELLED

  def _outcome(self, result, maybe_delivered: bool) -> tuple[bool, str | None]:
    with self._lock:
      self.version = max(self.version, result.version)
    if result.accepted:
      if result.resent:
        self._count("resent")
      return True, None
    reason = result.rejections[0][2]
    if reason == "duplicate" and maybe_delivered:
      self._count("resent")  # an earlier attempt of ours delivered it
      return True, None
    return False, reason

  def _count(self, key: str) -> None:
    with self._lock:
      self.counters[key] += 1

  @staticmethod
  def _sleep(seconds: float, cancel: Callable[[], bool] | None) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (cancel is not None and cancel()):
      time.sleep(min(0.05, max(0.0, end - time.monotonic())))


def _mesh_devices(config) -> int:
  """Devices that satisfy the config's mesh (an actor builds no mesh; -1 axes count as 1)."""
  n = 1
  for axis in ("data", "fsdp", "tensor", "expert"):
    n *= max(int(config.mesh[axis]), 1)
  return n


def _settings(config) -> dict[str, Any]:
  """Replay address, engine URLs, token, actor id and episode seed from flags and config."""
  urls = _ENGINE.value or config.rollout.urls
  if not urls:
    raise config_lib.ConfigError("rollout.urls", "no engine: pass --engine=URL[,URL...]")
  if not _REPLAY.value or ":" not in _REPLAY.value:
    raise config_lib.ConfigError("replay", "pass --replay=HOST:PORT (the learner's ReplayService)")
  token = _TOKEN.value or config.replay.auth_token or os.environ.get("SAO_REPLAY_TOKEN", "")
  if not token:
    raise config_lib.ConfigError("replay.auth_token", "no token: pass --auth-token")
  actor_id = _ACTOR_ID.value or f"{socket.gethostname()}-{os.getpid()}"
  seed = _SEED.value if _SEED.value is not None else int.from_bytes(os.urandom(7), "little")
  return dict(urls=urls, token=token, actor_id=actor_id, seed=seed)


def build(config, s: dict[str, Any]):
  """(workers, sink, engine) of one actor: agent loop over HttpEngine into the replay client."""
  from sao_jax import data, envs, models
  from sao_jax.rollout import AgentLoop, AgentSettings, HttpEngine, derive_seed
  from sao_jax.rollout.workers import RolloutWorkers

  spec = _TOKENIZER.value or config.model.tokenizer
  tokenizer = models.load_tokenizer(config.model.path if spec == "model" else spec)
  engine = HttpEngine(s["urls"])
  env_factory = envs.make(config.env)
  source = data.make_source(config.data, "train", seed=config.seed)
  tasks = data.make_iterator(source, seed=s["seed"] % 2**31)
  agent = AgentLoop(engine, tokenizer, env_factory, AgentSettings.from_config(config))
  client = ReplayClient(_REPLAY.value, auth_token=s["token"], max_retries=0,
                        max_message_bytes=config.replay.max_message_bytes)  # fmt: skip
  sink = ReplayClientQueue(client)
  workers = RolloutWorkers(
    agent, tasks, sink, num_workers=config.rollout.num_workers,
    seed=derive_seed(config.seed, "actor", s["actor_id"], s["seed"]),
    metadata={"actor": s["actor_id"]}, max_errors=None, backoff_s=1.0,
  )  # fmt: skip
  return workers, sink, engine, env_factory


def summary(workers, sink, engine, actor_id: str, started: float) -> dict[str, Any]:
  """The counters printed at exit (and logged periodically)."""
  return {
    "actor": actor_id,
    "elapsed_s": time.monotonic() - started,
    **workers.stats(),
    "push": dict(sink.counters),
    "learner_version": sink.version,
    "engine": dict(engine.counters),
  }


def main(argv):
  del argv
  if _CONFIG.value is None:
    raise config_lib.ConfigError("spec", "pass --config=experiments/<name>.py[:args]")
  config = config_lib.validate(_CONFIG.value, num_devices=_mesh_devices(_CONFIG.value))
  s = _settings(config)
  workers, sink, engine, env_factory = build(config, s)
  done = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: done.set())
  t0 = last_log = time.monotonic()
  workers.start()
  logging.info("actor %s: %d workers -> %s, engines %s", s["actor_id"],
               workers.num_workers, _REPLAY.value, s["urls"])  # fmt: skip
  code = 0
  while not done.wait(0.5):
    if workers.stats()["failed"]:
      code = 1
      break
    if sink.version >= 0:
      env_factory.set_step(sink.version)
    if _MAX_TRAJ.value and workers.stats()["accepted"] >= _MAX_TRAJ.value:
      break
    if time.monotonic() - last_log >= _LOG_EVERY.value:
      last_log = time.monotonic()
      logging.info("actor: %s", json.dumps(summary(workers, sink, engine, s["actor_id"], t0)))
  workers.stop(timeout=_GRACE.value, abort=False)
  out = summary(workers, sink, engine, s["actor_id"], t0)
  engine.close()
  sink.client.close()
  if code:
    try:
      workers.check()
    except Exception as e:
      print(f"error: {e}", file=sys.stderr, flush=True)
  print(json.dumps(out), flush=True)
  sys.exit(code)


if __name__ == "__main__":
  # Flags exist only when this runs as a program: importing sao_jax.actor next to sao_jax.train
  # (which defines --config as well) must not raise DuplicateFlagError.
  _CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment file and args, e.g. experiments/quickstart.py", lock_config=True
  )
  _REPLAY = flags.DEFINE_string("replay", None, "host:port of the learner's ReplayService.")
  _ENGINE = flags.DEFINE_string(
    "engine", None, "Engine base URLs, comma-separated (default: config.rollout.urls)."
  )
  _TOKEN = flags.DEFINE_string(
    "auth-token", None, "Replay token (default: config / $SAO_REPLAY_TOKEN)."
  )
  _ACTOR_ID = flags.DEFINE_string(
    "actor-id", None, "Name in logs and metadata (default: host-pid)."
  )
  _SEED = flags.DEFINE_integer("seed", None, "Episode seed (default: random per process).")
  _TOKENIZER = flags.DEFINE_string("tokenizer", None, "Tokenizer spec (default: the config's).")
  _MAX_TRAJ = flags.DEFINE_integer(
    "max-trajectories", 0, "Stop once at least this many were accepted (0: never)."
  )
  _LOG_EVERY = flags.DEFINE_float("log-every", 30.0, "Seconds between progress lines (stderr).")
  _GRACE = flags.DEFINE_float("grace", 10.0, "Seconds to wait for workers at shutdown.")
  cli.run(main)
