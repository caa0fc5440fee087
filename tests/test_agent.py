"""The agent loop against scripted engines: byte-exact token sequences and masks on the math-tool
and coding (SWE) environments, and every way an episode can end (env error, max turns, max context,
abort), concurrency that does not serialize on slow environments, seeds and ordering."""

import concurrent.futures
import json
import threading
import time

import numpy as np
import pytest

from sao_jax import data, envs
from sao_jax.envs.base import StepResult
from sao_jax.models.tokenizer import load_tokenizer
from sao_jax.rollout import AgentLoop, AgentSettings, GenerateEngine, GenerateResult, derive_seed

TOK = load_tokenizer("byte")


class ReplayEngine(GenerateEngine):
  """Plays the assistant turns of known conversations: for a prompt equal to the rendered history
  before an assistant turn, it returns exactly that turn's tokens in the full rendering (so the
  final turn carries the template's empty think block, as a model would have generated it)."""

  def __init__(self, conversations):
    self.turns = {}
    for messages in conversations:
      full = TOK.render_chat(messages)
      for i, m in enumerate(messages):
        if m["role"] != "assistant":
          continue
        prefix = TOK.render_chat(messages[:i], add_generation_prompt=True)
        assert full[: len(prefix)] == prefix
        end = full.index(TOK.eos_id, len(prefix)) + 1
        self.turns[tuple(prefix)] = full[len(prefix) : end]
    self.requests = []
    self.lock = threading.Lock()

  def submit(self, request):
    with self.lock:
      self.requests.append(request)
    out = self.turns[tuple(request.input_ids)]  # KeyError: the loop built a context we never saw
    n = len(out)
    result = GenerateResult(
      request.rid, out, [-0.01 * (i + 1) for i in range(n)], [3] * n, "stop", len(request.input_ids)
    )
    future = concurrent.futures.Future()
    future.set_result(result)
    return future

  def close(self):
    pass


def check_exact(traj, conversation):
  """Tokens are the full rendering minus the trailing newline; the mask covers assistant turns."""
  full = TOK.render_chat(conversation)
  assert full[-1] == TOK.encode("\n")[0]
  np.testing.assert_array_equal(traj.tokens, full[:-1])
  assert TOK.decode(traj.tokens) == TOK.render_chat_text(conversation)[:-1]
  expected_mask = np.zeros(len(full) - 1, bool)
  for i, m in enumerate(conversation):
    if m["role"] == "assistant":
      start = len(TOK.render_chat(conversation[:i], add_generation_prompt=True))
      expected_mask[start : full.index(TOK.eos_id, start) + 1] = True
  np.testing.assert_array_equal(traj.action_mask, expected_mask)
  assert not traj.action_mask[0]
  np.testing.assert_array_equal(traj.policy_versions, np.where(expected_mask, 3, -1))
  assert np.all(traj.rollout_logprobs[~expected_mask] == 0)
  assert np.all(traj.rollout_logprobs[expected_mask] < 0)
  assert traj.validate(vocab_size=TOK.vocab_size) is None


@pytest.mark.parametrize("tool_format", ["compact", "qwen3"])
def test_math_tool_episodes_are_byte_exact(tool_format):
  tasks = [data.arith_task(0, "train", i, 2) for i in range(3)]
  demos = [envs.demonstration(t, tool_format) for t in tasks]
  factory = envs.make(dict(name="math_tool", tool_format=tool_format, max_turns=4))
  settings = AgentSettings(max_turns=4, max_seq_len=4096, concurrency=3)
  trajs = AgentLoop(ReplayEngine(demos), TOK, factory, settings).run(tasks, seed=0)
  for task, demo, traj in zip(tasks, demos, trajs, strict=True):
    check_exact(traj, demo)
    assert traj.reward == 1.0 and traj.prompt_id == task["id"] and traj.env == "math_tool"
    assert traj.metadata["finish_reason"] == "answer" and traj.metadata["turns"] == 2
    assert traj.metadata["tool_calls"] == 1 and traj.metadata["tool_errors"] == 0


def test_swe_episode_is_byte_exact_and_solves_the_task():
  with open(envs.swe.PACKAGED / "swe_boltons.jsonl") as f:
    task = json.loads(f.readline())
  demo = envs.demonstration(task, "qwen3")
  factory = envs.make(dict(name="swe", tool_format="qwen3", max_turns=10, timeout_s=60.0))
  settings = AgentSettings(max_turns=10, max_seq_len=16384, concurrency=1)
  traj = AgentLoop(ReplayEngine([demo]), TOK, factory, settings).episode(task, seed=0)
  check_exact(traj, demo)
  assert traj.reward == 1.0 and traj.metadata["finish_reason"] == "submit"
  assert traj.prompt_id == str(task.get("id", 0))


