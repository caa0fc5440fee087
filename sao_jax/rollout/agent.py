"""The agent loop: environments + an engine -> token-exact `Trajectory`s (design.md §3.1).

One episode, token-in/token-out:

  tokens = tokenizer.render_chat(env.reset(task), add_generation_prompt=True)    # prompt
  repeat:  out = engine.submit(GenerateRequest(tokens, ...)).result()
           tokens += out.output_ids            (action: mask True, the engine's log-probs/versions)
           step = env.step(tokenizer.decode(out.output_ids))
           tokens += tokenizer.tool_observation_ids(step.observation)       (mask False)
  until step.done (reward = step.reward), max turns, max context or an environment error.

The conversation is never re-tokenized: the action ids are exactly what the engine sampled and the
observation ids are the chat template's tool-response framing around the new text only. An episode
that is cut short keeps what it has and says why in `metadata['finish_reason']`:
  * the environment's own reason when it ends the episode ('answer', 'submit', 'max_turns', ...);
  * 'max_turns'   -- `max_turns` policy turns without the environment finishing;
  * 'max_context' -- the next observation (or the prompt) does not fit in `max_seq_len` tokens;
  * 'env_error'   -- `reset` or `step` raised (message in metadata['error']); reward 0;
  * 'abort'       -- the engine aborted the generation (engine closed or told to abort).

Episodes run concurrently in a thread pool (`concurrency` at once), so a slow environment step (a
sandboxed subprocess) blocks only its own episode, never the engine. Seeds: episode i of a call
with base seed s samples turn j with `derive_seed(s, i, j)`, so the results depend only on the
engine's weights, the tasks and s -- not on timing.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import tqdm

from sao_jax.rollout.protocol import GenerateEngine, GenerateRequest
from sao_jax.types import Trajectory

GroupIds = Sequence[str] | Callable[[int, dict[str, Any]], str] | None


def derive_seed(*parts: Any) -> int:
  """A seed in [0, 2**63) from any parts (ints, strings), stable across runs and platforms."""
  digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") >> 1


@dataclasses.dataclass(frozen=True)
class AgentSettings:
  """What an episode may do (from `config.rollout`, `config.env`, `config.max_seq_len`).

  Attributes:
    max_turns: policy turns per episode.
    max_seq_len: tokens per trajectory (the learner's row length).
    max_new_tokens: tokens per turn.
    temperature: sampling temperature (0 = greedy, for evaluation).
    top_p: nucleus mass.
    top_k: top-k cut (0 = off).
    concurrency: episodes in flight at once.
    enable_thinking: passed to the chat template (None: the template's default).
  """

  max_turns: int = 4
  max_seq_len: int = 512
  max_new_tokens: int = 64
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  concurrency: int = 16
  enable_thinking: bool | None = None

  @classmethod
  def from_config(cls, config: Any, *, evaluation: bool = False) -> AgentSettings:
    """Settings of a run config; `evaluation` uses `config.eval.temperature` (0 = greedy)."""
    r = config.rollout
    return cls(
      max_turns=config.env.max_turns,
      max_seq_len=config.max_seq_len,
      max_new_tokens=r.max_new_tokens,
      temperature=config.eval.temperature if evaluation else r.temperature,
      top_p=1.0 if evaluation else r.top_p,
      top_k=0 if evaluation else r.top_k,
      concurrency=r.concurrency,
    )


@dataclasses.dataclass
class _Builder:
  """A trajectory under construction: parallel token, mask, log-prob and version lists."""

  tokens: list[int] = dataclasses.field(default_factory=list)
  mask: list[bool] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)

  def add_context(self, ids: Sequence[int]) -> None:
    self.tokens += ids
    self.mask += [False] * len(ids)
    self.logprobs += [0.0] * len(ids)
    self.versions += [-1] * len(ids)

  def add_action(self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]):
    self.tokens += ids
    self.mask += [True] * len(ids)
    self.logprobs += logprobs
    self.versions += versions


class AgentLoop:
  """Runs episodes of one environment against any `GenerateEngine`.

  Args:
    engine: the embedded Engine, an HttpEngine, or anything with `submit`.
    tokenizer: a `models.Tokenizer` (render_chat, tool_observation_ids, decode, stop_ids, eos_id).
    env_factory: a callable returning a fresh Env per episode (`envs.make(config.env)`).
    settings: AgentSettings.
    env_name: recorded in `Trajectory.env` (default: `env_factory.name`).
  """

  def __init__(
    self,
    engine: GenerateEngine,
    tokenizer: Any,
    env_factory: Callable[[], Any],
    settings: AgentSettings,
    *,
    env_name: str | None = None,
  ):
    engine_len = getattr(engine, "max_len", None)
    if engine_len is not None and engine_len < settings.max_seq_len:
      raise ValueError(
        f"AgentSettings.max_seq_len {settings.max_seq_len} exceeds the engine's max_len {engine_len}"
      )
    self.engine, self.tokenizer, self.env_factory = engine, tokenizer, env_factory
    self.settings = settings
    self.env_name = env_name or getattr(env_factory, "name", "env")
    self.stop_ids = tuple(tokenizer.stop_ids)

  def run(
    self,
    tasks: Sequence[dict[str, Any]],
    *,
    seed: int,
    group_ids: GroupIds = None,
    progress: bool = False,
  ) -> list[Trajectory]:
    """Runs one episode per task, `concurrency` at once; returns the trajectories in task order.

    Args:
      tasks: task records (sao_jax.data); repeat a task G times for G samples of one prompt.
      seed: base seed; episode i uses derive_seed(seed, i, turn).
      group_ids: one per task, or a function (index, task) -> group id (default: each episode its
        own group).
      progress: show a tqdm bar.

    Returns:
      list of Trajectory, `trajectories[i]` from `tasks[i]`.
    """
    out: list[Trajectory | None] = [None] * len(tasks)
    bar = _progress_bar(len(tasks), progress)
    for i, traj in self._stream(tasks, seed=seed, group_ids=group_ids, start_index=0):
      out[i] = traj
      bar.update(1)
    bar.close()
    return out

  def stream(
    self,
    tasks: Iterable[dict[str, Any]],
    *,
    seed: int,
    group_ids: GroupIds = None,
    start_index: int = 0,
  ) -> Iterator[Trajectory]:
    """Yields each trajectory as soon as it is scored (async mode); `tasks` may be endless.

    Episode i (counting from `start_index`, so a resumed stream continues the same seeds) is
    seeded as in `run`. Closing the generator stops new episodes; those in flight finish in the
    background and are dropped.
    """
    for _, traj in self._stream(tasks, seed=seed, group_ids=group_ids, start_index=start_index):
      yield traj

  def _stream(self, tasks, *, seed, group_ids, start_index) -> Iterator[tuple[int, Trajectory]]:
    items = enumerate(tasks, start_index)
    stop = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(self.settings.concurrency, "sao-episode")
    inflight: dict[concurrent.futures.Future, int] = {}

    def fill():
      while len(inflight) < self.settings.concurrency:
        item = next(items, None)
        if item is None:
          return
        i, task = item
        gid = _group_id(group_ids, i - start_index, task)
        inflight[pool.submit(self.episode, task, seed=seed, index=i, group_id=gid, stop=stop)] = i

    try:
      fill()
      while inflight:
        done, _ = concurrent.futures.wait(inflight, return_when="FIRST_COMPLETED")
        for f in done:
          yield inflight.pop(f), f.result()
        fill()
    finally:
      stop.set()
      pool.shutdown(wait=False, cancel_futures=True)

  def episode(
    self,
    task: dict[str, Any],
    *,
    seed: int,
    index: int = 0,
    group_id: str | None = None,
    stop: threading.Event | None = None,
  ) -> Trajectory:
    """Runs one episode to the end (blocking) and returns its Trajectory.

    Args:
      task: a task record; `task['id']` becomes the prompt id.
      seed: base seed; this episode's turn j samples with derive_seed(seed, index, j).
      index: the episode's index under `seed`.
      group_id: GRPO group (default: the episode's own uid).
      stop: when set, no further turn starts (the episode ends with 'abort').

    Returns:
      The Trajectory (metadata: turns, finish_reason, tool counters, error, timings).
    """
    prompt_id = str(task.get("id", index))
    uid = f"{prompt_id}-{derive_seed(seed, index):016x}"
    t0 = time.perf_counter()
    traj, meta, reward = _Builder(), {"gen_s": 0.0, "env_s": 0.0}, 0.0
    try:
      env = self._env_call(meta, self.env_factory)
      messages = self._env_call(meta, env.reset, task)
      prompt = self.tokenizer.render_chat(
        messages, add_generation_prompt=True, enable_thinking=self.settings.enable_thinking
      )
      reward, reason = self._turns(env, prompt, traj, meta, seed, index, stop)
    except _EnvError as e:
      reason, meta["error"] = "env_error", _short(e.__cause__)
    meta.update(finish_reason=reason, wall_s=time.perf_counter() - t0)
    return Trajectory(
      uid=uid,
      prompt_id=prompt_id,
      group_id=group_id if group_id is not None else uid,
      env=self.env_name,
      tokens=np.asarray(traj.tokens, np.int32),
      action_mask=np.asarray(traj.mask, bool),
      rollout_logprobs=np.asarray(traj.logprobs, np.float32),
      policy_versions=np.asarray(traj.versions, np.int32),
      reward=reward,
      metadata=meta,
    )

  def _turns(self, env, prompt, traj: _Builder, meta, seed, index, stop) -> tuple[float, str]:
    """Generate/step until the episode ends; returns (reward, finish_reason)."""
    s = self.settings
    meta["turns"] = 0
    if len(prompt) >= s.max_seq_len:  # not even room for one action token
      traj.add_context(prompt[: s.max_seq_len])
      return 0.0, "max_context"
    traj.add_context(prompt)
    for turn in range(s.max_turns):
      if stop is not None and stop.is_set():
        return 0.0, "abort"
      meta["turns"] = turn + 1
      out = self._generate(traj.tokens, derive_seed(seed, index, turn), meta)
      traj.add_action(out.output_ids, out.logprobs, out.versions)
      if out.finish_reason == "abort":
        return 0.0, "abort"
      meta["truncated_turns"] = meta.get("truncated_turns", 0) + (out.finish_reason == "length")
      closed = bool(out.output_ids) and out.output_ids[-1] in self.stop_ids
      text_ids = out.output_ids[:-1] if closed else out.output_ids
      step = self._env_call(meta, env.step, self.tokenizer.decode(text_ids))
      _record_info(meta, step.info)
      if step.done:
        return float(step.reward), str(step.info.get("finish_reason") or "done")
      obs = self.tokenizer.tool_observation_ids(
        step.observation or "",
        close_turn=not (closed and out.output_ids[-1] == self.tokenizer.eos_id),
        enable_thinking=s.enable_thinking,
      )
      if len(traj.tokens) + len(obs) >= s.max_seq_len:
        return 0.0, "max_context"
      traj.add_context(obs)
    return 0.0, "max_turns"

  def _generate(self, tokens: list[int], seed: int, meta: dict):
    s = self.settings
    request = GenerateRequest(
      input_ids=tokens,
      max_new_tokens=min(s.max_new_tokens, s.max_seq_len - len(tokens)),
      temperature=s.temperature,
      top_p=s.top_p,
      top_k=s.top_k,
      stop_token_ids=self.stop_ids,
      seed=seed,
    )
    t0 = time.perf_counter()
    out = self.engine.submit(request).result()
    meta["gen_s"] += time.perf_counter() - t0
    return out

  @staticmethod
  def _env_call(meta: dict, fn: Callable, *args):
    """Calls the environment, timing it; any exception becomes an _EnvError."""
    t0 = time.perf_counter()
    try:
      return fn(*args)
    except Exception as e:
      raise _EnvError() from e
    finally:
      meta["env_s"] += time.perf_counter() - t0


class _EnvError(Exception):
  """An environment's reset/step raised (the cause is attached)."""


def _short(error: BaseException | None, limit: int = 500) -> str:
  text = f"{type(error).__name__}: {error}"
  return text if len(text) <= limit else text[:limit] + "..."


def _record_info(meta: dict, info: dict[str, Any]) -> None:
  """Copies the scalar fields of an env's `info` (tool counters, ...) into the metadata."""
  for key, value in (info or {}).items():
    if key in ("finish_reason", "turns") or value is None:
      continue
    if isinstance(value, bool):
      meta[key] = int(value)
    elif isinstance(value, int | float | str):
      meta[key] = value


def _group_id(group_ids: GroupIds, i: int, task: dict[str, Any]) -> str | None:
  if group_ids is None:
    return None
  if callable(group_ids):
    return str(group_ids(i, task))
  return str(group_ids[i])


def _progress_bar(total: int, enabled: bool):
  return tqdm.tqdm(total=total, desc="episodes", disable=not enabled, leave=False)
