"""Tests for sao_jax.envs.humaneval: scoring through the sandbox and the retry environment."""

import concurrent.futures

import pytest

from sao_jax import data
from sao_jax.envs import humaneval

PROBLEMS = data.humaneval()


def _score_all(problems, completion_of):
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    return list(pool.map(lambda p: humaneval.score(p, completion_of(p)), problems))


def test_sample_canonical_solutions_pass_and_empty_fail():
  sample = PROBLEMS[::20]  # 9 problems across the set
  assert _score_all(sample, lambda p: p["canonical_solution"]) == [1.0] * len(sample)
  assert _score_all(sample, lambda p: "") == [0.0] * len(sample)
  assert _score_all(sample[:3], lambda p: "    return None\n") == [0.0] * 3


@pytest.mark.slow
def test_all_164_canonical_solutions_pass_and_empty_fail():
  assert _score_all(PROBLEMS, lambda p: p["canonical_solution"]) == [1.0] * 164
  assert _score_all(PROBLEMS, lambda p: "") == [0.0] * 164


def test_extract_code_and_full_function_completion():
  assert humaneval.extract_code("a\n```python\nx = 1\n```\nb\n```py\ny = 2\n```") == "y = 2\n"
  assert humaneval.extract_code("def f(): pass") == "def f(): pass"
  p = PROBLEMS[0]
  full = p["prompt"] + p["canonical_solution"]
  assert humaneval.score(p, "\n" + full) == 1.0  # a whole definition overrides the stub


def test_env_feedback_and_retry():
  p = PROBLEMS[2]  # truncate_number
  env = humaneval.HumanEvalEnv(max_turns=2)
  messages = env.reset(p)
  assert messages[1]["content"] == f"```python\n{p['prompt']}```"
  r = env.step("```python\ndef truncate_number(number):\n    return number\n```")
  assert (
    not r.done and r.observation.startswith("Tests failed:") and "AssertionError" in (r.observation)
  )
  demo = humaneval.demonstration(p)
  r = env.step(demo[-1]["content"])
  assert (r.done, r.reward, r.info["turns"], r.info["tool_errors"]) == (True, 1.0, 2, 1)
  env.reset(p)
  env.step("nonsense")
  r = env.step("still nonsense")
  assert (r.done, r.reward, r.info["finish_reason"]) == (True, 0.0, "max_turns")