# ------------------------------------------------------------------------- scripted environments
class ScriptEnv:
  """Answers each action with the next scripted (observation, reward, done) or raises."""

  name = "script"

  def __init__(self, script, delay=0.0):
    self.script, self.delay = list(script), delay

  def reset(self, task):
    if task.get("fail_reset"):
      raise RuntimeError("no workspace")
    return [dict(role="user", content=task["problem"])]

  def step(self, action):
    time.sleep(self.delay)
    item = self.script.pop(0)
    if isinstance(item, Exception):
      raise item
    obs, reward, done = item
    return StepResult(obs, reward, done, dict(finish_reason="answer" if done else None, n=1))


class FixedEngine(GenerateEngine):
  """Always generates `text` (+ <|im_end|> unless `finish` is 'length'), version = call count."""

  def __init__(self, text="<py>1</py>", finish="stop"):
    self.text, self.finish, self.calls = text, finish, 0
    self.lock = threading.Lock()

  def submit(self, request):
    with self.lock:
      self.calls += 1
      version = self.calls
    out = TOK.encode(self.text) + ([TOK.eos_id] if self.finish == "stop" else [])
    out = out[: request.max_new_tokens]
    n = len(out)
    f = concurrent.futures.Future()
    f.set_result(GenerateResult(request.rid, out, [-0.5] * n, [version] * n, self.finish, 0))
    return f

  def close(self):
    pass


def run(script, engine=None, tasks=None, **settings):
  tasks = tasks or [dict(id="t0", problem="2+2")]
  loop = AgentLoop(
    engine or FixedEngine(),
    TOK,
    lambda: ScriptEnv(script()),
    AgentSettings(**{"max_turns": 3, "max_seq_len": 256, **settings}),
    env_name="script",
  )
  return loop.run(tasks, seed=5)


def test_env_error_marks_the_episode_and_the_loop_goes_on():
  tasks = [dict(id="ok", problem="1"), dict(id="bad", problem="2"), dict(id="r", fail_reset=1)]
  scripts = iter([[("obs", 0.0, False), (None, 1.0, True)], [ValueError("boom")], []])
  lock = threading.Lock()

  def script():
    with lock:
      return next(scripts)

  ok, bad, no_reset = run(script, tasks=tasks, concurrency=1)
  assert ok.metadata["finish_reason"] == "answer" and ok.reward == 1.0
  assert bad.metadata["finish_reason"] == "env_error" and bad.reward == 0.0
  assert "ValueError: boom" in bad.metadata["error"] and bad.num_action_tokens > 0
  assert no_reset.metadata["finish_reason"] == "env_error" and len(no_reset) == 0
  assert "no workspace" in no_reset.metadata["error"]


def test_max_turns_and_versions_per_turn():
  (traj,) = run(lambda: [("o1", 0.0, False)] * 5, max_turns=3)
  assert traj.metadata["finish_reason"] == "max_turns" and traj.metadata["turns"] == 3
  versions = traj.policy_versions[traj.action_mask]
  assert sorted(set(versions)) == [1, 2, 3]  # one engine call per turn, its version per token
  assert np.all(np.diff(versions) >= 0)


def test_max_context_stops_before_an_observation_that_does_not_fit():
  (traj,) = run(lambda: [("x" * 300, 0.0, False)] * 3, max_seq_len=256)
  assert traj.metadata["finish_reason"] == "max_context" and len(traj) <= 256
  assert traj.action_mask[-1]  # ends on the action, the observation was not appended
  (short,) = run(lambda: [("ok", 0.0, False)] * 3, max_seq_len=40)
  assert len(short) <= 40 and short.metadata["finish_reason"] == "max_context"


def test_a_turn_cut_at_the_token_limit_is_closed_by_a_non_action_im_end():
  engine = FixedEngine("<py>print(1)</py>", finish="length")
  (traj,) = run(lambda: [("1", 0.0, False), (None, 1.0, True)], engine=engine, max_new_tokens=8)
  first = np.flatnonzero(traj.action_mask)[:8]
  after = first[-1] + 1
  assert traj.tokens[after] == TOK.eos_id and not traj.action_mask[after]
  assert traj.metadata["truncated_turns"] == 2 and traj.reward == 1.0


