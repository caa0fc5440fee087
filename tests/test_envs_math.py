"""Tests for sao_jax.envs.math_tool: answer checking, episodes, demonstrations, concurrency."""

import concurrent.futures

import ml_collections
import pytest

from sao_jax import data, envs
from sao_jax.envs import math_tool


@pytest.mark.parametrize(
  "text, boxed",
  [
    ("so \\boxed{10075}.", "10075"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{ {a}+{b} }", "{a}+{b}"),
    ("\\fbox{7}", "7"),
    ("no answer", None),
    ("\\boxed{unclosed", None),
  ],
)
def test_extract_boxed(text, boxed):
  assert math_tool.extract_boxed(text) == boxed


@pytest.mark.parametrize(
  "pred, gold, ok",
  [
    ("10075", "10075", True),
    ("10,075", "10075", True),
    ("-54", "-54", True),
    ("$42$", "42", True),
    ("42.", "42", True),
    ("43", "42", False),
    ("042", "42", True),
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac12", "\\frac{1}{2}", True),
    ("\\sqrt{8}", "2\\sqrt{2}", True),
    ("1+x^2", "x^2+1", True),
    ("(1, 2)", "(1,2)", True),
    ("\\frac{1}{3}", "0.5", False),
    ("\\pi", "3.14159", False),
    ("", "1", False),
    (None, "1", False),
  ],
)
def test_check_answer(pred, gold, ok):
  assert math_tool.check_answer(pred, gold) is ok


def test_check_answer_off_main_thread():
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    assert list(pool.map(math_tool.check_answer, ["\\frac{2}{4}", "3"], ["0.5", "0.5"])) == [
      True,
      False,
    ]


def _env(**kw):
  c = ml_collections.ConfigDict(
    dict(
      name="math_tool",
      max_turns=3,
      tool_format="compact",
      timeout_s=2.0,
      memory_mb=256,
      max_observation_chars=200,
    )
  )
  c.update(kw)
  return envs.make(c)()


TASK = dict(id="t", problem="347*29+12", answer="10075")


def test_episode_correct_wrong_and_no_answer():
  env = _env()
  env.reset(TASK)
  r = env.step("<py>print(347*29+12)</py>")
  assert (r.observation, r.reward, r.done) == ("10075", 0.0, False)
  r = env.step("The result is \\boxed{10075}")
  assert (r.reward, r.done, r.info["finish_reason"], r.info["tool_calls"]) == (
    1.0,
    True,
    "answer",
    1,
  )
  env.reset(TASK)
  assert env.step("\\boxed{10076}").reward == 0.0
  env.reset(TASK)
  r = env.step("I don't know")
  assert (r.reward, r.done, r.info["finish_reason"]) == (0.0, True, "no_answer")


def test_episode_tool_errors_timeouts_and_max_turns():
  env = _env()
  env.reset(TASK)
  r = env.step("<py>1/0</py>")
  assert (
    r.observation.endswith("ZeroDivisionError: division by zero") and r.info["tool_errors"] == 1
  )
  r = env.step("<py>while True: pass</py>")
  assert r.observation == "[timed out after 2 s]" and r.info["tool_errors"] == 2
  r = env.step("<py>print(1)</py>")
  assert (r.done, r.info["finish_reason"], r.info["turns"]) == (True, "max_turns", 3)
  env.reset(TASK)
  r = env.step("<py>print('x' * 5000)</py>")
  assert len(r.observation) <= 200 and "characters truncated" in r.observation


def test_qwen3_format_episode():
  env = _env(tool_format="qwen3")
  messages = env.reset(TASK)
  assert '"name": "python"' in messages[0]["content"] and messages[1]["content"] == "347*29+12"
  r = env.step('<tool_call>{"name": "python", "arguments": {"code": "print(2**10)"}}</tool_call>')
  assert r.observation == "1024"


@pytest.mark.parametrize("difficulty", [1, 3, 5])
def test_arith_demonstrations_match_the_env(difficulty):
  cfg = ml_collections.ConfigDict(
    dict(
      source="procedural", task="arith", difficulty=difficulty, path="", num_train=50, num_eval=5
    )
  )
  for task in data.make_source(cfg, "eval"):
    for fmt in ("compact", "qwen3"):
      demo = envs.demonstration(task, fmt)
      assert [m["role"] for m in demo] == ["system", "user", "assistant", "tool", "assistant"]
      env = _env(tool_format=fmt)
      assert env.reset(task) == demo[:2]
      assert env.step(demo[2]["content"]).observation == demo[3]["content"] == task["answer"]
      r = env.step(demo[4]["content"])
      assert (r.reward, r.done) == (1.0, True)
  compact = envs.demonstration(data.arith_task(0, "train", 0, 5), "compact")
  assert sum(len(m["content"]) for m in compact) < 200  # a byte-level model's 256-token budget


def test_demonstration_without_solution_code_is_a_direct_answer():
  demo = envs.demonstration(dict(id="x", problem="2+2?", answer="4"), "compact")
  assert [m["role"] for m in demo] == ["system", "user", "assistant"]
  assert demo[-1]["content"] == "\\boxed{4}"
  demo = envs.demonstration(
    dict(id="y", problem="p", answer="6", solution_code="print(2*3)"), "compact"
  )
  assert demo[3]["content"] == "6"  # output computed in the sandbox


def test_sixteen_concurrent_episodes():
  tasks = [dict(id=str(i), problem=f"{i}*{i}+1", answer=str(i * i + 1)) for i in range(16)]

  def episode(task):
    env = _env()
    env.reset(task)
    obs = env.step(f"<py>print({task['problem']})</py>").observation
    return env.step(f"\\boxed{{{obs}}}").reward

  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    assert list(pool.map(episode, tasks)) == [1.0] * 16


def test_make_rejects_unknown_env():
  with pytest.raises(ValueError, match="unknown environment 'chess'"):
    envs.make(dict(name="chess"))