def test_slow_environment_steps_run_concurrently():
  tasks = [dict(id=f"t{i}", problem=str(i)) for i in range(8)]
  loop = AgentLoop(
    FixedEngine(),
    TOK,
    lambda: ScriptEnv([(None, 1.0, True)], delay=0.5),
    AgentSettings(max_turns=2, max_seq_len=256, concurrency=8),
  )
  t0 = time.perf_counter()
  trajs = loop.run(tasks, seed=0)
  assert time.perf_counter() - t0 < 2.0  # 8 x 0.5 s serially
  assert [t.prompt_id for t in trajs] == [t["id"] for t in tasks]  # task order


def test_seeds_uids_and_groups_are_deterministic():
  tasks = [dict(id="a", problem="1"), dict(id="b", problem="2")]
  fixed = FixedEngine()
  loop = AgentLoop(
    fixed,
    TOK,
    lambda: ScriptEnv([(None, 0.0, True)]),
    AgentSettings(max_turns=1, max_seq_len=128),
  )
  seen = []
  fixed.submit = lambda r, s=fixed.submit: (seen.append(r.seed), s(r))[1]
  first = loop.run(tasks, seed=9, group_ids=["g", "g"])
  second = loop.run(tasks, seed=9, group_ids=lambda i, t: f"grp-{t['id']}")
  assert [t.uid for t in first] == [t.uid for t in second]
  assert len({t.uid for t in first}) == 2
  assert [t.group_id for t in first] == ["g", "g"]
  assert [t.group_id for t in second] == ["grp-a", "grp-b"]
  assert (
    sorted(seen[:2]) == sorted(seen[2:]) == sorted([derive_seed(9, 0, 0), derive_seed(9, 1, 0)])
  )
  third = loop.run(tasks, seed=10)
  assert third[0].uid != first[0].uid and third[0].group_id == third[0].uid


def test_stream_yields_each_trajectory_as_it_finishes():
  delays = {"slow": 0.6, "fast": 0.0}
  tasks = [dict(id="slow", problem="1"), dict(id="fast", problem="2")]

  class Env(ScriptEnv):
    def reset(self, task):
      self.delay = delays[task["id"]]
      return super().reset(task)

  loop = AgentLoop(
    FixedEngine(),
    TOK,
    lambda: Env([(None, 1.0, True)]),
    AgentSettings(max_turns=1, max_seq_len=128, concurrency=2),
  )
  order = [t.prompt_id for t in loop.stream(iter(tasks), seed=0)]
  assert order == ["fast", "slow"]
  endless = loop.stream(iter(lambda: dict(id="x", problem="3"), None), seed=0)
  assert [next(endless).prompt_id for _ in range(5)] == ["x"] * 5
  endless.close()


def test_settings_from_config():
  from sao_jax import config as config_lib

  c = config_lib.base_config()
  s = AgentSettings.from_config(c)
  assert (s.max_turns, s.max_seq_len, s.max_new_tokens) == (4, 512, 64)
  assert AgentSettings.from_config(c, evaluation=True).temperature == 0.0
  with pytest.raises(ValueError, match="max_seq_len"):

    class Small(FixedEngine):
      max_len = 100

    AgentLoop(Small(), TOK, lambda: None, s)


def test_factories_follow_the_config():
  from flax import nnx

  from sao_jax import config as config_lib
  from sao_jax import models, rollout
  from sao_jax.rollout import HttpEngine, make_agent, make_engine

  c = config_lib.base_config()
  c.rollout.engine, c.rollout.urls = "http", "http://127.0.0.1:1, http://127.0.0.1:2"
  http = make_engine(c, version=3)
  assert isinstance(http, HttpEngine) and http.version == 3 and len(http.servers) == 2
  http.close()
  c.rollout.engine = "embedded"
  with pytest.raises(ValueError, match="policy"):
    make_engine(c)
  engine = make_engine(c, models.Policy(models.get_preset("tiny"), rngs=nnx.Rngs(0)), version=2)
  assert (engine.num_slots, engine.max_len, engine.version) == (16, c.max_seq_len, 2)
  assert engine.windows == rollout.default_windows(c.max_seq_len)
  engine.close()
  c.rollout.decode_windows = "128, 256"
  engine = make_engine(c, models.Policy(models.get_preset("tiny"), rngs=nnx.Rngs(0)))
  assert engine.windows == (128, 256, c.max_seq_len)
  engine.close()
  loop = make_agent(c, FixedEngine(), TOK, evaluation=True)
  assert loop.env_name == "math_tool" and loop.settings.temperature == 0.0
